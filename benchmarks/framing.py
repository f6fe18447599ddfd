#!/usr/bin/env python3
"""Framing cost per line: Twisted's LineReceiver against the SSMP codec's whole-read split.

LineReceiver takes one line off its buffer at a time and keeps the rest, so its cost per line
grows with the size of the read; the SSMP codec splits a whole read with one bytes.split.  This
prints the CPU time per 80-byte MCAST line for reads of 1 KiB to 256 KiB (Twisted reads up to
64 KiB at a time by default).  Run from the repository root with brokerd importable:

    python benchmarks/framing.py
"""
from __future__ import annotations

import time

from twisted.protocols.basic import LineReceiver

from brokerd.protocols.ssmp.codec import SSMPParser

LINE = b"MCAST bench0 0:12345:123456789012345:" + b"x" * 40 + b"\n"
READ_SIZES = (1024, 16 * 1024, 64 * 1024, 256 * 1024)


class _Lines(LineReceiver):
    delimiter = b"\n"
    MAX_LENGTH = 4096

    def lineReceived(self, line: bytes) -> None:
        pass


def per_line_ns(feed, chunk: bytes, lines: int, repeat: int = 5) -> float:
    """Best-of-``repeat`` CPU time per line of feeding ``chunk`` (about 2 MB per repeat)."""
    rounds = max(3, 2_000_000 // len(chunk))
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(rounds):
            feed(chunk)
        best = min(best, time.process_time() - start)
    return best / rounds / lines * 1e9


def main() -> None:
    print("| read size | LineReceiver ns/line | whole-read split ns/line |")
    print("|---|---|---|")
    for size in READ_SIZES:
        lines = size // len(LINE)
        chunk = LINE * lines
        receiver = _Lines()
        framer = SSMPParser()._framer  # framing only, without parsing the requests
        old = per_line_ns(receiver.dataReceived, chunk, lines)
        new = per_line_ns(framer.frame, chunk, lines)
        print(f"| {size // 1024} KiB ({lines} lines) | {old:,.0f} | {new:,.0f} |")


if __name__ == "__main__":
    main()

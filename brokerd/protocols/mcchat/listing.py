"""Topic lists an MCCHAT connection still owes, written in pieces as its reader takes them.

A TL answer and the discovery snapshot (one MSG per active topic, sent on ``SUB ""``) grow
with the number of active topics: 65,536 topics of 256 bytes make a 16 MiB answer to a
one-byte request.  Built whole, a few clients that ask and never read would hold gigabytes.
So each list is produced in pieces of about :data:`CHUNK` bytes, the next piece only while
the connection's transport is under its output limit (the connection is the transport's
streaming producer; Twisted pauses it past the limit and resumes it when the reader caught
up).  What one connection holds for its lists is one snapshot of the topic names (shared
with every other connection while the topics do not change) and one piece.

Requests are counted, not stored: any number of TLRQs costs one counter.  A list's topics
are read when its first piece is written, so a ``TLRQ, SUB t, TLRQ`` gets ``t`` in the
second answer.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

TL = 0
"""A TL packet: ``05``, each topic NUL-terminated, ``04``."""
DISCOVERY = 1
"""The discovery snapshot: one ``MSG "" "" <topic>`` per active topic."""
CHUNK = 16 * 1024
"""Bytes of topic names per written piece (a piece may pass it by one topic)."""


class PendingLists:
    """The lists one connection was asked for and has not finished writing, in order."""

    __slots__ = ("requests", "topics", "kind", "position")

    def __init__(self) -> None:
        self.requests: deque[list[int]] = deque()
        """``[kind, count]`` runs of requests not started yet."""
        self.topics: tuple[bytes, ...] | None = None
        """The list being written (None between lists)."""
        self.kind = TL
        self.position = 0

    def request(self, kind: int) -> None:
        requests = self.requests
        if requests and requests[-1][0] == kind:
            requests[-1][1] += 1
        else:
            requests.append([kind, 1])

    @property
    def writing(self) -> bool:
        """In the middle of a list: nothing else may be written to the connection now."""
        return self.topics is not None

    @property
    def busy(self) -> bool:
        """A list is being written or waits to be."""
        return self.topics is not None or bool(self.requests)

    def next_piece(self, snapshot: Callable[[], tuple[bytes, ...]]) -> bytes:
        """The next bytes to write (possibly empty: a discovery snapshot of no topics).
        ``snapshot`` gives the active topics when a new list starts."""
        parts: list[bytes] = []
        if self.topics is None:
            run = self.requests[0]
            run[1] -= 1
            if not run[1]:
                self.requests.popleft()
            self.kind, self.topics, self.position = run[0], snapshot(), 0
            if self.kind == TL:
                parts.append(b"\x05")
        topics = self.topics
        tl = self.kind == TL
        i, n, size = self.position, len(topics), 0
        while i < n and size < CHUNK:
            topic = topics[i]
            parts.append(topic + b"\x00" if tl else b"\x03\x00\x00" + topic + b"\x00")
            size += len(topic)
            i += 1
        if i < n:
            self.position = i
        else:
            if tl:
                parts.append(b"\x04")
            self.topics = None
        return b"".join(parts)

    def clear(self) -> None:
        self.requests.clear()
        self.topics = None

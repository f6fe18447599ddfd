"""A subscriber that stops reading, over real sockets: the broker keeps serving everyone else,
drops (never reorders) what the stalled reader cannot take, and stays bounded."""
from __future__ import annotations

import socket

import pytest

from tests.support.broker import LineClient, start_broker

pytestmark = pytest.mark.slow

MESSAGES = 4000
PAYLOAD = 1000
BURST = 20


def vm_rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_stalled_subscriber_loses_messages_in_order_others_get_all(tmp_path):
    broker = start_broker(tmp_path, "--open-login", "--max-output-buffer", "65536")
    try:
        port = broker.ports["ssmp"]
        stalled_sock = socket.socket()
        stalled_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled_sock.connect(("127.0.0.1", port))
        stalled = LineClient(stalled_sock, timeout=10)
        assert stalled.request("LOGIN stalled open") == b"200"
        assert stalled.request("SUBSCRIBE flood") == b"200"
        healthy = LineClient.connect(port, timeout=10)
        assert healthy.request("LOGIN healthy open") == b"200"
        assert healthy.request("SUBSCRIBE flood") == b"200"
        publisher = LineClient.connect(port, timeout=10)
        assert publisher.request("LOGIN publisher open") == b"200"
        rss_before = vm_rss_kib(broker.process.pid)

        # Bursts of 20 KB: the healthy reader, read after each burst, never falls 64 KiB behind.
        for start in range(0, MESSAGES, BURST):
            batch = b"".join(
                b"MCAST flood %06d:" % i + b"x" * (PAYLOAD - 8) + b"\n" for i in range(start, start + BURST)
            )
            publisher.send(batch)
            for _ in range(BURST):
                assert publisher.line() == b"200"
            for i in range(start, start + BURST):
                assert healthy.line().startswith(b"000 publisher MCAST flood %06d:" % i)

        grown_kib = vm_rss_kib(broker.process.pid) - rss_before
        assert grown_kib < 16 * 1024, f"broker grew by {grown_kib} KiB for one stalled reader"

        # Now the stalled reader reads what it was given: an ordered subsequence, with gaps.
        stalled.sock.settimeout(1.0)
        seen = []
        try:
            while True:
                seen.append(int(stalled.line().split(b" ")[4][:6]))
        except (TimeoutError, socket.timeout):
            pass
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        assert 0 < len(seen) < MESSAGES
        # Drained: it is read and served again.
        stalled.sock.settimeout(10)
        assert stalled.request("PING") == b"000 . PONG"
        assert publisher.request("MCAST flood after") == b"200"
        assert stalled.line() == b"000 publisher MCAST flood after"
    finally:
        broker.stop()

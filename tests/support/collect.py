"""A raw Twisted client protocol for real-socket tests of misbehaving clients, and a bounded
wait on server state.

``Collector`` writes what the test says and keeps every byte it receives; it may start with
its reading paused (a client that asks and never reads), with a receive buffer that absorbs
little yet holds two loopback segments (below that the window only opens by the sender's
probes, and reading later would crawl).
"""
from __future__ import annotations

import inspect
import socket
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater

from tests.support.live import TIMEOUT
from tests.support.live import reactor as _reactor


class Collector(Protocol):
    """Collects what the server sends; ``until`` waits for it."""

    def __init__(self, read: bool = True) -> None:
        self.read = read
        self.received = bytearray()
        self._waits: list[tuple[Callable[[bytearray], bool], Deferred]] = []

    def connectionMade(self) -> None:
        if not self.read:
            self.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 128 * 1024)
            self.transport.pauseProducing()

    def start_reading(self) -> None:
        self.transport.resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        for condition, d in list(self._waits):
            if condition(self.received):
                self._waits.remove((condition, d))
                d.callback(None)

    def until(self, condition: Callable[[bytearray], bool] | int) -> Deferred:
        """Fires once ``condition(received)`` holds (an int: that many bytes came)."""
        if isinstance(condition, int):
            size = condition
            condition = lambda received: len(received) >= size  # noqa: E731
        d: Deferred = Deferred()
        self._waits.append((condition, d))
        self.dataReceived(b"")
        return d.addTimeout(TIMEOUT, _reactor())

    def until_one_of(self, candidates: list[bytes]) -> Deferred:
        """Fires once what came is exactly one of ``candidates``."""
        return self.until(lambda received: any(received == c for c in candidates))


async def eventually(condition: Callable[[], Any], what: str) -> None:
    """Wait until ``condition()`` (or what it returns, awaited: a query to the server) holds,
    for server state no event reports; at most TIMEOUT."""
    for _ in range(int(TIMEOUT / 0.02)):
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await deferLater(_reactor(), 0.02)
    raise AssertionError(f"timed out waiting for {what}")

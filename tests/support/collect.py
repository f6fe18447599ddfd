"""A raw Twisted client protocol for real-socket tests of misbehaving clients, and bounded
waits on server state: :func:`called` waits for the server's own method call (an event), and
:func:`eventually` polls, for slow tests on state no call reports.

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


def called(target: Any, name: str, condition: Callable[[], Any] = lambda: True) -> Deferred:
    """Fires once a call of ``target.<name>`` (and the Deferred it returns, if any) left
    ``condition()`` true, or at once if it holds already; fails after TIMEOUT.  The wait on an
    event of the server's own objects (a producer paused, a connection lost, a store read
    answered) that the quick tests use instead of polling the reactor.  The method is
    wrapped on the instance for the wait and put back when it ends."""
    d: Deferred = Deferred()
    if condition():
        d.callback(None)
        return d
    own = vars(target)
    had, saved = name in own, own.get(name)
    original = getattr(target, name)

    def check(result: Any = None) -> Any:
        if not d.called and condition():
            d.callback(None)
        return result

    def watching(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if isinstance(result, Deferred):
            return result.addBoth(check)
        return check(result)

    def restore(result: Any) -> Any:
        if vars(target).get(name) is watching:
            if had:
                setattr(target, name, saved)
            else:
                delattr(target, name)
        return result

    setattr(target, name, watching)
    return d.addTimeout(TIMEOUT, _reactor()).addBoth(restore)


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

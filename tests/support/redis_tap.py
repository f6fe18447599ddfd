"""A Redis client that is not a node, for the cluster's attack tests: it listens to channels
the nodes use (``SSUBSCRIBE``, what anyone on Redis's network can do) and records what it
sees, and it writes whatever bytes it likes to them (``SPUBLISH``)."""
from __future__ import annotations

from typing import Any

from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol

from brokerd.cluster.connection import RespReader
from tests.support.live import TIMEOUT, Waiter, reactor
from tests.support.redis import _encode, command


class _Listener(Protocol):
    def __init__(self, tap: Tap) -> None:
        self.tap = tap
        self.reader = RespReader(RuntimeError)

    def dataReceived(self, data: bytes) -> None:
        for reply in self.reader.feed(data):
            if isinstance(reply, list) and len(reply) == 3:
                if reply[0] == b"smessage":
                    self.tap.seen((reply[1], reply[2]))
                elif reply[0] == b"ssubscribe":
                    self.tap.subscribed(reply[1])


class Tap:
    """Records every (channel, bytes) published on the channels it listens to."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen = Waiter()
        self.subscribed = Waiter()
        self.protocol: Any = None

    async def listen(self, *channels: bytes) -> Tap:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.port)
        self.protocol = await endpoint.connect(Factory.forProtocol(lambda: _Listener(self))).addTimeout(
            TIMEOUT, reactor())
        for channel in channels:
            self.protocol.transport.write(_encode(b"SSUBSCRIBE", channel))
        await self.subscribed.until(lambda items: set(channels) <= set(items)).addTimeout(TIMEOUT, reactor())
        return self

    def frames(self, channel: bytes) -> list[bytes]:
        return [data for name, data in self.seen.items if name == channel]

    def until_frame(self, channel: bytes, count: int = 1) -> Deferred:
        """Fires once ``count`` frames were seen on ``channel``."""
        return self.seen.until(lambda items: sum(name == channel for name, _ in items) >= count).addTimeout(
            TIMEOUT, reactor())

    def publish(self, channel: bytes, data: bytes) -> int:
        """SPUBLISH ``data`` on ``channel`` (a blocking round trip on loopback); how many
        subscribers Redis delivered it to."""
        return int(command(self.port, "SPUBLISH", channel, data))

    def close(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.loseConnection()

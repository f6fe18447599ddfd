"""The two connections of a node to Redis, on txredisapi's reply parser, kept open.

:class:`Link` connects through the ``--cluster`` endpoint, prepares the connection (AUTH,
SELECT), hands it to the engine, and reconnects with a capped exponential backoff when it
fails or goes.  The protocol classes write their commands themselves and match replies in
order, so that pipelined SPUBLISHes need no Deferred each; the subscriber connection turns
``smessage`` pushes (sharded pub/sub, which txredisapi's SubscriberProtocol does not know) into
calls on the engine.  txredisapi is imported only when a node joins a cluster.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

CHANNEL_PREFIX = b"brokerd:t:"
"""Channel of a topic: the prefix, then the topic's bytes (the shard is the channel's hash)."""
RECONNECT_FIRST = 0.25
RECONNECT_MAX = 5.0
"""Seconds before the first reconnection attempt, and the most between two attempts."""


def channel(topic: bytes) -> bytes:
    return CHANNEL_PREFIX + topic


def _load_txredisapi() -> Any:
    try:
        import txredisapi
    except ModuleNotFoundError:  # pragma: no cover - the cluster extra is not installed
        from brokerd.errors import ConfigurationError

        raise ConfigurationError("--cluster needs txredisapi: pip install 'brokerd[cluster]'") from None
    return txredisapi


def protocols() -> tuple[type, type]:
    """The two connection classes, built on txredisapi's reply parser when first needed (so
    the broker starts without txredisapi when it is not in a cluster)."""
    txredisapi = _load_txredisapi()

    class Commands(txredisapi.RedisProtocol):
        """Writes commands itself and matches each reply to its command in order.  Replies
        to SPUBLISH are counted, not kept: the bytes in flight bound the backlog."""

        def __init__(self, engine: Any) -> None:
            super().__init__(charset=None, convertNumbers=False)
            self.engine = engine
            self.expected: deque[Deferred | int] = deque()

        def command(self, *args: bytes | str | int) -> Deferred:
            d: Deferred = Deferred()
            self.expected.append(d)
            self.transport.write(self._build_command(*args))
            return d

        def replyReceived(self, reply: Any) -> None:
            if not self.expected:
                return
            waiting = self.expected.popleft()
            if isinstance(waiting, int):
                self.engine.acknowledged(waiting, reply)
            elif isinstance(reply, Exception):
                waiting.errback(reply)
            else:
                waiting.callback(reply)

        def connectionLost(self, reason: Failure) -> None:
            super().connectionLost(reason)
            expected, self.expected = self.expected, deque()
            for waiting in expected:
                if isinstance(waiting, Deferred):
                    waiting.errback(reason)
                else:
                    self.engine.acknowledged(waiting, None)
            self.engine.connection_lost(self, reason)

    class Subscriber(Commands):
        """The subscribing connection: ``smessage`` pushes go to the engine, the
        ``ssubscribe``/``sunsubscribe`` confirmations (one per channel) are not replies."""

        def replyReceived(self, reply: Any) -> None:
            if isinstance(reply, list) and reply:
                kind = reply[0]
                if kind == b"smessage" and len(reply) == 3:
                    self.engine.received(reply[1], reply[2])
                    return
                if kind in (b"ssubscribe", b"sunsubscribe") and len(reply) == 3:
                    self.engine.confirmed(reply[1], kind == b"ssubscribe")
                    return
            super().replyReceived(reply)

        def follow(self, name: bytes, active: bool) -> None:
            """Subscribe to a topic's channel, or leave it (nothing to wait for)."""
            self.transport.write(self._build_command(b"SSUBSCRIBE" if active else b"SUNSUBSCRIBE", channel(name)))

    return Commands, Subscriber


class Link:
    """One connection kept open: connects, prepares (AUTH, SELECT), reconnects with backoff."""

    def __init__(self, engine: Any, role: str, protocol_class: type,
                 ready: Callable[[Any], Deferred | None]) -> None:
        self.engine = engine
        self.role = role
        self.protocol_class = protocol_class
        self.ready = ready
        self.protocol: Any = None
        self.delay = RECONNECT_FIRST
        self.retry: Any = None
        self.stopped = False
        self.connecting: Deferred | None = None

    def connect(self) -> None:
        self.retry = None
        if self.stopped:
            return
        engine = self.engine
        factory = Factory.forProtocol(lambda: self.protocol_class(engine))
        self.connecting = d = engine.endpoint.connect(factory)
        d.addCallback(self._prepare)
        d.addErrback(self._failed)

    def _prepare(self, protocol: Any) -> Deferred:
        self.connecting = None
        engine = self.engine
        steps: Deferred = succeed(None)
        if engine.password is not None:
            args = ("AUTH", engine.username, engine.password) if engine.username else ("AUTH", engine.password)
            steps.addCallback(lambda _: protocol.command(*args))
        if engine.address.db is not None:
            steps.addCallback(lambda _: protocol.command("SELECT", engine.address.db))

        def prepared(_: object) -> None:
            if self.stopped:  # stopped while AUTH/SELECT were on their way
                protocol.transport.loseConnection()
                return
            self.protocol = protocol
            self.delay = RECONNECT_FIRST
            self.ready(protocol)

        def refused(failure: Failure) -> None:
            protocol.transport.abortConnection()
            raise failure.value

        steps.addCallbacks(prepared, refused)
        return steps

    def _failed(self, failure: Failure) -> None:
        self.connecting = None
        self.engine.unreachable(self.role, failure)
        self.schedule()

    def lost(self) -> None:
        self.protocol = None
        if self.role == "subscriber":
            self.engine.following.clear()
        self.schedule()

    def schedule(self) -> None:
        if self.stopped or self.retry is not None:
            return
        self.retry = self.engine.reactor.callLater(self.delay, self.connect)
        self.delay = min(self.delay * 2, RECONNECT_MAX)

    def stop(self) -> Deferred | None:
        self.stopped = True
        if self.retry is not None and self.retry.active():
            self.retry.cancel()
        self.retry = None
        if self.connecting is not None:
            self.connecting.cancel()
        protocol, self.protocol = self.protocol, None
        if protocol is not None and protocol.transport is not None:
            done: Deferred = Deferred()
            protocol.whenDisconnected().addBoth(lambda _: done.callback(None))
            protocol.transport.loseConnection()
            return done
        return None

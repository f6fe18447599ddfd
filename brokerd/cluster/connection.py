"""The two connections of a node to a Redis server (one shard), on txredisapi's command
builder, kept open.

:class:`Link` connects through the shard's endpoint, prepares the connection (AUTH,
SELECT), hands it to the engine, and reconnects with a capped exponential backoff when it
fails or goes.  The protocol classes write their commands themselves and match replies in
order, so that pipelined SPUBLISHes need no Deferred each; the subscriber connection turns
``smessage`` pushes (sharded pub/sub, which txredisapi's SubscriberProtocol does not know) into
calls on the shard (:class:`brokerd.cluster.shards.Shard`, the protocols' ``engine``), with
the error answers to its SSUBSCRIBEs (a ``-MOVED`` on a Redis Cluster).  txredisapi is
imported only when a node joins a cluster.

Replies are read by :class:`RespReader`, not by txredisapi's parser: that one pauses the
transport after every bulk reply and resumes it a reactor turn later, which costs a turn (and
a copy of the rest of the read) per message a node receives.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol, TypeAlias, Union, cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IProtocol, IReactorTime, IStreamClientEndpoint, ITCPTransport
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

RespReply: TypeAlias = Union[bytes, int, None, list["RespReply"], Exception]
"""One RESP2 reply as :class:`RespReader` gives it: a bulk or simple string (bytes), an
integer, a null (None), an array, or an error (the reader's ``error_type``)."""
Pipelined = tuple[bytes, bytes, int]
"""A SPUBLISH waiting for its answer: (channel, envelope, redirections so far)."""

CHANNEL_PREFIX = b"brokerd:t:"
"""Channel of a topic: the prefix, then the topic's bytes (the shard is the channel's hash)."""
RECONNECT_FIRST = 0.25
RECONNECT_MAX = 5.0
"""Seconds before the first reconnection attempt, and the most between two attempts."""


def channel(topic: bytes) -> bytes:
    return CHANNEL_PREFIX + topic


MAX_DEPTH = 8
"""Arrays nested in one reply (the deepest brokerd reads, CLUSTER SLOTS, has three): a
deeper one closes the connection (it is not Redis speaking)."""
MAX_REPLY = 256 << 20
"""Bytes one reply may have (Redis's own limit for a bulk string is 512 MiB; an envelope is
bounded by the sender's --cluster-max-backlog): a longer one closes the connection."""


class ProtocolError(ValueError):
    """Bytes from Redis that are not RESP2 (or a reply over MAX_REPLY)."""


class _Incomplete(Exception):
    """The reply is not all here yet; ``needed``: the buffer's length it needs at least, when
    a bulk string's length says so (0: unknown)."""

    def __init__(self, needed: int = 0) -> None:
        super().__init__(needed)
        self.needed = needed


class RespReader:
    """Incremental RESP2 reader: bytes in, whole replies out (bulk strings as bytes, simple
    strings as bytes, integers, arrays as lists, errors as ``error_type(message)``).

    A reply whose bulk string is still arriving is not parsed again at every read: its
    chunks are kept until the length its header announced is there, then joined once, so a
    large message costs its bytes once, not once per read (any client of Redis can publish
    one on the channels a node reads)."""

    def __init__(self, error_type: type[Exception]) -> None:
        self.error_type = error_type
        self.rest = b""
        self.chunks: list[bytes] = []
        """The start of a reply known to need ``waiting`` bytes, and what came since."""
        self.buffered = 0
        self.waiting = 0

    def feed(self, data: bytes) -> list[RespReply]:
        if self.waiting:
            self.chunks.append(data)
            self.buffered += len(data)
            if self.buffered < self.waiting:
                return []
            buffer = b"".join(self.chunks)
            self.chunks, self.buffered, self.waiting = [], 0, 0
        else:
            buffer = self.rest + data if self.rest else data
        replies: list[RespReply] = []
        position = 0
        try:
            while position < len(buffer):
                reply, position = self._read(buffer, position, 0)
                replies.append(reply)
        except _Incomplete as incomplete:
            if len(buffer) - position > MAX_REPLY:
                raise ProtocolError("a reply longer than the limit") from None
            if incomplete.needed > len(buffer):
                self.chunks = [buffer[position:]]
                self.buffered = len(buffer) - position
                self.waiting = incomplete.needed - position
                self.rest = b""
                return replies
        self.rest = buffer[position:]
        return replies

    def _read(self, buffer: bytes, position: int, depth: int) -> tuple[RespReply, int]:
        end = buffer.find(b"\r\n", position)
        if end < 0:
            raise _Incomplete
        kind = buffer[position]
        try:
            if kind == 36:  # $ bulk string
                size = int(buffer[position + 1:end])
                if size < 0:
                    return None, end + 2
                if size > MAX_REPLY:
                    raise ProtocolError("a bulk string longer than the limit")
                stop = end + 2 + size
                if len(buffer) < stop + 2:
                    raise _Incomplete(stop + 2)
                return buffer[end + 2:stop], stop + 2
            if kind == 42:  # * array
                count = int(buffer[position + 1:end])
                if count < 0:
                    return None, end + 2
                if depth >= MAX_DEPTH:
                    raise ProtocolError("arrays nested deeper than the limit")
                items: list[RespReply] = []
                position = end + 2
                for _ in range(count):
                    item, position = self._read(buffer, position, depth + 1)
                    items.append(item)
                return items, position
            if kind == 58:  # : integer
                return int(buffer[position + 1:end]), end + 2
            if kind == 43:  # + simple string
                return buffer[position + 1:end], end + 2
            if kind == 45:  # - error
                return self.error_type(buffer[position + 1:end].decode("utf-8", "replace")), end + 2
        except ValueError as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise ProtocolError(f"a malformed length ({exc})") from None
        raise ProtocolError(f"an unknown reply type {bytes((kind,))!r}")


class ConnectionOwner(Protocol):
    """What the connections tell their shard (:class:`brokerd.cluster.shards.Shard`, which
    imports this module)."""

    def protocol_error(self, why: str) -> None: ...

    def acknowledged(self, entry: Pipelined, reply: RespReply) -> None: ...

    def connection_lost(self, protocol: object, reason: Failure) -> None: ...

    def received(self, name: bytes, data: bytes) -> None: ...

    def confirmed(self, name: bytes, subscribed: bool) -> None: ...

    def refused(self, error: Exception) -> None: ...


class LinkOwner(ConnectionOwner, Protocol):
    """The shard as its :class:`Link` sees it: where and how to connect, and what to tell."""

    @property
    def endpoint(self) -> IStreamClientEndpoint: ...

    @property
    def password(self) -> str | None: ...

    @property
    def username(self) -> str | None: ...

    @property
    def address(self) -> RedisServer: ...

    @property
    def reactor(self) -> IReactorTime: ...

    @property
    def following(self) -> set[bytes]: ...

    def unreachable(self, role: str, failure: Failure) -> None: ...


class RedisServer(Protocol):
    """The part of a shard's address a connection SELECTs."""

    @property
    def db(self) -> int | None: ...


class RedisConnection(Protocol):
    """One of the two connection classes of :func:`protocols` (built on txredisapi's, which
    has no type hints), as the shards use it."""

    transport: ITCPTransport
    """Set when the connection was made (before the Link holds it), and kept after it ends."""
    expected: deque[Deferred | Pipelined]

    def command(self, *args: bytes | str | int) -> Deferred: ...

    def whenDisconnected(self) -> Deferred: ...

    def _build_command(self, *args: bytes | str | int) -> bytes: ...


def load_txredisapi() -> ModuleType:
    try:
        import txredisapi
    except ModuleNotFoundError:  # pragma: no cover - the cluster extra is not installed
        from brokerd.errors import INSTALL_CLUSTER, ConfigurationError

        raise ConfigurationError(f"--cluster needs txredisapi: {INSTALL_CLUSTER}") from None
    return txredisapi


def protocols() -> tuple[type, type]:
    """The two connection classes, built on txredisapi's reply parser when first needed (so
    the broker starts without txredisapi when it is not in a cluster)."""
    txredisapi = load_txredisapi()
    RedisProtocol: Any = txredisapi.RedisProtocol  # txredisapi has no type hints

    class Commands(RedisProtocol):
        """Writes commands itself and matches each reply to its command in order.  A
        SPUBLISH waits as its (channel, envelope, redirections) tuple, not a Deferred, so
        that a ``-MOVED`` answer can send it again; the bytes in flight bound the backlog."""

        def __init__(self, engine: ConnectionOwner) -> None:
            super().__init__(charset=None, convertNumbers=False)
            self.engine = engine
            self.expected: deque[Deferred | Pipelined] = deque()
            self.reader = RespReader(txredisapi.ResponseError)

        def dataReceived(self, data: bytes) -> None:
            try:
                replies = self.reader.feed(data)
            except ProtocolError as exc:
                self.engine.protocol_error(str(exc))
                self.transport.abortConnection()
                return
            for reply in replies:
                self.replyReceived(reply)

        def command(self, *args: bytes | str | int) -> Deferred:
            d: Deferred = Deferred()
            self.expected.append(d)
            self.transport.write(self._build_command(*args))
            return d

        def replyReceived(self, reply: RespReply) -> None:
            if not self.expected:
                return
            waiting = self.expected.popleft()
            if isinstance(waiting, tuple):
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
        ``ssubscribe``/``sunsubscribe`` confirmations (one per channel) are not replies, and
        an error nothing waits for answers a SSUBSCRIBE (the shard's ``refused``)."""

        def replyReceived(self, reply: RespReply) -> None:
            if isinstance(reply, list) and reply:
                kind = reply[0]
                # a push's channel and message are bulk strings: anything else matches no channel
                # here, and a message's fails the shard's decoding (counted as damaged)
                if kind == b"smessage" and len(reply) == 3:
                    self.engine.received(cast(bytes, reply[1]), cast(bytes, reply[2]))
                    return
                if kind in (b"ssubscribe", b"sunsubscribe") and len(reply) == 3:
                    self.engine.confirmed(cast(bytes, reply[1]), kind == b"ssubscribe")
                    return
            if isinstance(reply, Exception) and not self.expected:
                self.engine.refused(reply)
                return
            super().replyReceived(reply)

    return Commands, Subscriber


class Link:
    """One connection kept open: connects, prepares (AUTH, SELECT), reconnects with backoff.
    ``engine`` is the owner (a shard): its ``endpoint``, ``password``, ``username``,
    ``address.db``, ``reactor``, ``following`` and ``unreachable``."""

    def __init__(self, engine: LinkOwner, role: str, protocol_class: type,
                 ready: Callable[[RedisConnection], Deferred | None]) -> None:
        self.engine = engine
        self.role = role
        self.protocol_class = protocol_class
        self.ready = ready
        self.protocol: RedisConnection | None = None
        self.delay = RECONNECT_FIRST
        self.retry: IDelayedCall | None = None
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

    def _prepare(self, built: IProtocol) -> Deferred:
        protocol = cast(RedisConnection, built)  # what protocol_class, one of protocols(), builds
        self.connecting = None
        engine = self.engine
        steps: Deferred = succeed(None)
        if engine.password is not None:
            args = ("AUTH", engine.username, engine.password) if engine.username else ("AUTH", engine.password)
            steps.addCallback(lambda _: protocol.command(*args))
        db = engine.address.db
        if db is not None:
            steps.addCallback(lambda _: protocol.command("SELECT", db))

        def prepared(_: object) -> None:
            if self.stopped:  # stopped while AUTH/SELECT were on their way
                protocol.transport.loseConnection()
                return
            self.protocol = protocol
            self.delay = RECONNECT_FIRST
            self.ready(protocol)

        def refused(failure: Failure) -> None:
            protocol.transport.abortConnection()
            failure.raiseException()

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

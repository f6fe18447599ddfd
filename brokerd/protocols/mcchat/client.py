"""A Twisted MCCHAT v1 client, for brokerd's own tools and for any Twisted program.

:class:`MCChatClientProtocol` is one connection.  Bytes go through the sans-IO
:class:`~brokerd.protocols.mcchat.codec.MCChatParser`.  MCCHAT answers nothing but TLRQ, so:

- :meth:`~MCChatClientProtocol.when_ready` fires once the server's INFO arrived (a server of
  another version is refused: the connection is closed);
- :meth:`~MCChatClientProtocol.subscribe`, :meth:`~MCChatClientProtocol.unsubscribe` and
  :meth:`~MCChatClientProtocol.publish` only write; a server handles one connection's packets
  in order, so :meth:`~MCChatClientProtocol.sync` (a TLRQ, waiting for its TL) is the barrier
  that says everything sent before it was handled;
- :meth:`~MCChatClientProtocol.topics` fires with the active topics of the next TL.

Strings are given and received as ``str`` (UTF-8 on the wire); each is checked before it is
sent, because a packet the server cannot frame costs the whole connection.  Messages arrive at
:meth:`~MCChatClientProtocol.on_message`, or at the factory's ``on_message`` callable.

:func:`client_endpoint` (the clients' shared one, from brokerd.protocols.endpoints) makes the
endpoint for :func:`connect` from a string; for TLS it needs the server's host name.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.errors import BrokerError
from brokerd.protocols.closing import ClosedNotifier, abort_connection
from brokerd.protocols.endpoints import client_endpoint
from brokerd.protocols.mcchat.codec import (
    VERSION,
    MCChatParser,
    encode_msg,
    encode_sub,
    encode_tlrq,
    encode_unsub,
)
from brokerd.protocols.mcchat.events import Info, Malformed, Msg, TopicList
from brokerd.protocols.nodelay import no_delay

MessageHandler = Callable[[str, str, str], object]
"""``(topic, username, message)`` for every MSG packet."""


class MCChatError(BrokerError):
    """The server is not one this client can talk to (another version, broken framing)."""


def _utf8(what: str, value: str | bytes) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


def _text(value: bytes) -> str:
    return value.decode("utf-8")  # the parser only lets valid UTF-8 through


class MCChatClientProtocol(ClosedNotifier, Protocol):
    """One MCCHAT connection seen from the client side."""

    _log = Logger()
    factory: MCChatClientFactory | None = None

    def __init__(self) -> None:
        self._parser = MCChatParser()
        self.version: int | None = None
        """The server's protocol version, once its INFO arrived."""
        self._usable = False
        self._reading = True
        self._ready: list[Deferred] = []
        self._topic_requests: deque[Deferred] = deque()
        self._lost: BaseException | None = None
        self._lost_waiters: list[Deferred] = []

    @property
    def is_open(self) -> bool:
        """True while packets can be sent."""
        return self._usable

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        no_delay(self.transport)
        self._usable = True

    def connectionLost(self, reason: Failure | None = None) -> None:
        """Fail whatever still waits for the server (TL answers, INFO) with ``reason``."""
        self._usable = False
        self._reading = False
        self._lost = reason.value if reason is not None else ConnectionClosed()
        waiting = list(self._ready) + list(self._topic_requests)
        self._ready = []
        self._topic_requests = deque()
        for d in waiting:
            d.errback(reason if reason is not None else Failure(self._lost))
        self._notify_closed()

    def when_ready(self) -> Deferred:
        """Fires with this protocol once the server's INFO (version 1) arrived."""
        if self.version is not None:
            return succeed(self)
        if self._lost is not None:
            return fail(self._lost)
        d: Deferred = Deferred()
        self._ready.append(d)
        return d

    def close(self) -> Deferred:
        """Close the connection (MCCHAT has no goodbye packet); fires once it is gone."""
        d = self.when_closed()
        self._usable = False
        if self.transport is not None and self._lost is None:
            self.transport.loseConnection()
        return d

    def _violation(self, why: str, **fields: object) -> None:
        self._log.warn("MCCHAT server broke the protocol, closing: " + why, **fields)
        self._usable = False
        self._reading = False
        error = MCChatError(why.format(**fields))
        ready, self._ready = self._ready, []
        for d in ready:
            d.errback(error)
        abort_connection(self.transport)

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if not self._reading:
            return
        events, error = self._parser.feed(data)
        for event in events:
            if not self._reading:
                return
            match event:
                case Msg(topic, username, message):
                    try:
                        self.on_message(_text(topic), _text(username), _text(message))
                    except Exception:
                        self._log.failure("Handling MCCHAT message {event!r}", event=event)
                case TopicList():
                    self._topic_list(event)
                case Info():
                    self._info(event)
                case Malformed():
                    self._log.warn("Dropped a malformed MCCHAT packet: {reason}", reason=event.reason)
                case _:
                    self._violation("the server sent a client packet {event!r}", event=event)
        if error is not None and self._reading:
            self._violation("{error}", error=error)

    def _info(self, info: Info) -> None:
        if info.version != VERSION:
            self._violation("the server speaks MCCHAT version {version}", version=info.version)
            return
        self.version = info.version
        ready, self._ready = self._ready, []
        for d in ready:
            d.callback(self)

    def _topic_list(self, packet: TopicList) -> None:
        if not self._topic_requests:
            self._log.info("Ignored a TL packet nobody asked for")
            return
        self._topic_requests.popleft().callback([_text(topic) for topic in packet.topics])

    def on_message(self, topic: str, username: str, message: str) -> None:
        """A MSG packet arrived.  Override it, or give the factory an ``on_message``."""
        handler = getattr(self.factory, "on_message", None)
        if handler is not None:
            handler(topic, username, message)

    # ------------------------------------------------------------------ output

    def _write(self, data: bytes) -> None:
        if not self._usable:
            raise ConnectionClosed("the MCCHAT connection is not open")
        self._made().write(data)

    def subscribe(self, topic: str | bytes) -> None:
        """Send SUB.  ValueError for a topic MCCHAT cannot carry; ConnectionClosed when the
        connection is gone."""
        self._write(encode_sub(_utf8("topic", topic)))

    def unsubscribe(self, topic: str | bytes) -> None:
        self._write(encode_unsub(_utf8("topic", topic)))

    def publish(self, topic: str | bytes, username: str | bytes, message: str | bytes) -> None:
        """Send a MSG; when we are subscribed to ``topic`` the server sends us a copy."""
        self._write(
            encode_msg(_utf8("topic", topic), _utf8("username", username), _utf8("message", message))
        )

    def topics(self) -> Deferred:
        """Send TLRQ; fires with the list of active topics (str) from the answering TL."""
        if not self._usable:
            return fail(ConnectionClosed("the MCCHAT connection is not open"))
        d: Deferred = Deferred()
        self._topic_requests.append(d)
        self._made().write(encode_tlrq())
        return d

    def sync(self) -> Deferred:
        """Fires (with None) once the server handled everything sent before this call."""
        return self.topics().addCallback(lambda _topics: None)


class MCChatClientFactory(ClientFactory):
    """Builds :class:`MCChatClientProtocol` instances sharing one ``on_message`` callable."""

    protocol = MCChatClientProtocol  # type: ignore[assignment]  # Twisted's Factory[P] wants P.factory set, a client protocol may have none

    def __init__(self, on_message: MessageHandler | None = None) -> None:
        self.on_message = on_message


async def connect(
    endpoint: IStreamClientEndpoint, on_message: MessageHandler | None = None
) -> MCChatClientProtocol:
    """Connect through ``endpoint`` and return the protocol once the server's INFO arrived."""
    protocol = cast(MCChatClientProtocol, await endpoint.connect(MCChatClientFactory(on_message)))  # what the factory built
    ready: MCChatClientProtocol = await protocol.when_ready()
    return ready


"""The socket.mq WebSocket messages (subprotocol ``socketmq.v1``) as frozen dataclasses.

Client to server: Auth, Subscribe, Unsubscribe, Publish, Register, Unregister, Respond.
Server to client: Hello, Result, Event, Request, Dropped.  docs/socketmq.md shows each on the
wire.  ``id`` is the client's correlation id (an int or a short string, or None when the client
wants an answer only on failure).  Payloads (``data``) are bytes; ``binary`` records whether
they travelled in a binary frame (so they are carried intact) or as a JSON string.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

MessageId = Union[int, str, None]


# ---------------------------------------------------------------------- client to server


@dataclass(frozen=True, slots=True)
class Auth:
    """Authenticate this connection: ``OpenPGP`` (``proof``), ``secret`` or ``open``."""

    id: MessageId
    method: str
    proof: str | None = None
    identity: str | None = None
    secret: str | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    id: MessageId
    event: str


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    id: MessageId
    event: str


Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Publish:
    """An event to publish, with the message properties a publisher may give (each optional:
    ``content_type``, ``response_topic`` the event a reply is wanted on, ``correlation`` the
    bytes a reply carries back, ``user_properties`` name/value pairs in order)."""

    id: MessageId
    event: str
    data: bytes
    binary: bool = False
    content_type: str | None = None
    response_topic: str | None = None
    correlation: bytes | None = None
    user_properties: Pairs = ()


@dataclass(frozen=True, slots=True)
class Register:
    """Serve ``application``: requests POSTed for it are forwarded to this connection."""

    id: MessageId
    application: str


@dataclass(frozen=True, slots=True)
class Unregister:
    id: MessageId
    application: str


@dataclass(frozen=True, slots=True)
class Respond:
    """The registered application's answer to a forwarded Request (``request`` is its token)."""

    id: MessageId
    request: str
    status: int
    data: bytes = b""
    binary: bool = False
    content_type: str | None = None


ClientMessage = Union[Auth, Subscribe, Unsubscribe, Publish, Register, Unregister, Respond]


# ---------------------------------------------------------------------- server to client


@dataclass(frozen=True, slots=True)
class Hello:
    """Sent once when the connection opens."""

    version: int
    security: str
    """``disabled``, ``enabled`` or ``required``."""
    nonce: str
    """Fresh per connection; an OpenPGP Auth proof must contain it."""
    server: str | None = None
    """The server key's fingerprint (None when OpenPGP is disabled)."""


@dataclass(frozen=True, slots=True)
class Result:
    """The answer to one client request: an HTTP-style ``status``."""

    id: MessageId
    status: int
    reason: str = ""
    identity: str | None = None
    proof: str | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """An event delivered to a subscriber, with its message's properties (as in Publish)."""

    event: str
    data: bytes
    binary: bool = False
    sender: str | None = None
    protocol: str | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation: bytes | None = None
    user_properties: Pairs = ()


@dataclass(frozen=True, slots=True)
class Request:
    """A POST forwarded to the application that registered for it."""

    request: str
    """The server's token for this request; the Respond must carry it."""
    application: str
    request_id: str
    data: bytes
    client: str | None = None
    version: str | None = None
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class Dropped:
    """``count`` events were dropped because this client read too slowly."""

    count: int


ServerMessage = Union[Hello, Result, Event, Request, Dropped]

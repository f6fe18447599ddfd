"""What the SSMP codec produces: requests (client to server), responses and events (server to
client).  NamedTuples rather than frozen dataclasses: one is built per line on the hot path and
tuple construction is several times cheaper."""
from __future__ import annotations

from typing import NamedTuple


class Request(NamedTuple):
    """A client request.

    ``target``: the identifier (LOGIN), topic (SUBSCRIBE, UNSUBSCRIBE, MCAST) or peer (UCAST).
    ``payload``: the payload as it stood on the wire (a binary payload keeps its two length
    bytes; :func:`brokerd.protocols.ssmp.codec.payload_content` strips them).
    ``option``: the scheme of a LOGIN, ``b"PRESENCE"`` on a SUBSCRIBE, else None.
    ``known``: False for a grammatical request with a verb SSMP 1.1 does not define (501).
    """

    verb: bytes
    target: bytes | None = None
    payload: bytes | None = None
    option: bytes | None = None
    known: bool = True


class Response(NamedTuple):
    """``code [SP payload]``."""

    code: bytes
    payload: bytes | None = None


class Event(NamedTuple):
    """``000 <sender> <verb> ...``: a forwarded request, PING or PONG."""

    sender: bytes
    verb: bytes
    target: bytes | None = None
    payload: bytes | None = None
    option: bytes | None = None

"""socket.mq WebSocket message codec (subprotocol ``socketmq.v1``), sans-IO.

WebSocket framing is Autobahn's job; this module turns one complete WebSocket message into one
event and back.  A text message is one JSON object.  A binary message is a JSON object (the
header), one LF byte, then the payload bytes, carried intact: compact JSON never contains a raw
LF, so the first LF ends the header.

Two kinds of bad input, each carrying what the peer deserves:

* :class:`FrameError` - not a message at all (bad UTF-8, bad JSON, not an object, no header):
  the connection is closed with ``close_code`` (1007).
* :class:`InvalidMessage` - a well-formed object that is not a valid request (unknown type,
  missing or bad field): answered with a ``result`` of ``status`` (400, or 501 for an unknown
  type), and the connection stays open.

It also frames the server's replies to one client itself (:func:`frame`: results, hello,
dropped, forwarded requests).  Events for many subscribers are prepared once through Autobahn
instead (wire.py).
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from typing import Any, Callable, Literal, TypeGuard, overload

from brokerd.errors import ProtocolError
from brokerd.protocols.socketmq.events import (
    Auth,
    ClientMessage,
    Dropped,
    Event,
    Hello,
    MessageId,
    Publish,
    Register,
    Request,
    Respond,
    Result,
    ServerMessage,
    Subscribe,
    Unregister,
    Unsubscribe,
)

from brokerd.protocols.socketmq.limits import (
    MAX_EVENT_NAME,
    MAX_HEADER,
    MAX_MESSAGE_ID,
    MAX_TEXT_FIELD,
)

CLOSE_INVALID_PAYLOAD = 1007
_MAX_SAFE_INT = 2**53
RESERVED_APPLICATIONS = frozenset({"public-key", "ws", "demo", "static", "socketmq.js"})
"""Names under /socket.mq/ that are resources, never applications."""

_APPLICATION = re.compile(r"[A-Za-z0-9._-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LF = b"\n"


class FrameError(ProtocolError):
    """Not a socket.mq message; close the connection with ``close_code``."""

    close_code = CLOSE_INVALID_PAYLOAD


class InvalidMessage(ProtocolError):
    """A JSON object that is not a valid message; answer ``status`` to ``id``."""

    reply: bytes
    """The Result that says so (always set, as the constructor does)."""

    def __init__(self, reason: str, status: int = 400, id: MessageId = None) -> None:
        self.status = status
        self.id = id
        self.reason = reason
        super().__init__(reason, encode(Result(id, status, reason))[0])


# ---------------------------------------------------------------------- names


def is_event_name(name: object) -> TypeGuard[str]:
    """1-255 UTF-8 bytes, no control characters."""
    if not isinstance(name, str) or not name or _CONTROL.search(name):
        return False
    try:
        return len(name.encode("utf-8")) <= MAX_EVENT_NAME
    except UnicodeEncodeError:  # lone surrogates from JSON escapes
        return False


def is_unicode(text: str) -> bool:
    """False for a string holding a lone surrogate (JSON may spell one, ``"\\ud800"``; UTF-8
    cannot encode it, so it could be neither used nor echoed back)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_application_name(name: object) -> TypeGuard[str]:
    """1-64 of ``[A-Za-z0-9._-]``, not a reserved resource name, not ``.`` or ``..``."""
    return (
        isinstance(name, str)
        and _APPLICATION.fullmatch(name) is not None
        and name not in RESERVED_APPLICATIONS
        and name not in (".", "..")
    )


# ---------------------------------------------------------------------- decoding


def split(payload: bytes, binary: bool) -> tuple[dict[str, Any], bytes | None]:
    """The JSON object of a message and, for a binary message, its payload bytes."""
    data: bytes | None = None
    if binary:
        end = payload.find(_LF, 0, MAX_HEADER + 1)
        if end < 0:
            raise FrameError("a binary message must start with a JSON header and LF")
        header, data = payload[:end], payload[end + 1:]
    else:
        header = payload
    try:
        obj = json.loads(header.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FrameError(f"not a JSON message: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise FrameError("a message must be a JSON object")
    return obj, data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def decode_client(payload: bytes, binary: bool) -> ClientMessage:
    """One client-to-server message, or FrameError / InvalidMessage."""
    obj, data = split(payload, binary)
    return _decode(obj, data, _CLIENT)


def decode_server(payload: bytes, binary: bool) -> ServerMessage:
    """One server-to-client message (for clients), or FrameError / InvalidMessage."""
    obj, data = split(payload, binary)
    return _decode(obj, data, _SERVER)


def _decode(obj: dict[str, Any], data: bytes | None, table: dict[str, Callable]) -> Any:
    raw_id = obj.get("id")
    if raw_id is not None and not _valid_id(raw_id):
        raise InvalidMessage("id must be an integer or a string of 1-64 Unicode characters")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise InvalidMessage("missing type", 400, raw_id)
    parse = table.get(kind)
    if parse is None:
        raise InvalidMessage(f"unknown type {kind[:64]!r}", 501, raw_id)
    try:
        return parse(_Fields(obj, data, raw_id))
    except _BadField as exc:
        raise InvalidMessage(str(exc), 400, raw_id) from None


def _valid_id(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT
    return isinstance(value, str) and 0 < len(value) <= MAX_MESSAGE_ID and is_unicode(value)


class _BadField(Exception):
    pass


class _Fields:
    """Typed access to a message's fields; each accessor raises _BadField."""

    __slots__ = ("obj", "data", "id")

    def __init__(self, obj: dict[str, Any], data: bytes | None, id: MessageId) -> None:
        self.obj, self.data, self.id = obj, data, id

    @overload
    def text(self, name: str, required: Literal[True] = True, limit: int = MAX_TEXT_FIELD) -> str: ...

    @overload
    def text(self, name: str, required: bool, limit: int = MAX_TEXT_FIELD) -> str | None: ...

    def text(self, name: str, required: bool = True, limit: int = MAX_TEXT_FIELD) -> str | None:
        value = self.obj.get(name)
        if value is None:
            if required:
                raise _BadField(f"missing {name}")
            return None
        if not isinstance(value, str) or len(value) > limit:
            raise _BadField(f"{name} must be a string of at most {limit} characters")
        if not is_unicode(value):
            raise _BadField(f"{name} is not valid Unicode (a lone surrogate)")
        return value

    def event(self) -> str:
        value = self.obj.get("event")
        if not is_event_name(value):
            raise _BadField("event must be 1-255 UTF-8 bytes without control characters")
        return value

    def application(self) -> str:
        value = self.obj.get("application")
        if not is_application_name(value):
            raise _BadField("application must be 1-64 of A-Z a-z 0-9 . _ - (not reserved)")
        return value

    def integer(self, name: str, low: int, high: int) -> int:
        value = self.obj.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _BadField(f"{name} must be an integer from {low} to {high}")
        return value

    def payload(self, required: bool = True) -> tuple[bytes, bool]:
        """(bytes, binary): the binary frame's payload, or the ``data`` string as UTF-8."""
        if self.data is not None:
            if "data" in self.obj:
                raise _BadField("a binary message carries its data after the header, not in it")
            return self.data, True
        value = self.obj.get("data")
        if value is None:
            if required:
                raise _BadField("missing data")
            return b"", False
        if not isinstance(value, str):
            raise _BadField("data must be a string (send bytes in a binary message)")
        try:
            return value.encode("utf-8"), False
        except UnicodeEncodeError:
            raise _BadField("data is not valid Unicode") from None


    def pairs(self, name: str) -> tuple[tuple[str, str], ...]:
        """A list of ``[name, value]`` string pairs (absent: none)."""
        value = self.obj.get(name)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(text, str) for text in pair)
                for pair in value):
            raise _BadField(f"{name} must be a list of [name, value] string pairs")
        if not all(is_unicode(text) for pair in value for text in pair):
            raise _BadField(f"{name} is not valid Unicode (a lone surrogate)")
        return tuple((pair[0], pair[1]) for pair in value)

    def base64(self, name: str) -> bytes | None:
        """Bytes given as standard base64 text (absent: None)."""
        text = self.text(name, required=False)
        if text is None:
            return None
        try:
            return base64.b64decode(text.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error):
            raise _BadField(f"{name} must be base64") from None

    def properties(self) -> dict[str, Any]:
        """The optional message properties of a publish or an event (docs/socketmq.md)."""
        response_topic = self.obj.get("response_topic")
        if response_topic is not None and not is_event_name(response_topic):
            raise _BadField("response_topic must be an event name")
        return {"content_type": self.text("content_type", required=False, limit=255),
                "response_topic": response_topic, "correlation": self.base64("correlation"),
                "user_properties": self.pairs("user_properties")}


def _properties(obj: dict[str, Any], m: Publish | Event) -> dict[str, Any]:
    """``obj`` with the message properties ``m`` has (none: unchanged)."""
    if m.content_type is not None:
        obj["content_type"] = m.content_type
    if m.response_topic is not None:
        obj["response_topic"] = m.response_topic
    if m.correlation is not None:
        obj["correlation"] = base64.b64encode(m.correlation).decode("ascii")
    if m.user_properties:
        obj["user_properties"] = [list(pair) for pair in m.user_properties]
    return obj


def _auth(f: _Fields) -> Auth:
    method = f.text("method", limit=32)
    if method == "OpenPGP":
        return Auth(f.id, method, proof=f.text("proof"))
    if method == "secret":
        return Auth(f.id, method, identity=f.text("identity", limit=64), secret=f.text("secret"))
    if method == "open":
        return Auth(f.id, method, identity=f.text("identity", limit=64))
    raise _BadField("method must be OpenPGP, secret or open")


def _publish(f: _Fields) -> Publish:
    data, binary = f.payload()
    return Publish(f.id, f.event(), data, binary, **f.properties())


def _respond(f: _Fields) -> Respond:
    data, binary = f.payload(required=False)
    return Respond(
        f.id,
        f.text("request", limit=MAX_MESSAGE_ID),
        f.integer("status", 100, 599),
        data,
        binary,
        f.text("content_type", required=False, limit=255),
    )


_CLIENT: dict[str, Callable[[_Fields], Any]] = {
    "auth": _auth,
    "subscribe": lambda f: Subscribe(f.id, f.event()),
    "unsubscribe": lambda f: Unsubscribe(f.id, f.event()),
    "publish": _publish,
    "register": lambda f: Register(f.id, f.application()),
    "unregister": lambda f: Unregister(f.id, f.application()),
    "respond": _respond,
}


def _event(f: _Fields) -> Event:
    data, binary = f.payload()
    return Event(f.event(), data, binary, f.text("from", False), f.text("protocol", False), **f.properties())


def _request(f: _Fields) -> Request:
    data, _binary = f.payload(required=False)
    return Request(
        f.text("request", limit=MAX_MESSAGE_ID),
        f.application(),
        f.text("request_id"),
        data,
        f.text("client", False),
        f.text("version", False),
        f.text("content_type", False),
    )


_SERVER: dict[str, Callable[[_Fields], Any]] = {
    "hello": lambda f: Hello(
        f.integer("version", 1, 1 << 16), f.text("security"), f.text("nonce"), f.text("server", False)
    ),
    "result": lambda f: Result(
        f.id,
        f.integer("status", 100, 599),
        f.text("reason", False) or "",
        f.text("identity", False),
        f.text("proof", False),
    ),
    "event": _event,
    "request": _request,
    "dropped": lambda f: Dropped(f.integer("count", 0, _MAX_SAFE_INT)),
}


# ---------------------------------------------------------------------- encoding


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _with_payload(obj: dict[str, Any], data: bytes, binary: bool) -> tuple[bytes, bool]:
    """Text message with ``data`` when the payload is text, else header + LF + payload."""
    if not binary:
        try:
            obj["data"] = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return _dumps(obj), False
    return _dumps(obj) + _LF + data, True


def _compact(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if value is not None}


def encode(message: ClientMessage | ServerMessage) -> tuple[bytes, bool]:
    """(payload, binary) of one WebSocket message."""
    kind = type(message)
    if kind is Result:
        m: Any = message
        obj = {"type": "result", "id": m.id, "status": m.status, "reason": m.reason}
        obj.update(_compact({"identity": m.identity, "proof": m.proof}))
        return _dumps(obj), False
    if kind is Event:
        m = message
        obj = _compact({"type": "event", "event": m.event, "from": m.sender, "protocol": m.protocol})
        return _with_payload(_properties(obj, m), m.data, m.binary)
    if kind is Request:
        m = message
        obj = _compact(
            {
                "type": "request",
                "request": m.request,
                "application": m.application,
                "request_id": m.request_id,
                "client": m.client,
                "version": m.version,
                "content_type": m.content_type,
            }
        )
        return _dumps(obj) + _LF + m.data, True
    if kind is Respond:
        m = message
        obj = _compact(
            {
                "type": "respond",
                "id": m.id,
                "request": m.request,
                "status": m.status,
                "content_type": m.content_type,
            }
        )
        return _with_payload(obj, m.data, m.binary)
    if kind is Publish:
        m = message
        obj = _compact({"type": "publish", "id": m.id, "event": m.event})
        return _with_payload(_properties(obj, m), m.data, m.binary)
    obj = _compact(_SIMPLE[kind](message))
    return _dumps(obj), False


_SIMPLE: dict[type, Callable[[Any], dict[str, Any]]] = {
    Hello: lambda m: {
        "type": "hello",
        "version": m.version,
        "security": m.security,
        "nonce": m.nonce,
        "server": m.server,
    },
    Dropped: lambda m: {"type": "dropped", "count": m.count},
    Auth: lambda m: {
        "type": "auth",
        "id": m.id,
        "method": m.method,
        "proof": m.proof,
        "identity": m.identity,
        "secret": m.secret,
    },
    Subscribe: lambda m: {"type": "subscribe", "id": m.id, "event": m.event},
    Unsubscribe: lambda m: {"type": "unsubscribe", "id": m.id, "event": m.event},
    Register: lambda m: {"type": "register", "id": m.id, "application": m.application},
    Unregister: lambda m: {"type": "unregister", "id": m.id, "application": m.application},
}


# ---------------------------------------------------------------------- framing


def frame(payload: bytes, binary: bool) -> bytes:
    """One unmasked, unfragmented server-to-client WebSocket frame (RFC 6455 section 5.2)."""
    first = 0x82 if binary else 0x81
    size = len(payload)
    if size < 126:
        header = bytes((first, size))
    elif size < 65536:
        header = struct.pack("!BBH", first, 126, size)
    else:
        header = struct.pack("!BBQ", first, 127, size)
    return header + payload

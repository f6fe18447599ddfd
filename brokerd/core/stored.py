"""The stored form of a Message: what the durable service writes into the store.

A pending message outlives its publisher's connection and the broker process, so the store
keeps it whole, in a form no protocol owns: a fixed tag, a length-prefixed JSON header with
the Message's typed fields (its Details included), then the data (the payload, followed by the data of every other
part of a multi-part message).  The JSON carries byte strings (topic, sender names) as
Latin-1 text, which maps every byte to one character and back.  Each subscriber's front end
renders the decoded Message when it delivers it, as it renders a live one.

Rows written before the durable service existed hold a front end's own body instead; they do not start
with :data:`TAG`, and :func:`is_stored_message` tells them apart.
"""
from __future__ import annotations

import json
import struct
from json.encoder import encode_basestring_ascii
from math import isfinite

from brokerd.core.message import (
    DEFAULT_PRIORITY,
    MULTICAST,
    PLAIN,
    Details,
    Message,
    Part,
)

TAG = b"\x00brokerd-message/1\n"
_LENGTH = struct.Struct(">I")
_dumps = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
"""The header is built here of strings, numbers and lists: it holds no cycle to look for."""
_loads = json.loads


def is_stored_message(data: bytes) -> bool:
    """Whether ``data`` is a Message encoded by :func:`encode`."""
    return data.startswith(TAG)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def encode(message: Message) -> bytes:
    """The stored form of ``message``."""
    return encode_stamped(message, message.message_id, message.created, message.expires)


def encode_stamped(message: Message, message_id: str | None, created: float | None,
                   expires: float | None) -> bytes:
    """The stored form of ``message`` with ``message_id``, ``created`` and ``expires`` in
    place of its own: what the durable service keeps of a message it numbers, without
    making the numbered copy of the Message first."""
    payload = message.payload
    if message.details is PLAIN:
        head = _plain_header(message, message_id, created, expires)
        if head is not None:
            return b"".join((TAG, _LENGTH.pack(len(head)), head, payload))
    parts = []
    blobs = [payload]
    for part in message.parts:
        if part.data is payload:
            parts.append([part.content_type, part.attributes, -1])
        else:
            parts.append([part.content_type, part.attributes, len(part.data)])
            blobs.append(part.data)
    header = {
        "k": message.kind, "t": _text(message.target), "p": message.protocol,
        "s": _text(message.sender_name), "d": _text(message.display_name),
        "b": message.binary, "c": message.content_type, "i": message_id,
        "cr": created, "pr": message.priority, "x": expires,
        "a": message.attributes, "n": len(payload), "parts": parts,
    }
    if message.details.qos:
        header["q"] = message.details.qos
    if message.details.retained:
        header["r"] = True
    if message.details.has_properties():
        _put_properties(header, message.details)
    head = _dumps(header).encode("ascii")
    return b"".join((TAG, _LENGTH.pack(len(head)), head, *blobs))


def _put_properties(header: dict, details: Details) -> None:
    """The request/response properties, each under its key only when present, so a row
    without them reads as before they existed (and one written before reads as none)."""
    if details.response_topic is not None:
        header["rt"] = details.response_topic
    if details.correlation is not None:
        header["cd"] = _text(details.correlation)
    if details.payload_format is not None:
        header["pf"] = details.payload_format
    if details.user_properties:
        header["u"] = details.user_properties


def _plain_header(message: Message, message_id: str | None, created: float | None,
                  expires: float | None) -> bytes | None:
    """The header :func:`encode_stamped` writes for a message with no Details (every SSMP,
    MCCHAT and socket.mq publish), put together from json's own escaping of each value
    instead of a dict through the encoder, which cost a fifth of such a durable publish.
    The same bytes (tests/core/test_stored.py holds it to the generic path); None for a
    value of another type than the usual, which takes the generic path."""
    binary = message.binary
    kind = message.kind
    protocol = message.protocol
    sender = message.sender_name
    display = message.display_name
    target = message.target
    if (binary.__class__ is not bool or kind.__class__ is not str or protocol.__class__ is not str
            or sender.__class__ is not bytes or target.__class__ is not bytes
            or (display is not None and display.__class__ is not bytes)
            or (message_id is not None and message_id.__class__ is not str)):
        return None
    stamp = _number(created)
    until = _number(expires)
    if stamp is None or until is None:
        return None
    e = encode_basestring_ascii
    key = (kind, target, protocol, sender, display, binary)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) >= _MAX_HEADS:
            _HEADS.clear()
        head = _HEADS[key] = (
            f'{{"k":{e(kind)},"t":{e(target.decode("latin-1"))},"p":{e(protocol)},'
            f'"s":{e(sender.decode("latin-1"))},'
            f'"d":{"null" if display is None else e(display.decode("latin-1"))},'
            f'"b":{"true" if binary else "false"},"c":null,"i":')
    return (f'{head}{"null" if message_id is None else e(message_id)},"cr":{stamp},"pr":{DEFAULT_PRIORITY},'
            f'"x":{until},"a":[],"n":{len(message.payload)},"parts":[]}}').encode("ascii")


_HEADS: dict[tuple, str] = {}
"""The text up to the id of recent plain headers, by what it is made of: a read's messages
share their kind, topic and sender (the types were checked before, so True is never taken
for 1)."""
_MAX_HEADS = 256


_TIMES: dict[float, str] = {}
"""Recent times as json writes them: the messages of one read share their time and expiry,
and ``float.__repr__`` (about 1 µs) was half of a plain header's cost."""
_MAX_TIMES = 64


def _number(value: float | None) -> str | None:
    """A time as json writes it (None: null); None for what json would not write so."""
    if value is None:
        return "null"
    if value.__class__ is float:
        text = _TIMES.get(value) if value else None  # -0.0 == 0.0, but json writes each its way
        if text is None:
            if not isfinite(value):
                return None
            if len(_TIMES) >= _MAX_TIMES:
                _TIMES.clear()
            text = _TIMES[value] = float.__repr__(value)
        return text
    if value.__class__ is int:
        return int.__repr__(value)
    return None


def _read(data: bytes) -> tuple[dict, bytes, list[tuple[list, bytes]]]:
    """The header, the payload and each part's ``(attributes, data)`` of stored ``data``;
    ValueError when it is not a whole stored message."""
    if not data.startswith(TAG):
        raise ValueError("not a stored message")
    at = len(TAG)
    try:
        (size,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        header = _loads(data[at:at + size])
        at += size
        end = at + header["n"]
        payload = data[at:end]
        parts = []
        for _content_type, attributes, length in header["parts"]:
            if length < 0:
                part_data = payload
            else:
                part_data = data[end:end + length]
                end += length
            parts.append((attributes, part_data))
        if end != len(data):
            raise ValueError("stored message has trailing or missing data")
        return header, payload, parts
    except (KeyError, TypeError, struct.error, UnicodeError) as exc:
        raise ValueError(f"corrupt stored message: {exc}") from None


def decode(data: bytes) -> Message:
    """The Message stored as ``data``; ValueError when ``data`` is not one."""
    return _message(*_read(data))


def _message(header: dict, payload: bytes, read: list[tuple[list, bytes]]) -> Message:
    try:
        parts = [Part(content_type, tuple(map(tuple, attributes)), part_data)
                 for (content_type, _a, _n), (attributes, part_data) in zip(header["parts"], read)]
        details = Details(content_type=header["c"], message_id=header["i"], created=header["cr"],
                          priority=header["pr"], expires=header["x"],
                          attributes=tuple(map(tuple, header["a"])), parts=tuple(parts),
                          qos=header.get("q", 0), retained=bool(header.get("r", False)),
                          response_topic=header.get("rt"), correlation=_bytes(header.get("cd")),
                          payload_format=header.get("pf"),
                          user_properties=tuple(map(tuple, header.get("u", ()))))
        return Message(header.get("k", MULTICAST), _bytes(header["t"]), payload, header["p"], header["s"].encode("latin-1"),
                       bool(header["b"]), display_name=_bytes(header["d"]), details=details)
    except (KeyError, TypeError, AttributeError, struct.error, UnicodeError) as exc:  # AttributeError: no sender
        raise ValueError(f"corrupt stored message: {exc}") from None


Sections = tuple[tuple[tuple[str, str], ...], list[tuple[tuple[tuple[str, str], ...], bytes]]]
"""The header attributes and each part's ``(attributes, data)``."""


def sections(data: bytes) -> Sections | None:
    """The header attributes and each part's ``(attributes, data)`` of stored ``data``,
    as :func:`decode` would give them (``Message.attributes``, ``Message.parts``), without
    building the Message: all a front end renders of a message that carries them, once per
    delivery.  None when the message has neither (its rendering needs the whole Message);
    ValueError when ``data`` is not a stored message."""
    header, _payload, read = _read(data)
    return _sections(header, read)


def sections_or_message(data: bytes) -> Sections | Message:
    """What a front end renders of stored ``data``, its header read once: :func:`sections`
    when the message carries attributes or parts, else the Message (:func:`decode`) that a
    message without them is rendered from.  ValueError when ``data`` is not one."""
    header, payload, read = _read(data)
    found = _sections(header, read)
    return _message(header, payload, read) if found is None else found


def _sections(header: dict, read: list[tuple[list, bytes]]) -> Sections | None:
    try:
        attributes = tuple(map(tuple, header["a"]))
        if not attributes and not read:
            return None
        return attributes, [(tuple(map(tuple, part_attributes)), part_data) for part_attributes, part_data in read]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"corrupt stored message: {exc}") from None

"""The compact binary form of a run of Messages sent between nodes.

One envelope carries a run of multicast messages to one topic, as the Broker hands it to the
engine: the sending node's instance id (so that a node recognises and skips its own echo),
then each message's fields.  It is made once per run on the publishing node and decoded once
per receiving node, whatever the number of recipients ("encode once per node").  Sans-IO:
stdlib and the core's message types only.

Layout (every length is a big-endian unsigned int; ``str`` is UTF-8 bytes with a length):

    envelope := MAGIC(1) origin:bytes8 count:u32 message*
    message  := flags:u8 kind:u8 protocol:short target:bytes sender:bytes payload:bytes
                [display:bytes] [principal: name:str realm:str] [details]
              | flags:u8(with SAME) payload:bytes [details]

SAME marks a message whose kind, protocol, target, sender, display name and principal are the
previous message's (a run from one publisher, the usual case): only its payload travels, and
the receiving node reuses the previous message's objects, so a wire format's ``render_run``
still sees one sender.
    details  := content_type:optstr message_id:optstr created:optf64 priority:i64
                expires:optf64 attributes parts

Anything that does not parse raises :class:`EnvelopeError`; the engine drops and counts it.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from brokerd.core.message import BROADCAST, MULTICAST, PLAIN, UNICAST, Details, Message, Part
from brokerd.core.principal import Principal

MAGIC = 0xB1
"""Version of the layout: a node that meets another byte refuses the envelope."""

_BINARY, _DISPLAY, _PRINCIPAL, _DETAILS, _SAME = 1, 2, 4, 8, 16
_KINDS = (MULTICAST, UNICAST, BROADCAST)
_KIND_CODE = {kind: code for code, kind in enumerate(_KINDS)}
_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">B8sI")
_F64 = struct.Struct(">d")
_I64 = struct.Struct(">q")
_NONE = 0xFFFFFFFF


class EnvelopeError(ValueError):
    """Bytes that are not an envelope of this version."""


def encode(origin: bytes, messages: Sequence[Message]) -> bytes:
    """The envelope of ``messages`` sent by the node whose instance id is ``origin`` (8 bytes)."""
    out = [_HEAD.pack(MAGIC, origin, len(messages))]
    add = out.append
    pack = _U32.pack
    previous: Message | None = None
    for message in messages:
        details = message.details
        principal = message.principal
        display = message.display_name
        flags = (
            (_BINARY if message.binary else 0)
            | (_DISPLAY if display is not None else 0)
            | (_PRINCIPAL if principal is not None else 0)
            | (_DETAILS if details is not PLAIN else 0)
        )
        if previous is not None and _same_head(previous, message):
            add(bytes((flags | _SAME,)))
            add(pack(len(message.payload)))
            add(message.payload)
            if details is not PLAIN:
                _put_details(out, details)
            continue
        previous = message
        protocol = message.protocol.encode("ascii")
        target = message.target or b""
        add(bytes((flags, _KIND_CODE[message.kind], len(protocol))))
        add(protocol)
        add(pack(len(target)))
        add(target)
        add(pack(len(message.sender_name)))
        add(message.sender_name)
        add(pack(len(message.payload)))
        add(message.payload)
        if display is not None:
            add(pack(len(display)))
            add(display)
        if principal is not None:
            _put_str(out, principal.name)
            _put_str(out, principal.realm)
        if details is not PLAIN:
            _put_details(out, details)
    return b"".join(out)


def _same_head(a: Message, b: Message) -> bool:
    return (a.kind == b.kind and a.protocol == b.protocol and a.target == b.target and a.sender_name == b.sender_name
            and a.display_name == b.display_name and a.principal == b.principal)


def origin_of(data: bytes) -> bytes:
    """The sending node's instance id, read without decoding the messages."""
    if len(data) < _HEAD.size or data[0] != MAGIC:
        raise EnvelopeError("not a brokerd envelope")
    return data[1:9]


def decode(data: bytes) -> list[Message]:
    """The messages of an envelope; EnvelopeError when it does not parse."""
    try:
        magic, _origin, count = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise EnvelopeError("not a brokerd envelope")
        reader = _Reader(data, _HEAD.size)
        messages: list[Message] = []
        append = messages.append
        unpack_size = _U32.unpack_from
        size_of_data = len(data)
        previous = None
        offset = _HEAD.size
        for _ in range(count):
            flags = data[offset]
            if flags & _SAME and not flags & _DETAILS and previous is not None:
                # A run's next payload (the usual case), read inline: this loop runs once per
                # message on every receiving node (docs/performance.md, cluster fan-out).
                start = offset + 5
                offset = start + unpack_size(data, offset + 1)[0]
                if offset > size_of_data:
                    raise IndexError("past the end")
                append(Message(previous.kind, previous.target, data[start:offset], previous.protocol,
                               previous.sender_name, flags & _BINARY != 0, previous.display_name, PLAIN,
                               previous.principal))
                continue
            reader.offset = offset
            previous = reader.message(previous)
            offset = reader.offset
            append(previous)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"a truncated or damaged envelope ({exc})") from None
    if offset != len(data):
        raise EnvelopeError("bytes after the last message")
    return messages


def _put_str(out: list[bytes], value: str | None) -> None:
    if value is None:
        out.append(_U32.pack(_NONE))
    else:
        raw = value.encode("utf-8")
        out.append(_U32.pack(len(raw)))
        out.append(raw)


def _put_float(out: list[bytes], value: float | None) -> None:
    if value is None:
        out.append(b"\x00")
    else:
        out.append(b"\x01")
        out.append(_F64.pack(value))


def _put_attributes(out: list[bytes], attributes: tuple[tuple[str, str], ...]) -> None:
    out.append(_U32.pack(len(attributes)))
    for name, value in attributes:
        _put_str(out, name)
        _put_str(out, value)


def _put_details(out: list[bytes], details: Details) -> None:
    _put_str(out, details.content_type)
    _put_str(out, details.message_id)
    _put_float(out, details.created)
    out.append(_I64.pack(details.priority))
    _put_float(out, details.expires)
    _put_attributes(out, details.attributes)
    out.append(_U32.pack(len(details.parts)))
    for part in details.parts:
        _put_str(out, part.content_type)
        _put_attributes(out, part.attributes)
        out.append(_U32.pack(len(part.data)))
        out.append(part.data)


class _Reader:
    """Reads fields off an envelope; every read checks the bounds (struct.error, IndexError)."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes, offset: int) -> None:
        self.data = data
        self.offset = offset

    def _take(self, size: int) -> bytes:
        end = self.offset + size
        if end > len(self.data):
            raise IndexError("past the end")
        chunk = self.data[self.offset:end]
        self.offset = end
        return chunk

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.data, self.offset)
        self.offset += 4
        return value

    def blob(self) -> bytes:
        return self._take(self.u32())

    def optstr(self) -> str | None:
        size = self.u32()
        return None if size == _NONE else self._take(size).decode("utf-8")

    def string(self) -> str:
        value = self.optstr()
        if value is None:
            raise IndexError("a missing string")
        return value

    def optfloat(self) -> float | None:
        if self._take(1) == b"\x00":
            return None
        (value,) = _F64.unpack_from(self._take(8))
        return value

    def attributes(self) -> tuple[tuple[str, str], ...]:
        return tuple((self.string(), self.string()) for _ in range(self.u32()))

    def details(self) -> Details:
        content_type = self.optstr()
        message_id = self.optstr()
        created = self.optfloat()
        (priority,) = _I64.unpack_from(self._take(8))
        expires = self.optfloat()
        attributes = self.attributes()
        parts = tuple(
            Part(self.optstr(), self.attributes(), self.blob())  # type: ignore[arg-type]
            for _ in range(self.u32())
        )
        return Details(content_type=content_type, message_id=message_id, created=created, priority=priority,
                       expires=expires, attributes=attributes, parts=parts)

    def message(self, previous: Message | None) -> Message:
        flags = self._take(1)[0]
        if flags & _SAME:
            if previous is None:
                raise IndexError("a message like a previous one, first")
            payload = self.blob()
            details = self.details() if flags & _DETAILS else PLAIN
            return Message(previous.kind, previous.target, payload, previous.protocol, previous.sender_name,
                           bool(flags & _BINARY), previous.display_name, details, previous.principal)
        kind, protocol_size = self._take(2)
        if kind >= len(_KINDS):
            raise IndexError("an unknown message kind")
        protocol = self._take(protocol_size).decode("ascii")
        target = self.blob()
        sender = self.blob()
        payload = self.blob()
        display = self.blob() if flags & _DISPLAY else None
        principal = Principal(self.string(), self.string()) if flags & _PRINCIPAL else None
        details = self.details() if flags & _DETAILS else PLAIN
        return Message(_KINDS[kind], target, payload, protocol, sender, bool(flags & _BINARY), display, details,
                       principal)

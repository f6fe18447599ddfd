"""The compact binary form of a run of Messages sent between nodes.

One envelope carries a run of multicast messages to one topic, as the Broker hands it to the
engine: the sending node's instance id (so that a node recognises and skips its own echo),
then each message's fields.  It is made once per run on the publishing node and decoded once
per receiving node, whatever the number of recipients ("encode once per node").  Sans-IO:
stdlib and the core's message types only.

Layout (every length is a big-endian unsigned int; ``str`` is UTF-8 bytes with a length):

    envelope := MAGIC(1) origin:bytes8 count:u32 sections:u8 [total:u64 section*] message*
    section  := format:short rendered:bytes
    message  := flags:u8 kind:u8 protocol:short target:bytes sender:bytes payload:bytes
                [display:bytes] [principal: name:str realm:str] [details]
              | flags:u8(with SAME) payload:bytes [details]

SAME marks a message whose kind, protocol, target, sender, display name and principal are the
previous message's (a run from one publisher, the usual case): only its payload travels, and
the receiving node reuses the previous message's objects, so a wire format's ``render_run``
still sees one sender.

Sections ("encode once per cluster"): the wire bytes the publishing node rendered for the run,
one per wire format name (an IWireFormat whose ``portable`` rendering depends on the message
only), with ``total``, the run's payload bytes.  They are only sent for a *uniform* run (every
message after the first is SAME, none has details): then the first message's head and ``count``
and ``total`` are all a receiving node needs besides the bytes (stats, the event log's summary),
so a node whose members all take pre-rendered formats never decodes the other messages
(:func:`open_run`, :class:`Run`).  A section is bounded by :func:`section_limit`; the encoder
leaves out one that exceeds it, the decoder refuses the envelope.

    details  := content_type:optstr message_id:optstr created:optf64 priority:i64
                expires:optf64 attributes parts qos:u8 flags:u8 [properties]
    properties := response_topic:optstr correlation:optbytes payload_format:u8 user_properties:attributes

In the details' ``flags`` bit 0 is ``retained`` and bit 1 says the request/response properties
follow (``payload_format`` 255: none given); a message without them is encoded as before they
existed, and a node that does not know them refuses an envelope with them (a flag out of range)
instead of misreading it.

Anything that does not parse raises :class:`EnvelopeError`; the engine drops and counts it.
So does an envelope on a topic's channel whose messages are not multicasts to that topic
(``topic`` of :func:`open_run`).  A protocol name outside :data:`PROTOCOLS` is read as
``other``: what the figures count per protocol stays a fixed set of series, whatever arrives.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from brokerd.config import PROTOCOLS as _FRONT_ENDS
from brokerd.core.message import BROADCAST, MULTICAST, PLAIN, UNICAST, Details, Message, Part
from brokerd.core.principal import Principal

MAGIC = 0xB2
"""Version of the layout: a node that meets another byte refuses the envelope."""

_BINARY, _DISPLAY, _PRINCIPAL, _DETAILS, _SAME = 1, 2, 4, 8, 16
_KINDS = (MULTICAST, UNICAST, BROADCAST)
_KIND_CODE = {kind: code for code, kind in enumerate(_KINDS)}
_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">B8sIB")
_U64 = struct.Struct(">Q")
_SAME_SIZE = struct.Struct(">BI")
MAX_SECTIONS = 16
"""Most rendered sections in one envelope (there are four wire protocols)."""
_F64 = struct.Struct(">d")
_WITH_PROPERTIES = 2
"""In the details' flags byte: the request/response properties follow."""
_NO_FORMAT = 255
"""The payload format byte of a message whose sender declared none."""
_I64 = struct.Struct(">q")
_NONE = 0xFFFFFFFF
OTHER = "other"
"""The protocol name of a message whose sending protocol is none of :data:`PROTOCOLS`."""
PROTOCOLS = frozenset((*_FRONT_ENDS, "sys"))
"""The protocols a message may come from: the four front ends and the system topics."""
_PROTOCOL_NAMES = {name.encode("ascii"): name for name in PROTOCOLS}


class EnvelopeError(ValueError):
    """Bytes that are not an envelope of this version."""


def section_limit(messages_size: int, count: int) -> int:
    """The largest rendered section a run of ``count`` messages whose own encoding takes
    ``messages_size`` bytes may carry: a wire format's framing adds a bounded amount per
    message (JSON escaping of socket.mq text at most multiplies it), so anything beyond is
    not a rendering of this run."""
    return 6 * messages_size + 256 * count + 1024


def encode(origin: bytes, messages: Sequence[Message], rendered: Mapping[str, bytes] | None = None) -> bytes:
    """The envelope of ``messages`` sent by the node whose instance id is ``origin`` (8 bytes),
    with the ``rendered`` wire bytes of the run by wire format name when the run is uniform
    (sections beyond :func:`section_limit` or past MAX_SECTIONS are left out)."""
    out: list[bytes] = []
    uniform = _encode_messages(out, messages)
    body = b"".join(out)
    if not rendered or not uniform:
        return _HEAD.pack(MAGIC, origin, len(messages), 0) + body
    limit = section_limit(len(body), len(messages))
    sections = [(name.encode("ascii"), data) for name, data in rendered.items() if len(data) <= limit]
    del sections[MAX_SECTIONS:]
    if not sections:
        return _HEAD.pack(MAGIC, origin, len(messages), 0) + body
    head = [_HEAD.pack(MAGIC, origin, len(messages), len(sections)),
            _U64.pack(sum([len(message.payload) for message in messages]))]
    for name, data in sections:
        head.append(bytes((len(name),)))
        head.append(name)
        head.append(_U32.pack(len(data)))
        head.append(data)
    head.append(body)
    return b"".join(head)


def _encode_messages(out: list[bytes], messages: Sequence[Message]) -> bool:
    """Append the messages' encoding to ``out``; True when the run is uniform (one head, no
    details: what rendered sections need)."""
    if len(messages) > 1 and _encode_uniform(out, messages):
        return True
    del out[:]
    return _encode_any(out, messages)


def _encode_uniform(out: list[bytes], messages: Sequence[Message]) -> bool:
    """The usual run (one publisher's messages to one topic, no details), in one pass that
    only packs each payload's flags and size; False at the first message that differs (the
    caller starts over with :func:`_encode_any`).  This runs once per message on the
    publishing node (docs/performance-history.md, cluster fan-out)."""
    first = messages[0]
    if first.details is not PLAIN:
        return False
    _encode_any(out, messages[:1])
    kind, target, protocol, sender = first.kind, first.target, first.protocol, first.sender_name
    display, principal = first.display_name, first.principal
    flags = _SAME | (_DISPLAY if display is not None else 0) | (_PRINCIPAL if principal is not None else 0)
    pack = _SAME_SIZE.pack
    add = out.append
    for message in messages[1:]:
        if (message.details is not PLAIN or message.target != target or message.sender_name != sender
                or message.protocol != protocol or message.kind != kind
                or (message.principal is not principal and message.principal != principal)
                or message.display_name != display):
            return False
        payload = message.payload
        add(pack(flags | _BINARY if message.binary else flags, len(payload)))
        add(payload)
    return True


def _encode_any(out: list[bytes], messages: Sequence[Message]) -> bool:
    add = out.append
    pack = _U32.pack
    previous: Message | None = None
    uniform = True
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
        if details is not PLAIN:
            uniform = False
        if previous is not None and _same_head(previous, message):
            add(bytes((flags | _SAME,)))
            add(pack(len(message.payload)))
            add(message.payload)
            if details is not PLAIN:
                _put_details(out, details)
            continue
        if previous is not None:
            uniform = False
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
    return uniform


def _same_head(a: Message, b: Message) -> bool:
    return (a.kind == b.kind and a.protocol == b.protocol and a.target == b.target and a.sender_name == b.sender_name
            and a.display_name == b.display_name and a.principal == b.principal)


def origin_of(data: bytes) -> bytes:
    """The sending node's instance id, read without decoding the messages."""
    if len(data) < _HEAD.size or data[0] != MAGIC:
        raise EnvelopeError("not a brokerd envelope")
    return data[1:9]


class Run:
    """An envelope opened by :func:`open_run`: its head, its rendered sections, and its
    messages decoded only when asked for (:meth:`messages`).

    ``first`` is the run's first message (its kind, protocol, sender, topic stand for all of
    them when ``sections`` is not empty: the run is uniform); ``total`` the payload bytes of the
    run (0 when there are no sections)."""

    __slots__ = ("data", "count", "total", "sections", "first", "topic", "_start", "_messages")

    def __init__(self, data: bytes, count: int, total: int, sections: dict[str, bytes], first: Message,
                 start: int, topic: bytes | None = None) -> None:
        self.data = data
        self.topic = topic
        self.count = count
        self.total = total
        self.sections = sections
        self.first = first
        self._start = start
        self._messages: list[Message] | None = None

    @property
    def decoded(self) -> bool:
        """Whether :meth:`messages` was called (the run was not delivered from its sections)."""
        return self._messages is not None

    def messages(self) -> list[Message]:
        """Every message of the run (decoded once); EnvelopeError when they do not parse."""
        if self._messages is None:
            self._messages = _decode_messages(self.data, self._start, self.count, self.topic)
        return self._messages


def open_run(data: bytes, topic: bytes | None = None) -> Run:
    """Read an envelope's head, sections and first message (the rest stays encoded);
    EnvelopeError when they do not parse, a section is out of bounds, or (given ``topic``,
    the channel's) a message is not a multicast to ``topic``."""
    try:
        magic, _origin, count, nsections = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise EnvelopeError("not a brokerd envelope")
        if count == 0:
            raise EnvelopeError("an envelope without messages")
        offset = _HEAD.size
        total = 0
        sections: dict[str, bytes] = {}
        if nsections:
            if nsections > MAX_SECTIONS:
                raise EnvelopeError(f"{nsections} rendered sections (at most {MAX_SECTIONS})")
            (total,) = _U64.unpack_from(data, offset)
            offset += 8
            spans = []
            for _ in range(nsections):
                size = data[offset]
                name = data[offset + 1:offset + 1 + size].decode("ascii")
                offset += 1 + size
                (length,) = _U32.unpack_from(data, offset)
                offset += 4
                spans.append((name, offset, length))
                offset += length
            body = len(data) - offset
            if body < 0:
                raise IndexError("past the end")
            limit = section_limit(body, count)
            for name, start, length in spans:
                if length > limit:
                    raise EnvelopeError(f"a rendered section of {length} bytes for a run of {body}")
                if name in sections:
                    raise EnvelopeError(f"two rendered sections for {name!r}")
                sections[name] = data[start:start + length]
        if count > (len(data) - offset) // 5:
            raise EnvelopeError(f"{count} messages in {len(data) - offset} bytes")
        reader = _Reader(data, offset)
        first = reader.message(None)
        _check_topic(first, topic)
        if sections and (first.details is not PLAIN or count > 1 and data[reader.offset] & _SAME == 0):
            raise EnvelopeError("rendered sections for a run that is not uniform")
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"a truncated or damaged envelope ({exc})") from None
    return Run(data, count, total, sections, first, offset, topic)


def _check_topic(message: Message, topic: bytes | None) -> None:
    if topic is not None and (message.kind != MULTICAST or message.target != topic):
        raise EnvelopeError("a message that is not a multicast to the channel's topic")


def decode(data: bytes) -> list[Message]:
    """The messages of an envelope; EnvelopeError when it does not parse."""
    return open_run(data).messages()


def _decode_messages(data: bytes, offset: int, count: int, topic: bytes | None = None) -> list[Message]:
    try:
        reader = _Reader(data, offset)
        messages: list[Message] = []
        append = messages.append
        unpack_size = _U32.unpack_from
        size_of_data = len(data)
        previous = None
        for _ in range(count):
            flags = data[offset]
            if flags & _SAME and not flags & _DETAILS and previous is not None:
                # A run's next payload (the usual case), read inline: this loop runs once per
                # message on every receiving node that decodes (docs/performance-history.md).
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
            _check_topic(previous, topic)
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
    if details.has_properties():
        out.append(bytes((details.qos, _WITH_PROPERTIES | (1 if details.retained else 0))))
        _put_str(out, details.response_topic)
        correlation = details.correlation
        if correlation is None:
            out.append(_U32.pack(_NONE))
        else:
            out.append(_U32.pack(len(correlation)))
            out.append(correlation)
        out.append(bytes((_NO_FORMAT if details.payload_format is None else details.payload_format,)))
        _put_attributes(out, details.user_properties)
    else:
        out.append(bytes((details.qos, 1 if details.retained else 0)))


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
            Part(self.string(), self.attributes(), self.blob())
            for _ in range(self.u32())
        )
        qos, flags = self._take(2)
        if qos > 2 or flags > (_WITH_PROPERTIES | 1):
            raise IndexError("a QoS or retained flag out of range")
        details = Details(content_type=content_type, message_id=message_id, created=created, priority=priority,
                          expires=expires, attributes=attributes, parts=parts, qos=qos, retained=bool(flags & 1))
        if flags & _WITH_PROPERTIES:
            response_topic = self.optstr()
            size = self.u32()
            correlation = None if size == _NONE else self._take(size)
            payload_format = self._take(1)[0]
            if payload_format > 1 and payload_format != _NO_FORMAT:
                raise IndexError("a payload format out of range")
            details.response_topic = response_topic
            details.correlation = correlation
            details.payload_format = None if payload_format == _NO_FORMAT else payload_format
            details.user_properties = self.attributes()
        return details

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
        protocol = _PROTOCOL_NAMES.get(self._take(protocol_size), OTHER)
        target = self.blob()
        sender = self.blob()
        payload = self.blob()
        display = self.blob() if flags & _DISPLAY else None
        principal = Principal(self.string(), self.string()) if flags & _PRINCIPAL else None
        details = self.details() if flags & _DETAILS else PLAIN
        return Message(_KINDS[kind], target, payload, protocol, sender, bool(flags & _BINARY), display, details,
                       principal)

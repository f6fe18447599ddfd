"""MCCHAT v1 wire codec, sans-IO and incremental: bytes in, packets out; packets in, bytes out.

A packet is an opcode byte and then a fixed shape: INFO one version byte, SUB/UNSUB one string,
MSG three, TLRQ nothing, TL strings until a 0x04 byte where the next string would start.
Strings are UTF-8 and end with a NUL byte.  :class:`MCChatParser` accepts the stream cut
anywhere (one byte at a time, many packets per read) and gives the same packets.

Two kinds of bad input, two answers:

* the stream cannot be framed any more (an unknown opcode, a string longer than its limit):
  :class:`MCChatProtocolError`, after which the parser only repeats that error.  MCCHAT has no
  length fields, so there is no way to find the next packet: a server closes.
* a complete packet whose content the spec forbids (a topic holding 0x04, a string that is not
  UTF-8): a :class:`~brokerd.protocols.mcchat.events.Malformed` event, and parsing goes on.

The hot path (a read full of MSG packets) costs three bounded ``bytes.find`` calls and three
slices per packet; UTF-8 is checked once per read when the whole read is valid (ASCII bytes
never occur inside a multi-byte sequence, so every string cut out of a valid read at NUL and
opcode bytes is valid too), and string by string only otherwise.

Nothing here touches a socket, a reactor or a clock.
"""
from __future__ import annotations

from collections.abc import Iterable

from brokerd.errors import ProtocolError
from brokerd.protocols.mcchat.events import (
    EOT_IN_TOPIC,
    INFO,
    MSG,
    NOT_UTF8,
    OPCODES,
    SUB,
    TL,
    TLRQ,
    UNSUB,
    Event,
    Info,
    Malformed,
    Msg,
    Packet,
    Sub,
    TopicList,
    TopicListRequest,
    Unsub,
)

VERSION = 1
"""The protocol version brokerd speaks (the INFO packet's second byte)."""
MAX_TOPIC = 256
"""Bytes in a topic name (UTF-8, without its NUL)."""
MAX_USERNAME = 256
"""Bytes in a MSG username."""
MAX_MESSAGE = 65_536
"""Bytes in a MSG message."""
MAX_TL_TOPICS = 65_536
"""Topics in one TL packet (the server lists at most this many; a client refuses more)."""
EOT = 4
"""The byte that ends a TL packet's list, and that topic names therefore cannot contain."""

_NUL = b"\x00"
_EOT = b"\x04"
_NUL_VALUE = 0
_EOT_VALUE = 4
"""The two as ints, for ``in`` tests: a bytes needle makes CPython try it as an int first and
build and clear a TypeError each time (``x in data`` tests run per message)."""
_TLRQ = TopicListRequest()
_FIELD_NAMES = {
    SUB: ("topic",),
    UNSUB: ("topic",),
    MSG: ("topic", "username", "message"),
    TL: ("topic", "topic", "topic"),
}
_new = tuple.__new__


class MCChatProtocolError(ProtocolError):
    """The byte stream broke MCCHAT framing; nothing after this point can be parsed.  MCCHAT
    has no error packet, so there is no reply: the peer is disconnected."""

    reply = None


def is_utf8(value: bytes) -> bool:
    """True when ``value`` is valid UTF-8 (ASCII is checked without decoding)."""
    if value.isascii():
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def string_problem(what: str, value: bytes, limit: int) -> str | None:
    """Why ``value`` cannot be an MCCHAT string of at most ``limit`` bytes (a NUL would end
    it early, and the peer would lose the stream), or None when it can."""
    if len(value) > limit:
        return f"{what} longer than {limit} bytes"
    if _NUL_VALUE in value:
        return f"{what} contains a NUL byte"
    if not is_utf8(value):
        return f"{what} is not UTF-8"
    return None


def topic_problem(topic: bytes) -> str | None:
    """Why ``topic`` cannot be an MCCHAT topic name (a string without 0x04, which ends a
    topic list), or None when it can."""
    problem = string_problem("topic", topic, MAX_TOPIC)
    if problem is None and _EOT_VALUE in topic:
        return _EOT_PROBLEM
    return problem


_EOT_PROBLEM = "topic contains the byte 0x04"


# ---------------------------------------------------------------------------- decoding

class MCChatParser:
    """Bytes from a peer in, packets out, in any chunking.

    Both directions use the one parser: a server gets SUB, UNSUB, MSG and TLRQ (and would see
    INFO or TL if a client sent them), a client INFO, MSG and TL.  The limits bound every
    buffer the parser keeps: at most one packet in progress, each string within its limit.
    """

    def __init__(
        self,
        max_topic: int = MAX_TOPIC,
        max_username: int = MAX_USERNAME,
        max_message: int = MAX_MESSAGE,
        max_topics: int = MAX_TL_TOPICS,
    ) -> None:
        self._max_topic = max_topic
        self._max_username = max_username
        self._max_message = max_message
        self._max_topics = max_topics
        self._limits = {
            SUB: (max_topic,),
            UNSUB: (max_topic,),
            MSG: (max_topic, max_username, max_message),
        }
        self._op = -1
        """Opcode of the packet in progress, -1 between packets."""
        self._fields: list[bytes] = []
        """Its completed strings."""
        self._partial = bytearray()
        """The string in progress (a bytearray: a string fed byte by byte grows in O(1))."""
        self.failed: MCChatProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for the packet in progress."""
        if self._op < 0:
            return 0
        return 1 + sum(len(f) + 1 for f in self._fields) + len(self._partial)

    def feed(self, data: bytes) -> tuple[list[Event], MCChatProtocolError | None]:
        """Return the packets completed by ``data`` and, if the stream then broke framing,
        the error.  After an error every later call returns only that error."""
        if self.failed is not None:
            return [], self.failed
        events: list[Event] = []
        try:
            pos = self._continue(self._op, data, 0, len(data), events) if self._op >= 0 else 0
            if pos < len(data):
                self._scan(data, pos, events)
        except MCChatProtocolError as exc:
            self.failed = exc
            self._op = -1
            self._fields = []
            self._partial = bytearray()
            return events, exc
        return events, None

    def _scan(self, data: bytes, pos: int, events: list[Event]) -> None:
        """Packets from ``data[pos:]``: complete ones inline, the rest by :meth:`_continue`."""
        size = len(data)
        valid = is_utf8(data)
        find = data.find
        append = events.append
        max_topic = self._max_topic
        max_username = self._max_username
        max_message = self._max_message
        while pos < size:
            op = data[pos]
            if op == MSG:
                # A bounded find: a NUL beyond the limit is as bad as none.
                topic_end = find(_NUL, pos + 1, pos + 2 + max_topic)
                if topic_end >= 0:
                    user_end = find(_NUL, topic_end + 1, topic_end + 2 + max_username)
                    if user_end >= 0:
                        end = find(_NUL, user_end + 1, user_end + 2 + max_message)
                        if end >= 0:
                            topic = data[pos + 1 : topic_end]
                            username = data[topic_end + 1 : user_end]
                            message = data[user_end + 1 : end]
                            if _EOT_VALUE in topic or not (
                                valid or (is_utf8(topic) and is_utf8(username) and is_utf8(message))
                            ):
                                append(_malformed(MSG, (topic, username, message)))
                            else:
                                append(_new(Msg, (topic, username, message)))
                            pos = end + 1
                            continue
            elif op == SUB or op == UNSUB:
                end = find(_NUL, pos + 1, pos + 2 + max_topic)
                if end >= 0:
                    topic = data[pos + 1 : end]
                    if _EOT_VALUE in topic or not (valid or is_utf8(topic)):
                        append(_malformed(op, (topic,)))
                    else:
                        append(_new(Sub, (topic,)) if op == SUB else _new(Unsub, (topic,)))
                    pos = end + 1
                    continue
            elif op == TLRQ:
                append(_TLRQ)
                pos += 1
                continue
            elif op > TL:
                raise MCChatProtocolError(f"unknown opcode {op}")
            # INFO, TL, and any packet that is incomplete or over a limit.
            pos = self._continue(op, data, pos + 1, size, events)

    def _continue(self, op: int, data: bytes, pos: int, size: int, events: list[Event]) -> int:
        """Read the rest of packet ``op`` from ``data[pos:]``, with ``self._fields`` and
        ``self._partial`` holding what came before.  Returns the position after the packet,
        or ``size`` with the state kept when ``data`` ends first."""
        if op == INFO:
            if pos < size:
                events.append(Info(data[pos]))
                self._op = -1
                return pos + 1
            self._op = INFO
            return size
        fields = self._fields
        partial = self._partial
        limits = self._limits.get(op)
        while True:
            if limits is None:  # TL: a 0x04 where a topic would start ends the list
                if not partial:
                    if pos >= size:
                        self._op = op
                        return size
                    if data[pos] == EOT:
                        self._finish(op, events)
                        return pos + 1
                    if len(fields) >= self._max_topics:
                        raise MCChatProtocolError(f"TL with more than {self._max_topics} topics")
                limit = self._max_topic
            else:
                limit = limits[len(fields)]
            room = limit - len(partial)
            end = data.find(_NUL, pos, pos + room + 1)
            if end < 0:
                if size - pos > room:
                    what = _FIELD_NAMES[op][min(len(fields), 2)]
                    raise MCChatProtocolError(f"{OPCODES[op]} {what} longer than {limit} bytes")
                partial += data[pos:]
                self._op = op
                return size
            if partial:
                partial += data[pos:end]
                fields.append(bytes(partial))
                partial.clear()
            else:
                fields.append(data[pos:end])
            pos = end + 1
            if limits is not None and len(fields) == len(limits):
                self._finish(op, events)
                return pos

    def _finish(self, op: int, events: list[Event]) -> None:
        """Turn the completed strings of packet ``op`` into its event (checked one by one:
        they may come from several reads) and get ready for the next packet."""
        fields = self._fields
        self._fields = []
        self._op = -1
        if op == TL:
            for topic in fields:
                if _EOT_VALUE in topic or not is_utf8(topic):
                    events.append(_malformed(op, fields))
                    return
            events.append(TopicList(tuple(fields)))
            return
        if _EOT_VALUE in fields[0] or not all(is_utf8(field) for field in fields):
            events.append(_malformed(op, fields))
        elif op == MSG:
            events.append(_new(Msg, tuple(fields)))
        else:
            events.append(_new(Sub, (fields[0],)) if op == SUB else _new(Unsub, (fields[0],)))


def _malformed(op: int, fields: Iterable[bytes]) -> Malformed:
    fields = tuple(fields)
    topics = fields if op == TL else fields[:1]
    if any(_EOT_VALUE in topic for topic in topics):
        return Malformed(op, EOT_IN_TOPIC)
    return Malformed(op, NOT_UTF8)


# ---------------------------------------------------------------------------- encoding

def check_string(what: str, value: bytes, limit: int) -> bytes:
    """``value`` if it can be an MCCHAT string of at most ``limit`` bytes, else ValueError
    saying why (:func:`string_problem`)."""
    if not isinstance(value, bytes):
        raise TypeError(f"MCCHAT strings are bytes here, not {type(value).__name__}")
    problem = string_problem(what, value, limit)
    if problem is not None:
        raise ValueError(problem)
    return value


def check_topic(topic: bytes) -> bytes:
    """``topic`` if it can be an MCCHAT topic name, else ValueError (:func:`topic_problem`)."""
    check_string("topic", topic, MAX_TOPIC)
    if _EOT_VALUE in topic:
        raise ValueError(_EOT_PROBLEM)
    return topic


def encode_info(version: int = VERSION) -> bytes:
    return bytes((INFO, version))


def encode_sub(topic: bytes) -> bytes:
    return b"\x01" + check_topic(topic) + _NUL


def encode_unsub(topic: bytes) -> bytes:
    return b"\x02" + check_topic(topic) + _NUL


def encode_msg(topic: bytes, username: bytes, message: bytes) -> bytes:
    return b"".join(
        (
            b"\x03",
            check_topic(topic),
            _NUL,
            check_string("username", username, MAX_USERNAME),
            _NUL,
            check_string("message", message, MAX_MESSAGE),
            _NUL,
        )
    )


def encode_tlrq() -> bytes:
    return b"\x04"


def encode_tl(topics: Iterable[bytes]) -> bytes:
    parts = [b"\x05"]
    for topic in topics:
        parts.append(check_topic(topic))
        parts.append(_NUL)
    if len(parts) > 1 + 2 * MAX_TL_TOPICS:
        raise ValueError(f"a TL packet lists at most {MAX_TL_TOPICS} topics")
    parts.append(_EOT)
    return b"".join(parts)


def encode(packet: Packet) -> bytes:
    """The wire form of any of the six packets; ValueError for content MCCHAT cannot carry."""
    match packet:
        case Msg():
            return encode_msg(*packet)
        case Sub():
            return encode_sub(packet.topic)
        case Unsub():
            return encode_unsub(packet.topic)
        case TopicListRequest():
            return encode_tlrq()
        case TopicList():
            return encode_tl(packet.topics)
        case Info():
            return encode_info(packet.version)
    raise TypeError(f"not an MCCHAT packet: {packet!r}")

"""MQTT's data representations (section 1.5 of both MQTT 3.1.1 and MQTT 5.0): bits, Two and Four
Byte Integers, UTF-8 Encoded Strings, Variable Byte Integers, Binary Data, UTF-8 String Pairs.

Readers take ``(data, pos, end)`` and return ``(value, next_pos)``: they read a packet's body in
place, with no copy of the body first.  Whatever would read past ``end`` is a truncated field
and raises :class:`~.reasons.MQTTProtocolError` (0x81 Malformed Packet), as does every rule of
1.5 a value breaks: a Variable Byte Integer longer than four bytes or not in its shortest form
(1.5.5, [MQTT-1.5.5-1]), a string that is not well-formed UTF-8, holds a surrogate (U+D800 to
U+DFFF, which Python's strict decoder refuses) or U+0000 (1.5.4, [MQTT-1.5.4-1], [MQTT-1.5.4-2]).

Writers refuse what a peer could not read with ValueError: a string or binary longer than
65,535 bytes, a string holding U+0000 or a lone surrogate, an integer out of its range.
"""
from __future__ import annotations

from brokerd.protocols.mqtt.reasons import malformed

MAX_VARIABLE_BYTE_INTEGER = 268_435_455
"""The largest value four bytes of Variable Byte Integer hold (1.5.5)."""
MAX_TWO_BYTE = 0xFFFF
MAX_FOUR_BYTE = 0xFFFF_FFFF

_VBI_CACHE = [bytes((value,)) for value in range(128)]


def encode_vbi(value: int) -> bytes:
    """``value`` as a Variable Byte Integer: seven bits a byte, least significant first, the top
    bit set on every byte but the last."""
    if value < 128:
        if value < 0:
            raise ValueError(f"a Variable Byte Integer is never negative ({value})")
        return _VBI_CACHE[value]
    if value > MAX_VARIABLE_BYTE_INTEGER:
        raise ValueError(f"{value} does not fit a Variable Byte Integer")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_vbi(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """A Variable Byte Integer at ``data[pos:end]``."""
    value = 0
    shift = 0
    for count in range(4):
        if pos >= end:
            raise malformed("truncated Variable Byte Integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and count:
                raise malformed("Variable Byte Integer not in its shortest form")
            return value, pos
        shift += 7
    raise malformed("Variable Byte Integer longer than four bytes")


def read_byte(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise malformed("truncated byte")
    return data[pos], pos + 1


def read_u16(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """A Two Byte Integer (big-endian)."""
    if pos + 2 > end:
        raise malformed("truncated Two Byte Integer")
    return data[pos] << 8 | data[pos + 1], pos + 2


def read_u32(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """A Four Byte Integer (big-endian)."""
    if pos + 4 > end:
        raise malformed("truncated Four Byte Integer")
    return int.from_bytes(data[pos : pos + 4], "big"), pos + 4


def read_binary(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    """Binary Data: a Two Byte length, then that many bytes."""
    if pos + 2 > end:
        raise malformed("truncated Binary Data length")
    stop = pos + 2 + (data[pos] << 8 | data[pos + 1])
    if stop > end:
        raise malformed("truncated Binary Data")
    return data[pos + 2 : stop], stop


def read_string(data: bytes, pos: int, end: int) -> tuple[str, int]:
    """A UTF-8 Encoded String: a Two Byte length, then that many bytes of well-formed UTF-8
    without U+0000."""
    if pos + 2 > end:
        raise malformed("truncated UTF-8 string length")
    stop = pos + 2 + (data[pos] << 8 | data[pos + 1])
    if stop > end:
        raise malformed("truncated UTF-8 string")
    try:
        text = data[pos + 2 : stop].decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise malformed("string contains U+0000")
    return text, stop


def string_bytes(value: str, what: str = "string") -> bytes:
    """The UTF-8 of ``value`` if it can be a UTF-8 Encoded String, else ValueError."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, not {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate, which UTF-8 cannot encode") from None
    if len(raw) > MAX_TWO_BYTE:
        raise ValueError(f"{what} is {len(raw)} bytes of UTF-8 (at most 65535)")
    if "\x00" in value:
        raise ValueError(f"{what} contains U+0000")
    return raw


def encode_string(value: str, what: str = "string") -> bytes:
    """A UTF-8 Encoded String: length, then the UTF-8."""
    raw = string_bytes(value, what)
    return len(raw).to_bytes(2, "big") + raw


def encode_binary(value: bytes, what: str = "binary data") -> bytes:
    """Binary Data: length, then the bytes."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_TWO_BYTE:
        raise ValueError(f"{what} is {len(value)} bytes (at most 65535)")
    return len(value).to_bytes(2, "big") + bytes(value)


def encode_u16(value: int, what: str = "Two Byte Integer") -> bytes:
    if not 0 <= value <= MAX_TWO_BYTE:
        raise ValueError(f"{what} {value} is not in 0-65535")
    return value.to_bytes(2, "big")


def encode_u32(value: int, what: str = "Four Byte Integer") -> bytes:
    if not 0 <= value <= MAX_FOUR_BYTE:
        raise ValueError(f"{what} {value} is not in 0-4294967295")
    return value.to_bytes(4, "big")


def encode_byte(value: int, what: str = "Byte") -> bytes:
    if not 0 <= value <= 0xFF:
        raise ValueError(f"{what} {value} is not in 0-255")
    return _VBI_CACHE[value] if value < 128 else bytes((value,))


def encode_packet_id(packet_id: int | None) -> bytes:
    """A Packet Identifier: a Two Byte Integer that is never 0 (2.2.1)."""
    if packet_id is None or not 1 <= packet_id <= MAX_TWO_BYTE:
        raise ValueError(f"a Packet Identifier is 1-65535, not {packet_id!r}")
    return packet_id.to_bytes(2, "big")

"""MQTT 5.0 properties (section 2.2.2): every property's identifier, data type, and the packets
that may carry it (the table of 2.2.2.2), with the reading and writing of a property block.

A property block is a Variable Byte Integer length and then that many bytes of properties, each
an identifier (a Variable Byte Integer; every v5 identifier fits one byte) and a value of the
identifier's type.  Reading refuses, as the spec says:

* an identifier the table does not have, or one not allowed in that packet: 0x81 Malformed
  Packet (2.2.2.2: "a Control Packet which contains an Identifier which is not valid for its
  packet type ... is a Malformed Packet");
* a property given twice: 0x82 Protocol Error, except User Property (any number, order kept)
  and Subscription Identifier in a PUBLISH (one per matching subscription; a SUBSCRIBE carries
  at most one, 3.8.2.1.2);
* a value outside what the property's section allows: 0x82 Protocol Error (a Receive Maximum,
  Maximum Packet Size, Topic Alias or Subscription Identifier of 0; a Maximum QoS, or a flag such
  as Retain Available or Request Problem Information, other than 0 or 1; a Response Topic holding
  a wildcard, [MQTT-3.3.2-14]).

Properties that only make sense in one direction (a Subscription Identifier in a PUBLISH a
client sent, an Assigned Client Identifier ...) are the decoder's or the server's business.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from brokerd.protocols.mqtt.datatypes import (
    MAX_VARIABLE_BYTE_INTEGER,
    encode_binary,
    encode_byte,
    encode_string,
    encode_u16,
    encode_u32,
    encode_vbi,
    read_binary,
    read_string,
    read_u16,
    read_u32,
    read_vbi,
)
from brokerd.protocols.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    NO_PROPERTIES,
    PACKET_NAMES,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    WILL,
    Properties,
)
from brokerd.protocols.mqtt.reasons import malformed, protocol_error

BYTE = "Byte"
TWO_BYTE = "Two Byte Integer"
FOUR_BYTE = "Four Byte Integer"
VARIABLE_BYTE = "Variable Byte Integer"
STRING = "UTF-8 Encoded String"
BINARY = "Binary Data"
STRING_PAIR = "UTF-8 String Pair"


def _flag(value: int) -> bool:
    return value in (0, 1)


def _nonzero(value: int) -> bool:
    return value != 0


def _subscription_identifier(value: int) -> bool:
    return 1 <= value <= MAX_VARIABLE_BYTE_INTEGER


def _no_wildcard(value: str) -> bool:
    return "+" not in value and "#" not in value


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One row of the table in 2.2.2.2, and the rule its own section sets on its value."""

    identifier: int
    name: str
    attribute: str
    kind: str
    packets: frozenset[int]
    valid: Callable | None = None
    """Returns False for a value its section calls a Protocol Error."""
    repeatable_in: frozenset[int] = frozenset()
    """Packets in which the property may occur more than once."""


def _spec(identifier, name, attribute, kind, packets, valid=None, repeatable_in=()):
    return PropertySpec(identifier, name, attribute, kind, frozenset(packets), valid, frozenset(repeatable_in))


_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)

PROPERTIES: dict[int, PropertySpec] = {
    spec.identifier: spec
    for spec in (
        _spec(0x01, "Payload Format Indicator", "payload_format_indicator", BYTE, (PUBLISH, WILL), _flag),
        _spec(0x02, "Message Expiry Interval", "message_expiry_interval", FOUR_BYTE, (PUBLISH, WILL)),
        _spec(0x03, "Content Type", "content_type", STRING, (PUBLISH, WILL)),
        _spec(0x08, "Response Topic", "response_topic", STRING, (PUBLISH, WILL), _no_wildcard),
        _spec(0x09, "Correlation Data", "correlation_data", BINARY, (PUBLISH, WILL)),
        _spec(0x0B, "Subscription Identifier", "subscription_identifiers", VARIABLE_BYTE,
              (PUBLISH, SUBSCRIBE), _subscription_identifier, repeatable_in=(PUBLISH,)),
        _spec(0x11, "Session Expiry Interval", "session_expiry_interval", FOUR_BYTE, (CONNECT, CONNACK, DISCONNECT)),
        _spec(0x12, "Assigned Client Identifier", "assigned_client_identifier", STRING, (CONNACK,)),
        _spec(0x13, "Server Keep Alive", "server_keep_alive", TWO_BYTE, (CONNACK,)),
        _spec(0x15, "Authentication Method", "authentication_method", STRING, (CONNECT, CONNACK, AUTH)),
        _spec(0x16, "Authentication Data", "authentication_data", BINARY, (CONNECT, CONNACK, AUTH)),
        _spec(0x17, "Request Problem Information", "request_problem_information", BYTE, (CONNECT,), _flag),
        _spec(0x18, "Will Delay Interval", "will_delay_interval", FOUR_BYTE, (WILL,)),
        _spec(0x19, "Request Response Information", "request_response_information", BYTE, (CONNECT,), _flag),
        _spec(0x1A, "Response Information", "response_information", STRING, (CONNACK,)),
        _spec(0x1C, "Server Reference", "server_reference", STRING, (CONNACK, DISCONNECT)),
        _spec(0x1F, "Reason String", "reason_string", STRING,
              (CONNACK, *_ACKS, SUBACK, UNSUBACK, DISCONNECT, AUTH)),
        _spec(0x21, "Receive Maximum", "receive_maximum", TWO_BYTE, (CONNECT, CONNACK), _nonzero),
        _spec(0x22, "Topic Alias Maximum", "topic_alias_maximum", TWO_BYTE, (CONNECT, CONNACK)),
        _spec(0x23, "Topic Alias", "topic_alias", TWO_BYTE, (PUBLISH,), _nonzero),
        _spec(0x24, "Maximum QoS", "maximum_qos", BYTE, (CONNACK,), _flag),
        _spec(0x25, "Retain Available", "retain_available", BYTE, (CONNACK,), _flag),
        _spec(0x26, "User Property", "user_properties", STRING_PAIR,
              (CONNECT, CONNACK, PUBLISH, WILL, *_ACKS, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK,
               DISCONNECT, AUTH),
              repeatable_in=(CONNECT, CONNACK, PUBLISH, WILL, *_ACKS, SUBSCRIBE, SUBACK, UNSUBSCRIBE,
                             UNSUBACK, DISCONNECT, AUTH)),
        _spec(0x27, "Maximum Packet Size", "maximum_packet_size", FOUR_BYTE, (CONNECT, CONNACK), _nonzero),
        _spec(0x28, "Wildcard Subscription Available", "wildcard_subscription_available", BYTE, (CONNACK,), _flag),
        _spec(0x29, "Subscription Identifier Available", "subscription_identifier_available", BYTE,
              (CONNACK,), _flag),
        _spec(0x2A, "Shared Subscription Available", "shared_subscription_available", BYTE, (CONNACK,), _flag),
    )
}
"""Every v5 property by identifier."""

BY_ATTRIBUTE: dict[str, PropertySpec] = {spec.attribute: spec for spec in PROPERTIES.values()}
"""The same table by the :class:`~.packets.Properties` field that holds each property."""

_LISTS = frozenset(("subscription_identifiers", "user_properties"))
_EMPTY_BLOCK = b"\x00"


def allowed_in(packet_type: int) -> tuple[PropertySpec, ...]:
    """The properties a packet type (or :data:`~.packets.WILL`) may carry, by identifier."""
    return tuple(spec for spec in PROPERTIES.values() if packet_type in spec.packets)


# ---------------------------------------------------------------------------- reading

def read_properties(data: bytes, pos: int, end: int, packet_type: int) -> tuple[Properties, int]:
    """The property block at ``data[pos:end]`` of a ``packet_type`` packet (or the Will
    Properties, :data:`~.packets.WILL`), and the position after it."""
    length, pos = read_vbi(data, pos, end)
    if length == 0:
        return NO_PROPERTIES, pos
    stop = pos + length
    if stop > end:
        raise malformed("property block longer than the packet")
    values: dict[str, object] = {}
    lists: dict[str, list[object]] = {}
    while pos < stop:
        identifier, pos = read_vbi(data, pos, stop)
        spec = PROPERTIES.get(identifier)
        if spec is None:
            raise malformed(f"unknown property identifier 0x{identifier:02X}")
        if packet_type not in spec.packets:
            raise malformed(f"{spec.name} is not allowed in {PACKET_NAMES[packet_type]}")
        value, pos = _read_value(spec.kind, data, pos, stop)
        if spec.valid is not None and not spec.valid(value):
            raise protocol_error(f"{spec.name} of {value!r} is not allowed")
        attribute = spec.attribute
        if attribute in _LISTS:
            held = lists.setdefault(attribute, [])
            if held and packet_type not in spec.repeatable_in:
                raise protocol_error(f"{spec.name} more than once in {PACKET_NAMES[packet_type]}")
            held.append(value)
        elif attribute in values:
            raise protocol_error(f"{spec.name} more than once")
        else:
            values[attribute] = value
    for attribute, held in lists.items():
        values[attribute] = tuple(held)
    return Properties(**values), stop  # type: ignore[arg-type]  # each value has the kind PROPERTIES gives its attribute


def _read_value(kind: str, data: bytes, pos: int, end: int) -> tuple[object, int]:
    if kind is BYTE:
        if pos >= end:
            raise malformed("truncated Byte property")
        return data[pos], pos + 1
    if kind is STRING:
        return read_string(data, pos, end)
    if kind is FOUR_BYTE:
        return read_u32(data, pos, end)
    if kind is TWO_BYTE:
        return read_u16(data, pos, end)
    if kind is VARIABLE_BYTE:
        return read_vbi(data, pos, end)
    if kind is BINARY:
        return read_binary(data, pos, end)
    name, pos = read_string(data, pos, end)
    value, pos = read_string(data, pos, end)
    return (name, value), pos


# ---------------------------------------------------------------------------- writing

def encode_properties(properties: Properties, packet_type: int) -> bytes:
    """The property block (length included) of ``properties`` in a ``packet_type`` packet;
    ValueError for a property the packet may not carry or a value a reader would refuse."""
    if properties is NO_PROPERTIES:
        return _EMPTY_BLOCK
    body = encode_property_list(properties, packet_type)
    return encode_vbi(len(body)) + body


def is_empty(properties: Properties) -> bool:
    """True when no property is present (cheap for the shared empty value)."""
    return properties is NO_PROPERTIES or properties == NO_PROPERTIES


def encode_property_list(properties: Properties, packet_type: int) -> bytes:
    """The properties without the block's length, in identifier order."""
    if properties is NO_PROPERTIES:
        return b""
    if not isinstance(properties, Properties):
        raise TypeError(f"properties must be Properties, not {type(properties).__name__}")
    parts: list[bytes] = []
    for identifier, spec in PROPERTIES.items():
        value = getattr(properties, spec.attribute)
        if value is None or value == ():
            continue
        if packet_type not in spec.packets:
            raise ValueError(f"{spec.name} is not allowed in {PACKET_NAMES[packet_type]}")
        if spec.attribute in _LISTS:
            if len(value) > 1 and packet_type not in spec.repeatable_in:
                raise ValueError(f"{spec.name} at most once in {PACKET_NAMES[packet_type]}")
            for item in value:
                parts.append(_encode_value(spec, identifier, item))
        else:
            parts.append(_encode_value(spec, identifier, value))
    return b"".join(parts)


def _encode_value(spec: PropertySpec, identifier: int, value) -> bytes:
    kind = spec.kind
    if kind is STRING_PAIR:
        if not (isinstance(value, tuple) and len(value) == 2):
            raise ValueError(f"a {spec.name} is a (name, value) pair, not {value!r}")
        raw = encode_string(value[0], spec.name) + encode_string(value[1], spec.name)
    elif kind is STRING:
        raw = encode_string(value, spec.name)
    elif kind is BINARY:
        raw = encode_binary(value, spec.name)
    else:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{spec.name} must be int, not {type(value).__name__}")
        if kind is BYTE:
            raw = encode_byte(value, spec.name)
        elif kind is TWO_BYTE:
            raw = encode_u16(value, spec.name)
        elif kind is FOUR_BYTE:
            raw = encode_u32(value, spec.name)
        else:
            raw = encode_vbi(value)
    if spec.valid is not None and not spec.valid(value):
        raise ValueError(f"{spec.name} of {value!r} is not allowed")
    return bytes((identifier,)) + raw


def check_properties(properties: Properties, packet_type: int) -> None:
    """ValueError or TypeError unless ``properties`` can go in a ``packet_type`` packet."""
    encode_property_list(properties, packet_type)


"""Reading one MQTT packet's variable header and payload, once its fixed header has framed it.

One function per packet type (chapter 3 of MQTT 3.1.1 and of MQTT 5.0), each taking the fixed
header's flag bits and the body in place, ``data[pos:end]``, and returning the packet or raising
:class:`~.reasons.MQTTProtocolError` with the v5 reason code the spec gives for what is wrong:

* 0x81 Malformed Packet: truncated fields, trailing bytes, a bad UTF-8 string; QoS 3 and DUP
  on a QoS 0 PUBLISH (3.3.1.1-3.3.1.2); the CONNECT reserved flag bit, inconsistent Will flags
  and, in 3.1.1, a password without a user name (3.1.2.3-3.1.2.9); reserved bits in subscription
  options (3.8.3.1); a property a packet may not carry (:mod:`.properties`).
* 0x82 Protocol Error: a Packet Identifier of 0 (2.2.1); a SUBSCRIBE or UNSUBSCRIBE without a
  topic filter; a v5 requested QoS or Retain Handling of 3; No Local on a shared subscription
  ([MQTT-3.8.3-4]); a reason code the packet may not carry; a PUBLISH with an empty topic and no
  Topic Alias; Authentication Data without an Authentication Method.
* 0x84 Unsupported Protocol Version: a CONNECT whose protocol is not MQTT 3.1.1 or 5.0 (3.1.2.1,
  3.1.2.2); 0x85 Client Identifier not valid: an empty one without Clean Session in 3.1.1
  ([MQTT-3.1.3-8]); 0x90 Topic Name invalid: a wildcard in a PUBLISH or Will topic.

Everything here is pure: no buffering (:mod:`.decoder` frames the stream), no session state.
"""
from __future__ import annotations

from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.datatypes import read_binary, read_string
from brokerd.protocols.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    PACKET_NAMES,
    PINGREQ,
    PINGREQ_PACKET,
    PINGRESP,
    PINGRESP_PACKET,
    PROTOCOL_NAME,
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
    Acknowledgement,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from brokerd.protocols.mqtt.properties import read_properties
from brokerd.protocols.mqtt.reasons import MQTTProtocolError, malformed, protocol_error
from brokerd.protocols.mqtt.topics import is_shared

_MQTT_31_NAME = b"\x00\x06MQIsdp"
"""MQTT 3.1's protocol name, which brokerd does not speak."""


def _trailing(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise malformed(f"{end - pos} bytes after the end of the {what}")


def _packet_id(data: bytes, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise malformed("truncated Packet Identifier")
    packet_id = data[pos] << 8 | data[pos + 1]
    if packet_id == 0:
        raise protocol_error("Packet Identifier 0")
    return packet_id


def _topic_name_problem(topic: str) -> MQTTProtocolError | None:
    if "+" in topic or "#" in topic:
        return MQTTProtocolError("topic name contains a wildcard", reasons.TOPIC_NAME_INVALID)
    return None


def _check_authentication(properties: Properties) -> None:
    if properties.authentication_data is not None and properties.authentication_method is None:
        raise protocol_error("Authentication Data without an Authentication Method")


# ---------------------------------------------------------------------------- CONNECT

def parse_connect(flags: int, data: bytes, pos: int, end: int, version: int | None) -> Connect:
    """CONNECT: the packet that tells which protocol version the rest of the stream speaks
    (``version`` is ignored; the protocol level byte decides)."""
    name_end = pos + len(PROTOCOL_NAME)
    if data[pos:min(name_end, end)] != PROTOCOL_NAME:
        if data[pos : min(pos + len(_MQTT_31_NAME), end)] == _MQTT_31_NAME:
            raise MQTTProtocolError("MQTT 3.1 (MQIsdp) is not supported", reasons.UNSUPPORTED_PROTOCOL_VERSION)
        raise malformed("protocol name is not MQTT")
    if name_end >= end:
        raise malformed("truncated CONNECT")
    level = data[name_end]
    if level not in (MQTT_311, MQTT_5):
        raise MQTTProtocolError(f"protocol level {level} is not supported", reasons.UNSUPPORTED_PROTOCOL_VERSION)
    try:
        return _connect_body(data, name_end + 1, end, level)
    except MQTTProtocolError as exc:
        exc.version = level
        raise


def _connect_body(data: bytes, pos: int, end: int, level: int) -> Connect:
    if pos + 3 > end:
        raise malformed("truncated CONNECT")
    flags = data[pos]
    keep_alive = data[pos + 1] << 8 | data[pos + 2]
    pos += 3
    if flags & 0x01:
        raise malformed("CONNECT reserved flag is set")
    clean_start = bool(flags & 0x02)
    has_will = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    has_password = bool(flags & 0x40)
    has_username = bool(flags & 0x80)
    if will_qos == 3:
        raise malformed("Will QoS 3")
    if not has_will and (will_qos or will_retain):
        raise malformed("Will QoS or Will Retain without the Will Flag")
    if has_password and not has_username and level == MQTT_311:
        raise malformed("password without a user name")
    properties = NO_PROPERTIES
    if level == MQTT_5:
        properties, pos = read_properties(data, pos, end, CONNECT)
        _check_authentication(properties)
    client_id, pos = read_string(data, pos, end)
    if not client_id and not clean_start and level == MQTT_311:
        raise MQTTProtocolError(
            "empty client identifier without Clean Session", reasons.CLIENT_IDENTIFIER_NOT_VALID
        )
    will = None
    if has_will:
        will_properties = NO_PROPERTIES
        if level == MQTT_5:
            will_properties, pos = read_properties(data, pos, end, WILL)
        will_topic, pos = read_string(data, pos, end)
        if not will_topic:
            raise MQTTProtocolError("empty Will Topic", reasons.TOPIC_NAME_INVALID)
        problem = _topic_name_problem(will_topic)
        if problem is not None:
            raise problem
        will_payload, pos = read_binary(data, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_properties)
    username = password = None
    if has_username:
        username, pos = read_string(data, pos, end)
    if has_password:
        password, pos = read_binary(data, pos, end)
    _trailing(pos, end, "CONNECT")
    return Connect(client_id, clean_start, keep_alive, will, username, password, properties)


def parse_connack(flags: int, data: bytes, pos: int, end: int, version: int) -> Connack:
    if pos + 2 > end:
        raise malformed("truncated CONNACK")
    acknowledge = data[pos]
    code = data[pos + 1]
    pos += 2
    if acknowledge & 0xFE:
        raise malformed("CONNACK reserved flag bits are set")
    session_present = bool(acknowledge)
    properties = NO_PROPERTIES
    if version == MQTT_5:
        if code not in reasons.CONNACK_REASONS:
            raise protocol_error(f"0x{code:02X} is not a CONNACK reason code")
        properties, pos = read_properties(data, pos, end, CONNACK)
        _check_authentication(properties)
    elif code not in reasons.V311_CONNACK_RETURN_CODES:
        raise protocol_error(f"{code} is not a CONNACK return code")
    if session_present and code:
        raise protocol_error("Session Present with a refused connection")
    _trailing(pos, end, "CONNACK")
    return Connack(session_present, code, properties)


# ---------------------------------------------------------------------------- PUBLISH and its answers

def parse_publish(flags: int, data: bytes, pos: int, end: int, version: int) -> Publish:
    """PUBLISH: the hot path, so the topic is read inline."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise malformed("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and not qos:
        raise malformed("DUP set on a QoS 0 PUBLISH")
    if pos + 2 > end:
        raise malformed("truncated topic name length")
    stop = pos + 2 + (data[pos] << 8 | data[pos + 1])
    if stop > end:
        raise malformed("truncated topic name")
    raw = data[pos + 2 : stop]
    pos = stop
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("topic name is not well-formed UTF-8") from None
    # str's "in" here: bytes' is several times slower on these short topics.
    if "\x00" in topic:
        raise malformed("topic name contains U+0000")
    if "+" in topic or "#" in topic:
        raise MQTTProtocolError("topic name contains a wildcard", reasons.TOPIC_NAME_INVALID)
    packet_id = None
    if qos:
        packet_id = _packet_id(data, pos, end)
        pos += 2
    properties = NO_PROPERTIES
    if version == MQTT_5:
        if pos < end and data[pos] == 0:
            pos += 1
        else:
            properties, pos = read_properties(data, pos, end, PUBLISH)
        if not topic and properties.topic_alias is None:
            raise protocol_error("empty topic name without a Topic Alias")
    elif not topic:
        raise protocol_error("empty topic name")
    return Publish(topic, data[pos:end], qos, bool(flags & 0x01), dup, packet_id, properties)


_ACK_CLASSES = {PUBACK: Puback, PUBREC: Pubrec, PUBREL: Pubrel, PUBCOMP: Pubcomp}
_ACK_REASONS = {
    PUBACK: reasons.PUBACK_REASONS,
    PUBREC: reasons.PUBACK_REASONS,
    PUBREL: reasons.PUBREL_REASONS,
    PUBCOMP: reasons.PUBREL_REASONS,
}


def parse_ack(packet_type: int, data: bytes, pos: int, end: int, version: int) -> Acknowledgement:
    """PUBACK, PUBREC, PUBREL and PUBCOMP: a Packet Identifier, then in v5 an optional reason
    code and optional properties (3.4.2.1: both may be left out when the code is Success and
    there are no properties; the properties alone when there are none)."""
    name = PACKET_NAMES[packet_type]
    packet_id = _packet_id(data, pos, end)
    pos += 2
    cls = _ACK_CLASSES[packet_type]
    if pos == end:
        return cls(packet_id)
    if version != MQTT_5:
        raise malformed(f"{end - pos} bytes after the end of the {name}")
    code = data[pos]
    pos += 1
    if code not in _ACK_REASONS[packet_type]:
        raise protocol_error(f"0x{code:02X} is not a {name} reason code")
    properties = NO_PROPERTIES
    if pos < end:
        properties, pos = read_properties(data, pos, end, packet_type)
        _trailing(pos, end, name)
    return cls(packet_id, code, properties)


# ---------------------------------------------------------------------------- SUBSCRIBE and UNSUBSCRIBE

def parse_subscribe(flags: int, data: bytes, pos: int, end: int, version: int) -> Subscribe:
    packet_id = _packet_id(data, pos, end)
    pos += 2
    properties = NO_PROPERTIES
    if version == MQTT_5:
        properties, pos = read_properties(data, pos, end, SUBSCRIBE)
    subscriptions = []
    while pos < end:
        topic_filter, pos = read_string(data, pos, end)
        if pos >= end:
            raise malformed("topic filter without its subscription options")
        options = data[pos]
        pos += 1
        subscriptions.append(_subscription(topic_filter, options, version))
    if not subscriptions:
        raise protocol_error("SUBSCRIBE without a topic filter")
    return Subscribe(packet_id, tuple(subscriptions), properties)


def _subscription(topic_filter: str, options: int, version: int) -> Subscription:
    qos = options & 0x03
    if version != MQTT_5:
        if options & 0xFC:
            raise malformed("reserved bits of the requested QoS byte are set")
        if qos == 3:
            raise malformed("requested QoS 3")
        return Subscription(topic_filter, qos)
    if options & 0xC0:
        raise malformed("reserved bits of the subscription options are set")
    if qos == 3:
        raise protocol_error("requested QoS 3")
    retain_handling = (options >> 4) & 0x03
    if retain_handling == 3:
        raise protocol_error("Retain Handling 3")
    no_local = bool(options & 0x04)
    if no_local and is_shared(topic_filter):
        raise protocol_error("No Local on a shared subscription")
    return Subscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)


def parse_suback(flags: int, data: bytes, pos: int, end: int, version: int) -> Suback:
    packet_id = _packet_id(data, pos, end)
    pos += 2
    properties = NO_PROPERTIES
    allowed = reasons.V311_SUBACK_RETURN_CODES
    if version == MQTT_5:
        properties, pos = read_properties(data, pos, end, SUBACK)
        allowed = reasons.SUBACK_REASONS
    return Suback(packet_id, _reason_codes(data, pos, end, allowed, "SUBACK"), properties)


def _reason_codes(data: bytes, pos: int, end: int, allowed: frozenset[int], name: str) -> tuple[int, ...]:
    """A SUBACK's or UNSUBACK's payload: one reason code per topic filter, at least one."""
    codes = tuple(data[pos:end])
    if not codes:
        raise protocol_error(f"{name} without a reason code")
    for code in codes:
        if code not in allowed:
            raise protocol_error(f"0x{code:02X} is not a {name} reason code")
    return codes


def parse_unsubscribe(flags: int, data: bytes, pos: int, end: int, version: int) -> Unsubscribe:
    packet_id = _packet_id(data, pos, end)
    pos += 2
    properties = NO_PROPERTIES
    if version == MQTT_5:
        properties, pos = read_properties(data, pos, end, UNSUBSCRIBE)
    filters = []
    while pos < end:
        topic_filter, pos = read_string(data, pos, end)
        filters.append(topic_filter)
    if not filters:
        raise protocol_error("UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, tuple(filters), properties)


def parse_unsuback(flags: int, data: bytes, pos: int, end: int, version: int) -> Unsuback:
    packet_id = _packet_id(data, pos, end)
    pos += 2
    if version != MQTT_5:
        _trailing(pos, end, "UNSUBACK")
        return Unsuback(packet_id)
    properties, pos = read_properties(data, pos, end, UNSUBACK)
    return Unsuback(packet_id, _reason_codes(data, pos, end, reasons.UNSUBACK_REASONS, "UNSUBACK"), properties)


# ---------------------------------------------------------------------------- the rest

def parse_pingreq(flags: int, data: bytes, pos: int, end: int, version: int):
    _trailing(pos, end, "PINGREQ")
    return PINGREQ_PACKET


def parse_pingresp(flags: int, data: bytes, pos: int, end: int, version: int):
    _trailing(pos, end, "PINGRESP")
    return PINGRESP_PACKET


def _reason_and_properties(
    packet_type: int, allowed: frozenset[int], data: bytes, pos: int, end: int
) -> tuple[int, Properties]:
    """DISCONNECT's and AUTH's body: nothing (Success), a reason code, or both and properties."""
    if pos == end:
        return reasons.SUCCESS, NO_PROPERTIES
    code = data[pos]
    pos += 1
    if code not in allowed:
        raise protocol_error(f"0x{code:02X} is not a valid reason code here")
    properties = NO_PROPERTIES
    if pos < end:
        properties, pos = read_properties(data, pos, end, packet_type)
        _trailing(pos, end, "packet")
    return code, properties


def parse_disconnect(flags: int, data: bytes, pos: int, end: int, version: int) -> Disconnect:
    if version != MQTT_5:
        _trailing(pos, end, "DISCONNECT")
        return Disconnect()
    code, properties = _reason_and_properties(DISCONNECT, reasons.DISCONNECT_REASONS, data, pos, end)
    return Disconnect(code, properties)


def parse_auth(flags: int, data: bytes, pos: int, end: int, version: int) -> Auth:
    code, properties = _reason_and_properties(AUTH, reasons.AUTH_REASONS, data, pos, end)
    _check_authentication(properties)
    return Auth(code, properties)


def _ack_parser(packet_type: int):
    def parse(flags: int, data: bytes, pos: int, end: int, version: int):
        return parse_ack(packet_type, data, pos, end, version)

    return parse


PARSERS = {
    CONNECT: parse_connect,
    CONNACK: parse_connack,
    PUBLISH: parse_publish,
    PUBACK: _ack_parser(PUBACK),
    PUBREC: _ack_parser(PUBREC),
    PUBREL: _ack_parser(PUBREL),
    PUBCOMP: _ack_parser(PUBCOMP),
    SUBSCRIBE: parse_subscribe,
    SUBACK: parse_suback,
    UNSUBSCRIBE: parse_unsubscribe,
    UNSUBACK: parse_unsuback,
    PINGREQ: parse_pingreq,
    PINGRESP: parse_pingresp,
    DISCONNECT: parse_disconnect,
    AUTH: parse_auth,
}
"""Each packet type's body reader: ``(flags, data, pos, end, version) -> Packet``."""


def parse_body(packet_type: int, flags: int, data: bytes, pos: int, end: int, version: int | None) -> Packet:
    """The packet whose fixed header said ``packet_type`` and ``flags`` (already checked) and
    whose body is ``data[pos:end]``; ``version`` is the protocol level in force (None only for
    CONNECT, which says its own)."""
    return PARSERS[packet_type](flags, data, pos, end, version)

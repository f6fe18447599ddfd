"""Encoding every MQTT packet, both directions, in MQTT 3.1.1 or MQTT 5.0: ``encode(packet, version)``.

The layouts are chapter 3 of each spec (fixed header 2.1, Remaining Length 1.5.5, properties
2.2.2).  Where v5 lets a sender leave fields out, this encoder does, as the spec's own examples
do: a PUBACK, PUBREC, PUBREL or PUBCOMP with Success and no properties is just its Packet
Identifier (3.4.2.1), with another reason code and no properties it has no Property Length; a
DISCONNECT or AUTH with Success and no properties is empty (3.14.2.1, 3.15.2.1).

The encoder refuses, with ValueError (TypeError for a value of the wrong type), anything the
decoder at the other end would refuse: v5-only content on a 3.1.1 wire (properties, reason codes
other than Success, AUTH, the v5 subscription options, a password without a user name), a
reason code the packet may not carry, a Packet Identifier outside 1-65535, a topic name with a
wildcard, strings the wire cannot hold.  Topic filters are written as given (a client may send a
filter the server will refuse: that is the server's SUBACK to give).

PUBLISH goes through :class:`~.publish.PublishFrame`, which a server uses directly to send one
message to many subscribers.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.datatypes import (
    encode_binary,
    encode_packet_id,
    encode_string,
    encode_u16,
    encode_vbi,
)
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    PROTOCOL_NAME,
    VERSIONS,
    WILL,
    Acknowledgement,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
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
)
from brokerd.protocols.mqtt.properties import encode_properties, is_empty
from brokerd.protocols.mqtt.publish import PublishFrame
from brokerd.protocols.mqtt.topics import is_shared


def encode(packet: Packet, version: int) -> bytes:
    """The wire form of ``packet`` in protocol level ``version`` (4: 3.1.1, 5: 5.0)."""
    if version not in VERSIONS:
        raise ValueError(f"MQTT protocol level 4 or 5, not {version!r}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, version)


def _frame(packet_type: int, flags: int, body: bytes) -> bytes:
    return bytes((packet_type << 4 | flags,)) + encode_vbi(len(body)) + body


def _properties(properties: Properties, packet_type: int, version: int) -> bytes:
    """The property block in v5; nothing in 3.1.1, where there must be none."""
    if not isinstance(properties, Properties):
        raise TypeError(f"properties must be Properties, not {type(properties).__name__}")
    if version == MQTT_5:
        if properties.authentication_data is not None and properties.authentication_method is None:
            raise ValueError("Authentication Data needs an Authentication Method")
        return encode_properties(properties, packet_type)
    if not is_empty(properties):
        raise ValueError("MQTT 3.1.1 packets have no properties")
    return b""


def _qos(qos: int, what: str = "QoS") -> int:
    if qos not in (0, 1, 2):
        raise ValueError(f"{what} is 0, 1 or 2, not {qos!r}")
    return qos


def _check_reason(code: int, allowed: frozenset[int], name: str) -> None:
    if code not in allowed:
        raise ValueError(f"{code!r} is not a {name} reason code")


# ---------------------------------------------------------------------------- CONNECT, CONNACK

def encode_connect(packet: Connect, version: int) -> bytes:
    will = packet.will
    flags = 0x02 if packet.clean_start else 0
    if packet.username is not None:
        flags |= 0x80
    if packet.password is not None:
        if packet.username is None and version == MQTT_311:
            raise ValueError("MQTT 3.1.1 has no password without a user name")
        flags |= 0x40
    if not packet.client_id and not packet.clean_start and version == MQTT_311:
        raise ValueError("MQTT 3.1.1 needs Clean Session with an empty client identifier")
    parts = [PROTOCOL_NAME, bytes((version,)), b"", encode_u16(packet.keep_alive, "Keep Alive")]
    parts.append(_properties(packet.properties, Connect.TYPE, version))
    parts.append(encode_string(packet.client_id, "client identifier"))
    if will is not None:
        flags |= 0x04 | _qos(will.qos, "Will QoS") << 3 | (0x20 if will.retain else 0)
        if not will.topic or "+" in will.topic or "#" in will.topic:
            raise ValueError("the Will Topic is a topic name: not empty, no wildcard")
        parts.append(_properties(will.properties, WILL, version))
        parts.append(encode_string(will.topic, "Will Topic"))
        parts.append(encode_binary(will.payload, "Will Payload"))
    if packet.username is not None:
        parts.append(encode_string(packet.username, "user name"))
    if packet.password is not None:
        parts.append(encode_binary(packet.password, "password"))
    parts[2] = bytes((flags,))
    return _frame(Connect.TYPE, 0, b"".join(parts))


def encode_connack(packet: Connack, version: int) -> bytes:
    code = packet.reason_code
    if version == MQTT_5:
        _check_reason(code, reasons.CONNACK_REASONS, "CONNACK")
    elif code not in reasons.V311_CONNACK_RETURN_CODES:
        raise ValueError(f"{code!r} is not a 3.1.1 CONNACK return code (reasons.connack_return_code)")
    if packet.session_present and code:
        raise ValueError("Session Present must be 0 when the connection is refused")
    body = bytes((1 if packet.session_present else 0, code)) + _properties(packet.properties, Connack.TYPE, version)
    return _frame(Connack.TYPE, 0, body)


# ---------------------------------------------------------------------------- PUBLISH and its answers

def encode_publish(packet: Publish, version: int) -> bytes:
    frame = PublishFrame(packet.topic, packet.payload, version, packet.properties)
    return frame.packet(_qos(packet.qos), packet.retain, packet.packet_id, packet.dup)


_ACK_REASONS = {
    Puback: reasons.PUBACK_REASONS,
    Pubrec: reasons.PUBACK_REASONS,
    Pubrel: reasons.PUBREL_REASONS,
    Pubcomp: reasons.PUBREL_REASONS,
}


def encode_ack(packet: Acknowledgement, version: int) -> bytes:
    """PUBACK, PUBREC, PUBREL, PUBCOMP: as short as the spec allows (module docstring)."""
    kind = type(packet)
    flags = 0x02 if kind is Pubrel else 0
    packet_id = encode_packet_id(packet.packet_id)
    code = packet.reason_code
    if version == MQTT_311:
        if code or not is_empty(packet.properties):
            raise ValueError("MQTT 3.1.1 acknowledgements carry only the Packet Identifier")
        return _frame(kind.TYPE, flags, packet_id)
    _check_reason(code, _ACK_REASONS[kind], kind.__name__.upper())
    if is_empty(packet.properties):
        if code == reasons.SUCCESS:
            return _frame(kind.TYPE, flags, packet_id)
        return _frame(kind.TYPE, flags, packet_id + bytes((code,)))
    return _frame(kind.TYPE, flags, packet_id + bytes((code,)) + _properties(packet.properties, kind.TYPE, version))


# ---------------------------------------------------------------------------- SUBSCRIBE and UNSUBSCRIBE

def _options(subscription: Subscription, version: int) -> int:
    qos = _qos(subscription.qos)
    if version == MQTT_311:
        if subscription.no_local or subscription.retain_as_published or subscription.retain_handling:
            raise ValueError("MQTT 3.1.1 subscriptions have only a QoS")
        return qos
    if subscription.retain_handling not in (0, 1, 2):
        raise ValueError(f"Retain Handling is 0, 1 or 2, not {subscription.retain_handling!r}")
    if subscription.no_local and is_shared(subscription.topic_filter):
        raise ValueError("No Local cannot be set on a shared subscription")
    return (
        qos
        | (0x04 if subscription.no_local else 0)
        | (0x08 if subscription.retain_as_published else 0)
        | subscription.retain_handling << 4
    )


def encode_subscribe(packet: Subscribe, version: int) -> bytes:
    if not packet.subscriptions:
        raise ValueError("a SUBSCRIBE has at least one subscription")
    parts = [encode_packet_id(packet.packet_id), _properties(packet.properties, Subscribe.TYPE, version)]
    for subscription in packet.subscriptions:
        parts.append(encode_string(subscription.topic_filter, "topic filter"))
        parts.append(bytes((_options(subscription, version),)))
    return _frame(Subscribe.TYPE, 0x02, b"".join(parts))


def encode_suback(packet: Suback, version: int) -> bytes:
    if not packet.reason_codes:
        raise ValueError("a SUBACK has at least one reason code")
    allowed = reasons.SUBACK_REASONS if version == MQTT_5 else reasons.V311_SUBACK_RETURN_CODES
    for code in packet.reason_codes:
        _check_reason(code, allowed, "SUBACK")
    body = encode_packet_id(packet.packet_id) + _properties(packet.properties, Suback.TYPE, version)
    return _frame(Suback.TYPE, 0, body + bytes(packet.reason_codes))


def encode_unsubscribe(packet: Unsubscribe, version: int) -> bytes:
    if not packet.topic_filters:
        raise ValueError("an UNSUBSCRIBE has at least one topic filter")
    parts = [encode_packet_id(packet.packet_id), _properties(packet.properties, Unsubscribe.TYPE, version)]
    parts.extend(encode_string(topic_filter, "topic filter") for topic_filter in packet.topic_filters)
    return _frame(Unsubscribe.TYPE, 0x02, b"".join(parts))


def encode_unsuback(packet: Unsuback, version: int) -> bytes:
    packet_id = encode_packet_id(packet.packet_id)
    if version == MQTT_311:
        if packet.reason_codes or not is_empty(packet.properties):
            raise ValueError("an MQTT 3.1.1 UNSUBACK carries only the Packet Identifier")
        return _frame(Unsuback.TYPE, 0, packet_id)
    if not packet.reason_codes:
        raise ValueError("a v5 UNSUBACK has one reason code per topic filter")
    for code in packet.reason_codes:
        _check_reason(code, reasons.UNSUBACK_REASONS, "UNSUBACK")
    body = packet_id + _properties(packet.properties, Unsuback.TYPE, version) + bytes(packet.reason_codes)
    return _frame(Unsuback.TYPE, 0, body)


# ---------------------------------------------------------------------------- the rest

def encode_pingreq(packet: Pingreq, version: int) -> bytes:
    return b"\xc0\x00"


def encode_pingresp(packet: Pingresp, version: int) -> bytes:
    return b"\xd0\x00"


def encode_disconnect(packet: Disconnect, version: int) -> bytes:
    code = packet.reason_code
    if version == MQTT_311:
        if code or not is_empty(packet.properties):
            raise ValueError("an MQTT 3.1.1 DISCONNECT has no reason code and no properties")
        return b"\xe0\x00"
    _check_reason(code, reasons.DISCONNECT_REASONS, "DISCONNECT")
    if is_empty(packet.properties):
        return b"\xe0\x00" if code == reasons.SUCCESS else bytes((0xE0, 1, code))
    return _frame(Disconnect.TYPE, 0, bytes((code,)) + _properties(packet.properties, Disconnect.TYPE, version))


def encode_auth(packet: Auth, version: int) -> bytes:
    if version != MQTT_5:
        raise ValueError("AUTH is MQTT 5.0 only")
    code = packet.reason_code
    _check_reason(code, reasons.AUTH_REASONS, "AUTH")
    if code == reasons.SUCCESS and is_empty(packet.properties):
        return b"\xf0\x00"
    return _frame(Auth.TYPE, 0, bytes((code,)) + _properties(packet.properties, Auth.TYPE, version))


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: encode_connect,
    Connack: encode_connack,
    Publish: encode_publish,
    Puback: encode_ack,
    Pubrec: encode_ack,
    Pubrel: encode_ack,
    Pubcomp: encode_ack,
    Subscribe: encode_subscribe,
    Suback: encode_suback,
    Unsubscribe: encode_unsubscribe,
    Unsuback: encode_unsuback,
    Pingreq: encode_pingreq,
    Pingresp: encode_pingresp,
    Disconnect: encode_disconnect,
    Auth: encode_auth,
}

"""PUBLISH bytes built once and sent to many subscribers (MQTT 3.1.1 and 5.0 section 3.3).

A PUBLISH is a fixed header (flags: DUP, QoS, RETAIN), the topic name, a Packet Identifier at
QoS 1 and 2, the v5 property block, and the payload.  For fan-out the topic, properties and
payload are the same for every subscriber; what differs is the QoS (the lower of the message's
and the subscription's), the RETAIN flag (Retain As Published), the Packet Identifier, and in
v5 the Subscription Identifiers.  :class:`PublishFrame` encodes the shared parts once:

* ``frame.packet()`` is the whole QoS 0 packet, cached: the same bytes for every QoS 0
  subscriber;
* ``frame.head(qos, packet_id=...)`` is the fixed header, topic and Packet Identifier (a few
  bytes: a cached prefix and the two id bytes), and ``frame.tail`` the properties and payload,
  so ``transport.writeSequence((frame.head(1, packet_id=n), frame.tail))`` sends a QoS 1 copy
  without copying the payload; ``frame.packet(qos, packet_id=n)`` joins them;
* ``frame.with_subscription_identifiers(ids)`` is a frame for subscribers whose subscriptions
  carried identifiers (the property block differs, the topic field is reused).

Everything is checked when the frame is made (ValueError), never per subscriber.
"""
from __future__ import annotations

from brokerd.protocols.mqtt.datatypes import encode_string, encode_vbi
from brokerd.protocols.mqtt.packets import MQTT_5, NO_PROPERTIES, PUBLISH, VERSIONS, Properties
from brokerd.protocols.mqtt.properties import encode_property_list, is_empty

MAX_REMAINING_LENGTH = 268_435_455
_TOPIC_FIELDS: dict[str, bytes] = {}
"""Encoded topic names of recent frames: a topic carries message after message, and encoding
and checking its name again for each is a tenth of a small PUBLISH's cost.  Bounded: emptied
past :data:`_TOPIC_FIELD_ENTRIES`, and longer names are not kept."""
_TOPIC_FIELD_ENTRIES = 4096
_TOPIC_FIELD_LONGEST = 256


class PublishFrame:
    """The shared bytes of one PUBLISH in one protocol version (see the module docstring)."""

    __slots__ = ("version", "topic", "tail", "_topic_field", "_property_list", "_payload", "_prefixes", "_qos0")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        version: int,
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"MQTT protocol level 4 or 5, not {version!r}")
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        topic_field = _TOPIC_FIELDS.get(topic)
        if topic_field is None:
            topic_field = _topic_field(topic)
        if "+" in topic or "#" in topic:
            raise ValueError("a topic name has no wildcard")
        if not topic and (version != MQTT_5 or properties.topic_alias is None):
            raise ValueError("an empty topic name needs a v5 Topic Alias")
        self.version = version
        self.topic = topic
        self._topic_field = topic_field
        self._payload = payload
        if version == MQTT_5:
            self._property_list = encode_property_list(properties, PUBLISH)
            self.tail = b"".join((encode_vbi(len(self._property_list)), self._property_list, payload))
        else:
            if not is_empty(properties):
                raise ValueError("MQTT 3.1.1 packets have no properties")
            self._property_list = b""
            self.tail = payload
        if len(topic_field) + 2 + len(self.tail) > MAX_REMAINING_LENGTH:
            raise ValueError("PUBLISH larger than a Remaining Length can describe")
        self._prefixes: dict[int, bytes] = {}
        self._qos0: list[bytes | None] = [None, None]

    def size(self, qos: int) -> int:
        """The packet's size in bytes at ``qos`` (to compare with a client's Maximum Packet
        Size, which a server must not exceed)."""
        remaining = len(self._topic_field) + len(self.tail) + (2 if qos else 0)
        return 1 + len(encode_vbi(remaining)) + remaining

    def _prefix(self, first: int) -> bytes:
        prefix = self._prefixes.get(first)
        if prefix is None:
            remaining = len(self._topic_field) + len(self.tail) + (2 if first & 0x06 else 0)
            prefix = self._prefixes[first] = bytes((first,)) + encode_vbi(remaining) + self._topic_field
        return prefix

    def head(self, qos: int = 0, retain: bool = False, packet_id: int | None = None, dup: bool = False) -> bytes:
        """The fixed header, the topic name and (QoS 1 and 2) the Packet Identifier."""
        if qos:
            if qos not in (1, 2):
                raise ValueError(f"QoS 0, 1 or 2, not {qos!r}")
            if packet_id is None or not 1 <= packet_id <= 0xFFFF:
                raise ValueError(f"QoS {qos} needs a Packet Identifier of 1-65535, not {packet_id!r}")
            first = 0x30 | (0x08 if dup else 0) | qos << 1 | (0x01 if retain else 0)
            return self._prefix(first) + packet_id.to_bytes(2, "big")
        if packet_id is not None or dup:
            raise ValueError("a QoS 0 PUBLISH has no Packet Identifier and no DUP flag")
        return self._prefix(0x31 if retain else 0x30)

    def packet(self, qos: int = 0, retain: bool = False, packet_id: int | None = None, dup: bool = False) -> bytes:
        """The whole PUBLISH (cached at QoS 0, where every subscriber gets the same bytes)."""
        if not qos and packet_id is None and not dup:
            cached = self._qos0[retain]
            if cached is None:
                cached = self._qos0[retain] = self._prefix(0x31 if retain else 0x30) + self.tail
            return cached
        return self.head(qos, retain, packet_id, dup) + self.tail

    def with_topic_alias(self, alias: int, send_topic: bool) -> PublishFrame:
        """The same message for one v5 connection with a Topic Alias (3.3.2.3.4): the topic
        name and the alias that stands for it from now on (``send_topic``), or the alias
        alone, with an empty topic name, for a topic the connection has the alias of."""
        if self.version != MQTT_5:
            raise ValueError("Topic Aliases are MQTT 5.0 only")
        return self._derived(encode_property_list(Properties(topic_alias=alias), PUBLISH),
                             self._topic_field if send_topic else b"\x00\x00")

    def with_subscription_identifiers(self, identifiers: tuple[int, ...]) -> PublishFrame:
        """The same message for a v5 subscriber whose matching subscriptions had these
        Subscription Identifiers (3.3.4: the server sends them with the message)."""
        if self.version != MQTT_5:
            raise ValueError("Subscription Identifiers are MQTT 5.0 only")
        extra = encode_property_list(Properties(subscription_identifiers=tuple(identifiers)), PUBLISH)
        return self._derived(extra, self._topic_field)

    def _derived(self, extra: bytes, topic_field: bytes) -> PublishFrame:
        """This frame with ``extra`` properties and ``topic_field`` (its own, or empty)."""
        frame = PublishFrame.__new__(PublishFrame)
        frame.version = self.version
        frame.topic = self.topic
        frame._topic_field = topic_field
        frame._payload = self._payload
        frame._property_list = self._property_list + extra
        frame.tail = b"".join((encode_vbi(len(frame._property_list)), frame._property_list, self._payload))
        if len(frame._topic_field) + 2 + len(frame.tail) > MAX_REMAINING_LENGTH:
            raise ValueError("PUBLISH larger than a Remaining Length can describe")
        frame._prefixes = {}
        frame._qos0 = [None, None]
        return frame


def _topic_field(topic: str) -> bytes:
    """The topic name as a PUBLISH carries it (ValueError for one no UTF-8 Encoded String can
    be), kept in :data:`_TOPIC_FIELDS` for the next frame of the topic."""
    field = encode_string(topic, "topic name")
    if len(field) <= _TOPIC_FIELD_LONGEST:
        if len(_TOPIC_FIELDS) >= _TOPIC_FIELD_ENTRIES:
            _TOPIC_FIELDS.clear()
        _TOPIC_FIELDS[topic] = field
    return field

"""How core messages look to MQTT sessions (one IWireFormat per protocol version), and how an
MQTT PUBLISH or will becomes a core message (:func:`core_message`).

The core renders a message once per wire format and hands every session of the format the
same object (brokerd.core.router.Router.fan_out).  For MQTT that object is
:class:`MQTTPublishes`: the bytes of the QoS 0 PUBLISH packets (what a session whose
subscriptions are all QoS 0 writes as they are, the common fan-out case), carrying for each
message its :class:`~brokerd.protocols.mqtt.publish.PublishFrame` and the message itself, so a
session that must number a QoS 1 or 2 copy, or leave one out (no-local), builds only the few
bytes that differ (the fixed header and the Packet Identifier) and shares the rest.

Mapping (docs/mqtt.md): a core topic ``a/b`` is the MQTT topic ``a/b``; a core topic that is
not valid UTF-8 or holds ``+``, ``#`` or NUL has no MQTT name and is not rendered (the core
counts the message as unrenderable).  Only messages to topics reach MQTT sessions (MQTT has no
unicast address and no presence).  The v5 message properties are the message's (docs/architecture.md):
Content Type its ``content_type``, Response Topic, Correlation Data, Payload Format Indicator and
User Properties (in order) its ``response_topic``, ``correlation``, ``payload_format`` and
``user_properties``, and the Message Expiry Interval what is left of its ``expires`` when the
frame is made (so a message that waited is sent with the time it has left, 3.3.2.3.3); 3.1.1
has no properties and its subscribers get the message without them.  A property value MQTT
cannot carry (another protocol's text with a NUL, a response topic with a wildcard, more than
65,535 bytes) is left out, the rest of the message is sent.  The QoS of a message is its
``details.qos`` (other protocols' messages are QoS 0).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from zope.interface import implementer

from brokerd.core.message import MULTICAST, PLAIN, Details, Message
from brokerd.core.principal import Principal
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311, NO_PROPERTIES, PUBLISH, Properties
from brokerd.protocols.mqtt.properties import check_properties
from brokerd.protocols.mqtt.publish import PublishFrame

_PLAIN_DETAILS = {(qos, retained): Details(qos=qos, retained=retained) for qos in (0, 1, 2) for retained in (False, True)}
_PLAIN_DETAILS[(0, False)] = PLAIN


def is_binary(payload: bytes, properties: Properties) -> bool:
    """Whether other protocols should carry ``payload`` as binary: unless a v5 Payload Format
    Indicator says UTF-8, a payload is text when it is valid UTF-8 (ASCII checked first)."""
    if properties.payload_format_indicator == 1 or payload.isascii():
        return False
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def message_details(qos: int, retain: bool, properties: Properties, now: float) -> Details:
    """The Details of an MQTT publish (a PUBLISH or a will): its QoS and retain flag and its
    message properties; a shared one when it has no message properties (the common case)."""
    if properties is NO_PROPERTIES:
        return _PLAIN_DETAILS[(qos, retain)]
    expiry = properties.message_expiry_interval
    if (properties.content_type is None and expiry is None and properties.response_topic is None
            and properties.correlation_data is None and properties.payload_format_indicator is None
            and not properties.user_properties):
        return _PLAIN_DETAILS[(qos, retain)]
    return Details(qos=qos, retained=retain, content_type=properties.content_type,
                   expires=None if expiry is None else now + expiry, response_topic=properties.response_topic,
                   correlation=properties.correlation_data, payload_format=properties.payload_format_indicator,
                   user_properties=properties.user_properties)


def core_message(target: bytes, payload: bytes, qos: int, retain: bool, properties: Properties,
                 sender: bytes, principal: Principal, now: float) -> Message:
    """The core's message for an MQTT publish (a PUBLISH or a will) to topic ``target``: its
    QoS, retain flag and message properties in the Details (:func:`message_details`)."""
    details = _PLAIN_DETAILS[(qos, retain)] if properties is NO_PROPERTIES else message_details(
        qos, retain, properties, now)
    return Message(MULTICAST, target, payload, "mqtt", sender, is_binary(payload, properties),
                   details=details, principal=principal)


def publish_properties(details: Details, now: float) -> Properties:
    """The v5 PUBLISH properties of a message with ``details`` at time ``now`` (see the
    module docstring); a value MQTT cannot carry is left out."""
    if details is PLAIN or (details.content_type is None and details.expires is None
                            and not details.has_properties()):
        return NO_PROPERTIES
    expires = details.expires
    return Properties(
        content_type=details.content_type,
        message_expiry_interval=None if expires is None else min(max(0, int(expires - now)), 0xFFFFFFFF),
        response_topic=details.response_topic, correlation_data=details.correlation,
        payload_format_indicator=details.payload_format, user_properties=details.user_properties)


def carried(properties: Properties) -> Properties:
    """``properties`` without the values a PUBLISH cannot carry (another protocol's)."""
    kept: dict[str, object] = {}
    for name in ("content_type", "message_expiry_interval", "response_topic", "correlation_data",
                 "payload_format_indicator"):
        value = getattr(properties, name)
        if value is not None and _fits(Properties(**{name: value})):
            kept[name] = value
    kept["user_properties"] = tuple(pair for pair in properties.user_properties
                                    if _fits(Properties(user_properties=(pair,))))
    return Properties(**kept)  # type: ignore[arg-type]  # each value was read from the field of its name


def _fits(properties: Properties) -> bool:
    try:
        check_properties(properties, PUBLISH)
    except (ValueError, TypeError):
        return False
    return True


class Rendered:
    """One message as MQTT sessions receive it: its frame and the message (QoS, sender)."""

    __slots__ = ("frame", "message", "qos")

    def __init__(self, frame: PublishFrame, message: Message) -> None:
        self.frame = frame
        self.message = message
        self.qos = message.details.qos


class MQTTPublishes(bytes):
    """The QoS 0 PUBLISH packets of one message or a run, joined, and ``items``: each
    message's :class:`Rendered` (see the module docstring)."""

    items: tuple[Rendered, ...]


_NAME_ENTRIES = 4096
_NAME_LONGEST = 256


def topic_name(target: bytes) -> str | None:
    """The MQTT topic name of a core topic, or None when MQTT cannot name it."""
    try:
        name = target.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not name or "+" in name or "#" in name or "\x00" in name or len(target) > 65_535:
        return None
    return name


@implementer(IWireFormat)
class MQTTWireFormat(WireFormat):
    """Renders core messages as PUBLISH packets of one MQTT protocol version."""

    protocol = "mqtt"
    queued_delivery = False

    def __init__(self, version: int, clock: Callable[[], float]) -> None:
        self.version = version
        self.clock = clock
        self.unrepresentable = 0
        self._names: dict[bytes, str | None] = {}
        """:func:`topic_name` of recent core topics: a run or a busy topic renders message
        after message to one.  Bounded as the frames' topic fields are (:mod:`.publish`)."""

    def _name_of(self, target: bytes) -> str | None:
        name = topic_name(target)
        if len(target) <= _NAME_LONGEST:
            if len(self._names) >= _NAME_ENTRIES:
                self._names.clear()
            self._names[target] = name
        return name

    def rendered(self, message: Message) -> Rendered | None:
        """``message`` as MQTT sessions of this version receive it (a retained message sent
        to a new subscription, a stored one read for a persistent session); None when MQTT
        cannot carry it (no multicast, no valid topic name)."""
        target = message.target
        if message.kind != MULTICAST or target is None:  # a multicast always has its topic
            return None
        name: str | None | Literal[False] = self._names.get(target, False)  # False: not named yet
        if name is False:
            name = self._name_of(target)
        if name is None:
            return None
        properties = NO_PROPERTIES
        if self.version == MQTT_5:
            details = message.details
            if details is not PLAIN:
                properties = publish_properties(details, self.clock())
        try:
            frame = PublishFrame(name, message.payload, self.version, properties)
        except (ValueError, TypeError):
            if properties is NO_PROPERTIES:
                raise
            frame = PublishFrame(name, message.payload, self.version, carried(properties))
        return Rendered(frame, message)

    def render_message(self, message: Message) -> MQTTPublishes | None:
        rendered = self.rendered(message)
        if rendered is None:
            self.unrepresentable += 1
            return None
        data = MQTTPublishes(rendered.frame.packet())
        data.items = (rendered,)
        return data

    def render_run(self, messages: list[Message]) -> MQTTPublishes | None:
        """A run as one MQTTPublishes; None when one message of it cannot be carried (the
        core then renders them one by one and counts what it drops)."""
        items = []
        for message in messages:
            rendered = self.rendered(message)
            if rendered is None:
                return None
            items.append(rendered)
        data = MQTTPublishes(b"".join(item.frame.packet() for item in items))
        data.items = tuple(items)
        return data

    def render_presence(self, topic: bytes, member: ISubscriber, joined: bool, presence: bool) -> None:
        """MQTT has no presence events."""
        return


def wire_formats(clock: Callable[[], float]) -> dict[int, MQTTWireFormat]:
    """One wire format per protocol version, sharing ``clock``."""
    return {MQTT_311: MQTTWireFormat(MQTT_311, clock), MQTT_5: MQTTWireFormat(MQTT_5, clock)}

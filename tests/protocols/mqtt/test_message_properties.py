"""The message properties as MQTT sessions get them, on a Clock: v5 PUBLISHes carry them (user
properties in order), 3.1.1 ones do not; the Message Expiry Interval sent is what is left of it
when the message leaves the session's queue, and a message that expired while it waited, or a
retained one that expired, is not sent."""
from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Details, Message
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.protocols.mqtt.decoder import MQTTClientDecoder
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311, Publish
from brokerd.protocols.mqtt.retaining import RetainedDelivery
from brokerd.protocols.mqtt.session import MQTTSession, SubscriptionOptions
from brokerd.protocols.mqtt.wire import wire_formats

ALICE = Principal("alice", ACCOUNT)
REQUEST = Details(qos=1, content_type="text/plain", response_topic="replies/1", correlation=b"\x00\x01",
                  payload_format=1, user_properties=(("b", "2"), ("a", "1"), ("b", "3")))


def _published(version: int, data: bytes) -> list[Publish]:
    packets, error = MQTTClientDecoder(version).feed(data)
    assert error is None
    return packets  # type: ignore[return-value]


def _clock() -> Clock:
    clock = Clock()
    clock.advance(1000)
    return clock


def test_v5_carries_the_properties_in_order_and_311_gets_the_bare_message():
    clock = _clock()
    formats = wire_formats(clock.seconds)
    message = Message(MULTICAST, b"req", b"body", "smqp", b"alice", details=REQUEST.replace(expires=1600.0))
    [v5] = _published(MQTT_5, formats[MQTT_5].render_message(message))
    properties = v5.properties
    assert (properties.response_topic, properties.correlation_data, properties.payload_format_indicator,
            properties.content_type, properties.message_expiry_interval) == ("replies/1", b"\x00\x01", 1,
                                                                              "text/plain", 600)
    assert properties.user_properties == (("b", "2"), ("a", "1"), ("b", "3"))
    [v3] = _published(MQTT_311, formats[MQTT_311].render_message(message))
    assert (v3.topic, v3.payload) == ("req", b"body")


def test_a_property_mqtt_cannot_carry_is_left_out_and_the_rest_is_sent():
    """Another protocol's text may hold what an MQTT string may not (U+0000), or a response
    topic a wildcard: those values are not sent, the message and its other properties are."""
    formats = wire_formats(_clock().seconds)
    details = REQUEST.replace(response_topic="replies/#", user_properties=(("ok", "1"), ("bad", "a\x00b")))
    message = Message(MULTICAST, b"req", b"body", "smqp", b"alice", details=details)
    [v5] = _published(MQTT_5, formats[MQTT_5].render_message(message))
    assert v5.payload == b"body" and v5.properties.response_topic is None
    assert v5.properties.user_properties == (("ok", "1"),) and v5.properties.correlation_data == b"\x00\x01"


def _session(clock: Clock, window: int) -> tuple[MQTTSession, StringTransport]:
    session = MQTTSession("dev", ALICE, wire_formats(clock.seconds)[MQTT_5], window, 10)
    transport = StringTransport()
    session.bind(SimpleNamespace(transport=transport, write_now=transport.write, congested=False), window, None)
    session.subscribed("a/+", SubscriptionOptions(1, matched=b"a/+"))
    return session, transport


def test_a_queued_message_is_sent_with_the_expiry_it_has_left_and_not_once_expired():
    clock = _clock()
    session, transport = _session(clock, window=1)
    formats = session.wire_format
    for payload, expires in ((b"first", None), (b"lasting", 1600.0), (b"short", 1050.0), (b"last", None)):
        message = Message(MULTICAST, b"a/b", payload, "mqtt", b"pub", details=REQUEST.replace(expires=expires))
        session.send(formats.render_message(message))
    [first] = _published(MQTT_5, transport.value())
    assert first.payload == b"first" and len(session.queued) == 3
    transport.clear()

    clock.advance(100)  # "lasting" has 500 s left; "short" expired
    session.acknowledged(first.packet_id)
    [lasting] = _published(MQTT_5, transport.value())
    assert lasting.payload == b"lasting" and lasting.properties.message_expiry_interval == 500
    assert lasting.properties.user_properties == REQUEST.user_properties
    transport.clear()
    dropped = session.dropped
    session.acknowledged(lasting.packet_id)
    [last] = _published(MQTT_5, transport.value())
    assert last.payload == b"last" and session.dropped == dropped + 1, "the expired one was not sent"


def test_an_expired_retained_message_is_not_sent_to_a_new_subscription():
    """The retained messages a new subscription gets (brokerd/protocols/mqtt/retaining.py)
    leave out those whose Message Expiry Interval has passed; the others carry what is left."""
    clock = _clock()
    broker = Broker()
    for topic, expires in ((b"s/short", 1010.0), (b"s/long", 2000.0), (b"s/never", None)):
        broker.retained.retain(Message(MULTICAST, topic, topic, "mqtt", b"p",
                                       details=Details(retained=True, expires=expires)))
    session, transport = _session(clock, window=10)
    session.subscribed("s/#", SubscriptionOptions(0, matched=b"s/#"))
    connection = SimpleNamespace(closed=False, congested=False, factory=SimpleNamespace(broker=broker),
                                 transport=transport, write_now=transport.write)
    session.connection = connection
    clock.advance(10)
    RetainedDelivery(connection, session, clock).add("s/#")
    clock.advance(0)
    sent = _published(MQTT_5, transport.value())
    assert [(p.payload, p.properties.message_expiry_interval) for p in sent] == [(b"s/long", 990), (b"s/never", None)]

"""MQTT 5 message properties through a real ``twistd brokerd``, driven by paho-mqtt: request and
response between two v5 clients (Response Topic, Correlation Data, ordered and repeated User
Properties, Content Type, Payload Format Indicator, Message Expiry Interval), the same message
to a 3.1.1 subscriber without them, the properties kept for a retained message and for a
persistent session away, and a message over the property limits refused with 0x97.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311
from paho.mqtt.packettypes import PacketTypes

from tests.integration.test_mqtt_paho import (  # noqa: F401  (clients: the fixture, on this module's broker)
    ANONYMOUS_SESSIONS,
    MQTT_LISTENER,
    assert_clean_log,
    clients,
    properties,
    unique,
)
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

REQUEST_PROPERTIES = {
    "ResponseTopic": "",  # set per test
    "CorrelationData": b"\x00\xffrequest-7",
    "UserProperty": [("trace", "a"), ("lang", "fr"), ("trace", "b")],
    "ContentType": "application/json",
    "PayloadFormatIndicator": 1,
    "MessageExpiryInterval": 600,
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-properties"), "--max-user-properties", "4",
                           "--max-property-bytes", "200", *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


def assert_request_properties(got: Any, response_topic: str) -> None:
    props = got.properties
    assert props.ResponseTopic == response_topic
    assert props.CorrelationData == b"\x00\xffrequest-7"
    assert props.UserProperty == [("trace", "a"), ("lang", "fr"), ("trace", "b")], "in order, repeated"
    assert props.ContentType == "application/json"
    assert props.PayloadFormatIndicator == 1
    assert 0 < props.MessageExpiryInterval <= 600


def test_request_and_response_between_two_v5_clients_and_a_v311_subscriber_gets_the_bare_message(clients) -> None:
    requests = unique("requests", MQTTv5)
    replies = unique("replies", MQTTv5)
    requester = clients(MQTTv5)
    requester.subscribe(replies, 1)
    responder = clients(MQTTv5)
    responder.subscribe(requests, 1)
    old = clients(MQTTv311)
    old.subscribe(requests, 1)

    requester.publish(requests, b'{"op": "time"}', 1, **{**REQUEST_PROPERTIES, "ResponseTopic": replies})
    request = responder.message()
    assert request.payload == b'{"op": "time"}'
    assert_request_properties(request, replies)
    responder.publish(request.properties.ResponseTopic, b'{"time": 1}', 1,
                      CorrelationData=request.properties.CorrelationData)
    reply = requester.message()
    assert (reply.topic, reply.payload) == (replies, b'{"time": 1}')
    assert reply.properties.CorrelationData == b"\x00\xffrequest-7"
    assert not hasattr(reply.properties, "ResponseTopic"), "a reply carries only what its sender set"

    bare = old.message()  # a 3.1.1 PUBLISH has no property block: paho would read it as payload
    assert (bare.topic, bare.payload, bare.qos) == (requests, b'{"op": "time"}', 1)


def test_a_retained_message_keeps_its_properties(clients) -> None:
    topic = unique("retained-props", MQTTv5)
    pub = clients(MQTTv5)
    pub.publish(topic, b"state", 1, retain=True, **{**REQUEST_PROPERTIES, "ResponseTopic": "ask/" + topic})
    late = clients(MQTTv5)
    late.subscribe(topic, 1)
    got = late.message()
    assert (got.payload, got.retain) == (b"state", True)
    assert_request_properties(got, "ask/" + topic)


def test_a_persistent_session_away_gets_the_properties_from_the_store(clients) -> None:
    topic = unique("stored-props", MQTTv5)
    client_id = unique("stored-props", MQTTv5)
    first = clients(MQTTv5, client_id, clean=False, expiry=300)
    first.subscribe(topic, 1)
    first.disconnect()
    pub = clients(MQTTv5)
    pub.publish(topic, b"while away", 1, **{**REQUEST_PROPERTIES, "ResponseTopic": "back/" + client_id})
    back = clients(MQTTv5, client_id, clean=False, expiry=300)
    got = back.message()
    assert got.payload == b"while away"
    assert_request_properties(got, "back/" + client_id)


def test_properties_over_the_limits_are_refused_with_quota_exceeded(clients) -> None:
    """``--max-user-properties 4`` and ``--max-property-bytes 200`` (this module's broker): at
    the limit a message goes; one pair more, or one byte more, is answered 0x97 and not
    delivered."""
    topic = unique("limits", MQTTv5)
    sub = clients(MQTTv5)
    sub.subscribe(topic, 1)
    pub = clients(MQTTv5)
    four = [("k", str(n)) for n in range(4)]
    assert pub.publish(topic, b"four pairs", 1, UserProperty=four) == 0
    assert pub.publish(topic, b"five pairs", 1, UserProperty=[*four, ("k", "4")]) == 0x97
    assert pub.publish(topic, b"200 bytes", 1, CorrelationData=b"c" * 190, ContentType="text/plain") == 0
    assert pub.publish(topic, b"201 bytes", 1, CorrelationData=b"c" * 191, ContentType="text/plain") == 0x97
    assert pub.publish(topic, b"sentinel", 1) == 0
    assert [m.payload for m in sub.messages_until(b"sentinel")] == [b"four pairs", b"200 bytes", b"sentinel"]


def test_a_will_over_the_limits_is_refused_at_connect(clients) -> None:
    """The will's properties are bounded as a PUBLISH's: CONNACK 0x97 for five pairs, while
    four connect, and that will, published when its connection breaks, keeps them."""
    topic = unique("will-props", MQTTv5)
    four = [("k", str(n)) for n in range(4)]
    refused = clients(MQTTv5, connect=False, will=(topic, b"gone", 1, False,
                                                   properties(PacketTypes.WILLMESSAGE, UserProperty=[*four, ("k", "4")])))
    refused.start()
    assert refused.connack()[1] == 0x97
    watcher = clients(MQTTv5)
    watcher.subscribe(topic, 1)
    accepted = clients(MQTTv5, will=(topic, b"gone", 1, False, properties(PacketTypes.WILLMESSAGE, UserProperty=four)))
    accepted.abort()
    got = watcher.message()
    assert got.payload == b"gone" and got.properties.UserProperty == four

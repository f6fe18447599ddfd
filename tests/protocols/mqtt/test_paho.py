"""A cross-check against another implementation: paho-mqtt's client, driven through its public
API over a loopback socket, talks to this codec playing the server.  What paho sends (CONNECT
with a will, user name and password; SUBSCRIBE; PUBLISH; the QoS 2 answers; UNSUBSCRIBE;
DISCONNECT) decodes to the packets the calls asked for, and what this codec encodes (CONNACK,
SUBACK, PUBACK, PUBLISH, PUBREL, UNSUBACK) paho reads back with the values sent: in MQTT 3.1.1
and in MQTT 5.0 with properties."""
from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from brokerd.protocols.mqtt.decoder import MQTTServerDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Connack,
    Connect,
    Disconnect,
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

BOUND = 10.0
"""Seconds any one wait may take before the test fails."""


class Server:
    """The server end of one connection: a real socket, this codec on it."""

    def __init__(self, listener: socket.socket, client) -> None:
        self.connection, _ = listener.accept()
        self.connection.settimeout(0.05)
        self.client = client
        self.decoder = MQTTServerDecoder()
        self.waiting: list = []

    def expect(self):
        """The next packet paho sends, running paho's loop meanwhile (it may have to read what
        this end sent before it answers), within the bound."""
        for _ in range(int(BOUND / 0.1)):
            if self.waiting:
                return self.waiting.pop(0)
            self.client.loop(timeout=0.05)
            try:
                data = self.connection.recv(65536)
            except TimeoutError:
                continue
            assert data, "paho closed the connection"
            packets, error = self.decoder.feed(data)
            assert error is None, error
            self.waiting += packets
        raise AssertionError("paho sent nothing")

    def send(self, packet) -> None:
        self.connection.sendall(encode(packet, self.decoder.version))


class Recorder:
    """paho's callbacks, recorded."""

    def __init__(self, client) -> None:
        self.events: dict[str, list] = {"connect": [], "subscribe": [], "publish": [], "message": [], "unsubscribe": []}
        client.on_connect = lambda c, u, flags, rc, props: self.events["connect"].append((flags, rc, props))
        client.on_subscribe = lambda c, u, mid, codes, props: self.events["subscribe"].append((mid, codes, props))
        client.on_publish = lambda c, u, mid, rc, props: self.events["publish"].append((mid, rc, props))
        client.on_message = lambda c, u, message: self.events["message"].append(message)
        client.on_unsubscribe = lambda c, u, mid, codes, props: self.events["unsubscribe"].append((mid, codes, props))

    def pump(self, client, kind: str):
        """Run paho's loop until its ``kind`` callback has been called (within the bound)."""
        for _ in range(int(BOUND / 0.1)):
            if self.events[kind]:
                return self.events[kind].pop(0)
            client.loop(timeout=0.1)
        raise AssertionError(f"paho never called on_{kind}")


@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    sock.settimeout(BOUND)
    yield sock
    sock.close()


def _paho_properties(packet_type: int, **values) -> PahoProperties:
    properties = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def test_paho_mqtt_3_1_1(listener) -> None:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-311", protocol=mqtt.MQTTv311)
    recorder = Recorder(client)
    client.username_pw_set("user", "secret")
    client.will_set("will/topic", b"gone", qos=1, retain=True)
    client.connect("127.0.0.1", listener.getsockname()[1], keepalive=30)
    server = Server(listener, client)
    try:
        assert server.expect() == Connect("paho-311", True, 30, Will("will/topic", b"gone", 1, True), "user", b"secret")
        assert server.decoder.version == MQTT_311
        server.send(Connack(True, 0))
        flags, code, _ = recorder.pump(client, "connect")
        assert (flags.session_present, code.value) == (True, 0)

        _, mid = client.subscribe([("a/+", 1), ("b/#", 2)])
        assert server.expect() == Subscribe(mid, (Subscription("a/+", 1), Subscription("b/#", 2)))
        server.send(Suback(mid, (1, 0x80)))
        got_mid, codes, _ = recorder.pump(client, "subscribe")
        assert (got_mid, [c.value for c in codes]) == (mid, [1, 0x80])

        info = client.publish("a/b", b"payload", qos=1, retain=True)
        assert server.expect() == Publish("a/b", b"payload", 1, True, False, info.mid)
        server.send(Puback(info.mid))
        assert recorder.pump(client, "publish")[0] == info.mid

        server.send(Publish("b/c", b"to you", 2, False, False, 77))
        assert server.expect() == Pubrec(77)
        server.send(Pubrel(77))
        assert server.expect() == Pubcomp(77)
        message = recorder.pump(client, "message")
        assert (message.topic, message.payload, message.qos, message.mid) == ("b/c", b"to you", 2, 77)

        _, mid = client.unsubscribe("a/+")
        assert server.expect() == Unsubscribe(mid, ("a/+",))
        server.send(Unsuback(mid))
        assert recorder.pump(client, "unsubscribe")[0] == mid

        client.disconnect()
        assert server.expect() == Disconnect()
    finally:
        client.loop(timeout=0)
        server.connection.close()


def test_paho_mqtt_5(listener) -> None:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-5", protocol=mqtt.MQTTv5)
    recorder = Recorder(client)
    client.username_pw_set("user", "secret")
    will_properties = _paho_properties(PacketTypes.WILLMESSAGE, WillDelayInterval=5, ContentType="text/plain")
    client.will_set("will/topic", b"gone", qos=2, retain=False, properties=will_properties)
    connect_properties = _paho_properties(
        PacketTypes.CONNECT, SessionExpiryInterval=120, ReceiveMaximum=10, UserProperty=("k", "v")
    )
    client.connect("127.0.0.1", listener.getsockname()[1], keepalive=30, clean_start=True, properties=connect_properties)
    server = Server(listener, client)
    try:
        assert server.expect() == Connect(
            "paho-5",
            True,
            30,
            Will("will/topic", b"gone", 2, False, Properties(content_type="text/plain", will_delay_interval=5)),
            "user",
            b"secret",
            Properties(session_expiry_interval=120, receive_maximum=10, user_properties=(("k", "v"),)),
        )
        assert server.decoder.version == MQTT_5
        server.send(Connack(False, 0, Properties(reason_string="welcome", topic_alias_maximum=4, retain_available=1)))
        flags, code, properties = recorder.pump(client, "connect")
        assert (flags.session_present, code.value) == (False, 0)
        assert (properties.ReasonString, properties.TopicAliasMaximum, properties.RetainAvailable) == ("welcome", 4, 1)

        _, mid = client.subscribe(
            [
                ("a/+", SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True, retainHandling=2)),
                ("$share/g/b/#", SubscribeOptions(qos=2)),
            ],
            properties=_paho_properties(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=42),
        )
        assert server.expect() == Subscribe(
            mid,
            (Subscription("a/+", 1, True, True, 2), Subscription("$share/g/b/#", 2)),
            Properties(subscription_identifiers=(42,)),
        )
        server.send(Suback(mid, (1, 0x9E), Properties(reason_string="no shares")))
        got_mid, codes, properties = recorder.pump(client, "subscribe")
        assert (got_mid, [c.value for c in codes], properties.ReasonString) == (mid, [1, 0x9E], "no shares")

        publish_properties = _paho_properties(
            PacketTypes.PUBLISH,
            PayloadFormatIndicator=1,
            MessageExpiryInterval=60,
            ResponseTopic="reply/here",
            CorrelationData=b"\x01\x02",
            UserProperty=[("a", "1"), ("a", "2")],
        )
        info = client.publish("a/b", b"payload", qos=1, retain=True, properties=publish_properties)
        assert server.expect() == Publish(
            "a/b",
            b"payload",
            1,
            True,
            False,
            info.mid,
            Properties(
                payload_format_indicator=1,
                message_expiry_interval=60,
                response_topic="reply/here",
                correlation_data=b"\x01\x02",
                user_properties=(("a", "1"), ("a", "2")),
            ),
        )
        server.send(Puback(info.mid, 0x10, Properties(reason_string="nobody")))
        got_mid, code, _ = recorder.pump(client, "publish")
        assert (got_mid, code.value) == (info.mid, 0x10)

        server.send(Publish("b/c", b"to you", 2, False, False, 77, Properties(subscription_identifiers=(42,))))
        assert server.expect() == Pubrec(77)
        server.send(Pubrel(77))
        assert server.expect() == Pubcomp(77)
        message = recorder.pump(client, "message")
        assert (message.topic, message.payload, message.qos) == ("b/c", b"to you", 2)
        assert message.properties.SubscriptionIdentifier == [42]

        _, mid = client.unsubscribe(["a/+", "$share/g/b/#"])
        assert server.expect() == Unsubscribe(mid, ("a/+", "$share/g/b/#"))
        server.send(Unsuback(mid, (0x00, 0x11)))
        got_mid, codes, _ = recorder.pump(client, "unsubscribe")
        assert (got_mid, [c.value for c in codes]) == (mid, [0x00, 0x11])

        client.disconnect(
            reasoncode=ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"),
            properties=_paho_properties(PacketTypes.DISCONNECT, SessionExpiryInterval=0),
        )
        assert server.expect() == Disconnect(0x04, Properties(session_expiry_interval=0))
    finally:
        client.loop(timeout=0)
        server.connection.close()

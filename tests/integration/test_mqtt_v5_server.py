"""MQTT 5's server side, over raw sockets to a real ``twistd brokerd``: the client's Receive
Maximum holds QoS 1 messages back in the session (in order), Server Keep Alive when
``--mqtt-max-keep-alive`` lowers the client's, Response Information when asked, Reason Strings
on refusals (unless Request Problem Information is 0), and Topic Aliases from the server up to
the client's Topic Alias Maximum.

The packets sent are written by hand (test_mqtt_bad_input's helpers); the properties received
are read with paho's own property reader, not the codec under test.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from paho.mqtt.client import MQTTv5
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.integration.test_mqtt_bad_input import (
    RawMQTT,
    packet,
    publish_packet,
    string,
    subscribe_packet,
    varint,
)
from tests.integration.test_mqtt_paho import MQTT_LISTENER, MQTTClient, assert_clean_log
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

MAX_KEEP_ALIVE = 30
TOPIC_ALIASES = 3
"""``--mqtt-topic-alias-maximum``: fewer than the client below takes."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-v5-server"), "--mqtt-max-keep-alive", str(MAX_KEEP_ALIVE),
                           "--mqtt-topic-alias-maximum", str(TOPIC_ALIASES), "--max-user-properties", "1",
                           listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


@pytest.fixture
def raw(broker: RunningBroker) -> Iterator[Callable[[], RawMQTT]]:
    made: list[RawMQTT] = []

    def make() -> RawMQTT:
        client = RawMQTT(broker)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def publisher(broker: RunningBroker) -> Iterator[MQTTClient]:
    client = MQTTClient(broker.ports["mqtt"], MQTTv5)
    yield client
    client.disconnect()


def read_properties(data: bytes, packet_type: int) -> tuple[Properties, bytes]:
    """The property block at the start of ``data`` (paho's reader), and what follows it; none
    when an acknowledgement left its block out (3.4.2.2.1: allowed without properties)."""
    properties = Properties(packet_type)
    if not data:
        return properties, data
    _, length = properties.unpack(data)
    return properties, data[length:]


def connect(client: RawMQTT, client_id: str, *, keepalive: int = 60, properties: bytes = b"") -> Properties:
    """A v5 CONNECT with ``properties`` (written by hand); the CONNACK's properties (success)."""
    body = string(b"MQTT") + bytes((5, 0x02)) + keepalive.to_bytes(2, "big") + varint(len(properties)) + properties
    client.send(packet(0x10, body + string(client_id)))
    got = client.read()
    assert got is not None and got[0] == 0x20 and got[1][1] == 0, got
    return read_properties(got[1][2:], PacketTypes.CONNACK)[0]


def received_publish(got: tuple[int, bytes] | None) -> tuple[str, int, Properties, bytes]:
    """(topic, packet id or 0, properties, payload) of a v5 PUBLISH."""
    assert got is not None and got[0] & 0xF0 == 0x30, got
    first, body = got
    size = int.from_bytes(body[:2], "big")
    topic, rest = body[2:2 + size].decode(), body[2 + size:]
    packet_id = 0
    if first & 0x06:
        packet_id, rest = int.from_bytes(rest[:2], "big"), rest[2:]
    properties, payload = read_properties(rest, PacketTypes.PUBLISH)
    return topic, packet_id, properties, payload


def until_pingresp(client: RawMQTT) -> list[tuple[int, bytes]]:
    """PINGREQ, and every packet that comes before its PINGRESP."""
    client.send(b"\xc0\x00")
    got = []
    while True:
        one = client.read()
        assert one is not None
        if one[0] == 0xD0:
            return got
        got.append(one)


def u16(identifier: int, value: int) -> bytes:
    return bytes((identifier,)) + value.to_bytes(2, "big")


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


def test_the_clients_receive_maximum_holds_qos_1_messages_back_in_order(raw, publisher: MQTTClient) -> None:
    """Receive Maximum 2 and no PUBACK: exactly two in flight; each PUBACK lets the next one
    go, in the order published."""
    client = raw()
    connect(client, "rm2", properties=u16(0x21, 2))
    client.send(subscribe_packet(5, "rm/t", 1, 1))
    assert client.read() == (0x90, b"\x00\x01\x00\x01")
    for n in range(5):
        assert publisher.publish("rm/t", f"m{n}".encode(), 1) == 0  # routed to the session before its PUBACK
    sent = [received_publish(one) for one in until_pingresp(client)]
    assert [payload for _t, _id, _p, payload in sent] == [b"m0", b"m1"], "two in flight, the rest wait"
    client.send(puback(sent[0][1]))
    [third] = [received_publish(one) for one in until_pingresp(client)]
    assert third[3] == b"m2"
    client.send(puback(sent[1][1]) + puback(third[1]))
    rest = [received_publish(one) for one in until_pingresp(client)]
    assert [payload for _t, _id, _p, payload in rest] == [b"m3", b"m4"]


def test_server_keep_alive_is_announced_when_the_server_lowers_the_clients(raw) -> None:
    assert connect(raw(), "ka-long", keepalive=600).ServerKeepAlive == MAX_KEEP_ALIVE
    assert connect(raw(), "ka-none", keepalive=0).ServerKeepAlive == MAX_KEEP_ALIVE, "0 (none) is longer than any"
    assert not hasattr(connect(raw(), "ka-short", keepalive=10), "ServerKeepAlive"), "the client's own applies"


def test_response_information_is_sent_when_asked(raw) -> None:
    assert connect(raw(), "asker", properties=b"\x19\x01").ResponseInformation == "reply/asker"
    assert not hasattr(connect(raw(), "not-asking"), "ResponseInformation")
    assert not hasattr(connect(raw(), "asks-not", properties=b"\x19\x00"), "ResponseInformation")


def test_refusals_carry_reason_strings_unless_the_client_asked_for_none(raw) -> None:
    """A PUBACK 0x97 (two user properties, over ``--max-user-properties 1``) and a SUBACK
    0x8F carry a Reason String; with Request Problem Information 0 they do not; what is
    allowed gets its plain success (the positive control)."""
    for problem_information, expect in ((b"", True), (b"\x17\x00", False)):
        client = raw()
        connect(client, f"reasons-{bool(problem_information)}", properties=problem_information)
        two = b"\x26" + string("a") + string("1") + b"\x26" + string("b") + string("2")
        client.send(publish_packet(5, "r/t", b"x", 1, 7, two) + publish_packet(5, "r/t", b"x", 1, 8))
        first, body = client.read()
        assert (first, body[:3]) == (0x40, b"\x00\x07\x97")
        properties, _ = read_properties(body[3:], PacketTypes.PUBACK)
        assert hasattr(properties, "ReasonString") is expect
        if expect:
            assert "2 user properties" in properties.ReasonString
        assert client.read() == (0x40, b"\x00\x08"), "one user property less: published"
        client.send(packet(0x82, b"\x00\x09\x00" + string("a/#/b") + b"\x01" + string("fine/+") + b"\x01"))
        first, body = client.read()
        assert first == 0x90 and body[:2] == b"\x00\x09"
        properties, codes = read_properties(body[2:], PacketTypes.SUBACK)
        assert codes == b"\x8f\x01"
        assert (getattr(properties, "ReasonString", None) == "refused 1: not a valid topic filter") is expect
        assert hasattr(properties, "ReasonString") is expect


def test_topic_aliases_go_to_a_client_that_takes_them(raw, publisher: MQTTClient) -> None:
    """The client takes 8, the server sets at most ``--mqtt-topic-alias-maximum`` (3): each of
    the first three topics comes once with its name and an alias, then by the alias alone (an
    empty topic name); a fourth topic always comes by name.  A new connection starts afresh,
    and a client that takes none gets names only."""
    client = raw()
    connect(client, "aliased", properties=u16(0x22, 8))
    client.send(subscribe_packet(5, "al/#", 0, 1))
    assert client.read()[0] == 0x90
    topics = ["al/a", "al/b", "al/a", "al/c", "al/d", "al/d", "al/b"]
    for n, topic in enumerate(topics):
        publisher.publish(topic, f"{n}".encode(), 1)
    got = [received_publish(one) for one in until_pingresp(client)]
    assert [(topic, getattr(props, "TopicAlias", None), payload) for topic, _id, props, payload in got] == [
        ("al/a", 1, b"0"), ("al/b", 2, b"1"), ("", 1, b"2"), ("al/c", 3, b"3"), ("al/d", None, b"4"),
        ("al/d", None, b"5"), ("", 2, b"6")]

    plain = raw()
    connect(plain, "unaliased")
    plain.send(subscribe_packet(5, "al/#", 0, 1))
    assert plain.read()[0] == 0x90
    publisher.publish("al/a", b"again", 1)
    [(topic, _id, props, payload)] = [received_publish(one) for one in until_pingresp(plain)]
    assert (topic, hasattr(props, "TopicAlias"), payload) == ("al/a", False, b"again")
    [(topic, _id, props, payload)] = [received_publish(one) for one in until_pingresp(client)]
    assert (topic, props.TopicAlias, payload) == ("", 1, b"again")


def test_a_payload_that_is_not_the_utf8_its_payload_format_indicator_says_is_refused(raw) -> None:
    """3.3.2.3.2: PUBACK 0x99 with a Reason String, and not published; the same bytes without
    the indicator, and UTF-8 with it, are published (the positive controls)."""
    client = raw()
    connect(client, "format")
    client.send(subscribe_packet(5, "pf/t", 0, 1))
    assert client.read()[0] == 0x90
    client.send(publish_packet(5, "pf/t", b"\xff\xfe", 1, 1, b"\x01\x01") + publish_packet(5, "pf/t", b"\xff\xfe", 1, 2)
                + publish_packet(5, "pf/t", "\u00e9t\u00e9".encode(), 1, 3, b"\x01\x01"))
    got = until_pingresp(client)
    acks = [(body[:2], body[2:3]) for first, body in got if first == 0x40]
    assert acks == [(b"\x00\x01", b"\x99"), (b"\x00\x02", b""), (b"\x00\x03", b"")]
    refusal = next(body for first, body in got if first == 0x40 and body[:2] == b"\x00\x01")
    assert "not UTF-8" in read_properties(refusal[3:], PacketTypes.PUBACK)[0].ReasonString
    published = [received_publish(one) for one in got if one[0] & 0xF0 == 0x30]
    assert [(payload, getattr(props, "PayloadFormatIndicator", None)) for _t, _id, props, payload in published] == [
        (b"\xff\xfe", None), ("\u00e9t\u00e9".encode(), 1)]


def test_unsubscribing_what_was_not_subscribed_says_so(raw) -> None:
    client = raw()
    connect(client, "unsub")
    client.send(subscribe_packet(5, "u/a", 0, 1))
    assert client.read()[0] == 0x90
    client.send(packet(0xA2, b"\x00\x02\x00" + string("u/a") + string("u/never")))
    first, body = client.read()
    assert first == 0xB0 and body[:2] == b"\x00\x02"
    properties, codes = read_properties(body[2:], PacketTypes.UNSUBACK)
    assert codes == b"\x00\x11" and properties.ReasonString == "no subscription existed for 2"

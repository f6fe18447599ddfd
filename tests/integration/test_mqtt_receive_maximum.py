"""The server's Receive Maximum (MQTT 5.0 3.3.4, 4.9) over raw sockets to a real ``twistd brokerd``.

The CONNACK announces ``--mqtt-max-inflight`` as the Receive Maximum: QoS 1 and 2 PUBLISHes
whose flow is not over count against it, a QoS 2 one until its PUBREL came (the server sent
PUBCOMP), not only until its PUBREC was written.  One more gets DISCONNECT 0x93 in v5; a 3.1.1
connection, which is told no limit, is closed past the same one.  A client that releases its
messages as it goes publishes as many as it likes, which every test shows beside the refusal.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.test_mqtt_bad_input import (
    V5,
    V311,
    RawMQTT,
    connect_packet,
    packet,
    publish_packet,
)
from tests.integration.test_mqtt_paho import MQTT_LISTENER, MQTTClient, assert_clean_log
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

RECEIVE_MAXIMUM = 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-receive-maximum"),
                           "--mqtt-max-inflight", str(RECEIVE_MAXIMUM), listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


@pytest.fixture
def watcher(broker: RunningBroker) -> Iterator[MQTTClient]:
    """A v5 subscriber to ``rm/#``: what the raw clients publish reaches it."""
    client = MQTTClient(broker.ports["mqtt"], MQTTv5)
    assert client.subscribe("rm/#", 0) == 0
    yield client
    client.disconnect()


def pubrel_packet(packet_id: int) -> bytes:
    return packet(0x62, packet_id.to_bytes(2, "big"))


def pubrec(packet_id: int) -> tuple[int, bytes]:
    return 0x50, packet_id.to_bytes(2, "big")


def pubcomp(packet_id: int) -> tuple[int, bytes]:
    return 0x70, packet_id.to_bytes(2, "big")


def _connected(broker: RunningBroker, version: int, client_id: str) -> RawMQTT:
    client = RawMQTT(broker)
    client.send(connect_packet(version, client_id))
    first, body = client.read()
    assert first == 0x20 and body[1] == 0, body
    if version == V5:
        assert b"\x21" + RECEIVE_MAXIMUM.to_bytes(2, "big") in body, "the CONNACK announces the Receive Maximum"
    return client


@pytest.mark.parametrize("version", [pytest.param(V311, id="3.1.1"), pytest.param(V5, id="5.0")])
def test_qos2_messages_waiting_for_pubrel_count_against_the_receive_maximum(
        broker: RunningBroker, watcher: MQTTClient, version: int) -> None:
    # Allowed: released as they go, many more than the Receive Maximum, one at a time.
    releasing = _connected(broker, version, f"rm-releasing-{version}")
    count = 4 * RECEIVE_MAXIMUM
    for packet_id in range(1, count + 1):
        releasing.send(publish_packet(version, "rm/released", b"%d" % packet_id, 2, packet_id))
        assert releasing.read() == pubrec(packet_id)
        releasing.send(pubrel_packet(packet_id))
        assert releasing.read() == pubcomp(packet_id)
    assert [watcher.message().payload for _ in range(count)] == [b"%d" % n for n in range(1, count + 1)]
    releasing.close()

    # Never released: the Receive Maximum's worth is taken, one more ends the connection.
    hoarding = _connected(broker, version, f"rm-hoarding-{version}")
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):
        hoarding.send(publish_packet(version, "rm/hoarded", b"h%d" % packet_id, 2, packet_id))
        assert hoarding.read() == pubrec(packet_id)
    hoarding.send(publish_packet(version, "rm/hoarded", b"one too many", 2, RECEIVE_MAXIMUM + 1))
    if version == V5:
        assert hoarding.disconnect_reason() == 0x93  # Receive Maximum exceeded
    else:
        hoarding.closed()
    got = [watcher.message().payload for _ in range(RECEIVE_MAXIMUM)]
    assert got == [b"h%d" % n for n in range(1, RECEIVE_MAXIMUM + 1)]
    marker = MQTTClient(broker.ports["mqtt"], MQTTv5)
    assert marker.publish("rm/marker", b"after", 1) == 0
    assert watcher.message().payload == b"after", "the one too many was not published"
    marker.disconnect()


def test_a_released_slot_is_free_again_and_qos1_counts_with_qos2(broker: RunningBroker, watcher: MQTTClient) -> None:
    client = _connected(broker, V5, "rm-mixed")
    client.send(publish_packet(V5, "rm/mixed", b"q1", 1, 100))
    assert client.read() == (0x40, b"\x00\x64")  # a QoS 1 flow is over with its PUBACK
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):
        client.send(publish_packet(V5, "rm/mixed", b"q2-%d" % packet_id, 2, packet_id))
        assert client.read() == pubrec(packet_id)
    client.send(pubrel_packet(1))
    assert client.read() == pubcomp(1)
    client.send(publish_packet(V5, "rm/mixed", b"in the freed slot", 2, 200))
    assert client.read() == pubrec(200)
    client.send(publish_packet(V5, "rm/mixed", b"over", 1, 201))
    assert client.disconnect_reason() == 0x93
    got = [watcher.message().payload for _ in range(RECEIVE_MAXIMUM + 2)]
    assert got == [b"q1"] + [b"q2-%d" % n for n in range(1, RECEIVE_MAXIMUM + 1)] + [b"in the freed slot"]
    marker = MQTTClient(broker.ports["mqtt"], MQTTv5)
    assert marker.publish("rm/marker", b"after", 1) == 0
    assert watcher.message().payload == b"after", "the one over the Receive Maximum was not published"
    marker.disconnect()

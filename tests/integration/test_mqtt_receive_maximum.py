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
from tests.integration.test_mqtt_paho import ANONYMOUS_SESSIONS, MQTT_LISTENER, MQTTClient, assert_clean_log
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

RECEIVE_MAXIMUM = 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-receive-maximum"),
                           "--mqtt-max-inflight", str(RECEIVE_MAXIMUM), *ANONYMOUS_SESSIONS,
                           listeners=MQTT_LISTENER)
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


def _next_is_a_marker(broker: RunningBroker, watcher: MQTTClient) -> None:
    """The watcher's next message is a marker published now: the PUBLISH over the Receive
    Maximum, sent before it, was not published."""
    marker = MQTTClient(broker.ports["mqtt"], MQTTv5)
    assert marker.publish("rm/marker", b"after", 1) == 0
    assert watcher.message().payload == b"after", "the one over the Receive Maximum was published"
    marker.disconnect()


def _connected(broker: RunningBroker, version: int, client_id: str, **options) -> RawMQTT:
    client = RawMQTT(broker)
    client.send(connect_packet(version, client_id, **options))
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
    _next_is_a_marker(broker, watcher)


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
    _next_is_a_marker(broker, watcher)


@pytest.mark.parametrize("version", [pytest.param(V311, id="3.1.1"), pytest.param(V5, id="5.0")])
def test_messages_awaiting_pubrel_of_an_earlier_connection_count_against_the_receive_maximum(
        broker: RunningBroker, watcher: MQTTClient, version: int) -> None:
    """A persistent session keeps its QoS 2 PUBLISHes awaiting PUBREL across connections (and
    stores them): a client cannot heap more of them up by reconnecting."""
    persistent = {"clean": False, "session_expiry": 60 if version == V5 else None}
    client_id = f"rm-across-{version}"
    first = _connected(broker, version, client_id, **persistent)
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):
        first.send(publish_packet(version, "rm/across", b"a%d" % packet_id, 2, packet_id))
        assert first.read() == pubrec(packet_id)
    first.close()
    again = _connected(broker, version, client_id, **persistent)
    again.send(publish_packet(version, "rm/across", b"one too many", 2, RECEIVE_MAXIMUM + 1))
    if version == V5:
        assert again.disconnect_reason() == 0x93
    else:
        again.closed()
    # Released as 4.4 has it, before anything new: the slot is free.
    last = _connected(broker, version, client_id, **persistent)
    last.send(pubrel_packet(1))
    assert last.read() == pubcomp(1)
    last.send(publish_packet(version, "rm/across", b"in the freed slot", 2, 1))
    assert last.read() == pubrec(1)
    got = [watcher.message().payload for _ in range(RECEIVE_MAXIMUM + 1)]
    assert got == [b"a%d" % n for n in range(1, RECEIVE_MAXIMUM + 1)] + [b"in the freed slot"]
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):  # the session ends with nothing awaiting PUBREL
        last.send(pubrel_packet(packet_id))
        assert last.read() == pubcomp(packet_id)
    last.close()


def test_a_client_answering_as_it_reads_gets_the_disconnect_and_an_orderly_close(
        broker: RunningBroker, watcher: MQTTClient) -> None:
    """A burst one over the Receive Maximum, read back the way clients read (a PUBREL for each
    PUBREC as it comes, as Eclipse paho's interoperability suite does): the client's PUBRELs
    cross the server's DISCONNECT 0x93.  The server closes its side after the DISCONNECT and
    drops what still comes (4.13: the reason code is for the client to read), rather than
    closing outright, which makes the kernel answer the PUBRELs with a reset: the client's
    next write failed then, before it could read the DISCONNECT."""
    client = _connected(broker, V5, "rm-burst")
    client.send(b"".join(publish_packet(V5, "rm/burst", b"b%d" % packet_id, 2, packet_id)
                         for packet_id in range(1, RECEIVE_MAXIMUM + 2)))
    answered = []
    while True:
        first, body = client.read()
        if first != 0x50:
            break
        packet_id = int.from_bytes(body[:2], "big")
        client.send(pubrel_packet(packet_id))  # a reset here (BrokenPipeError) fails the test
        answered.append(packet_id)
    assert answered == list(range(1, RECEIVE_MAXIMUM + 1))
    assert (first, body[:1]) == (0xE0, b"\x93"), (first, body)  # DISCONNECT, Receive Maximum exceeded
    assert client.sock.recv(1) == b"", "an orderly close (FIN), not a reset, after the DISCONNECT"
    got = [watcher.message().payload for _ in range(RECEIVE_MAXIMUM)]
    assert got == [b"b%d" % n for n in range(1, RECEIVE_MAXIMUM + 1)]
    _next_is_a_marker(broker, watcher)
    client.close()

"""QoS 2 of a persistent MQTT session is exactly once across a kill -9 of a real ``twistd
brokerd`` (MQTT 4.3.3, 4.4), in both directions, with 3.1.1 and 5.0.

The client in the middle of the exchange is driven with raw packets (test_mqtt_bad_input's
RawMQTT), so that the broker dies exactly between two of its steps; the other side is
paho-mqtt, and what its application sees is the proof:

- to a subscriber: the broker sent two stored messages; PUBREC came for the first (the broker
  answered PUBREL: the store had it released) and not for the second.  After the restart the
  resumed session gets PUBREL for the first, never its PUBLISH again, and the second again
  with DUP and the same Packet Identifier;
- from a publisher (whose session is stored: it has a subscription): the broker answered
  PUBREC (the message and its Packet Identifier were committed).  After the restart the publisher sends the PUBLISH again with DUP (as one that
  missed the PUBREC would), gets PUBREC and no second copy is published, then PUBREL, answered
  PUBCOMP; the identifier is free again for a new message.

"Nothing more arrives" is shown by a marker being the next packet or message.
"""
from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311

from brokerd.store.sqlite import FILENAME
from tests.integration.test_mqtt_bad_input import RawMQTT, packet, publish_packet, subscribe_packet
from tests.integration.test_mqtt_paho import ANONYMOUS_SESSIONS, MQTT_LISTENER, MQTTClient, assert_clean_log, close_clients
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

PAHO = {4: MQTTv311, 5: MQTTv5}
EXPIRY = 3600


def _stop_with_no_flow_left(broker: RunningBroker) -> None:
    """Stop the broker; every exchange ended, so its store keeps none (nothing leaks)."""
    broker.stop()
    assert_clean_log(broker)
    with closing(sqlite3.connect(broker.data_dir / FILENAME)) as connection:
        assert connection.execute("SELECT * FROM flows").fetchall() == []


def _start(tmp_path: Path) -> RunningBroker:
    return start_broker(tmp_path, *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)


def _kill_and_restart(broker: RunningBroker, tmp_path: Path) -> RunningBroker:
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    assert_clean_log(broker)
    return _start(tmp_path)


@pytest.fixture
def made() -> Iterator[Callable[..., Any]]:
    """``made(client)``: a RawMQTT or MQTTClient closed after the test."""
    raws: list[RawMQTT] = []
    pahos: list[MQTTClient] = []

    def keep(client: Any) -> Any:
        (raws if isinstance(client, RawMQTT) else pahos).append(client)
        return client

    yield keep
    for raw in raws:
        raw.close()
    close_clients(pahos)


def _raw_session(broker: RunningBroker, version: int, client_id: str, made: Callable[..., Any]) -> tuple[RawMQTT, int]:
    """A RawMQTT connected to ``client_id``'s persistent session; (it, Session Present)."""
    raw = made(RawMQTT(broker))
    present, code = raw.connack(version, client_id, clean=False,
                                session_expiry=EXPIRY if version == 5 else None)
    assert code == 0
    return raw, present


def _ack(kind: int, packet_id: int) -> bytes:
    """PUBREC (0x50), PUBREL (0x62) or PUBCOMP (0x70) for ``packet_id``, reason 0."""
    return packet(kind, packet_id.to_bytes(2, "big"))


def _expect(raw: RawMQTT, kind: int, packet_id: int) -> None:
    """The next packet is ``kind`` (first byte) for ``packet_id``, with reason 0 if any."""
    got = raw.read()
    assert got is not None and got[0] == kind, got
    assert int.from_bytes(got[1][:2], "big") == packet_id, got
    assert got[1][2:3] in (b"", b"\x00"), f"reason code {got[1][2:3]!r}"


def _publish(raw: RawMQTT, version: int) -> tuple[int, int, bytes]:
    """The next packet is a QoS 2 PUBLISH to ``eo/out``: (DUP, Packet Identifier, payload)."""
    got = raw.read()
    assert got is not None and got[0] & 0xF6 == 0x34, got  # PUBLISH, QoS 2, RETAIN 0
    first, body = got
    topic_length = int.from_bytes(body[:2], "big")
    assert body[2:2 + topic_length] == b"eo/out"
    rest = body[2 + topic_length:]
    packet_id, rest = int.from_bytes(rest[:2], "big"), rest[2:]
    if version == 5:
        rest = rest[1 + rest[0]:]  # the properties (none are over 127 bytes here)
    return first >> 3 & 1, packet_id, rest


def _killed_in_the_middle(tmp_path: Path, made: Callable[..., Any], version: int) -> tuple[RunningBroker, int, int]:
    """``eo-sub`` was sent two stored messages, PUBRECed the first (and got its PUBREL), not
    the second, and the broker was killed: the broker started again, and the two Packet
    Identifiers."""
    broker = _start(tmp_path)
    sub, _present = _raw_session(broker, version, "eo-sub", made)
    sub.send(subscribe_packet(version, "eo/out", 2, packet_id=1))
    got = sub.read()
    assert got is not None and got[0] == 0x90 and got[1][-1] == 2, got
    publisher = made(MQTTClient(broker.ports["mqtt"], PAHO[version]))
    for payload in (b"released", b"received"):
        assert publisher.publish("eo/out", payload, 2) == 0  # PUBCOMP: stored for the session
    dup, released_id, payload = _publish(sub, version)
    assert (dup, payload) == (0, b"released")
    dup, received_id, payload = _publish(sub, version)
    assert (dup, payload) == (0, b"received")
    sub.send(_ack(0x50, released_id))  # PUBREC for the first only
    _expect(sub, 0x62, released_id)  # PUBREL: the store has it released
    broker = _kill_and_restart(broker, tmp_path)  # no PUBCOMP, no PUBREC for the second
    sub.close()
    return broker, released_id, received_id


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_to_a_subscriber_a_released_message_is_not_sent_again_after_kill_9(tmp_path: Path, made, version: int) -> None:
    broker, released_id, received_id = _killed_in_the_middle(tmp_path, made, version)
    sub, present = _raw_session(broker, version, "eo-sub", made)
    assert present == 1, "the session did not survive kill -9"
    _expect(sub, 0x62, released_id)  # its PUBREL again, not its PUBLISH
    dup, packet_id, payload = _publish(sub, version)
    assert (dup, packet_id, payload) == (1, received_id, b"received"), "not sent again as it was"
    sub.send(_ack(0x70, released_id))  # PUBCOMP
    sub.send(_ack(0x50, received_id))
    _expect(sub, 0x62, received_id)
    sub.send(_ack(0x70, received_id))

    publisher = made(MQTTClient(broker.ports["mqtt"], PAHO[version]))
    assert publisher.publish("eo/out", b"marker", 2) == 0
    dup, packet_id, payload = _publish(sub, version)
    assert (dup, payload) == (0, b"marker"), "a message came again before the marker"
    sub.send(_ack(0x50, packet_id))
    _expect(sub, 0x62, packet_id)
    sub.send(_ack(0x70, packet_id))
    sub.send(packet(0xC0, b""))  # PINGREQ: the PINGRESP comes once the PUBCOMP before it was read
    assert sub.read() == (0xD0, b"")
    _stop_with_no_flow_left(broker)
    # The event log has each message acknowledged once, the one resumed released with its topic.
    acked = [event for path in sorted((tmp_path / "data" / "events").rglob("*.jsonl"))
             for event in map(json.loads, path.read_text().splitlines())
             if event.get("session") == "eo-sub" and event["kind"] == "acked"]
    assert [event["topic"] for event in acked] == ["eo/out"] * 3, acked


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_from_a_publisher_a_received_message_is_published_once_after_kill_9(tmp_path: Path, made, version: int) -> None:
    broker = _start(tmp_path)
    paho = PAHO[version]
    expiry = EXPIRY if version == 5 else None
    watcher = made(MQTTClient(broker.ports["mqtt"], paho, "eo-watch", clean=False, expiry=expiry))
    assert watcher.subscribe("eo/in", 2) == 2
    watcher.disconnect()
    pub, _present = _raw_session(broker, version, "eo-pub", made)
    pub.send(subscribe_packet(version, "eo/pub/+", 1, packet_id=1))  # what makes the session stored
    got = pub.read()
    assert got is not None and got[0] == 0x90, got
    pub.send(publish_packet(version, "eo/in", b"once", 2, packet_id=7))
    _expect(pub, 0x50, 7)  # PUBREC: committed

    broker = _kill_and_restart(broker, tmp_path)  # no PUBREL yet
    pub.close()
    pub, present = _raw_session(broker, version, "eo-pub", made)
    assert present == 1, "the session did not survive kill -9"
    again = bytearray(publish_packet(version, "eo/in", b"once", 2, packet_id=7))
    again[0] |= 0x08  # DUP: as a publisher that missed the PUBREC sends it
    pub.send(bytes(again))
    _expect(pub, 0x50, 7)
    pub.send(_ack(0x62, 7))
    _expect(pub, 0x70, 7)  # PUBCOMP, reason 0: the broker knew the identifier
    # Released: the identifier is a new message's now.
    pub.send(publish_packet(version, "eo/in", b"next", 2, packet_id=7))
    _expect(pub, 0x50, 7)
    pub.send(_ack(0x62, 7))
    _expect(pub, 0x70, 7)

    watcher = made(MQTTClient(broker.ports["mqtt"], paho, "eo-watch", clean=False, connect=False, expiry=expiry))
    assert watcher.connect(), "the subscriber's session did not survive kill -9"
    got = [watcher.message(), watcher.message()]
    assert [(m.payload, m.qos) for m in got] == [(b"once", 2), (b"next", 2)], "not exactly once"
    marker = made(MQTTClient(broker.ports["mqtt"], paho))
    assert marker.publish("eo/in", b"marker", 2) == 0
    assert watcher.message().payload == b"marker", "a message came again before the marker"
    watcher.disconnect()  # after its PUBCOMPs
    _stop_with_no_flow_left(broker)


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_a_paho_subscriber_back_after_kill_9_sees_each_message_once(tmp_path: Path, made, version: int) -> None:
    """The same crash, and paho resumes the session: its application gets the message it had
    not received (PUBREC) and never the released one again, then the marker."""
    broker, _released_id, _received_id = _killed_in_the_middle(tmp_path, made, version)
    paho = PAHO[version]
    sub = made(MQTTClient(broker.ports["mqtt"], paho, "eo-sub", clean=False, connect=False,
                          expiry=EXPIRY if version == 5 else None))
    assert sub.connect(), "the session did not survive kill -9"
    publisher = made(MQTTClient(broker.ports["mqtt"], paho))
    assert publisher.publish("eo/out", b"marker", 2) == 0
    assert [(m.payload, m.qos) for m in (sub.message(), sub.message())] == [(b"received", 2), (b"marker", 2)]
    sub.disconnect()  # after its PUBCOMPs
    _stop_with_no_flow_left(broker)

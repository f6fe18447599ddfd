"""MQTT persistent sessions survive a kill -9 of a real ``twistd brokerd``.

Each test starts a broker on a data directory of its own, builds sessions over real sockets
with paho-mqtt (test_mqtt_paho's MQTTClient), kills the broker with SIGKILL and starts it again
on the same data directory (new ports; each broker's log is checked before the next one
overwrites it).  What they prove:

- a 3.1.1 Clean Session 0 session keeps its subscription and every QoS 1 message acknowledged
  to its publishers (MQTT PUBACK, SSMP 200) while its client was away: Session Present 1, each
  message once, the MQTT ones in publish order;
- a message delivered but not acknowledged (no PUBACK: paho's manual acknowledgement) when the
  broker dies is delivered again;
- a v5 session with a Session Expiry Interval keeps its QoS 2 subscription and messages, and a
  v5 session with Session Expiry Interval 0 ends with its connection, even one a kill ended.

"Nothing (more) arrives" is shown by a marker published afterwards being the next message; every
wait is a bounded ``Queue.get`` (test_mqtt_paho's BOUND).
"""
from __future__ import annotations

import json
import queue
import signal
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import MQTTMessage, MQTTv5, MQTTv311

from brokerd.core.subscriber import OWNED_TAG
from brokerd.store.sqlite import FILENAME, SUBSCRIBER_TABLES
from tests.integration.test_mqtt_crossproto import SSMPPeer
from tests.integration.test_mqtt_paho import (
    ANONYMOUS_SESSIONS,
    MQTTClient,
    assert_clean_log,
    close_clients,
    texts,
)
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

LISTENERS = {protocol: "tcp:{port}:interface=127.0.0.1" for protocol in ("mqtt", "ssmp")}


def _start(tmp_path: Path) -> RunningBroker:
    """A broker on ``tmp_path``'s data directory; ``--open-login`` for the SSMP publisher,
    persistent sessions for the anonymous MQTT clients."""
    return start_broker(tmp_path, "--open-login", *ANONYMOUS_SESSIONS, listeners=LISTENERS)


def _kill_and_restart(broker: RunningBroker, tmp_path: Path) -> RunningBroker:
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    assert_clean_log(broker)
    return _start(tmp_path)


def _stop(broker: RunningBroker) -> None:
    broker.stop()
    assert_clean_log(broker)


@pytest.fixture
def clients() -> Iterator[Callable[..., MQTTClient]]:
    """``clients(broker, version, client_id="", **options)``: MQTTClients (connected unless
    ``connect=False``), disconnected or stopped after the test."""
    made: list[MQTTClient] = []

    def make(broker: RunningBroker, version: int, client_id: str = "", **options: Any) -> MQTTClient:
        client = MQTTClient(broker.ports["mqtt"], version, client_id, **options)
        made.append(client)
        return client

    yield make
    close_clients(made)


def _receive(client: MQTTClient, count: int) -> list[MQTTMessage]:
    """The next ``count`` messages; fails, saying which came, if one does not come in time."""
    got: list[MQTTMessage] = []
    try:
        while len(got) < count:
            got.append(client.message())
    except queue.Empty:
        raise AssertionError(f"only {len(got)} of {count} messages arrived: {texts(got)}") from None
    return got


def _next_is(client: MQTTClient, publisher: MQTTClient, topic: str, payload: bytes, qos: int) -> MQTTMessage:
    """Publish a marker; it must be the next message ``client`` gets (nothing came before it)."""
    assert publisher.publish(topic, payload, qos) == 0
    got = client.message()
    assert (got.topic, got.payload) == (topic, payload), f"{texts([got])} came before the marker"
    return got


def _resume(clients: Callable[..., MQTTClient], broker: RunningBroker, version: int, client_id: str,
            **options: Any) -> tuple[MQTTClient, bool]:
    """A new client object connecting to ``client_id``'s session; (it, Session Present)."""
    client = clients(broker, version, client_id, clean=False, connect=False, **options)
    return client, client.connect()


def _kept_while_away(clients: Callable[..., MQTTClient], broker: RunningBroker, client_id: str,
                     topic_filter: str, topic: str, payloads: list[bytes]) -> MQTTClient:
    """``client_id``'s 3.1.1 session subscribes to ``topic_filter`` at QoS 1 and goes away; a
    publisher then sends ``payloads`` to ``topic`` at QoS 1, each answered PUBACK (so stored
    for the session).  Returns the publisher, still connected."""
    device = clients(broker, MQTTv311, client_id, clean=False)
    assert device.subscribe(topic_filter, 1) == 1
    device.disconnect()
    publisher = clients(broker, MQTTv311)
    for payload in payloads:
        assert publisher.publish(topic, payload, 1) == 0  # PUBACK
    return publisher


def test_v311_session_and_acknowledged_messages_survive_kill_9(tmp_path: Path, clients) -> None:
    broker = _start(tmp_path)
    sent = [f"mqtt {i}".encode() for i in range(20)]
    publisher = _kept_while_away(clients, broker, "crash-dev", "crash/+/t", "crash/a/t", sent)
    # Kept for the absent session and delivered at QoS 1 like the MQTT ones: it was stored for
    # the session before SSMP's 200 (docs/mqtt.md, "QoS").
    ssmp = SSMPPeer(broker, "crashpub")
    ssmp.publish("crash/a/t", "from ssmp")  # 200
    ssmp.close()
    publisher.disconnect()

    broker = _kill_and_restart(broker, tmp_path)
    device, present = _resume(clients, broker, MQTTv311, "crash-dev")
    assert present, "CONNACK Session Present 0: the session did not survive kill -9"
    got = _receive(device, 21)  # paho acknowledges each one (PUBACK) as it arrives
    assert [(m.topic, m.qos) for m in got] == [("crash/a/t", 1)] * 21, texts(got)
    assert [m.payload for m in got if m.payload != b"from ssmp"] == sent, "the MQTT ones, in publish order"
    assert [m.payload for m in got].count(b"from ssmp") == 1

    publisher = clients(broker, MQTTv311)
    live = _next_is(device, publisher, "crash/b/t", b"after the restart", 1)  # the subscription survived
    assert live.qos == 1

    # All acknowledged: a new connection to the session gets nothing again.
    device.disconnect()
    device, present = _resume(clients, broker, MQTTv311, "crash-dev")
    assert present, "the session ended at a clean DISCONNECT"
    _next_is(device, publisher, "crash/a/t", b"marker", 1)
    _stop(broker)
    # The event log has each stored message's outcomes for the session, as for SMQP's.
    outcomes = [event["kind"] for path in sorted((tmp_path / "data" / "events").rglob("*.jsonl"))
                for event in map(json.loads, path.read_text().splitlines())
                if event.get("session") == "crash-dev" and event["kind"] in ("delivered", "acked")]
    assert outcomes.count("acked") >= 22 and outcomes.count("delivered") >= 22, outcomes


def test_v311_message_delivered_but_not_acknowledged_comes_again_after_kill_9(tmp_path: Path, clients) -> None:
    broker = _start(tmp_path)
    device = clients(broker, MQTTv311, "crash-dev", clean=False, connect=False)
    device.client.manual_ack_set(True)  # paho sends no PUBACK unless told to
    device.connect()
    assert device.subscribe("crash/+/t", 1) == 1
    publisher = clients(broker, MQTTv311)
    assert publisher.publish("crash/a/t", b"not acknowledged", 1) == 0
    got = device.message()
    assert (got.topic, got.payload, got.qos) == ("crash/a/t", b"not acknowledged", 1)

    broker = _kill_and_restart(broker, tmp_path)  # with the PUBACK never sent
    device.stop()
    device, present = _resume(clients, broker, MQTTv311, "crash-dev")
    assert present, "CONNACK Session Present 0: the session did not survive kill -9"
    got = device.message()
    assert (got.topic, got.payload, got.qos) == ("crash/a/t", b"not acknowledged", 1), "not sent again"
    publisher = clients(broker, MQTTv311)
    _next_is(device, publisher, "crash/a/t", b"marker", 1)  # acknowledged now: not sent a third time
    _stop(broker)


def test_v5_session_expiry_decides_what_survives_kill_9(tmp_path: Path, clients) -> None:
    """``crash5-dev`` (Session Expiry Interval 3600) is away at the kill and keeps its QoS 2
    subscription and messages; ``crash5-brief`` (Session Expiry Interval 0) is connected at the
    kill, and its session ends with that connection."""
    broker = _start(tmp_path)
    keeper = clients(broker, MQTTv5, "crash5-dev", clean=False, expiry=3600)
    assert keeper.subscribe("crash5/#", 2) == 2
    keeper.disconnect()
    brief = clients(broker, MQTTv5, "crash5-brief", clean=False, expiry=0)
    assert brief.subscribe("crash5/#", 2) == 2

    publisher = clients(broker, MQTTv5)
    sent = [f"exactly once {i}".encode() for i in range(10)]
    for payload in sent:
        assert publisher.publish("crash5/x", payload, 2) == 0  # PUBREC, PUBREL, PUBCOMP
    assert [m.payload for m in _receive(brief, len(sent))] == sent

    broker = _kill_and_restart(broker, tmp_path)
    keeper, present = _resume(clients, broker, MQTTv5, "crash5-dev", expiry=3600)
    assert present, "CONNACK Session Present 0: the session did not survive kill -9"
    got = _receive(keeper, len(sent))
    assert [(m.topic, m.payload, m.qos) for m in got] == [("crash5/x", payload, 2) for payload in sent]

    brief.stop()
    brief, present = _resume(clients, broker, MQTTv5, "crash5-brief", expiry=0)
    assert not present, "a session with Session Expiry Interval 0 outlived its connection"
    assert brief.subscribe("crash5/#", 2) == 2
    publisher = clients(broker, MQTTv5)
    _next_is(brief, publisher, "crash5/fresh", b"fresh", 2)
    fresh = keeper.message()  # and nothing again for the keeper before it
    assert (fresh.topic, fresh.payload, fresh.qos) == ("crash5/fresh", b"fresh", 2)
    _stop(broker)


def test_a_session_stored_before_subscriber_names_had_a_version_tag_is_taken_up(tmp_path: Path, clients) -> None:
    """A store written before owned subscribers' names carried their encoding's tag (schema
    version 5: ``mqtt/<realm>/<name>/<client id>/<incarnation>``) is migrated when the broker
    opens it: the session, its subscription and its pending messages are all there."""
    broker = _start(tmp_path)
    sent = [f"kept {i}".encode() for i in range(3)]
    _kept_while_away(clients, broker, "old-dev", "old/+/t", "old/a/t", sent).disconnect()
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    assert_clean_log(broker)

    path = tmp_path / "data" / FILENAME
    with sqlite3.connect(path) as connection:  # the names as the previous schema wrote them
        for table in SUBSCRIBER_TABLES:
            connection.execute(f"UPDATE {table} SET subscriber = substr(subscriber, 4)"
                               f" WHERE substr(subscriber, 1, 3) = '{OWNED_TAG}'")
        names = {name for (name,) in connection.execute("SELECT subscriber FROM deliveries")}
        assert len(names) == 1 and names.pop().startswith("mqtt/")
        connection.execute("PRAGMA user_version=5")
    connection.close()

    broker = _start(tmp_path)
    device, present = _resume(clients, broker, MQTTv311, "old-dev")
    assert present, "the session written by the previous schema was not taken up"
    got = _receive(device, 3)
    assert [m.payload for m in got] == sent, texts(got)
    publisher = clients(broker, MQTTv311)
    _next_is(device, publisher, "old/b/t", b"live after the migration", 1)
    _stop(broker)

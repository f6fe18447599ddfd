"""The quotas of persistent MQTT sessions, on a real ``twistd brokerd`` over real sockets.

A persistent session outlives its connection, so the connection limits never bounded it: one
anonymous client looping CONNECT with new client identifiers filled the memory and the store.
What these tests prove (docs/mqtt.md, "Quotas of persistent sessions"):

- the anonymous principal has none by default: a v5 client asking for one is told Session
  Expiry Interval 0 and its session ends with its connection; a 3.1.1 Clean Session 0 CONNECT
  is refused with return code 5;
- a logged-in principal has at most ``--mqtt-max-sessions-per-principal``, the node at most
  ``--mqtt-max-sessions``: one more is refused (v5 CONNACK 0x97, 3.1.1 return code 3), while a
  client coming back to its session, a clean session, and a new one once a slot is free are not;
- a persistent session keeps at most ``--mqtt-max-session-subscriptions`` (SUBACK 0x97 per filter);
- a restart re-arms no stored session beyond the quotas, and the ones within them still get
  their messages;
- refusals are counted on /metrics and logged once per interval, not once each.

Each positive control (what is allowed still works) sits in the test beside the refusal.
"""
from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.integration.test_mqtt_bad_input import V5, V311, RawMQTT, connect_packet, subscribe_packet
from tests.integration.test_mqtt_paho import BOUND, MQTTClient, assert_clean_log
from tests.support.broker import RunningBroker, free_port, start_broker

pytestmark = pytest.mark.slow

LISTENERS = {"mqtt": "tcp:{port}:interface=127.0.0.1"}
DAY = 86_400
QUOTA_EXCEEDED = 0x97
SESSION_EXPIRY_ZERO = b"\x11\x00\x00\x00\x00"
"""The CONNACK property Session Expiry Interval 0 (3.2.2.3.2)."""


class Broker:
    """A broker with accounts and an admin listener on ``tmp_path``'s data directory."""

    def __init__(self, tmp_path: Path, *options: str) -> None:
        accounts = tmp_path / "accounts"
        if not accounts.exists():
            write_test_accounts(accounts)
        self.admin = free_port()
        self.running: RunningBroker = start_broker(
            tmp_path, "--accounts", str(accounts), "--admin", f"tcp:{self.admin}:interface=127.0.0.1",
            *options, listeners=LISTENERS, wait_for=(self.admin,))
        self.raws: list[RawMQTT] = []

    @property
    def port(self) -> int:
        return self.running.ports["mqtt"]

    def raw(self) -> RawMQTT:
        client = RawMQTT(self.running)
        self.raws.append(client)
        return client

    def connack(self, version: int, client_id: str, account: str | None = None, *, clean: bool = False,
                expiry: int | None = DAY) -> tuple[int, int, bytes]:
        """CONNECT on a new raw connection, then DISCONNECT when it was accepted: (Session
        Present, reason or return code, the CONNACK's body)."""
        client = self.raw()
        password = ACCOUNTS[account].encode() if account is not None else None
        client.send(_connect(version, client_id, account, password, clean, expiry))
        first, body = client.read()
        assert first == 0x20, (first, body)
        if body[1] == 0:
            client.send(b"\xe0\x00")
            client.closed()
        else:
            client.closed()
        return body[0], body[1], body

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        raise AssertionError(f"/metrics has no {name}{labels}")

    def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait until ``condition()`` holds, at most :data:`BOUND` seconds."""
        deadline = time.monotonic() + BOUND
        while not condition():
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.05)

    def stop(self) -> None:
        for client in self.raws:
            client.close()
        self.running.stop()
        assert_clean_log(self.running)


def _connect(version: int, client_id: str, username: str | None, password: bytes | None, clean: bool,
             expiry: int | None) -> bytes:
    return connect_packet(version, client_id, username=username, password=password, clean=clean,
                          session_expiry=expiry if version == V5 else None)


@pytest.fixture
def started(tmp_path: Path) -> Iterator:
    """``started(*options)``: a :class:`Broker` on ``tmp_path``, stopped (log checked) after."""
    made: list[Broker] = []

    def start(*options: str) -> Broker:
        broker = Broker(tmp_path, *options)
        made.append(broker)
        return broker

    yield start
    for broker in made:
        if broker.running.process.poll() is None:
            broker.stop()


def _client(broker: Broker, version: int, client_id: str, account: str | None = None, **options) -> MQTTClient:
    password = ACCOUNTS[account] if account is not None else None
    if version == MQTTv5:
        options.setdefault("expiry", DAY)
    return MQTTClient(broker.port, version, client_id, clean=False, username=account, password=password, **options)


# ---------------------------------------------------------------------- anonymous


def test_an_anonymous_v5_client_gets_a_session_that_ends_with_its_connection(started) -> None:
    broker = started()
    anonymous = _client(broker, MQTTv5, "anon-v5", connect=False)
    anonymous.start()
    present, reason, props = anonymous.connack()
    assert (present, reason) == (False, 0)
    assert props.SessionExpiryInterval == 0, "the CONNACK overrides the Session Expiry Interval"
    assert anonymous.subscribe("quota/anon", 1) == 1
    anonymous.disconnect()
    alice = _client(broker, MQTTv5, "alice-v5", "alice")  # positive control: a logged-in principal
    assert alice.subscribe("quota/anon", 1) == 1
    alice.disconnect()

    publisher = MQTTClient(broker.port, MQTTv5, username="bob", password=ACCOUNTS["bob"])
    assert publisher.publish("quota/anon", b"while away", 1) == 0
    alice = _client(broker, MQTTv5, "alice-v5", "alice", connect=False)
    assert alice.connect(), "alice's session was kept"
    assert alice.message().payload == b"while away"
    anonymous = _client(broker, MQTTv5, "anon-v5", connect=False)
    assert not anonymous.connect(), "the anonymous session ended with its connection"
    assert anonymous.subscribe("quota/marker", 1) == 1
    assert publisher.publish("quota/marker", b"marker", 1) == 0
    assert anonymous.message().payload == b"marker", "nothing was kept for the anonymous session"
    for client in (alice, anonymous, publisher):
        client.disconnect()
    assert broker.metric("brokerd_mqtt_quota_refusals_total", quota="anonymous_sessions") == 2
    assert broker.metric("brokerd_mqtt_persistent_sessions") == 1


def test_an_anonymous_v311_clean_session_0_connect_is_refused_with_return_code_5(started) -> None:
    broker = started()
    assert broker.connack(V311, "anon-311")[:2] == (0, 5)
    assert broker.connack(V311, "anon-311", clean=True)[:2] == (0, 0), "a clean session is still served"
    assert broker.connack(V311, "alice-311", "alice")[:2] == (0, 0), "a logged-in principal's persistent one too"
    assert broker.connack(V311, "alice-311", "alice")[:2] == (1, 0)


def test_the_operator_may_give_the_anonymous_principal_persistent_sessions(started) -> None:
    broker = started("--mqtt-anonymous-sessions", "2")
    assert broker.connack(V5, "anon-1")[1] == 0
    assert SESSION_EXPIRY_ZERO not in broker.connack(V5, "anon-1")[2]
    assert broker.connack(V311, "anon-2")[:2] == (0, 0)
    assert broker.connack(V311, "anon-2")[:2] == (1, 0)
    assert broker.connack(V5, "anon-3")[1] == QUOTA_EXCEEDED, "all anonymous clients share the quota"
    assert broker.connack(V311, "anon-3")[:2] == (0, 3)


# ---------------------------------------------------------------------- logged-in principals


def test_persistent_sessions_per_principal_and_in_all(started) -> None:
    broker = started("--mqtt-max-sessions-per-principal", "3", "--mqtt-max-sessions", "5")
    for n in range(3):
        assert broker.connack(V5, f"alice-{n}", "alice")[:2] == (0, 0)
    assert broker.connack(V5, "alice-3", "alice")[1] == QUOTA_EXCEEDED
    assert broker.connack(V311, "alice-3", "alice")[:2] == (0, 3)
    assert broker.connack(V5, "alice-0", "alice")[:2] == (1, 0), "coming back to a session is no new one"
    assert broker.connack(V5, "alice-clean", "alice", clean=True, expiry=None)[:2] == (0, 0), \
        "a session that ends with its connection is no persistent one"
    for n in range(2):
        assert broker.connack(V311, f"bob-{n}", "bob")[:2] == (0, 0)
    assert broker.connack(V5, "bob-2", "bob")[1] == QUOTA_EXCEEDED, "the node's five are taken"
    assert broker.metric("brokerd_mqtt_persistent_sessions") == 5
    # alice ends one of hers (Clean Start, no expiry): a slot is free again.
    assert broker.connack(V5, "alice-1", "alice", clean=True, expiry=None)[:2] == (0, 0)
    assert broker.connack(V5, "bob-2", "bob")[:2] == (0, 0)
    assert broker.metric("brokerd_mqtt_quota_refusals_total", quota="sessions_per_principal") == 2
    assert broker.metric("brokerd_mqtt_quota_refusals_total", quota="sessions") == 1


def test_refusals_are_logged_once_per_interval_not_once_each(started) -> None:
    broker = started("--mqtt-max-sessions", "1")
    assert broker.connack(V5, "alice-only", "alice")[1] == 0
    for n in range(20):
        assert broker.connack(V5, f"bob-{n}", "bob")[1] == QUOTA_EXCEEDED
    assert broker.connack(V5, "alice-only", "alice")[:2] == (1, 0)
    assert broker.metric("brokerd_mqtt_quota_refusals_total", quota="sessions") == 20
    assert broker.running.log().count("MQTT quotas refused") == 1, "one line per minute at most"


@pytest.mark.parametrize("version", [pytest.param(V311, id="3.1.1"), pytest.param(V5, id="5.0")])
def test_a_persistent_session_keeps_at_most_its_quota_of_subscriptions(started, version: int) -> None:
    broker = started("--mqtt-max-session-subscriptions", "3")
    refused = QUOTA_EXCEEDED if version == V5 else 0x80
    kept = broker.raw()
    kept.send(_connect(version, "alice-subs", "alice", ACCOUNTS["alice"].encode(), False, DAY))
    assert kept.read()[0] == 0x20
    codes = []
    for n, topic_filter in enumerate(["s/1", "s/2", "s/3", "s/4", "s/2", "s/+/deep/#"], 1):
        kept.send(subscribe_packet(version, topic_filter, 1, n))
        first, body = kept.read()
        assert first == 0x90 and body[:2] == n.to_bytes(2, "big")
        codes.append(body[-1])
    assert codes == [1, 1, 1, refused, 1, refused], "a filter it has already is replaced, not added"
    # Positive control: a clean session is bounded by --max-subscriptions only.
    clean = broker.raw()
    clean.send(_connect(version, "alice-clean-subs", "alice", ACCOUNTS["alice"].encode(), True, None))
    assert clean.read()[0] == 0x20
    for n in range(1, 6):
        clean.send(subscribe_packet(version, f"c/{n}", 1, n))
        assert clean.read() == (0x90, n.to_bytes(2, "big") + (b"\x00" if version == V5 else b"") + b"\x01")
    assert broker.metric("brokerd_mqtt_quota_refusals_total", quota="session_subscriptions") == 2


# ---------------------------------------------------------------------- restart


def test_a_restart_rearms_no_stored_session_beyond_the_quotas(started) -> None:
    broker = started("--mqtt-anonymous-sessions", "2", "--mqtt-max-sessions-per-principal", "1")
    owners = [("anon-a", None), ("anon-b", None), ("alice-kept", "alice")]
    for client_id, account in owners:
        client = _client(broker, MQTTv311, client_id, account)
        assert client.subscribe("restart/t", 1) == 1
        client.disconnect()
    broker.stop()

    # The operator lowers the quotas: the anonymous sessions are beyond them now.
    broker = started("--mqtt-max-sessions-per-principal", "1")
    publisher = MQTTClient(broker.port, MQTTv5, username="bob", password=ACCOUNTS["bob"])
    # Its CONNACK came once the store was read (a CONNECT waits for that), so the stored
    # sessions are counted by now.
    assert broker.metric("brokerd_mqtt_persistent_sessions") == 1
    assert publisher.publish("restart/t", b"after the restart", 1) == 0
    alice = _client(broker, MQTTv311, "alice-kept", "alice", connect=False)
    assert alice.connect(), "the session within the quotas survived the restart"
    assert alice.message().payload == b"after the restart"
    assert broker.connack(V5, "alice-other", "alice")[1] == QUOTA_EXCEEDED, "it still counts"
    anonymous = _client(broker, MQTTv5, "anon-a", connect=False)
    assert not anonymous.connect(), "the anonymous session was not re-armed"
    assert anonymous.subscribe("restart/marker", 1) == 1
    assert publisher.publish("restart/marker", b"marker", 1) == 0
    assert anonymous.message().payload == b"marker", "nothing was stored for it"
    assert broker.metric("brokerd_mqtt_quota_refusals_total", quota="anonymous_sessions") >= 2
    for client in (alice, anonymous, publisher):
        client.disconnect()


# ---------------------------------------------------------------------- what waits in the store


def test_the_store_keeps_at_most_its_quota_of_messages_for_a_session_across_a_restart(started) -> None:
    options = ("--mqtt-max-stored-queued", "5")
    broker = started(*options)
    alice = _client(broker, MQTTv311, "alice-away", "alice")
    assert alice.subscribe("queued/t", 1) == 1
    alice.disconnect()
    publisher = MQTTClient(broker.port, MQTTv5, username="bob", password=ACCOUNTS["bob"])
    for n in range(1, 9):
        assert publisher.publish("queued/t", b"m%d" % n, 1) == 0, "the publisher is still answered"
    publisher.disconnect()
    assert broker.metric("brokerd_messages_dropped_total", reason="stored_queue_full") == 3
    assert broker.running.log().count("not stored for durable subscribers") == 1, "one line per minute at most"
    broker.stop()

    broker = started(*options)  # the counts are read from the store again
    publisher = MQTTClient(broker.port, MQTTv5, username="bob", password=ACCOUNTS["bob"])
    assert publisher.publish("queued/t", b"m9", 1) == 0
    assert broker.metric("brokerd_messages_dropped_total", reason="stored_queue_full") == 1
    alice = _client(broker, MQTTv311, "alice-away", "alice", connect=False)
    assert alice.connect()
    assert [alice.message().payload for _ in range(5)] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    # Acknowledged (paho's PUBACKs, once the store has them), they no longer count: what
    # comes next is stored and delivered.
    broker.until(lambda: broker.metric("brokerd_smqp_pending_messages") == 0, "the acknowledgements stored")
    assert publisher.publish("queued/t", b"live", 1) == 0
    assert alice.message().payload == b"live", "nothing more was kept: the next message is the live one"
    for client in (alice, publisher):
        client.disconnect()

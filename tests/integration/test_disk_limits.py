"""The disk on a real ``twistd brokerd``: below ``--disk-free-limit`` stored publishes are
refused (451) while acknowledgements still commit and every protocol keeps serving; the event
log stays under ``--event-log-max-bytes`` however fast a client makes it grow.

A full disk is simulated without root: a floor above the actual free space."""
from __future__ import annotations

import signal

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.integration.test_mqtt_paho import ANONYMOUS_SESSIONS, MQTTClient
from tests.support.broker import LineClient, start_broker
from tests.support.innocent import ALL_PROTOCOLS, assert_serves_every_protocol, connect

pytestmark = pytest.mark.slow

SMQP = {"smqp": "tcp:{port}:interface=127.0.0.1"}
ABOVE_ANY_DISK = str(1 << 62)


def _publish(client: BlockingSMQP, cmuid: str, data: bytes):
    client.send(client.publish_bytes("/floor", cmuid, data))
    return client.reply()


def test_below_the_floor_publishes_are_refused_and_acknowledgements_commit(tmp_path):
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = start_broker(tmp_path, "--accounts", str(accounts), listeners=SMQP)
    try:
        bob = BlockingSMQP(broker.ports["smqp"])
        bob.login("bob", "sub")
        assert bob.command("CREATE TOPIC /floor").code == 200
        assert bob.command("SUB MESSAGE /floor").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()
        alice = BlockingSMQP(broker.ports["smqp"])
        alice.login("alice", "pub")
        assert _publish(alice, "before", b"stored before the disk filled").code == 200
        alice.close()
    finally:
        broker.stop()

    full = start_broker(tmp_path, "--accounts", str(accounts), "--open-login",
                        "--disk-free-limit", ABOVE_ANY_DISK, listeners=ALL_PROTOCOLS)
    try:
        alice = BlockingSMQP(full.ports["smqp"])
        alice.login("alice", "pub")
        refused = _publish(alice, "during", b"not stored")
        assert refused.code == 451 and "disk" in refused.lines[0], refused
        volatile = alice.publish_bytes("/floor", "volatile", b"not stored anyway", ("Guarantee", "NO"))
        alice.send(volatile + b"NOOP\r\n")
        noop = alice.reply()  # a volatile publish is not answered unless refused
        assert noop.code == 200 and noop.lines[0] != refused.lines[0], noop

        bob = BlockingSMQP(full.ports["smqp"])
        bob.login("bob", "sub")
        notify = bob.notify()
        assert notify.body.sections[0].data == b"stored before the disk filled"
        assert bob.command("310 ACK").code == 310
        assert bob.command("NOOP").code == 200
        assert_serves_every_protocol(full)
        assert full.stop(signal.SIGKILL) == -signal.SIGKILL  # the acknowledgement was on disk
    finally:
        full.stop(signal.SIGKILL)

    again = start_broker(tmp_path, "--accounts", str(accounts), listeners=SMQP)
    try:
        bob = BlockingSMQP(again.ports["smqp"])
        bob.login("bob", "sub")
        alice = BlockingSMQP(again.ports["smqp"])
        alice.login("alice", "pub")
        assert _publish(alice, "after", b"room again").code == 200
        # the next notification is the new message: the acknowledged one is not offered again
        assert bob.notify().body.sections[0].data == b"room again"
    finally:
        again.stop()
    assert "Traceback" not in full.log() + again.log()


def test_the_event_log_stays_under_its_cap_during_a_subscribe_flood(tmp_path):
    cap = 400_000
    broker = start_broker(tmp_path, "--open-login", "--event-log-max-bytes", str(cap),
                          "--event-log-flush", "0.2", listeners=ALL_PROTOCOLS)
    pairs = 15_000
    try:
        flood = connect(broker.ports["ssmp"], "127.0.0.4")
        assert flood.request("LOGIN flood open") == b"200"
        flood.send(b"SUBSCRIBE f\nUNSUBSCRIBE f\n" * pairs)
        for _ in range(2 * pairs):
            assert flood.line() == b"200"
        assert_serves_every_protocol(broker)
    finally:
        assert broker.stop() in (0, -signal.SIGTERM)
    files = list((broker.data_dir / "events").rglob("*.jsonl"))
    kept = sum(path.stat().st_size for path in files)
    lines = sum(path.read_bytes().count(b"\n") for path in files)
    assert lines < 2 * pairs / 4  # most of what the flood wrote is gone
    assert kept <= cap + cap // 8 + 1024  # the cap, plus the file being written
    assert "Traceback" not in broker.log()


def test_below_the_floor_the_core_keeps_nothing_new_for_any_protocol(tmp_path):
    """The floor is the core's: an MQTT or SSMP publish that would be stored for a durable
    subscriber (here a persistent MQTT session) is refused with the protocol's failure (v5
    PUBACK 0x97 Quota exceeded, SSMP 500), while subscriptions still commit and publishes
    that nobody keeps go through."""
    full = start_broker(tmp_path, "--open-login", "--disk-free-limit", ABOVE_ANY_DISK, *ANONYMOUS_SESSIONS,
                        listeners={"mqtt": "tcp:{port}:interface=127.0.0.1", "ssmp": "tcp:{port}:interface=127.0.0.1"})
    try:
        device = MQTTClient(full.ports["mqtt"], MQTTv5, "floor-dev", clean=False, expiry=300)
        assert device.subscribe("floor/#", 1) == 1  # a subscription is still committed
        device.disconnect()
        publisher = MQTTClient(full.ports["mqtt"], MQTTv5)
        assert publisher.publish("floor/a", b"would be stored", 1) == 0x97
        assert publisher.publish("elsewhere", b"kept by nobody", 1) == 0
        publisher.disconnect()
        ssmp = LineClient.connect(full.ports["ssmp"])
        assert ssmp.request("LOGIN floorpub open") == b"200"
        assert ssmp.request("MCAST floor/b would be stored") == b"500"
        assert ssmp.request("MCAST elsewhere kept by nobody") == b"200"
        ssmp.close()
    finally:
        full.stop()
    assert "Traceback" not in full.log() and "Unhandled" not in full.log()

"""The admin listener sees MQTT sessions like every other protocol's: ``brokerd-ctl sessions``
lists one with its client identifier, principal, source and subscriptions, ``brokerd-ctl close``
ends its connection (a v5 client is told 0x98, Administrative action), and ``status`` counts it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.test_mqtt_paho import ANONYMOUS_SESSIONS, MQTTClient, assert_clean_log
from tests.support.broker import REPO, free_port, start_broker

pytestmark = pytest.mark.slow  # a real twistd broker per test, and brokerd-ctl processes

LOOPBACK = "tcp:{port}:interface=127.0.0.1"


def ctl(admin: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "brokerd.cli.ctl", "--admin", f"http://127.0.0.1:{admin}", *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


def test_ctl_lists_and_closes_an_mqtt_session(tmp_path: Path) -> None:
    admin = free_port()
    broker = start_broker(tmp_path, "--admin", f"tcp:{admin}:interface=127.0.0.1",
                          listeners={"mqtt": LOOPBACK}, wait_for=(admin,))
    try:
        closing = MQTTClient(broker.ports["mqtt"], MQTTv5, "sensor-9")
        closing.subscribe("sensors/#", 1)
        listing = ctl(admin, "sessions")
        assert listing.returncode == 0, listing.stderr
        rows = {line.split("\t")[2]: line.split("\t") for line in listing.stdout.splitlines()}
        assert "sensor-9" in rows, listing.stdout
        row = rows["sensor-9"]
        assert row[1] == "mqtt" and "127.0.0.1:" in listing.stdout and "sensors/#" in listing.stdout
        status = ctl(admin, "status")
        assert "mqtt 1" in status.stdout, status.stdout

        closed = ctl(admin, "close", row[0])
        assert closed.returncode == 0, closed.stderr
        assert closing.disconnected() == 0x98
        again = MQTTClient(broker.ports["mqtt"], MQTTv5, "sensor-9")  # it may come back at once
        again.subscribe("after", 0)
        again.publish("after", b"back", 1)
        assert again.message().payload == b"back"
        again.disconnect()
    finally:
        broker.stop()
    assert_clean_log(broker)


def test_statistics_topics_reach_mqtt_subscribers_live_and_stored(tmp_path: Path) -> None:
    """``~sys/brokerd/...`` figures go to MQTT filters (not only to a topic's members): a live
    wildcard subscription gets them, and so does a persistent session's QoS 1 subscription,
    which takes them from the store; brokerd-ctl lists the stored subscription."""
    admin = free_port()
    broker = start_broker(tmp_path, "--sys-interval", "0.2", "--admin", f"tcp:{admin}:interface=127.0.0.1",
                          *ANONYMOUS_SESSIONS, listeners={"mqtt": LOOPBACK}, wait_for=(admin,))
    try:
        live = MQTTClient(broker.ports["mqtt"], MQTTv5, "watcher")
        assert live.subscribe("~sys/brokerd/sessions/+", 0) == 0
        stored = MQTTClient(broker.ports["mqtt"], MQTTv5, "stored-watcher", clean=False, expiry=300)
        assert stored.subscribe("~sys/brokerd/connections/open", 1) == 1
        message = live.message()
        assert message.topic == "~sys/brokerd/sessions/mqtt" and int(message.payload) >= 1
        message = stored.message()
        assert (message.topic, message.qos) == ("~sys/brokerd/connections/open", 1) and int(message.payload) >= 2
        listing = ctl(admin, "sessions")
        row = next(line for line in listing.stdout.splitlines() if "stored-watcher" in line)
        assert "~sys/brokerd/connections/open" in row, listing.stdout
        live.disconnect()
        stored.disconnect()
    finally:
        broker.stop()
    assert_clean_log(broker)

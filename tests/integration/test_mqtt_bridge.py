"""MQTT bridges against Debian's mosquitto: a real ``twistd brokerd`` bridged to a real
``mosquitto`` on loopback, paho-mqtt clients on both sides.

Each test starts its own mosquitto (tests.support.mosquitto) and a brokerd whose bridge points
at it, and waits for the bridge's "is up" log line (it is written once the bridge's
subscriptions exist on both sides).  Messages go both ways through patterns with and without
prefixes; a message published on either side arrives once on the other and is not echoed back
(a sentinel sent after it bounds each wait for what must not come).
"""
from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311

from tests.integration.test_mqtt_admin import ctl
from tests.integration.test_mqtt_paho import MQTT_LISTENER, MQTTClient, assert_clean_log
from tests.support import processes
from tests.support.broker import RunningBroker, free_port, start_broker
from tests.support.certs import make_pki
from tests.support.mosquitto import (  # noqa: F401
    Mosquitto,
    mosquitto,
    mosquitto_binary,
    password_file,
    start_mosquitto,
)

pytestmark = pytest.mark.slow

BOUND = 20.0
"""Seconds the bridge may take to come up (or back)."""


def bridge_config(path: Path, mosquitto: Mosquitto, protocol: str, *topics: str, extra: str = "") -> Path:
    """A brokerd TOML file with one ``[[mqtt-bridge]]`` named ``cloud`` to ``mosquitto``."""
    lines = ["[[mqtt-bridge]]", 'name = "cloud"', f'address = "127.0.0.1:{mosquitto.port}"',
             f'protocol = "{protocol}"', 'client-id = "brokerd-test-bridge"', "restart-timeout = 1",
             "topic = [" + ", ".join(f'"{topic}"' for topic in topics) + "]", extra]
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for_log(broker: RunningBroker, text: str, start: int = 0) -> None:
    """Wait (bounded) until ``text`` appears in the broker's log after offset ``start``."""
    deadline = time.monotonic() + BOUND
    while text not in broker.log()[start:]:
        assert broker.process.poll() is None, broker.log()[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in the log: {broker.log()[-3000:]}"
        time.sleep(0.05)


UP = "MQTT bridge cloud (tcp:127.0.0.1:{port}) is up"
ANONYMOUS_SESSIONS = ("--mqtt-anonymous-sessions", "4")
"""brokerd keeps no persistent session for an anonymous client unless told to (the tests' keepers)."""


def start_bridged(tmp_path: Path, mosquitto: Mosquitto, protocol: str, *topics: str, extra: str = "") -> RunningBroker:
    home = tmp_path / "brokerd"
    home.mkdir()
    config = bridge_config(home / "brokerd.toml", mosquitto, protocol, *topics, extra=extra)
    broker = start_broker(home, "--config", str(config), listeners=MQTT_LISTENER)
    wait_for_log(broker, UP.format(port=mosquitto.port))
    return broker


def until(client: MQTTClient, sentinel: bytes) -> list[tuple[str, bytes]]:
    """(topic, payload) of every message up to and including ``sentinel``."""
    return [(message.topic, message.payload) for message in client.messages_until(sentinel)]


def collect(client: MQTTClient, expected: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """(topic, payload) of the messages that arrive until every one of ``expected`` did."""
    got: list[tuple[str, bytes]] = []
    while not all(item in got for item in expected):
        message = client.message()
        got.append((message.topic, message.payload))
    return got


@pytest.mark.parametrize("protocol", ["mqttv5", "mqttv311"])
def test_messages_cross_both_ways_once_and_never_come_back(tmp_path: Path, mosquitto: Mosquitto,
                                                          protocol: str) -> None:
    broker = start_bridged(tmp_path, mosquitto, protocol, "out/# out 1", "cmd/# in 1 here/ there/",
                           "both/# both 1", "plain/# out 0", "q2/# both 2")
    local = MQTTClient(broker.ports["mqtt"], MQTTv5, "local-watch")
    remote = MQTTClient(mosquitto.port, MQTTv5, "remote-watch")
    try:
        assert local.subscribe("#", 1) == 1
        assert remote.subscribe("#", 1) == 1

        # out: published here, arrives there (QoS 1 from the store, QoS 0 live); both: each way
        assert local.publish("out/a", b"to-remote", qos=1) == 0
        local.publish("plain/b", b"live", qos=0)
        assert local.publish("both/l", b"from-local", qos=1) == 0
        # in: published there below the remote prefix, arrives here below the local prefix
        remote.publish("there/cmd/x", b"to-local", qos=1)
        remote.publish("both/r", b"from-remote", qos=1)
        # QoS 2 each way (PUBREC once stored here, PUBCOMP there settles the stored copy)
        assert local.publish("q2/l", b"exactly-l", qos=2) == 0
        remote.publish("q2/r", b"exactly-r", qos=2)
        local_expected = [("out/a", b"to-remote"), ("plain/b", b"live"), ("both/l", b"from-local"),
                          ("here/cmd/x", b"to-local"), ("both/r", b"from-remote"), ("q2/l", b"exactly-l"),
                          ("q2/r", b"exactly-r")]
        remote_expected = [("out/a", b"to-remote"), ("plain/b", b"live"), ("both/l", b"from-local"),
                           ("there/cmd/x", b"to-local"), ("both/r", b"from-remote"), ("q2/l", b"exactly-l"),
                           ("q2/r", b"exactly-r")]
        # each once on each side ("there/cmd/x" is no out pattern's: it stays there)
        assert sorted(collect(local, local_expected)) == sorted(local_expected)
        assert sorted(collect(remote, remote_expected)) == sorted(remote_expected)

        # No echo: both/r is stored here before end-l is published, so an echo of it would
        # reach mosquitto before end-l; mosquitto sent both/l to the bridge before it saw
        # end-r, so an echo of both/l would reach brokerd's subscriber before end-r.
        local.publish("both/end-l", b"end-l", qos=1)
        remote.publish("both/end-r", b"end-r", qos=1)
        assert [item for item in until(remote, b"end-l") if item[1] != b"end-r"] == [("both/end-l", b"end-l")]
        assert [item for item in until(local, b"end-r") if item[1] != b"end-l"] == [("both/end-r", b"end-r")]
    finally:
        local.disconnect()
        remote.disconnect()
        broker.stop()
    assert_clean_log(broker)


def restart(mosquitto: Mosquitto) -> Mosquitto:
    """Stop ``mosquitto`` (it saves its persistence file) and start it again on its port."""
    mosquitto.stop()
    directory = mosquitto.log_path.parent
    log_path = directory / "mosquitto-again.log"
    process = processes.spawn([mosquitto_binary(), "-c", str(directory / "mosquitto.conf")], log_path, cwd=directory)
    processes.wait_for_port(mosquitto.port, process, log_path, time.monotonic() + BOUND)
    return Mosquitto(mosquitto.port, process, log_path)


def stop_all(broker: RunningBroker, server: Mosquitto, *clients: MQTTClient) -> None:
    for client in clients:
        client.disconnect()
    broker.stop()
    server.stop()


def test_what_was_published_while_mosquitto_restarted_arrives_after(tmp_path: Path) -> None:
    directory = tmp_path / "mosquitto"
    server = start_mosquitto(directory, "persistence true", f"persistence_location {directory}/")
    broker = start_bridged(tmp_path, server, "mqttv5", "out/# out 1")
    watcher = MQTTClient(server.port, MQTTv311, "watcher", clean=False)
    local = MQTTClient(broker.ports["mqtt"], MQTTv5, "publisher")
    try:
        assert watcher.subscribe("out/#", 1) == 1
        assert local.publish("out/before", b"before", qos=1) == 0
        assert until(watcher, b"before") == [("out/before", b"before")]  # the bridge works
        watcher.disconnect()  # its session (QoS 1, clean session 0) stays in mosquitto

        mark = len(broker.log())
        server.stop()
        wait_for_log(broker, "MQTT bridge cloud", mark)  # it saw the loss
        sent = [f"while-{n}".encode() for n in range(5)]
        for payload in sent:
            assert local.publish("out/while", payload, qos=1) == 0  # acknowledged here

        mark = len(broker.log())
        server = restart(server)
        wait_for_log(broker, UP.format(port=server.port), mark)
        watcher = MQTTClient(server.port, MQTTv311, "watcher", clean=False)
        got = until(watcher, sent[-1])
        assert got == [("out/while", payload) for payload in sent]
    finally:
        stop_all(broker, server, watcher, local)
    assert_clean_log(broker)


def eventually(read: Callable[[], str], pattern: str) -> str:
    """Read (a command's output) until ``pattern`` matches, within :data:`BOUND` seconds: the
    counts change when the other broker's acknowledgement came, a moment after its subscriber
    had the message."""
    deadline = time.monotonic() + BOUND
    while True:
        text = read()
        found = re.search(pattern, text, re.M)
        if found is not None:
            return found.group(0)
        assert time.monotonic() < deadline, f"no {pattern!r} in {text}"
        time.sleep(0.1)


def test_status_metrics_and_sys_topics_show_the_bridge(tmp_path: Path, mosquitto: Mosquitto) -> None:
    admin = free_port()
    home = tmp_path / "brokerd"
    home.mkdir()
    config = bridge_config(home / "brokerd.toml", mosquitto, "mqttv5", "out/# out 1")
    broker = start_broker(home, "--config", str(config), "--admin", f"tcp:{admin}:interface=127.0.0.1",
                          "--sys-interval", "0.2", listeners=MQTT_LISTENER, wait_for=(admin,))
    local = remote = None
    try:
        wait_for_log(broker, UP.format(port=mosquitto.port))
        local = MQTTClient(broker.ports["mqtt"], MQTTv5, "sys-watch")
        remote = MQTTClient(mosquitto.port, MQTTv5, "remote-watch")
        assert remote.subscribe("out/#", 1) == 1
        assert local.subscribe("~sys/brokerd/mqtt_bridges/cloud/state", 0) == 0
        assert local.message().payload == b"up"
        assert local.publish("out/a", b"one", qos=1) == 0
        assert until(remote, b"one") == [("out/a", b"one")]

        def status() -> str:
            done = ctl(admin, "status")
            assert done.returncode == 0, done.stderr
            return done.stdout

        def metrics() -> str:
            return ctl(admin, "metrics").stdout

        eventually(status, r"^MQTT bridges: cloud up \(sent 1, received 0, queued 0, dropped 0\)$")
        eventually(metrics, r'^brokerd_mqtt_bridge_messages_total\{bridge="cloud",direction="sent"\} 1\.0$')
        assert 'brokerd_mqtt_bridge_up{bridge="cloud"} 1.0' in metrics()

        mark = len(broker.log())
        mosquitto.stop()
        wait_for_log(broker, f"MQTT bridge cloud (tcp:127.0.0.1:{mosquitto.port}) is down", mark)
        assert local.publish("out/b", b"kept", qos=1) == 0
        eventually(status, r"^MQTT bridges: cloud (down|connecting) \(sent 1, received 0, queued 1, dropped 0\)$")
        eventually(metrics, r'^brokerd_mqtt_bridge_queued_messages\{bridge="cloud"\} 1\.0$')
        assert 'brokerd_mqtt_bridge_up{bridge="cloud"} 0.0' in metrics()
    finally:
        for client in (local, remote):
            if client is not None:
                client.disconnect()
        broker.stop()
    assert_clean_log(broker)


def test_a_bridge_over_tls_with_a_client_certificate_and_a_password(tmp_path: Path) -> None:
    """mosquitto asks for a client certificate from its CA and a password: the bridge that has
    both carries messages; one with a wrong password is refused (and says so in the log)."""
    pki = make_pki(tmp_path)
    users = password_file(tmp_path / "passwords", {"site": "right", "watcher": "w"})
    (tmp_path / "site.password").write_text("right\n")
    (tmp_path / "wrong.password").write_text("wrong\n")
    tls_port = free_port()
    server = start_mosquitto(tmp_path / "mosquitto", f"password_file {users}", f"listener {tls_port} 127.0.0.1",
                             f"cafile {pki.ca}", f"certfile {pki.server.cert}", f"keyfile {pki.server.key}",
                             "require_certificate true", anonymous=False)
    home = tmp_path / "brokerd"
    home.mkdir()
    tls = (f'tls = true\ntls-ca = "{pki.ca}"\ntls-cert = "{pki.client.cert}"\ntls-key = "{pki.client.key}"\n'
           'tls-hostname = "localhost"\nusername = "site"\n')
    config = bridge_config(home / "brokerd.toml", server, "mqttv5", "out/# out 1",
                           extra=f'{tls}password-file = "{tmp_path / "site.password"}"\n\n'
                                 '[[mqtt-bridge]]\nname = "wrong"\ntopic = "out/# out 1"\n'
                                 f'address = "127.0.0.1:{tls_port}"\n{tls}'
                                 f'password-file = "{tmp_path / "wrong.password"}"\n')
    config.write_text(config.read_text().replace(f"127.0.0.1:{server.port}", f"127.0.0.1:{tls_port}", 1))
    broker = start_broker(home, "--config", str(config), listeners=MQTT_LISTENER)
    watcher = local = None
    try:
        wait_for_log(broker, f"MQTT bridge cloud (tcp:127.0.0.1:{tls_port}) is up")
        wait_for_log(broker, f"MQTT bridge wrong (tcp:127.0.0.1:{tls_port}) is refused: the server refused the "
                             "connection: 0x87 Not authorized")
        watcher = MQTTClient(server.port, MQTTv5, "watcher", username="watcher", password="w")
        assert watcher.subscribe("out/#", 1) == 1
        local = MQTTClient(broker.ports["mqtt"], MQTTv5, "publisher")
        assert local.publish("out/secure", b"over tls", qos=1) == 0
        # once, from the bridge that logged in (the refused one never connected)
        assert until(watcher, b"over tls") == [("out/secure", b"over tls")]
        local.publish("out/end", b"end", qos=1)
        assert until(watcher, b"end") == [("out/end", b"end")]
    finally:
        for client in (watcher, local):
            if client is not None:
                client.disconnect()
        broker.stop()
        server.stop()
    assert_clean_log(broker)


def test_past_max_queued_new_messages_are_dropped_and_counted(tmp_path: Path) -> None:
    directory = tmp_path / "mosquitto"
    server = start_mosquitto(directory, "persistence true", f"persistence_location {directory}/")
    admin = free_port()
    home = tmp_path / "brokerd"
    home.mkdir()
    config = bridge_config(home / "brokerd.toml", server, "mqttv5", "out/# out 1", extra="max-queued = 2")
    broker = start_broker(home, "--config", str(config), "--admin", f"tcp:{admin}:interface=127.0.0.1",
                          listeners=MQTT_LISTENER, wait_for=(admin,))
    watcher = MQTTClient(server.port, MQTTv311, "watcher", clean=False)
    local = MQTTClient(broker.ports["mqtt"], MQTTv5, "publisher")
    try:
        wait_for_log(broker, UP.format(port=server.port))
        assert watcher.subscribe("out/#", 1) == 1
        watcher.disconnect()
        mark = len(broker.log())
        server.stop()
        wait_for_log(broker, f"MQTT bridge cloud (tcp:127.0.0.1:{server.port}) is down", mark)
        for n in range(4):
            assert local.publish("out/q", f"m{n}".encode(), qos=1) == 0
        wait_for_log(broker, "MQTT bridge cloud: 2 messages (", mark)  # the one warning of the episode
        line = ctl(admin, "status").stdout
        assert re.search(r"^MQTT bridges: cloud \w+ \(sent 0, received 0, queued 2, dropped 2\)$", line, re.M), line

        mark = len(broker.log())
        server = restart(server)
        wait_for_log(broker, UP.format(port=server.port), mark)
        eventually(lambda: ctl(admin, "status").stdout,
                   r"^MQTT bridges: cloud up \(sent 2, received 0, queued 0, dropped 2\)$")
        assert local.publish("out/q", b"after", qos=1) == 0  # room again once the two went
        watcher = MQTTClient(server.port, MQTTv311, "watcher", clean=False)
        assert until(watcher, b"after") == [("out/q", b"m0"), ("out/q", b"m1"), ("out/q", b"after")]
    finally:
        stop_all(broker, server, watcher, local)
    assert_clean_log(broker)


def test_what_mosquitto_kept_for_the_bridge_while_brokerd_was_killed_arrives(tmp_path: Path,
                                                                              mosquitto: Mosquitto) -> None:
    """The bridge's session on mosquitto is persistent (clean-session false): QoS 1 messages
    published there while brokerd is down wait in mosquitto, come when the bridge is back,
    and reach a persistent session of brokerd's whose client is away."""
    home = tmp_path / "brokerd"
    home.mkdir()
    config = bridge_config(home / "brokerd.toml", mosquitto, "mqttv5", "in/# in 1")
    broker = start_broker(home, "--config", str(config), *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
    wait_for_log(broker, UP.format(port=mosquitto.port))
    keeper = MQTTClient(broker.ports["mqtt"], MQTTv311, "keeper", clean=False)
    remote = MQTTClient(mosquitto.port, MQTTv5, "remote-publisher")
    try:
        assert keeper.subscribe("in/#", 1) == 1
        keeper.disconnect()
        broker.stop(signal.SIGKILL)
        sent = [f"while-{n}".encode() for n in range(3)]
        for payload in sent:
            remote.publish("in/x", payload, qos=1)  # mosquitto keeps them for the bridge's session

        broker = start_broker(home, "--config", str(config), *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
        wait_for_log(broker, UP.format(port=mosquitto.port))
        keeper = MQTTClient(broker.ports["mqtt"], MQTTv311, "keeper", clean=False)
        assert until(keeper, sent[-1]) == [("in/x", payload) for payload in sent]
    finally:
        keeper.disconnect()
        remote.disconnect()
        broker.stop()
    assert_clean_log(broker)


def test_a_message_brokerd_could_not_store_is_not_acknowledged_and_comes_again(tmp_path: Path,
                                                                               mosquitto: Mosquitto) -> None:
    """Below --disk-free-limit brokerd stores nothing: the bridge does not acknowledge what
    comes in for a stored session, so mosquitto keeps it and sends it again once brokerd can."""
    home = tmp_path / "brokerd"
    home.mkdir()
    config = bridge_config(home / "brokerd.toml", mosquitto, "mqttv5", "in/# in 1")
    broker = start_broker(home, "--config", str(config), *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
    remote = MQTTClient(mosquitto.port, MQTTv5, "remote-publisher")
    keeper = None
    try:
        wait_for_log(broker, UP.format(port=mosquitto.port))
        keeper = MQTTClient(broker.ports["mqtt"], MQTTv311, "keeper", clean=False)
        assert keeper.subscribe("in/#", 1) == 1
        keeper.disconnect()
        broker.stop()

        broker = start_broker(home, "--config", str(config), "--disk-free-limit", str(1 << 62), *ANONYMOUS_SESSIONS,
                              listeners=MQTT_LISTENER)
        wait_for_log(broker, UP.format(port=mosquitto.port))
        remote.publish("in/x", b"held", qos=1)
        wait_for_log(broker, "failed (the disk is nearly full; the message was not stored); the connection is "
                             "dropped unanswered")
        broker.stop()

        broker = start_broker(home, "--config", str(config), *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
        wait_for_log(broker, UP.format(port=mosquitto.port))
        keeper = MQTTClient(broker.ports["mqtt"], MQTTv311, "keeper", clean=False)
        assert until(keeper, b"held") == [("in/x", b"held")]
    finally:
        for client in (keeper, remote):
            if client is not None:
                client.disconnect()
        broker.stop()
    assert_clean_log(broker)


def test_a_311_bridge_to_a_broker_that_refuses_the_bridge_flag_connects_without_it(tmp_path: Path) -> None:
    """brokerd's own MQTT server answers protocol level 0x84 with return code 1: a 3.1.1
    bridge to it tries once more without the flag, and carries messages."""
    (tmp_path / "other").mkdir()
    # the bridge logs in there anonymously with a persistent session
    other = start_broker(tmp_path / "other", *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
    home = tmp_path / "brokerd"
    home.mkdir()
    config = home / "brokerd.toml"
    port = other.ports["mqtt"]
    config.write_text(f'[[mqtt-bridge]]\nname = "cloud"\naddress = "127.0.0.1:{port}"\nprotocol = "mqttv311"\n'
                      'restart-timeout = 1\ntopic = ["news/# out 1"]\n')
    broker = start_broker(home, "--config", str(config), listeners=MQTT_LISTENER)
    watcher = local = None
    try:
        wait_for_log(broker, "MQTT bridge cloud: the other broker does not take the bridge flag; connecting without it")
        wait_for_log(broker, f"MQTT bridge cloud (tcp:127.0.0.1:{port}) is up")
        watcher = MQTTClient(port, MQTTv5, "watcher")
        assert watcher.subscribe("news/#", 1) == 1
        local = MQTTClient(broker.ports["mqtt"], MQTTv5, "publisher")
        assert local.publish("news/today", b"bridged", qos=1) == 0
        assert until(watcher, b"bridged") == [("news/today", b"bridged")]
    finally:
        for client in (watcher, local):
            if client is not None:
                client.disconnect()
        broker.stop()
        other.stop()
    assert_clean_log(broker)
    assert_clean_log(other)

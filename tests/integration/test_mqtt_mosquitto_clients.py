"""Debian's ``mosquitto_pub`` and ``mosquitto_sub`` (libmosquitto, another MQTT implementation)
against the MQTT front end of a real ``twistd brokerd``: what ``mosquitto_pub -q 0/1/2`` sends,
``mosquitto_sub -C N`` receives, in MQTT 3.1.1 and 5.0, and retained messages with ``-r``.

``mosquitto_sub`` runs with ``-d`` and line-buffered output: the test publishes once it printed
``received SUBACK`` (so the subscription exists), and ``-W`` bounds how long it waits for
messages; every ``mosquitto_pub`` exits on its own once its flow is done (QoS 1: PUBACK, QoS 2:
PUBCOMP), so its exit status says the broker completed the flow.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.test_mqtt_paho import MQTT_LISTENER, assert_clean_log
from tests.support.broker import RunningBroker, start_broker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mosquitto_sub") is None or shutil.which("stdbuf") is None,
                       reason="needs mosquitto-clients and coreutils' stdbuf"),
]

BOUND = 10
"""Seconds a mosquitto client may wait (``-W``) or run before the test fails."""
VERSIONS = ["mqttv311", "mqttv5"]
FORMAT = "MSG|%t|%q|%r|%p"
"""``-F``: one line per message, marked so the ``-d`` lines are told apart."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-mosquitto"), listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


class Subscriber:
    """A running ``mosquitto_sub -C count``, subscribed once :meth:`subscribed` returned."""

    def __init__(self, broker: RunningBroker, version: str, topic: str, qos: int, count: int) -> None:
        self.process = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.ports["mqtt"]), "-V", version,
             "-t", topic, "-q", str(qos), "-C", str(count), "-W", str(BOUND), "-d", "-F", FORMAT],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    def subscribed(self) -> None:
        """Read its output until the SUBACK came (``-W`` bounds the wait: it exits)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if "received SUBACK" in line:
                return
        raise AssertionError(f"mosquitto_sub never got its SUBACK: {self.lines} {self.process.stderr.read()!r}")

    def messages(self) -> list[tuple[str, int, int, str]]:
        """Wait for it to exit after its ``-C`` messages; (topic, qos, retain, payload) each."""
        self.process.wait(timeout=BOUND + 5)
        # Read through the pipe's file object: subscribed() may have buffered lines in it.
        self.lines += self.process.stdout.read().splitlines()  # type: ignore[union-attr]
        err = self.process.stderr.read()  # type: ignore[union-attr]
        assert self.process.returncode == 0, (self.process.returncode, err, self.lines)
        found = []
        for line in self.lines:
            if line.startswith("MSG|"):
                _, topic, qos, retain, payload = line.split("|", 4)
                found.append((topic, int(qos), int(retain), payload))
        return found

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=BOUND)


def mosquitto_pub(broker: RunningBroker, version: str, topic: str, *args: str) -> None:
    result = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.ports["mqtt"]), "-V", version, "-t", topic, *args],
        capture_output=True, text=True, timeout=BOUND, check=False)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)


@pytest.fixture
def subscribers() -> Iterator:
    started: list[Subscriber] = []

    def start(*args, **kwargs) -> Subscriber:
        subscriber = Subscriber(*args, **kwargs)
        started.append(subscriber)
        subscriber.subscribed()
        return subscriber

    yield start
    for subscriber in started:
        subscriber.kill()


@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_sub_receives_what_mosquitto_pub_sends_at_each_qos(broker, subscribers, version: str) -> None:
    topic = f"mosquitto/{version}/qos"
    sub = subscribers(broker, version, topic, 2, 3)
    for qos in (0, 1, 2):
        mosquitto_pub(broker, version, topic, "-q", str(qos), "-m", f"hello at qos {qos}")
    assert sub.messages() == [(topic, qos, 0, f"hello at qos {qos}") for qos in (0, 1, 2)]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_subscription_qos_caps_what_mosquitto_sub_gets(broker, subscribers, version: str) -> None:
    topic = f"mosquitto/{version}/capped"
    sub = subscribers(broker, version, "mosquitto/+/capped", 1, 3)
    for qos in (2, 1, 0):
        mosquitto_pub(broker, version, topic, "-q", str(qos), "-m", f"sent at {qos}")
    assert sub.messages() == [(topic, 1, 0, "sent at 2"), (topic, 1, 0, "sent at 1"), (topic, 0, 0, "sent at 0")]


@pytest.mark.parametrize(("publisher", "subscriber"), [("mqttv311", "mqttv5"), ("mqttv5", "mqttv311")])
def test_between_protocol_versions(broker, subscribers, publisher: str, subscriber: str) -> None:
    topic = f"mosquitto/{publisher}-to-{subscriber}"
    sub = subscribers(broker, subscriber, topic, 2, 2)
    mosquitto_pub(broker, publisher, topic, "-q", "2", "-m", "across versions")
    mosquitto_pub(broker, publisher, topic, "-q", "1", "-m", "ünïcödé")
    assert sub.messages() == [(topic, 2, 0, "across versions"), (topic, 1, 0, "ünïcödé")]


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_with_r_reaches_a_later_mosquitto_sub_until_cleared(broker, subscribers, version: str) -> None:
    topic = f"mosquitto/{version}/retained"
    mosquitto_pub(broker, version, topic, "-q", "1", "-r", "-m", "kept for later")
    late = subscribers(broker, version, topic, 1, 1)
    assert late.messages() == [(topic, 1, 1, "kept for later")], late.lines

    mosquitto_pub(broker, version, topic, "-q", "1", "-r", "-n")  # an empty retained message clears it
    later = subscribers(broker, version, topic, 1, 1)
    mosquitto_pub(broker, version, topic, "-q", "1", "-m", "live")
    assert later.messages() == [(topic, 1, 0, "live")], "nothing retained came before the live message"

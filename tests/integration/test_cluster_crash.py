"""Crashes in a cluster of ``twistd brokerd`` nodes (``--cluster redis://`` and ``--store
postgresql://`` on one database): a node killed with SIGKILL mid-traffic, and Redis killed
with SIGKILL mid-traffic.  Whatever a publisher was acknowledged (SMQP 200 after the store,
SSMP 200 on a topic with a durable subscriber) reaches the durable subscriber, served by
another (surviving) node, once each after its acknowledgements."""
from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.support.broker import LineClient, RunningBroker, start_broker
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - the fixtures
from tests.support.redis import RedisServer, cluster_secret, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

LISTENERS = {"smqp": "tcp:{port}:interface=127.0.0.1", "ssmp": "tcp:{port}:interface=127.0.0.1"}
COUNT = 150


def start_node(tmp_path: Path, name: str, redis: RedisServer, store: str) -> RunningBroker:
    accounts = tmp_path / "accounts"
    if not accounts.exists():
        write_test_accounts(accounts)
    directory = tmp_path / name
    directory.mkdir()
    return start_broker(directory, "--accounts", str(accounts), "--cluster", redis.url, "--store", store,
                        "--cluster-secret-file", str(cluster_secret(tmp_path / f"{name}.secret")),
                        "--node-name", name, "--open-login", listeners=LISTENERS)


def subscribe_durably(node: RunningBroker) -> None:
    """bob:durable subscribes to /crash (which it creates) and leaves."""
    bob = BlockingSMQP(node.ports["smqp"])
    bob.login("bob", "durable")
    assert bob.command("CREATE TOPIC /crash").code == 200
    assert bob.command("SUB MESSAGE /crash").code == 200
    assert bob.command("QUIT").code == 200
    bob.close()


class Publishers:
    """An SMQP and an SSMP publisher on one node, each writing its publishes in pipelined
    batches; ``acknowledged`` collects the payloads answered 200."""

    def __init__(self, node: RunningBroker) -> None:
        self.smqp = BlockingSMQP(node.ports["smqp"])
        self.smqp.login("bob", "pub")
        self.ssmp = LineClient.connect(node.ports["ssmp"], timeout=10.0)
        self.ssmp.send(b"LOGIN publisher open\n")
        assert self.ssmp.line().rstrip(b"\r") == b"200"
        self.acknowledged: list[bytes] = []
        self.smqp_answered = 0
        self.ssmp_answered = 0

    def send(self, start: int, stop: int) -> None:
        """Write publishes number ``start`` to ``stop`` (excluded) of each, at once."""
        numbers = range(start, stop)
        self.smqp.send(b"".join(self.smqp.publish_bytes("/crash", f"C{i}", b"smqp-%d" % i) for i in numbers))
        self.ssmp.send(b"".join(b"MCAST crash ssmp-%d\n" % i for i in numbers))

    def read(self, count: int) -> None:
        """Read ``count`` more answers of each publisher (each must be 200)."""
        for _ in range(count):
            reply = self.smqp.reply()
            assert reply.code == 200, reply
            self.acknowledged.append(b"smqp-%d" % self.smqp_answered)
            self.smqp_answered += 1
            assert self.ssmp.line().rstrip(b"\r") == b"200"
            self.acknowledged.append(b"ssmp-%d" % self.ssmp_answered)
            self.ssmp_answered += 1

    def read_until_lost(self) -> None:
        """Read whatever answers arrived before the connections were lost."""
        try:
            while self.smqp_answered < COUNT:
                reply = self.smqp.reply()
                assert reply.code == 200, reply
                self.acknowledged.append(b"smqp-%d" % self.smqp_answered)
                self.smqp_answered += 1
        except (EOFError, OSError):
            pass
        try:
            while self.ssmp_answered < COUNT:
                line = self.ssmp.line().rstrip(b"\r")
                assert line == b"200", line
                self.acknowledged.append(b"ssmp-%d" % self.ssmp_answered)
                self.ssmp_answered += 1
        except (EOFError, OSError):
            pass

    def close(self) -> None:
        self.smqp.close()
        self.ssmp.sock.close()


def silent(client: BlockingSMQP) -> bool:
    """No MESSAGE waits once a NOOP was answered and half a second passed without bytes."""
    assert client.command("NOOP").code == 200
    if any(getattr(event, "kind", None) == "MESSAGE" for event in client.events):
        return False
    client.sock.settimeout(0.5)
    try:
        data = client.sock.recv(65536)
    except (socket.timeout, TimeoutError):
        return True
    finally:
        client.sock.settimeout(10.0)
    client.events.extend(client.parser.feed(data))
    return False


def drain(node: RunningBroker, acknowledged: list[bytes]) -> list[bytes]:
    """bob:durable logs in on ``node``, acknowledges every notification until it has every
    ``acknowledged`` payload and nothing more comes; what it got, in order."""
    bob = BlockingSMQP(node.ports["smqp"])
    bob.login("bob", "durable")
    received: list[bytes] = []
    wanted = set(acknowledged)
    while not wanted.issubset(received) or not silent(bob):
        notify = bob.notify()
        assert notify.kind == "MESSAGE" and notify.args == ("/crash", "ADD"), notify
        received.append(notify.body.sections[0].data)
        assert bob.command("310 ACK").code == 310
    bob.close()
    return received


def check(received: list[bytes], acknowledged: list[bytes]) -> None:
    assert len(received) == len(set(received)), "each once"
    missing = [payload for payload in acknowledged if payload not in received]
    assert missing == [], missing
    for protocol in (b"smqp-", b"ssmp-"):
        got = [int(p[5:]) for p in received if p.startswith(protocol)]
        assert got == sorted(got), (protocol, got)  # in order per publisher


@contextmanager
def publishing_to_a_durable_subscriber(tmp_path: Path, redis_server: RedisServer,
                                       postgres_url: str) -> Iterator[tuple[RunningBroker, RunningBroker, Publishers]]:
    """Node 1 with bob's durable subscription and publishers whose first 20 messages were
    acknowledged, and node 2 on the same Redis and store; both nodes killed at the end."""
    first = start_node(tmp_path, "node1", redis_server, postgres_url)
    second = None
    try:
        subscribe_durably(first)
        second = start_node(tmp_path, "node2", redis_server, postgres_url)
        publishers = Publishers(first)
        publishers.send(0, 20)
        publishers.read(20)
        yield first, second, publishers
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            second.stop(signal.SIGKILL)


def test_a_node_killed_mid_traffic_loses_nothing_acknowledged(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    with publishing_to_a_durable_subscriber(tmp_path, redis_server, postgres_url) as (first, second, publishers):
        publishers.send(20, COUNT)  # killed while these are in flight
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        publishers.read_until_lost()
        publishers.close()
        assert len(publishers.acknowledged) >= 40
        check(drain(second, publishers.acknowledged), publishers.acknowledged)


def test_redis_killed_mid_traffic_loses_nothing_acknowledged(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    with publishing_to_a_durable_subscriber(tmp_path, redis_server, postgres_url) as (_first, second, publishers):
        redis_server.kill()
        publishers.send(20, COUNT)
        publishers.read_until_lost()
        publishers.close()
        # Redis being away costs the durable publishers nothing: every publish was answered.
        assert publishers.smqp_answered == COUNT and publishers.ssmp_answered == COUNT
        check(drain(second, publishers.acknowledged), publishers.acknowledged)

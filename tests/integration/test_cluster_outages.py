"""The log of an outage, on a cluster of two ``twistd brokerd`` processes (``--cluster redis://``
and ``--store postgresql://`` on one database): PostgreSQL stopped and started again, then Redis
killed and started again, with publishes all along.  Each node logs one line per change of
state (the store unavailable, connected again; Redis unreachable, connected again), no
traceback, no critical line, no line the logger could not format; the clients get the
documented answers meanwhile (SMQP ``451 ... not stored``, SSMP ``500`` on a topic with a
durable subscriber, ``200`` for live traffic), and service is back afterwards."""
from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.integration.test_postgresql_store import _publish, _publish_until_stored
from tests.support.broker import LineClient, RunningBroker, start_broker
from tests.support.postgres import own_postgres  # noqa: F401 - the fixture
from tests.support.postgres import PostgresServer
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

LISTENERS = {"smqp": "tcp:{port}:interface=127.0.0.1", "ssmp": "tcp:{port}:interface=127.0.0.1"}
WAIT = 60.0
"""Seconds a node gets to notice a change of state and log it."""

STORE_DOWN = re.compile(r"PostgreSQL store \S+ unavailable: .*; stored publishes are refused until it is back")
STORE_BACK = re.compile(r"PostgreSQL store \S+: connected again")
REDIS_DOWN = re.compile(r"Cluster: Redis at \S+ is unreachable")
REDIS_BACK = re.compile(r"Cluster: connected to Redis at \S+ again")
NOT_ALLOWED = ("Traceback", "Unhandled Error", "Unable to format event", "#critical]", "CRITICAL")


def start_node(tmp_path: Path, name: str, redis: RedisServer, store: str, accounts: Path) -> RunningBroker:
    directory = tmp_path / name
    directory.mkdir()
    return start_broker(directory, "--accounts", str(accounts), "--cluster", redis.url, "--store", store,
                        "--node-name", name, "--open-login", "--no-event-log", listeners=LISTENERS)


def wait_for_line(node: RunningBroker, pattern: re.Pattern, count: int = 1) -> None:
    """Until the node's log has ``count`` lines matching ``pattern`` (bounded by WAIT)."""
    deadline = time.monotonic() + WAIT
    while len(pattern.findall(node.log())) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {pattern.pattern!r} in {node.log_path}:\n{node.log()[-3000:]}")
        time.sleep(0.1)  # polling the log file, bounded by the deadline


def ssmp_until(client: LineClient, line: str, answer: bytes) -> None:
    """Send ``line`` until it is answered ``answer`` (the node reconnects after its backoff)."""
    deadline = time.monotonic() + WAIT
    while client.request(line) != answer:
        if time.monotonic() > deadline:
            raise AssertionError(f"{line!r} never answered {answer!r}")
        time.sleep(0.2)  # one try per fifth of a second, bounded by the deadline


def test_outages_of_postgresql_and_redis_log_one_line_per_change_and_answer_as_documented(
        tmp_path: Path, own_postgres: PostgresServer, redis_server: RedisServer) -> None:
    url = own_postgres.create_database()
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    nodes = [start_node(tmp_path, name, redis_server, url, accounts) for name in ("node1", "node2")]
    first, second = nodes
    try:
        bob = BlockingSMQP(first.ports["smqp"])
        bob.login("bob", "durable")
        assert bob.command("CREATE TOPIC /outage").code == 200
        assert bob.command("SUB MESSAGE /outage").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()
        alice = BlockingSMQP(second.ports["smqp"])
        alice.login("alice", "pub")
        assert _publish(alice, "/outage", "B", b"stored before").code == 200
        ssmp = LineClient.connect(first.ports["ssmp"])
        assert ssmp.request("LOGIN pub open") == b"200"
        ssmp_until(ssmp, "MCAST outage ssmp-before", b"200")  # node 1 learns of the subscription

        own_postgres.stop()
        for attempt in range(5):
            refused = _publish(alice, "/outage", f"D{attempt}", b"not stored")
            assert refused.code == 451 and "not stored" in refused.lines[0], refused
            assert ssmp.request(f"MCAST outage ssmp-during-{attempt}") == b"500"
        assert ssmp.request("MCAST volatile live-only") == b"200"
        for node in nodes:
            wait_for_line(node, STORE_DOWN)
        own_postgres.start()
        _publish_until_stored(alice, "/outage", b"stored after", time.monotonic() + WAIT)
        ssmp_until(ssmp, "MCAST outage ssmp-after", b"200")
        for node in nodes:
            wait_for_line(node, STORE_BACK)

        redis_server.kill()
        for node in nodes:
            wait_for_line(node, REDIS_DOWN)
        for attempt in range(5):
            assert ssmp.request(f"MCAST volatile during-{attempt}") == b"200"  # local service goes on
        redis_server.start()
        for node in nodes:
            wait_for_line(node, REDIS_BACK)
        assert _publish(alice, "/outage", "A", b"after both").code == 200
        alice.close()
        ssmp.sock.close()
    finally:
        for node in nodes:
            node.stop(signal.SIGTERM)
    for node in nodes:
        log = node.log()
        counts = [len(pattern.findall(log)) for pattern in (STORE_DOWN, STORE_BACK, REDIS_DOWN, REDIS_BACK)]
        assert counts == [1, 1, 1, 1], (counts, log[-5000:])
        found = [word for word in NOT_ALLOWED if word in log]
        assert found == [], (found, log[-8000:])

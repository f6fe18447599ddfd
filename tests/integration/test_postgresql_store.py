"""Real ``twistd brokerd`` processes with ``--store postgresql://...`` on a PostgreSQL server the
tests start: SMQP durable publish/subscribe/acknowledge on it, two brokers (two nodes) on one
database (node 2 serves what node 1 stored), and an outage of the server (stored publishes
refused with the protocol's temporary failure, nothing acknowledged lost, service back once
the server is)."""
from __future__ import annotations

import signal
import time

import pytest

from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.support.broker import LineClient, start_broker

pytestmark = pytest.mark.slow

SMQP = {"smqp": "tcp:{port}:interface=127.0.0.1"}
SMQP_SSMP = {**SMQP, "ssmp": "tcp:{port}:interface=127.0.0.1"}


def _node(tmp_path, name: str, url: str, accounts, listeners=SMQP, *options: str):
    directory = tmp_path / name
    directory.mkdir()
    return start_broker(directory, "--accounts", str(accounts), "--store", url, *options, listeners=listeners)


def _publish(client: BlockingSMQP, topic: str, cmuid: str, data: bytes):
    client.send(client.publish_bytes(topic, cmuid, data))
    return client.reply()


def test_node_2_serves_the_durable_subscriber_what_node_1_stored(tmp_path, postgres_url):
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    one = _node(tmp_path, "one", postgres_url, accounts)
    two = None
    try:
        bob = BlockingSMQP(one.ports["smqp"])
        bob.login("bob", "durable")
        assert bob.command("CREATE TOPIC /cluster").code == 200
        assert bob.command("SUB MESSAGE /cluster").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()
        two = _node(tmp_path, "two", postgres_url, accounts)

        alice = BlockingSMQP(one.ports["smqp"])
        alice.login("alice", "pub")
        payloads = [b"first\r\n.\r\n\x00", b"second", b"third"]
        replies = [_publish(alice, "/cluster", f"C{i}", data) for i, data in enumerate(payloads)]
        assert [r.code for r in replies] == [200, 200, 200]
        smuids = [r.lines[2] if len(r.lines) > 2 else r.lines[-1] for r in replies]
        assert len(set(smuids)) == 3

        served = BlockingSMQP(two.ports["smqp"])  # node 2: read from the shared database
        served.login("bob", "durable")
        received = []
        for _ in payloads:
            notify = served.notify()
            assert notify.kind == "MESSAGE" and notify.args == ("/cluster", "ADD")
            received.append(notify.body.sections[0].data)
            assert served.command("310 ACK").code == 310
        assert received == payloads
        assert served.command("QUIT").code == 200
        served.close()

        # Back on node 1: the acknowledged messages are not offered again; a new one is.
        bob = BlockingSMQP(one.ports["smqp"])
        bob.login("bob", "durable")
        assert _publish(alice, "/cluster", "C9", b"after the acknowledgements").code == 200
        assert bob.notify().body.sections[0].data == b"after the acknowledgements"
        assert bob.command("310 ACK").code == 310
        bob.close()
        alice.close()
    finally:
        one.stop()
        if two is not None:
            two.stop()
    for node in (one, two):
        assert "Traceback" not in node.log()


def _publish_until_stored(client: BlockingSMQP, topic: str, data: bytes, deadline: float):
    """The store reconnects after its backoff: publish until one is answered 200 (bounded)."""
    attempt = 0
    while True:
        attempt += 1
        reply = _publish(client, topic, f"R{attempt}", data)
        if reply.code == 200:
            return attempt
        assert reply.code == 451, reply
        if time.monotonic() > deadline:
            raise AssertionError("the broker did not store again after the server came back")
        time.sleep(0.2)  # one try per fifth of a second, bounded by the deadline


def test_an_outage_refuses_stored_publishes_and_loses_nothing_acknowledged(tmp_path, own_postgres):
    url = own_postgres.create_database()
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = _node(tmp_path, "node", url, accounts, SMQP_SSMP, "--open-login")
    try:
        bob = BlockingSMQP(broker.ports["smqp"])
        bob.login("bob", "durable")
        assert bob.command("CREATE TOPIC /outage").code == 200
        assert bob.command("SUB MESSAGE /outage").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()
        alice = BlockingSMQP(broker.ports["smqp"])
        alice.login("alice", "pub")
        assert _publish(alice, "/outage", "B", b"stored before").code == 200
        ssmp = LineClient.connect(broker.ports["ssmp"])
        assert ssmp.request("LOGIN pub open") == b"200"
        assert ssmp.request("MCAST outage ssmp-before") == b"200"

        own_postgres.stop()  # immediate: as a crash of the database server
        refused = _publish(alice, "/outage", "D", b"not stored")
        assert refused.code == 451 and "not stored" in refused.lines[0], refused
        assert ssmp.request("MCAST outage ssmp-during") == b"500"  # SSMP's "could not be stored"
        assert ssmp.request("MCAST volatile live-only") == b"200"  # no durable subscriber: served
        assert alice.command("NOOP").code == 200

        own_postgres.start()
        _publish_until_stored(alice, "/outage", b"stored after", time.monotonic() + 60)
        assert ssmp.request("MCAST outage ssmp-after") == b"200"

        bob = BlockingSMQP(broker.ports["smqp"])
        bob.login("bob", "durable")
        received = []
        for _ in range(4):
            received.append(bob.notify().body.sections[0].data)
            assert bob.command("310 ACK").code == 310
        assert received == [b"stored before", b"ssmp-before", b"stored after", b"ssmp-after"]
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        broker.stop(signal.SIGKILL)

    again = _node(tmp_path, "again", url, accounts, SMQP)
    try:
        bob = BlockingSMQP(again.ports["smqp"])
        bob.login("bob", "durable")
        alice = BlockingSMQP(again.ports["smqp"])
        alice.login("alice", "pub")
        assert _publish(alice, "/outage", "N", b"next").code == 200
        # every acknowledgement was committed: the next notification is the new message
        assert bob.notify().body.sections[0].data == b"next"
    finally:
        again.stop()
    assert "unavailable" in broker.log() and "Traceback" not in again.log()


def test_a_broker_started_before_its_database_serves_once_it_is_up(tmp_path, own_postgres):
    url = own_postgres.create_database()
    own_postgres.stop()
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = _node(tmp_path, "early", url, accounts, SMQP_SSMP, "--open-login")
    try:
        ssmp = LineClient.connect(broker.ports["ssmp"])  # the other protocols serve meanwhile
        assert ssmp.request("LOGIN early open") == b"200"
        assert ssmp.request("MCAST anything live") == b"200"
        own_postgres.start()
        alice = BlockingSMQP(broker.ports["smqp"], timeout=60)  # greeted once the store is open
        alice.login("alice", "pub")
        assert alice.command("CREATE TOPIC /late").code == 200
        assert _publish(alice, "/late", "L", b"stored").code == 200
        alice.close()
    finally:
        broker.stop()
    assert "unavailable" in broker.log() and "Traceback" not in broker.log()


def test_an_unusable_store_url_is_one_line(tmp_path):
    from tests.support.broker import twistd
    import subprocess

    done = subprocess.run([*twistd(), "--data-dir", str(tmp_path), "--store", "mysql://x/y"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--store mysql://x/y: only postgresql:// URLs are supported" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_database_the_server_does_not_have_is_a_configuration_error(tmp_path, postgres_server, postgres_url):
    """A missing database (or role) is the wrong option it is: one line and exit 1 at start, as
    any other; a database that exists starts (positive control), and a server that cannot be
    reached is an outage the broker rides out (test_a_broker_started_before_its_database...)."""
    import subprocess
    import sys

    from tests.support.processes import repo_env

    def brokerd(url: str, *check: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "brokerd.cli.server", "--data-dir", str(tmp_path / "wrong"),
                               "--ssmp", "tcp:0:interface=127.0.0.1", "--store", url, *check],
                              capture_output=True, text=True, timeout=30, env=repo_env())

    for url, wrong in ((postgres_server.url("nosuch"), 'database "nosuch" does not exist'),
                       (postgres_url.replace("://brokerd@", "://nobody@", 1), 'role "nobody" does not exist')):
        for check in ((), ("--check-config",)):  # starting, and checking the configuration
            done = brokerd(url, *check)
            assert done.returncode == 1, done
            lines = (done.stdout + done.stderr).splitlines()
            assert len(lines) == 1 and lines[0].startswith("brokerd: --store postgresql://"), lines
            assert wrong in lines[0], lines
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = _node(tmp_path, "right", postgres_url, accounts)
    try:
        alice = BlockingSMQP(broker.ports["smqp"], timeout=60)  # greeted once the store is open
        alice.login("alice", "pub")
        assert alice.command("CREATE TOPIC /right").code == 200
        alice.close()
    finally:
        broker.stop()
    assert "Traceback" not in broker.log()

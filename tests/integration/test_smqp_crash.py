"""Crash safety of SMQP against a real ``twistd brokerd`` killed with SIGKILL: every message the
broker answered 200 to survives, is delivered exactly once after the subscriber's
acknowledgements, and a notification that was sent but not acknowledged comes again."""
from __future__ import annotations

import signal
import socket

import pytest

from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.support.broker import start_broker

SMQP = {"smqp": "tcp:{port}:interface=127.0.0.1"}


def _start(tmp_path, accounts):
    return start_broker(tmp_path, "--accounts", str(accounts), listeners=SMQP)


def _silent(client: BlockingSMQP) -> bool:
    """Nothing more arrives: a NOOP round trip, then half a second of quiet."""
    reply = client.command("NOOP")
    assert reply.code == 200
    if any(getattr(event, "kind", None) == "MESSAGE" for event in client.events):
        return False
    client.sock.settimeout(0.5)
    try:
        data = client.sock.recv(65536)
    except (socket.timeout, TimeoutError):
        return True
    finally:
        client.sock.settimeout(10.0)
    return not data


@pytest.mark.slow
def test_acknowledged_publishes_survive_kill_9_and_arrive_exactly_once(tmp_path):
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = _start(tmp_path, accounts)
    try:
        port = broker.ports["smqp"]
        bob = BlockingSMQP(port)
        bob.login("bob", "durable")
        assert bob.command("CREATE TOPIC /crash").code == 200
        assert bob.command("SUB MESSAGE /crash").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()

        alice = BlockingSMQP(port)
        alice.login("alice", "pub")
        count = 200
        payloads = [f"m{i}\r\n.\r\n".encode() + bytes([i % 256]) for i in range(count)]
        alice.send(b"".join(alice.publish_bytes("/crash", f"C{i}", data) for i, data in enumerate(payloads)))
        replies = [alice.reply() for _ in range(count)]
        assert [r.code for r in replies] == [200] * count
        assert [r.lines[1].split("/")[-1].split("(")[0] for r in replies] == [f"C{i}" for i in range(count)]
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        broker.stop(signal.SIGKILL)

    restarted = start_broker(tmp_path, "--accounts", str(accounts), listeners=SMQP)
    try:
        bob = BlockingSMQP(restarted.ports["smqp"])
        bob.login("bob", "durable")
        received = []
        for _ in range(count):
            notify = bob.notify()
            assert notify.kind == "MESSAGE" and notify.args == ("/crash", "ADD")
            received.append(notify.body.sections[0].data)
            assert bob.command("310 ACK").code == 310
        assert received == payloads
        assert _silent(bob)
        bob.close()

        # A second connection of the same subscriber gets nothing again: all acknowledged.
        again = BlockingSMQP(restarted.ports["smqp"])
        again.login("bob", "durable")
        assert _silent(again)
        again.close()
    finally:
        restarted.stop(signal.SIGKILL)


@pytest.mark.slow
def test_unacknowledged_notifications_come_again_after_kill_9(tmp_path):
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = _start(tmp_path, accounts)
    try:
        port = broker.ports["smqp"]
        bob = BlockingSMQP(port)
        bob.login("bob", "s1")
        assert bob.command("CREATE TOPIC /pending").code == 200
        assert bob.command("SUB MESSAGE /pending").code == 200
        alice = BlockingSMQP(port)
        alice.login("alice", "pub")
        for i in range(5):
            alice.send(alice.publish_bytes("/pending", f"P{i}", f"p{i}".encode()))
            assert alice.reply().code == 200
        first = bob.notify()
        assert first.body.sections[0].data == b"p0"
        assert bob.command("310 ACK").code == 310
        second = bob.notify()
        assert second.body.sections[0].data == b"p1"
        # p1 was sent but never acknowledged when the broker dies.
        broker.stop(signal.SIGKILL)
    finally:
        broker.stop(signal.SIGKILL)

    restarted = _start(tmp_path, accounts)
    try:
        bob = BlockingSMQP(restarted.ports["smqp"])
        bob.login("bob", "s1")
        got = []
        for _ in range(4):
            notify = bob.notify()
            got.append(notify.body.sections[0].data)
            assert bob.command("310 ACK").code == 310
        assert got == [b"p1", b"p2", b"p3", b"p4"]
        assert _silent(bob)
    finally:
        restarted.stop(signal.SIGKILL)


@pytest.mark.slow
def test_twistd_stop_says_notify_server_bye(tmp_path):
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = _start(tmp_path, accounts)
    try:
        client = BlockingSMQP(broker.ports["smqp"])
        client.login("alice", "bye")
        quiet = BlockingSMQP(broker.ports["smqp"])
        quiet.login("bob", "nobye")
        assert quiet.command("UNSUB SERVER BYE").code == 200
        broker.process.send_signal(signal.SIGTERM)
        notify = client.notify()
        assert (notify.kind, notify.args) == ("SERVER", ("BYE", "00:00:00"))
        with pytest.raises(EOFError):
            quiet.notify()
        broker.process.wait(15)
    finally:
        broker.stop(signal.SIGKILL)

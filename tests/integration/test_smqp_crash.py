"""Crash safety of durable delivery against a real ``twistd brokerd`` killed with SIGKILL: every
message the broker acknowledged (SMQP 200, and for a topic with a durable subscriber SSMP 200
and the socket.mq publish result) survives, is delivered exactly once after the subscriber's
acknowledgements, and a notification that was sent but not acknowledged comes again."""
from __future__ import annotations

import signal
import socket

import pytest
import pytest_twisted
from twisted.internet.defer import gatherResults

from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.support.broker import LineClient, start_broker

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


MIXED = {name: "tcp:{port}:interface=127.0.0.1" for name in ("smqp", "ssmp", "mcchat", "socketmq")}


def _drain(subscriber: BlockingSMQP) -> list[bytes]:
    """Every pending notification's data, each acknowledged: the first may wait for the
    store, each next one follows the server's 310 (they all fit in one outbox window); a
    NOOP round trip with no notification before its reply ends it."""
    from brokerd.protocols.smqp.events import Notify

    received = []
    notify = subscriber.notify()
    while True:
        assert notify.kind == "MESSAGE" and notify.args == ("/mixed", "ADD")
        received.append(notify.body.sections[0].data)
        assert subscriber.command("310 ACK").code == 310
        assert subscriber.command("NOOP").code == 200
        if not any(isinstance(event, Notify) for event in subscriber.events):
            return received
        notify = subscriber.notify()


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_mixed_protocol_publishes_acknowledged_before_kill_9_all_arrive_once(tmp_path):
    """SMQP, SSMP, socket.mq and MCCHAT publish to /mixed (durable subscriber offline) at
    once, and SSMP goes on publishing while the broker is killed: after the restart the
    subscriber gets every message that was acknowledged (SMQP 200, SSMP 200, socket.mq
    result), each once."""
    from brokerd.protocols.mcchat.codec import encode_msg
    from brokerd.protocols.socketmq.api import Client

    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    broker = start_broker(tmp_path, "--accounts", str(accounts), "--open-login", listeners=MIXED)
    web = Client(f"http://127.0.0.1:{broker.ports['socketmq']}")
    count = 40
    acknowledged: list[bytes] = []
    try:
        bob = BlockingSMQP(broker.ports["smqp"])
        bob.login("bob", "durable")
        assert bob.command("CREATE TOPIC /mixed").code == 200
        assert bob.command("SUB MESSAGE /mixed").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()

        ssmp = LineClient.connect(broker.ports["ssmp"])
        assert ssmp.request("LOGIN pub open") == b"200"
        mcchat = socket.create_connection(("127.0.0.1", broker.ports["mcchat"]), timeout=10)
        alice = BlockingSMQP(broker.ports["smqp"])
        alice.login("alice", "pub")
        await web.connect()

        ssmp.send(b"".join(b"MCAST mixed ssmp-%d\n" % i for i in range(count)))
        mcchat.sendall(b"".join(encode_msg(b"mixed", b"zoe", b"mcchat-%d" % i) for i in range(count)))
        alice.send(b"".join(alice.publish_bytes("/mixed", f"C{i}", b"smqp-%d" % i) for i in range(count)))
        results = [web.publish("mixed", f"socketmq-{i}") for i in range(count)]
        for i in range(count):
            assert ssmp.line() == b"200"
            acknowledged.append(b"ssmp-%d" % i)
        for i in range(count):
            assert alice.reply().code == 200
            acknowledged.append(b"smqp-%d" % i)
        await gatherResults(results)
        acknowledged += [b"socketmq-%d" % i for i in range(count)]
        # in flight when the broker dies: stored or not, but never half
        ssmp.send(b"".join(b"MCAST mixed late-%d\n" % i for i in range(count)))
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        broker.stop(signal.SIGKILL)
        await web.close()

    restarted = _start(tmp_path, accounts)
    try:
        bob = BlockingSMQP(restarted.ports["smqp"])
        bob.login("bob", "durable")
        received = _drain(bob)
        assert len(received) == len(set(received)), "each message once"
        assert set(acknowledged) <= set(received)
        assert {data.rsplit(b"-", 1)[0] for data in received} <= {b"ssmp", b"smqp", b"socketmq", b"mcchat", b"late"}
        # per publisher, in the order published
        for prefix in (b"ssmp-", b"smqp-", b"socketmq-", b"mcchat-", b"late-"):
            numbers = [int(data[len(prefix):]) for data in received if data.startswith(prefix)]
            assert numbers == sorted(numbers)
        bob.close()
    finally:
        restarted.stop(signal.SIGKILL)

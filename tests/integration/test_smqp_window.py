"""SET NOTIFY WINDOW (brokerd's extension, docs/smqp.md) over real sockets with the real
client: a window of n keeps exactly n notifications outstanding, the server's 310 of each
answer still follows its commit and comes before the NOTIFY it makes room for, one
subscriber's acknowledgements share the store's commits, bad or too large windows are
refused and the client keeps the draft's one at a time, and ONE topics and 416 behave as
without a window."""
from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import gatherResults

from brokerd.protocols.smqp.client import SMQPError
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401
from tests.support.live import SMQPInbox


def data_of(notify) -> bytes:
    return notify.body.sections[0].data


async def refused(d, code: int) -> SMQPError:
    with pytest.raises(SMQPError) as info:
        await d
    assert info.value.code == code, info.value
    return info.value


async def backlog(server, topic: str, count: int, subscriber: str = "c1") -> None:
    """``count`` messages stored for alice:``subscriber`` while she is offline."""
    alice = await server.login("alice", subscriber)
    await alice.create_topic(topic)
    await alice.subscribe(topic)
    await alice.quit()
    bob = await server.login("bob", "pub")
    await gatherResults([bob.publish(topic, f"M{i}", [("text/plain", f"m{i}".encode())])
                         for i in range(count)])


class Recorder(SMQPInbox):
    """An inbox that also keeps the order of NOTIFYs and the server's answers on the wire."""

    def __init__(self, client) -> None:
        super().__init__(client)
        self.wire: list[str] = []

    def got(self, notify) -> None:
        self.wire.append(data_of(notify).decode())
        super().got(notify)

    def ack(self, code: str = "310 ACK"):
        d = self.client.acknowledge(code)

        def answered(reply):
            self.wire.append(str(reply.code))
            return reply

        return d.addCallback(answered)


@pytest_twisted.ensureDeferred
async def test_window_of_n_keeps_n_outstanding_and_each_310_precedes_the_next_notify(smqp_server):
    server = await smqp_server()
    await backlog(server, "/w", 10)
    alice = await server.login("alice", "c1")
    inbox = Recorder(alice)
    # The window is asked for before the login's pending messages go out (SUSPEND first).
    await alice.command("SET", "NOTIFY", "SUSPEND")
    assert await alice.set_notify_window(4) == 4
    await alice.command("SET", "NOTIFY", "RESUME")
    first = [data_of(await inbox.next()) for _ in range(4)]
    assert first == [b"m0", b"m1", b"m2", b"m3"]
    assert await inbox.quiet(), "a fifth notification waits for an answer"
    outbox = server.factory.service.outboxes["alice:c1"]
    assert len(outbox.sent) == 4 and outbox.heap, "more were ready to go"

    reply = await inbox.ack()
    assert reply.code == 310
    assert data_of(await inbox.next()) == b"m4"
    assert await inbox.quiet(), "one answer makes room for one notification"
    assert inbox.wire[:6] == ["m0", "m1", "m2", "m3", "310", "m4"]

    received = [b"m4"]
    answers = [inbox.ack() for _ in range(4)]
    while len(received) < 6:
        received.append(data_of(await inbox.next()))
        answers.append(inbox.ack())
    await gatherResults(answers)
    assert received == [f"m{i}".encode() for i in range(4, 10)]
    # Never more than 4 NOTIFYs without the server's answer between them and the 310s in order.
    outstanding = 0
    for item in inbox.wire:
        outstanding += -1 if item == "310" else 1
        assert 0 <= outstanding <= 4, inbox.wire
    assert outstanding == 0
    await refused(alice.acknowledge(), 503)
    assert await inbox.quiet()
    stats = server.factory.service.stats
    assert stats["acked"] == 10 and stats["redelivered"] == 0


@pytest_twisted.ensureDeferred
async def test_acknowledgements_of_one_subscriber_share_commits_only_with_a_window(smqp_server):
    server = await smqp_server()
    store = server.runtime.store
    await backlog(server, "/g", 40)

    # The draft's exchange: each acknowledgement is a commit of its own.
    alice = await server.login("alice", "c1")
    inbox = SMQPInbox(alice)
    for _ in range(10):
        await inbox.next()
        before = store.batches
        await alice.acknowledge()
        assert store.batches > before
    await alice.quit()

    # A window of 30: thirty acknowledgements sent at once share a few commits.
    alice = await server.login("alice", "c1")
    inbox = SMQPInbox(alice)
    await alice.command("SET", "NOTIFY", "SUSPEND")
    assert await alice.set_notify_window(30) == 30
    await alice.command("SET", "NOTIFY", "RESUME")
    received = [data_of(await inbox.next()) for _ in range(30)]
    assert received == [f"m{i}".encode() for i in range(10, 40)]
    before = store.batches
    replies = await gatherResults([alice.acknowledge() for _ in range(30)])
    assert [r.code for r in replies] == [310] * 30
    commits = store.batches - before
    assert 1 <= commits <= 5, commits
    assert await inbox.quiet()
    assert server.factory.service.stats["acked"] == 40


@pytest_twisted.ensureDeferred
async def test_bytes_outstanding_are_bounded_by_the_queued_bytes_limit(smqp_server):
    server = await smqp_server(smqp_max_queued_bytes=2500)
    alice = await server.login("alice", "c1")
    await alice.create_topic("/b")
    await alice.subscribe("/b")
    await alice.quit()
    bob = await server.login("bob", "pub")
    for i in range(3):
        await bob.publish("/b", f"B{i}", [("application/octet-stream", bytes([i]) * 1500)])
    alice = await server.login("alice", "c1")
    inbox = SMQPInbox(alice)
    assert await alice.set_notify_window(10) == 10
    # Two bodies of 1500 bytes would pass 2500: one outstanding despite the window of 10.
    assert data_of(await inbox.next()) == b"\x00" * 1500
    assert await inbox.quiet()
    assert len(server.factory.service.outboxes["alice:c1"].sent) == 1
    assert (await alice.acknowledge()).code == 310
    assert data_of(await inbox.next()) == b"\x01" * 1500
    assert await inbox.quiet()
    assert (await alice.acknowledge()).code == 310
    assert data_of(await inbox.next()) == b"\x02" * 1500
    assert (await alice.acknowledge()).code == 310
    assert await inbox.quiet()


@pytest_twisted.ensureDeferred
async def test_bad_windows_are_refused_and_the_client_falls_back_to_one(smqp_server):
    server = await smqp_server(smqp_max_notify_window=8)
    await backlog(server, "/f", 3)
    alice = await server.login("alice", "c1")
    inbox = SMQPInbox(alice)
    await alice.command("SET", "NOTIFY", "SUSPEND")
    for value in ("0", "-1", "two", "2 /f"):
        await refused(alice.send_raw(f"SET NOTIFY WINDOW {value}\r\n".encode()), 400)
    error = await refused(alice.command("SET", "NOTIFY", "WINDOW", "9"), 510)
    assert "at most 8" in str(error)
    assert await alice.set_notify_window(9) == 1  # refused: the draft's one at a time
    assert alice.notify_window == 1
    await alice.command("SET", "NOTIFY", "RESUME")
    assert data_of(await inbox.next()) == b"m0"
    assert await inbox.quiet(), "one at a time after the refusal"
    await alice.acknowledge()
    assert data_of(await inbox.next()) == b"m1"
    # The largest window allowed is granted.
    assert await alice.set_notify_window(8) == 8
    assert data_of(await inbox.next()) == b"m2"
    await gatherResults([alice.acknowledge(), alice.acknowledge()])
    assert await inbox.quiet()


@pytest_twisted.ensureDeferred
async def test_window_on_a_one_topic_with_416(smqp_server):
    server = await smqp_server()
    carol = await server.login("bob", "c2")
    alice = await server.login("alice", "c1")
    await alice.create_topic("/one")
    await alice.set_delivery("/one", "ONE")
    await carol.subscribe("/one")
    await carol.quit()
    await alice.subscribe("/one")
    inbox = SMQPInbox(alice)
    assert await alice.set_notify_window(3) == 3
    bob = await server.login("bob", "pub")
    for i in range(3):
        await bob.publish("/one", f"O{i}", [("text/plain", f"o{i}".encode())])
    assert [data_of(await inbox.next()) for _ in range(3)] == [b"o0", b"o1", b"o2"]
    # alice holds all three: the other subscriber gets none of them meanwhile.
    carol = await server.login("bob", "c2")
    carol_inbox = SMQPInbox(carol)
    assert await carol_inbox.quiet()
    # alice refuses the first (it goes to carol at once) and acknowledges the other two.
    replies = await gatherResults([alice.acknowledge("416 not now"), alice.acknowledge(),
                                   alice.acknowledge()])
    assert [r.code for r in replies] == [200, 310, 310]
    assert data_of(await carol_inbox.next()) == b"o0"
    assert (await carol.acknowledge()).code == 310
    assert await carol_inbox.quiet() and await inbox.quiet()
    assert server.factory.service.stats["acked"] == 3


@pytest_twisted.ensureDeferred
async def test_unanswered_window_closes_the_session_and_comes_again(smqp_server):
    server = await smqp_server(durable_retry_timeout=0.3)
    await backlog(server, "/r", 3)
    alice = await server.login("alice", "c1")
    inbox = SMQPInbox(alice)
    await alice.command("SET", "NOTIFY", "SUSPEND")
    assert await alice.set_notify_window(3) == 3
    await alice.command("SET", "NOTIFY", "RESUME")
    assert [data_of(await inbox.next()) for _ in range(3)] == [b"m0", b"m1", b"m2"]
    assert (await alice.acknowledge()).code == 310
    # m1 and m2 stay unanswered: no resend on this connection, the session is closed.
    await alice.when_closed()
    assert [data_of(n) for n in inbox.items] == []
    alice = await server.login("alice", "c1")
    inbox = SMQPInbox(alice)
    assert data_of(await inbox.next()) == b"m1"
    assert (await alice.acknowledge()).code == 310
    assert data_of(await inbox.next()) == b"m2"
    assert (await alice.acknowledge()).code == 310
    assert await inbox.quiet()
    stats = server.factory.service.stats
    assert stats["acked"] == 3 and stats["redelivered"] == 2


class _Drainer:
    """A blocking subscriber with a window: answers each notification at once; the
    server's 310s come in the order of the answers, so each confirms the oldest
    notification not confirmed yet."""

    def __init__(self, client) -> None:
        self.client = client
        self.received: list[bytes] = []
        self.confirmed: list[bytes] = []

    def until(self, done) -> None:
        from brokerd.protocols.smqp.events import Notify, Reply

        while not done():
            event = self.client._next()
            if isinstance(event, Notify):
                self.received.append(event.body.sections[0].data)
                self.client.send(b"310 ACK\r\n")
            else:
                assert isinstance(event, Reply) and event.code == 310, event
                self.confirmed.append(self.received[len(self.confirmed)])


def _windowed_login(port: int, window: int):
    from tests.integration.smqp_fixtures import BlockingSMQP

    client = BlockingSMQP(port)
    client.login("bob", "durable")
    assert client.command("SET NOTIFY SUSPEND").code == 200
    assert client.command(f"SET NOTIFY WINDOW {window}").code == 200
    assert client.command("SET NOTIFY RESUME").code == 200
    return client


@pytest.mark.slow
def test_kill_9_during_a_windowed_drain_loses_nothing_and_repeats_nothing_confirmed(tmp_path):
    import signal

    from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
    from tests.support.broker import start_broker

    listeners = {"smqp": "tcp:{port}:interface=127.0.0.1"}
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    options = ("--accounts", str(accounts), "--smqp-max-notify-window", "32")
    broker = start_broker(tmp_path, *options, listeners=listeners)
    count = 400
    payloads = [f"w{i:03}".encode() for i in range(count)]
    try:
        port = broker.ports["smqp"]
        bob = BlockingSMQP(port)
        bob.login("bob", "durable")
        assert bob.command("CREATE TOPIC /win").code == 200
        assert bob.command("SUB MESSAGE /win").code == 200
        assert bob.command("QUIT").code == 200
        bob.close()
        alice = BlockingSMQP(port)
        alice.login("alice", "pub")
        alice.send(b"".join(alice.publish_bytes("/win", f"C{i}", data) for i, data in enumerate(payloads)))
        assert [alice.reply().code for _ in range(count)] == [200] * count
        alice.close()

        before = _Drainer(_windowed_login(port, 32))
        before.until(lambda: len(before.confirmed) >= 150)
        # Answers are in flight (sent, not confirmed) when the broker dies.
        assert len(before.received) > len(before.confirmed)
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
        before.client.close()
    finally:
        broker.stop(signal.SIGKILL)
    assert before.received == payloads[:len(before.received)]

    restarted = start_broker(tmp_path, *options, listeners=listeners)
    try:
        after = _Drainer(_windowed_login(restarted.ports["smqp"], 32))
        after.until(lambda: payloads[-1] in after.confirmed)
        # Nothing the server confirmed comes again; nothing is lost; no duplicates, in order.
        assert not set(after.received) & set(before.confirmed)
        assert set(before.received) | set(after.received) == set(payloads)
        assert after.received == sorted(set(after.received))
        assert after.received[-(count - len(before.received)):] == payloads[len(before.received):]
        assert after.confirmed == after.received
        assert after.client.command("NOOP").code == 200
        assert not any(getattr(e, "kind", None) == "MESSAGE" for e in after.client.events)
        after.client.close()
    finally:
        restarted.stop(signal.SIGKILL)

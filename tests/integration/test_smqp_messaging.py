"""SMQP publish/subscribe end to end over real sockets with the real client: PUBLISH replies,
NOTIFY and the two-phase 310 exchange, durable subscriptions, priorities, Guarantee: NO,
ONE delivery and 416, wildcards, SINCE/UNTIL, receipts, expiry and retries into the Trash,
REMOVE/MOVE/GET/LIST MESSAGE, RECALL/REPLACE/REPLY, SUSPEND/RESUME, NOTIFY TOPIC/SUBSCRIBERS."""
from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import DeferredList

from brokerd.protocols.smqp.client import SMQPError
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401
from tests.support.live import SMQPInbox


async def session(server, account="alice", channel="c1"):
    client = await server.login(account, channel)
    return client, SMQPInbox(client)


def data_of(notify) -> bytes:
    return notify.body.sections[0].data


async def refused(d, code: int) -> SMQPError:
    with pytest.raises(SMQPError) as info:
        await d
    assert info.value.code == code, info.value
    return info.value


@pytest_twisted.ensureDeferred
async def test_publish_notify_two_phase_round_trip(smqp_server):
    server = await smqp_server()
    alice, inbox = await session(server)
    await alice.create_topic("/news")
    assert await alice.subscribe("/news") == ["/news"]
    bob, _ = await session(server, "bob")
    payload = b"line1\r\n.\r\n\x00\xff binary"
    reply = await bob.publish("/NEWS", "A004", [("application/octet-stream", payload), ("text/plain", b"hi")],
                              [("Name", "IBM quote"), ("Priority", "3"), ("X-Custom", "yes")])
    cmuid, smuid = reply.values
    assert cmuid.startswith(f"bob:c1@{server.factory.domain}/A004(")
    assert smuid.startswith(server.factory.suid + "/")
    await bob.publish("/news", "A005", [("text/plain", b"second")])
    first = await inbox.next()
    assert first.args == ("/news", "ADD")
    assert first.body.get("Smuid") == smuid and first.body.get("Cmuid") == cmuid
    assert first.body.get("X-Custom") == "yes" and first.body.get("Name") == "IBM quote"
    assert [s.data for s in first.body.sections] == [payload, b"hi"]
    assert await inbox.quiet(), "the next notification waits for the acknowledgement"
    ack = await alice.acknowledge()
    assert (ack.code, ack.lines) == (310, ("ACK",))
    assert data_of(await inbox.next()) == b"second"
    await alice.acknowledge()
    await refused(alice.acknowledge(), 503)
    await refused(bob.publish("/news", "B1", [("text/plain", b"x")], created=None, headers=[("Priority", "0")]), 400)
    await refused(bob.send_raw(b"PUB MESSAGE /news B2\r\n\r\nContent-Type: text/plain\r\n"
                               b"Content-Length: 1\r\n\r\nx\r\n.\r\n"), 400)  # no Created
    await refused(bob.publish("/nothere", "B3", [("text/plain", b"x")]), 404)
    await refused(bob.publish("/news/Trash", "B4", [("text/plain", b"x")]), 403)


@pytest_twisted.ensureDeferred
async def test_durable_subscription_priority_and_redelivery_on_reconnect(smqp_server):
    server = await smqp_server()
    alice, _ = await session(server)
    await alice.create_topic("/quotes")
    await alice.subscribe("/quotes")
    await alice.quit()
    bob, _ = await session(server, "bob")
    for n, priority in enumerate((1, 5, 3, 5)):
        await bob.publish("/quotes", f"Q{n}", [("text/plain", f"q{n}".encode())], [("Priority", str(priority))])
    alice, inbox = await session(server)
    assert data_of(await inbox.next()) == b"q1"
    await alice.acknowledge()
    assert data_of(await inbox.next()) == b"q3"
    # Disconnect without acknowledging q3: it comes again, q1 never does.
    alice.transport.abortConnection()
    await alice.when_closed()
    alice, inbox = await session(server)
    assert [data_of(await inbox.next())] == [b"q3"]
    await alice.acknowledge()
    assert data_of(await inbox.next()) == b"q2"
    await alice.acknowledge()
    assert data_of(await inbox.next()) == b"q0"
    await alice.acknowledge()
    assert await inbox.quiet()
    assert await alice.count("MESSAGE", "/quotes") == 4


@pytest_twisted.ensureDeferred
async def test_guarantee_no_has_no_acknowledgements(smqp_server):
    server = await smqp_server()
    alice, inbox = await session(server)
    await alice.create_topic("/Mouse")
    await alice.subscribe("/mouse")
    bob, _ = await session(server, "bob")
    bob.send_raw(b"")  # keep the FIFO honest: the publish gets no reply, the NOOP does
    bob._pending.pop()
    bob.transport.write(b"PUB MESSAGE /mouse M1\r\nCreated: D20020101T000000Z\r\nGuarantee: NO\r\n\r\n"
                        b"Content-Type: text/plain\r\nContent-Length: 3\r\n\r\nxy1\r\n.\r\n")
    reply = await bob.noop()
    assert reply.lines == ("OK",)
    notify = await inbox.next()
    assert notify.body.get("Guarantee") == "NO" and data_of(notify) == b"xy1"
    assert notify.args == ("/Mouse", "ADD")  # the topic as created, like every NOTIFY MESSAGE
    assert notify.body.get("Created") == "D20020101T000000Z" and notify.body.get("Smuid").startswith(server.factory.suid)
    assert await alice.count("MESSAGE", "/mouse") == 0


@pytest_twisted.ensureDeferred
async def test_one_delivery_and_416(smqp_server):
    server = await smqp_server()
    first, first_inbox = await session(server, "alice", "w1")
    second, second_inbox = await session(server, "alice", "w2")
    await first.create_topic("/work")
    await first.set_delivery("/work", "ONE")
    await first.subscribe("/work")
    await second.subscribe("/work")
    bob, _ = await session(server, "bob")
    await bob.publish("/work", "J1", [("text/plain", b"job")])
    await DeferredList([first_inbox.arrival(), second_inbox.arrival()], fireOnOneCallback=True).addTimeout(5, reactor)
    owner, other = (first, second) if first_inbox.items else (second, first)
    owner_inbox, other_inbox = (first_inbox, second_inbox) if owner is first else (second_inbox, first_inbox)
    assert data_of(await owner_inbox.next()) == b"job"
    assert await other_inbox.quiet(), "ONE delivery: one session at a time"
    reply = await owner.acknowledge("416 Not available")
    assert reply.code == 200
    assert data_of(await other_inbox.next()) == b"job"
    await other.acknowledge()
    assert await owner_inbox.quiet() and await other_inbox.quiet()


@pytest_twisted.ensureDeferred
async def test_one_message_left_unanswered_goes_to_a_subscriber_that_answers(smqp_server):
    """Without a window too: a ONE message its holder leaves unanswered for the retry
    timeout is not sent to it again; the holder is closed with 421 and the message goes to
    the other subscriber, which acknowledges it."""
    server = await smqp_server(durable_retry_timeout=0.3)
    silent, silent_inbox = await session(server, "alice", "silent")
    await silent.create_topic("/work")
    await silent.set_delivery("/work", "ONE")
    await silent.subscribe("/work")
    bob, _ = await session(server, "bob")
    await bob.publish("/work", "J1", [("text/plain", b"job")])
    assert data_of(await silent_inbox.next()) == b"job"
    worker, worker_inbox = await session(server, "alice", "worker")
    await worker.subscribe("/work")
    assert data_of(await worker_inbox.next()) == b"job"  # once the silent one was closed
    await silent.when_closed()
    assert silent_inbox.items == []  # not sent to it again
    assert (await worker.acknowledge()).code == 310
    assert await worker_inbox.quiet()


@pytest_twisted.ensureDeferred
async def test_subscribe_forms_wildcards_since_until_and_unsubscribe(smqp_server):
    server = await smqp_server(max_subscriptions=4)
    alice, inbox = await session(server)
    for topic in ("/stocks", "/stocks/quotes", "/stocks/quotes/ibm", "/stocks/quotes/sony", "/weather"):
        await alice.create_topic(topic)
    await refused(alice.command("SUB", "MESSAGE", "/*"), 510)
    await refused(alice.command("SUB", "MESSAGE", "/weather", "SINCE", "D20020101T000000Z",
                                "UNTIL", "D20020101T000000Z"), 409)
    assert await alice.subscribe("/stocks/quotes/*") == ["/stocks/quotes/ibm", "/stocks/quotes/sony"]
    assert await alice.subscribe("/weather", "DELETE,REPLACE") == ["/weather"]
    await alice.command("SUB", "TOPIC", "/stocks")
    await alice.command("SUB", "SUB", "/weather")
    await refused(alice.subscribe("/stocks"), 413)
    listed = (await alice.command("LIST", "SUBSCRIPTIONS")).values
    assert list(listed) == ["/stocks/quotes/*", "/weather", "SUB /weather", "TOPIC /stocks"]
    bob, _ = await session(server, "bob")
    await alice.create_topic("/stocks/quotes/new")
    await bob.publish("/stocks/quotes/new", "N1", [("text/plain", b"fresh")])
    await bob.publish("/weather", "W1", [("text/plain", b"rain")])  # ADD not subscribed
    notices = []
    while True:
        notify = await inbox.next()
        if notify.kind == "MESSAGE":
            break
        notices.append(notify)
    assert notify.args[0] == "/stocks/quotes/new" and data_of(notify) == b"fresh"
    assert ("TOPIC", ("/stocks/quotes", "ADD", "/stocks/quotes/new")) not in [(n.kind, n.args) for n in notices]
    await alice.acknowledge()
    assert await inbox.quiet()
    reply = await alice.command("UNSUB", "*")
    assert list(reply.values) == ["MESSAGE /stocks/quotes/*", "MESSAGE /weather", "SUB /weather", "TOPIC /stocks"]
    assert (await alice.command("LIST", "SUBSCRIPTIONS")).values == ()
    await refused(alice.unsubscribe("/weather"), 404)
    # UNTIL in the past: the next message ends the subscription.
    await alice.command("SUB", "MESSAGE", "/weather", "UNTIL", "D20020101T000000Z")
    await bob.publish("/weather", "W2", [("text/plain", b"late")])
    assert await inbox.quiet()
    assert (await alice.command("LIST", "SUBSCRIPTIONS")).values == ()


@pytest_twisted.ensureDeferred
async def test_topic_and_subscriber_notices(smqp_server):
    server = await smqp_server()
    alice, inbox = await session(server)
    await alice.create_topic("/chat")
    await alice.command("SUB", "TOPIC", "/chat/*")
    await alice.command("SUB", "SUB", "/chat")
    await alice.create_topic("/chat/internet")
    await alice.set_keywords("/chat/internet", ["NET"])
    bob, _ = await session(server, "bob")
    await bob.subscribe("/chat")
    await alice.rename_topic("/chat/internet", "/chat/web")
    got = [(n.kind, n.args) for n in [await inbox.next() for _ in range(4)]]
    assert got == [("TOPIC", ("/chat", "ADD", "/chat/internet")),
                   ("TOPIC", ("/chat/internet", "KEYWORDS", "(NET)")),
                   ("SUBSCRIBERS", ("/chat", "1")),
                   ("TOPIC", ("/chat/internet", "RENAME", "/chat/web"))]


@pytest_twisted.ensureDeferred
async def test_expiry_receipt_and_trash(smqp_server):
    server = await smqp_server()
    alice, inbox = await session(server)
    await alice.create_topic("/short")
    bob, _ = await session(server, "bob")
    await bob.subscribe("/short")
    await bob.quit()
    await alice.publish("/short", "E1", [("text/plain", b"soon gone")], [("Timeout", "00:00:01"), ("Receipt", "ALL")])
    receipt = await inbox.next(timeout=5)
    assert receipt.kind == "RECEIPT" and receipt.args[0] == "/short"
    assert receipt.body.get("Receipt") == "0/1" and receipt.body.sections == ()
    await alice.acknowledge()
    assert await alice.count("MESSAGE", "/short") == 0
    assert await alice.count("MESSAGE", "/short/Trash") == 1
    bob, bob_inbox = await session(server, "bob")
    assert await bob_inbox.quiet()


@pytest_twisted.ensureDeferred
async def test_receipt_one_and_retries_into_the_trash(smqp_server):
    server = await smqp_server(durable_retry_timeout=0.2, durable_max_attempts=2)
    alice, inbox = await session(server)
    await alice.create_topic("/flaky")
    bob, bob_inbox = await session(server, "bob")
    await bob.subscribe("/flaky")
    await alice.publish("/flaky", "R1", [("text/plain", b"ack me")], [("Receipt", "ONE")])
    assert data_of(await bob_inbox.next()) == b"ack me"
    assert data_of(await bob_inbox.next()) == b"ack me"  # sent again after the retry timeout
    receipt = await inbox.next()
    assert receipt.body.get("Receipt") == "0/1"
    assert await alice.count("MESSAGE", "/flaky/Trash") == 1
    assert server.factory.service.stats["redelivered"] == 1
    await alice.acknowledge()
    await alice.publish("/flaky", "R2", [("text/plain", b"ok")], [("Receipt", "yes")])
    await bob_inbox.next()
    await bob.acknowledge()
    receipt = await inbox.next()
    assert receipt.body.get("Receipt") == "1/1" and receipt.body.get("Cmuid").endswith(")")


@pytest_twisted.ensureDeferred
async def test_get_list_remove_move_recall_replace(smqp_server):
    server = await smqp_server()
    alice, inbox = await session(server)
    await alice.create_topic("/chat")
    await alice.create_topic("/chat/old")
    smuids = []
    for n in range(3):
        smuids.append((await alice.publish("/chat", f"G{n}", [("text/plain", f"g{n}".encode())])).values[1])
    numbers = [int(s.split("/")[-1].split("(")[0]) for s in smuids]
    listed = (await alice.command("LIST", "MESSAGE", "/chat")).values
    assert listed == (f"{numbers[0]}-{numbers[2]}",)
    await alice.command("SUB", "MESSAGE", "DELETE,MOVE,REPLACE", "/chat")
    await alice.command("REMOVE", "MESSAGE", "/chat", smuids[0])
    deleted = await inbox.next()
    assert deleted.args == ("/chat", "DELETE") and deleted.body.sections == ()
    await alice.command("SUB", "MESSAGE", "/chat/old")
    await alice.command("MOVE", "MESSAGE", "/chat", smuids[1], "/chat/old")
    moved = await inbox.next()
    assert moved.args == ("/chat", "MOVE")
    arrived = await inbox.next()  # the destination's subscribers get the message itself
    assert arrived.args == ("/chat/old", "ADD") and data_of(arrived) == b"g1"
    await alice.acknowledge()
    assert (await alice.command("LIST", "MESSAGE", "/chat/old")).values == (str(numbers[1]),)
    assert (await alice.command("LIST", "MESSAGE", "/chat/Trash")).values == (str(numbers[0]),)
    await alice.publish("/chat", "G9", [("text/plain", b"new g2")], [("Smuid", smuids[2])], mode="REPLACE")
    replaced = await inbox.next()
    assert replaced.args == ("/chat", "REPLACE") and data_of(replaced) == b"new g2"
    await alice.acknowledge()
    recall_target = (await alice.publish("/chat", "G10", [("text/plain", b"oops")])).values[1]
    reply = await alice.publish("/chat", "G11", [], [("Smuid", recall_target)], mode="RECALL")
    assert reply.values[1] == recall_target
    await refused(alice.publish("/chat", "G12", [], [("Smuid", recall_target)], mode="RECALL"), 404)
    await refused(alice.command("REMOVE", "MESSAGE", "/chat", "999999"), 404)
    guest, _ = await session(server, "guest")
    await refused(guest.command("REMOVE", "MESSAGE", "/chat/old", str(numbers[1])), 403)
    await refused(guest.publish("/chat", "G13", [("text/plain", b"x")]), 403)


@pytest_twisted.ensureDeferred
async def test_point_to_point_and_reply(smqp_server):
    server = await smqp_server()
    alice, alice_inbox = await session(server)
    bob, bob_inbox = await session(server, "bob", "b1")
    domain = server.factory.domain
    sent = await alice.publish(f"bob:b1@{domain}", "P1", [("text/plain", b"hello bob")], [("Reply", "YES")])
    notify = await bob_inbox.next()
    assert notify.args == ("/accounts/bob/b1", "ADD") and data_of(notify) == b"hello bob"
    await bob.acknowledge()
    cmuid, smuid = sent.values
    await bob.publish(f"alice:c1@{domain}", "R1", [("text/plain", b"thanks")],
                      [("Smuid", smuid), ("Cmuid", cmuid)], mode="REPLY")
    answer = await alice_inbox.next()
    assert answer.body.get_all("Smuid")[0] == smuid and len(answer.body.get_all("Smuid")) == 2
    assert answer.body.get_all("Cmuid")[0] == cmuid and "bob:b1@" in answer.body.get_all("Cmuid")[1]
    await alice.acknowledge()
    await refused(alice.publish("nobody@" + domain, "P2", [("text/plain", b"x")]), 404)
    await refused(alice.publish("bob@elsewhere.example", "P3", [("text/plain", b"x")]), 405)


@pytest_twisted.ensureDeferred
async def test_suspend_resume_and_312(smqp_server):
    server = await smqp_server()
    alice, inbox = await session(server)
    await alice.create_topic("/a")
    await alice.create_topic("/b")
    await alice.subscribe("/a")
    await alice.subscribe("/b")
    await alice.command("SET", "NOTIFY", "SUSPEND")
    await alice.publish("/a", "S1", [("text/plain", b"a1")])
    assert await inbox.quiet()
    await alice.command("SET", "NOTIFY", "RESUME")
    assert data_of(await inbox.next()) == b"a1"
    wait = await alice.acknowledge("312 wait")
    assert wait.code == 310
    await alice.publish("/a", "S2", [("text/plain", b"a2")])
    await alice.publish("/b", "S3", [("text/plain", b"b1")])
    assert data_of(await inbox.next()) == b"b1"
    await alice.acknowledge()
    assert await inbox.quiet()
    await alice.command("SET", "NOTIFY", "RESUME", "/a")
    assert data_of(await inbox.next()) == b"a2"
    await alice.acknowledge()
    await alice.set_delivery("/b", "NONE")
    await alice.publish("/b", "S4", [("text/plain", b"held")])
    assert await inbox.quiet()
    await alice.set_delivery("/b", "ALL")
    assert data_of(await inbox.next()) == b"held"


@pytest_twisted.ensureDeferred
async def test_reply_permission_is_the_answered_messages_topics(smqp_server, tmp_path):
    ual = tmp_path / "ual"
    ual.write_text("/ @accounts psacr\n/announce bob s\n/support bob sr\n")
    server = await smqp_server(ual_file=ual)
    alice, alice_inbox = await session(server)
    await alice.create_topic("/announce")
    await alice.create_topic("/support")
    announced = (await alice.publish("/announce", "A1", [("text/plain", b"read only")])).values
    asked = (await alice.publish("/support", "A2", [("text/plain", b"any questions?")])).values
    bob, _ = await session(server, "bob", "b1")
    to_alice = f"alice:c1@{server.factory.domain}"
    error = await refused(bob.publish(to_alice, "R1", [("text/plain", b"no")],
                                      [("Smuid", announced[1]), ("Cmuid", announced[0])], mode="REPLY"), 403)
    assert error.lines == ("Forbidden: no reply permission on /announce",)
    await bob.publish(to_alice, "R2", [("text/plain", b"yes")], [("Smuid", asked[1]), ("Cmuid", asked[0])],
                      mode="REPLY")
    answer = await alice_inbox.next()
    assert answer.args == ("/accounts/alice/c1", "ADD") and data_of(answer) == b"yes"
    await alice.acknowledge()
    await refused(bob.publish(to_alice, "R3", [("text/plain", b"?")], [("Smuid", "424242")], mode="REPLY"), 404)
    await refused(bob.publish(to_alice, "R4", [("text/plain", b"?")], mode="REPLY"), 400)

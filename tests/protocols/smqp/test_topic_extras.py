"""Per-topic message timeouts (SET/GET TOPIC TIMEOUT, our extension), REMOVE TOPIC dropping
the subscriptions of what it removes, and the reply permission of PUBLISH MESSAGE REPLY to an
address: the server on a StringTransport with a Clock and the in-memory store."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from brokerd.auth.accounts import AccountsChecker, PasswordHash, run_inline, write_accounts
from brokerd.auth.ual import parse_access_list
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.smqp.codec import SMQPClientParser
from brokerd.protocols.smqp.events import Reply
from brokerd.protocols.smqp.server import SMQPServerFactory
from brokerd.store.memory import MemoryStore
from brokerd.store.records import SubscriptionRecord
from tests.support.smqp import smqp_factory

PUB = ("PUB MESSAGE {target} {cmuid}\r\nCreated: D20020101T000000Z\r\n{headers}\r\n"
       "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi\r\n.\r\n")


class FlakyStore(MemoryStore):
    """Fails put_topics while ``broken``."""

    broken = False

    def put_topics(self, records):
        if self.broken:
            return fail(OSError("disk full"))
        return super().put_topics(records)


def make_factory(tmp_path: Path, ual: str = "", **settings) -> SMQPServerFactory:
    path = tmp_path / "accounts"
    write_accounts(path, {name: PasswordHash.create(name + "pw", n=2) for name in ("alice", "bob")})
    factory = smqp_factory(Broker(), Settings(domain="test.example", **settings), Clock(), FlakyStore(),
                                AccountsChecker(path, run=run_inline), ual=parse_access_list(ual), run=run_inline)
    factory.start()
    factory.startFactory()
    return factory


@pytest.fixture
def factory(tmp_path: Path) -> SMQPServerFactory:
    factory = make_factory(tmp_path)
    yield factory
    factory.stopFactory()


class Client:
    """One logged-in connection; ``send`` returns what the server wrote, parsed."""

    def __init__(self, factory: SMQPServerFactory, account: str = "alice", channel: str = "c1") -> None:
        self.protocol = factory.buildProtocol(None)
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)
        self.parser = SMQPClientParser()
        self.received()  # the greeting
        password = "" if account == "guest" else f" {account}pw"
        self.raw(f"LOGIN {account}:{channel} CLEAR/1.0\r\nPASS {account}{password}\r\n")

    def raw(self, text: str) -> list:
        """Send ``text``; what the server wrote in answer (earlier output is dropped)."""
        self.transport.clear()
        self.protocol.dataReceived(text.encode("utf-8"))
        return self.received()

    def send(self, *lines: str) -> list:
        return self.raw("".join(line + "\r\n" for line in lines))

    def received(self) -> list:
        """What the server wrote since the last command (notifications), parsed."""
        events = self.parser.feed(self.transport.value())
        self.transport.clear()
        return events

    def one(self, line: str) -> Reply:
        [reply] = self.send(line)
        return reply

    def publish(self, target: str, cmuid: str, *headers: tuple[str, str], mode: str = "") -> list:
        text = "".join(f"{n}: {v}\r\n" for n, v in headers)
        target = f"{mode} {target}" if mode else target
        return self.raw(PUB.format(target=target, cmuid=cmuid, headers=text))


def ok(replies: list) -> None:
    assert all(isinstance(r, Reply) and r.code == 200 for r in replies), replies


def expiry(factory: SMQPServerFactory, client_id: str) -> float | None:
    """The ``expires`` of the stored message the client published as ``client_id``."""
    [found] = [m for m in factory.store._messages.values() if f"/{client_id}(" in m.client_message_id]
    return found.expires


# ---------------------------------------------------------------------------- topic timeouts

def test_set_and_get_topic_timeout_exact_bytes(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /Chat", "CREATE TOPIC /Chat/Web"))
    alice.transport.clear()
    alice.protocol.dataReceived(b"GET TOPIC TIMEOUT /chat/web\r\nSET TOPIC TIMEOUT /chat 3600\r\n"
                                b"GET TOPIC TIMEOUT /chat/web\r\nSET TOPIC TIMEOUT /chat/web INF\r\n"
                                b"GET TOPIC TIMEOUT /chat/web\r\nSET TOPIC TIMEOUT /chat/web default\r\n"
                                b"SET TOPIC TIMEOUT /chat 00:00:01:30\r\nGET TOPIC TIMEOUT /chat/web\r\n")
    assert alice.transport.value() == (
        b"200-OK\r\n200-01:00:00:00\r\n200 From: SERVER\r\n"
        b"200 OK\r\n"
        b"200-OK\r\n200-00:01:00:00\r\n200 From: /Chat\r\n"
        b"200 OK\r\n"
        b"200-OK\r\n200-INFINITE\r\n200 From: /Chat/Web\r\n"
        b"200 OK\r\n"
        b"200 OK\r\n"
        b"200-OK\r\n200-00:00:01:30\r\n200 From: /Chat\r\n")
    assert factory.store._topics["chat"].timeout == 90.0
    assert factory.store._topics["chat/web"].timeout is None


def test_refusals_and_undo(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /a"))
    assert alice.one("SET TOPIC TIMEOUT / 60").code == 403
    assert alice.one("SET TOPIC TIMEOUT /accounts/alice/c1 60").code == 403
    assert alice.one("SET TOPIC TIMEOUT /a/Trash 60").code == 403
    assert alice.one("SET TOPIC TIMEOUT /nothere 60").code == 404
    assert alice.one("SET TOPIC TIMEOUT /a soon").code == 400
    guest = Client(factory, "guest", "g1")
    assert guest.one("GET TOPIC TIMEOUT /a").values == ("01:00:00:00", "From: SERVER")
    assert guest.one("SET TOPIC TIMEOUT /a 60").code == 403  # no administer permission
    factory.store.broken = True
    assert alice.one("SET TOPIC TIMEOUT /a 60").code == 451
    factory.store.broken = False
    assert alice.one("GET TOPIC TIMEOUT /a").values == ("01:00:00:00", "From: SERVER")


def test_a_message_without_timeout_takes_its_topics_then_the_servers(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /a", "CREATE TOPIC /a/b", "CREATE TOPIC /c", "CREATE TOPIC /v > /a/b",
                  "SET TOPIC TIMEOUT /a 10", "SET TOPIC TIMEOUT /v INFINITE"))
    now = factory.clock.seconds()
    for target in ("/a", "/a/b", "/c", "/v"):
        ok(alice.publish(target, "M" + target[1:].replace("/", "")))
    ok(alice.publish("/a", "T1", ("Timeout", "00:00:05")))
    ok(alice.publish("alice:c9@test.example", "P1"))
    assert expiry(factory, "Ma") == now + 10  # the topic's own
    assert expiry(factory, "Mab") is None  # /v is virtual: INFINITE was set on its target /a/b
    assert expiry(factory, "Mv") is None
    assert expiry(factory, "Mc") == now + Settings.durable_message_timeout
    assert expiry(factory, "T1") == now + 5  # the message's Timeout wins
    assert expiry(factory, "P1") == now + Settings.durable_message_timeout
    ok(alice.send("SET TOPIC TIMEOUT /accounts/alice 20"))  # the account's login topics inherit
    ok(alice.publish("alice:c9@test.example", "P2"))
    assert expiry(factory, "P2") == now + 20


def test_a_message_expires_into_the_trash_after_its_topics_timeout(factory):
    """A topic's timeout, inherited by its children; a message's own INFINITE Timeout and a
    topic with the server's default keep theirs (the same as the real-socket test of
    test_smqp_topics, without its second of real time)."""
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /short", "CREATE TOPIC /short/child", "CREATE TOPIC /long",
                  "SET TOPIC TIMEOUT /short 1"))
    ok(alice.publish("/short", "S1"))
    ok(alice.publish("/short/child", "S2"))
    ok(alice.publish("/short", "S3", ("Timeout", "INFINITE")))
    ok(alice.publish("/long", "L1"))
    assert alice.one("COUNT MESSAGE /short").values == ("2",)
    factory.clock.advance(0.9)
    assert alice.one("COUNT MESSAGE /short/child").values == ("1",)
    factory.clock.advance(0.1)
    assert alice.one("COUNT MESSAGE /short").values == ("1",)  # the INFINITE one stays
    assert alice.one("COUNT MESSAGE /short/Trash").values == ("1",)
    assert alice.one("COUNT MESSAGE /short/child").values == ("0",)
    assert alice.one("COUNT MESSAGE /short/child/Trash").values == ("1",)
    assert alice.one("COUNT MESSAGE /long").values == ("1",)


def test_receipts_take_the_login_topics_timeout(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /a", "SET TOPIC TIMEOUT /accounts/alice 30"))
    ok(alice.publish("/a", "R1", ("Receipt", "ALL"), ("Timeout", "00:00:01")))
    factory.clock.advance(1.0)
    [receipt] = [m for m in factory.store._messages.values() if m.publisher == "server"]
    assert receipt.topic == "accounts/alice/c1" and receipt.expires == receipt.received + 30


# ---------------------------------------------------------------------------- delivery settings

def test_delivery_settings_shape_retries_and_the_trash(tmp_path):
    factory = make_factory(tmp_path, durable_retry_timeout=2.0, durable_max_attempts=2, durable_dead_letter_retention=120.0)
    bob = Client(factory, "bob", "b1")
    ok(bob.send("CREATE TOPIC /a", "SUB MESSAGE /a"))
    alice = Client(factory)
    ok(alice.publish("/a", "M1"))
    bob.transport.clear()
    factory.clock.advance(1.9)
    assert bob.transport.value() == b""
    factory.clock.advance(0.1)
    assert bob.transport.value().count(b"NOTIFY MESSAGE /a ADD\r\n") == 1  # the second attempt
    factory.clock.advance(2.0)  # no acknowledgement after 2 attempts: given up, to the Trash
    assert factory.service.stats["given_up"] == 1
    assert alice.one("COUNT MESSAGE /a/Trash").values == ("1",)
    # Trash emptyings run every 60 s: at 60 and 120 the message (trashed at 4) is younger
    # than 120 s; at 180 it is not (with the default retention it would stay an hour).
    for _ in range(4):
        factory.clock.advance(29.0)
    assert alice.one("COUNT MESSAGE /a/Trash").values == ("1",)
    for _ in range(2):
        factory.clock.advance(30.0)
    assert alice.one("COUNT MESSAGE /a/Trash").values == ("0",)
    factory.stopFactory()


# ---------------------------------------------------------------------------- REMOVE TOPIC

def test_remove_topic_drops_the_subscriptions_and_tells_topic_subscribers(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /News", "CREATE TOPIC /News/EU", "CREATE TOPIC /keep",
                  "CREATE TOPIC /link > /news/eu"))
    bob = Client(factory, "bob", "b1")
    ok(bob.send("SUB MESSAGE /news/eu", "SUB TOPIC /news", "SUB TOPIC DELETE /news/eu", "SUB SUB /news",
                "SUB MESSAGE /news/*", "SUB MESSAGE /keep", "SUB TOPIC /*"))
    away = SubscriptionRecord("eve:e1", "MESSAGE", "news/eu", ("ADD",))  # a subscriber not logged in
    factory.store.put_subscription(away)
    factory.service.index.add(away)
    ok(alice.publish("/news/eu", "M1") + alice.publish("/news/eu", "M2"))
    first = bob.received()
    assert [(n.kind, n.args) for n in first] == [("MESSAGE", ("/News/EU", "ADD"))], first
    assert alice.one("REMOVE TOPIC /news").lines == ("OK", "2 messages pending")
    stored = {(s.subscriber, s.kind, s.topic) for s in factory.store._subscriptions.values()}
    assert stored == {("bob:b1", "MESSAGE", "keep"), ("bob:b1", "TOPIC", "/*")}
    assert factory.service.index.account_channels("eve") == set()
    # Bob's notices wait for his acknowledgement of M1; then each removed topic that one of
    # his TOPIC subscriptions covers (and takes DELETE), and the message still pending.
    events = bob.raw("310 ACK\r\n")
    assert isinstance(events[0], Reply) and events[0].code == 310
    notices = [(n.kind, n.args) for n in events[1:]]
    assert notices[:3] == [("TOPIC", ("/News", "DELETE")), ("TOPIC", ("/News/EU", "DELETE")),
                           ("TOPIC", ("/link", "DELETE"))]
    assert notices[3] == ("MESSAGE", ("/news/eu", "ADD")) and events[4].body.sections[0].data == b"hi"
    assert bob.one("LIST SUBSCRIPTIONS").values == ("/keep", "TOPIC /*")
    # A topic made again under the old name has none of the old subscribers.
    ok(alice.send("CREATE TOPIC /news", "CREATE TOPIC /news/eu"))
    assert factory.service.recipients("news/eu", "ADD", factory.clock.seconds()) == []
    assert not factory.durable.covers(b"news/eu") and factory.durable.covers(b"keep")


def test_remove_topic_store_failure_keeps_the_subscriptions(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /a", "SUB MESSAGE /a"))

    def broken(keys, subscriptions=()):
        return fail(OSError("disk full"))

    factory.store.delete_topics = broken  # type: ignore[method-assign]
    assert alice.one("REMOVE TOPIC /a").code == 451
    assert alice.one("LIST SUBSCRIPTIONS").values == ("/a",)
    assert alice.one("LIST TOPIC /").values == ("/a",)


# ---------------------------------------------------------------------------- REPLY permission

REPLY_UAL = """
/        @accounts  psacr
/quiet   @accounts  psac
/quiet   bob        s
/open    bob        sr
"""


def test_a_reply_to_an_address_needs_reply_permission_on_the_answered_messages_topic(tmp_path):
    factory = make_factory(tmp_path, REPLY_UAL)
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /quiet", "CREATE TOPIC /open", "CREATE TOPIC /quiet/sub"))
    quiet = alice.publish("/quiet", "Q1")[0].values[1]
    opened = alice.publish("/open", "O1")[0].values[1]
    bob = Client(factory, "bob", "b1")
    to_alice = "alice:c1@test.example"
    refused = bob.publish(to_alice, "R1", ("Smuid", quiet), mode="REPLY")
    assert refused[0].code == 403 and refused[0].lines == ("Forbidden: no reply permission on /quiet",)
    ok(bob.publish(to_alice, "R2", ("Smuid", opened), mode="REPLY"))
    # The answered message is the last Smuid (a reply carries its history first).
    assert bob.publish(to_alice, "R3", ("Smuid", opened), ("Smuid", quiet), mode="REPLY")[0].code == 403
    # Unknown, or an SMUID of another server: 404; no Smuid: 400.
    assert bob.publish(to_alice, "R4", ("Smuid", "999999"), mode="REPLY")[0].code == 404
    other = "elsewhere/x/" + opened.rsplit("/", 1)[1]
    assert bob.publish(to_alice, "R5", ("Smuid", other), mode="REPLY")[0].code == 404
    assert bob.publish(to_alice, "R6", mode="REPLY")[0].code == 400
    assert bob.publish(to_alice, "R6", ("Smuid", "not/a/smuid"), mode="REPLY")[0].code == 400
    # A message that went to the Trash is still answered by its topic's permission.
    number = opened.rsplit("/", 1)[1].split("(")[0]
    ok(alice.send(f"REMOVE MESSAGE /open {number}"))
    ok(bob.publish(to_alice, "R7", ("Smuid", opened), mode="REPLY"))
    # The reply itself sits in alice's login topic; she may answer it (her own topic).
    replies = [m for m in factory.store._messages.values() if m.topic == "accounts/alice/c1"]
    answer = replies[0].message_id
    ok(alice.publish("bob:b1@test.example", "A1", ("Smuid", opened), ("Smuid", answer), mode="REPLY"))
    # A new message to an account still needs publish permission on /.
    guest = Client(factory, "guest", "g1")
    assert guest.publish(to_alice, "G1")[0].code == 403
    factory.stopFactory()


def test_a_reply_to_a_hidden_topics_message_is_not_found(tmp_path):
    factory = make_factory(tmp_path, "/ @accounts psacr\n/secret bob -\n")
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /secret"))
    smuid = alice.publish("/secret", "S1")[0].values[1]
    bob = Client(factory, "bob", "b1")
    reply = bob.publish("alice:c1@test.example", "R1", ("Smuid", smuid), mode="REPLY")[0]
    assert reply.code == 404 and reply.lines == ("Not found: the message answered is not on the server",)
    factory.stopFactory()


def test_topic_record_timeout_survives_the_tree(factory):
    alice = Client(factory)
    ok(alice.send("CREATE TOPIC /a", "SET TOPIC TIMEOUT /a INFINITE", "SET TOPIC NAME /a /b"))
    assert factory.store._topics["b"].timeout == math.inf and "a" not in factory.store._topics

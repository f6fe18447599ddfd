"""What the SMQP front end writes to the event log: refused logins, and every outcome of a
stored message (delivered, acked, redelivered, given up, expired, trashed) with its SMUID,
topic, publisher, size and latency; accepted messages the core does not route; the bridge's
sessions under their own protocol name.  StringTransport, a Clock, the in-memory store."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from brokerd.auth.accounts import AccountsChecker, PasswordHash, run_inline, write_accounts
from brokerd.auth.ual import AccessList
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.smqp import outbox as outbox_module
from brokerd.store.memory import MemoryStore
from tests.protocols.recording import RecordingEvents
from tests.support.smqp import smqp_factory

MAX_ATTEMPTS, RETRY_TIMEOUT = Settings.durable_max_attempts, Settings.durable_retry_timeout

PUB = (b"PUB MESSAGE /a %s\r\nCreated: D20020101T000000Z\r\n%s\r\n"
       b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n%s\r\n.\r\n")


class RoutedMessages:
    """The Broker's observer, keeping the messages it routed (the core's ``accepted``)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def message_routed(self, message: Any, recipients: int, dropped: int) -> None:
        self.messages.append(message)

    def messages_routed(self, messages: list, recipients_each: int, dropped_each: int) -> None:
        self.messages.extend(messages)

    def session_attached(self, session: Any) -> None:
        pass

    def session_detached(self, session: Any) -> None:
        pass

    def subscribed(self, session: Any, topic: bytes) -> None:
        pass

    def unsubscribed(self, session: Any, topic: bytes) -> None:
        pass


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        path = tmp_path / "accounts"
        write_accounts(path, {"alice": PasswordHash.create("alicepw", n=2)})
        self.clock = Clock()
        self.clock.advance(1000.0)
        self.events = RecordingEvents()
        self.routed = RoutedMessages()
        self.factory = smqp_factory(
            Broker(observer=self.routed), Settings(login_timeout=5.0, domain="test.example"), self.clock,
            MemoryStore(), AccountsChecker(path, run=run_inline), ual=AccessList(),
            run=run_inline, events=self.events,
        )
        self.factory.start()
        self._port = 5000

    def connect(self) -> tuple[Any, StringTransport]:
        self._port += 1
        peer = IPv4Address("TCP", "127.0.0.1", self._port)
        protocol = self.factory.buildProtocol(peer)
        transport = StringTransport(peerAddress=peer)
        protocol.makeConnection(transport)
        transport.clear()
        return protocol, transport

    def login(self, channel: str) -> tuple[Any, StringTransport]:
        protocol, transport = self.connect()
        protocol.dataReceived(f"LOGIN alice:{channel} CLEAR/1.0\r\nPASS alice alicepw\r\n".encode())
        assert b"200 Suid: " in transport.value()
        transport.clear()
        return protocol, transport

    def publish(self, publisher: Any, transport: StringTransport, data: bytes, attributes: bytes = b"") -> str:
        """Publish ``data`` to /a; the SMUID from the reply."""
        transport.clear()
        publisher.dataReceived(PUB % (b"C1", attributes, data))
        reply = transport.value()
        assert reply.startswith(b"200-OK\r\n"), reply
        return reply.rstrip(b"\r\n").rsplit(b"\r\n", 1)[-1][4:].decode()

    def publish_volatile(self, publisher: Any, transport: StringTransport, data: bytes) -> None:
        """Publish ``data`` to /a with ``Guarantee: NO`` (never answered with 200)."""
        transport.clear()
        publisher.dataReceived(PUB % (b"C1", b"Guarantee: NO\r\n", data))
        assert transport.value() == b""


@pytest.fixture
def s(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def _outcomes(events: RecordingEvents) -> list[tuple]:
    return [(r["kind"], r.get("session"), r.get("reason")) for r in events.records
            if r["kind"] not in ("auth_failure", "accepted")]


def test_refused_logins_are_auth_failures(s):
    protocol, transport = s.connect()
    protocol.dataReceived(b"LOGIN bob:c1 CLEAR/1.0\r\n")
    protocol.dataReceived(b"LOGIN alice:c1 CLEAR/1.0\r\nPASS alice wrong\r\n")
    other, other_transport = s.connect()
    other.dataReceived(b"LOGIN alice:c1 KERBEROS/5.0\r\nLOGIN alice:c1 CERT/1.0\r\n")
    assert [line[:3] for line in other_transport.value().split(b"\r\n") if line[3:4] == b" "] == [b"405", b"405"]
    failures = s.events.of("auth_failure")
    assert [(f["session"], f["scheme"], f["reason"]) for f in failures] == [
        ("bob", "CLEAR", "unknown account"),
        ("alice", "CLEAR", "wrong password"),
        ("alice", "KERBEROS", "unsupported method"),
        ("alice", "CERT", "no client certificate"),
    ]
    assert [f["source"] for f in failures] == ["127.0.0.1:5001"] * 2 + ["127.0.0.1:5002"] * 2
    assert all(f["protocol"] == "smqp" and f["outcome"] == "refused" for f in failures)
    s.login("c1")
    assert len(s.events.of("auth_failure")) == 4  # a good login is the core's ``login``


def test_too_many_logins_and_a_wrong_old_password_are_auth_failures(s, monkeypatch):
    from brokerd.protocols.smqp import login as login_module

    monkeypatch.setattr(login_module, "MAX_LOGINS_PER_ACCOUNT", 1)
    protocol, transport = s.login("c1")
    other, _ = s.connect()
    other.dataReceived(b"LOGIN alice:c2 CLEAR/1.0\r\nPASS alice alicepw\r\n")
    protocol.dataReceived(b"SET LOGIN PASSWORD CLEAR/1.0\r\nPASS alice nope\r\n")
    assert transport.value().endswith(b"401 Unauthorized: password not correct\r\n")
    assert [(f["session"], f["reason"]) for f in s.events.of("auth_failure")] == [
        ("alice", "too many concurrent logins"),
        ("alice", "wrong password (SET LOGIN PASSWORD)"),
    ]


def test_delivered_then_acked_with_id_topic_size_and_latency(s):
    subscriber, sub_transport = s.login("s1")
    subscriber.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    publisher, pub_transport = s.login("p1")
    smuid = s.publish(publisher, pub_transport, b"m1")
    assert smuid.startswith(s.factory.suid + "/")
    s.clock.advance(0.25)
    subscriber.dataReceived(b"310 ACK\r\n")
    assert sub_transport.value().endswith(b"310 ACK\r\n")
    delivered, acked = s.events.of("delivered"), s.events.of("acked")
    assert acked == [{"protocol": "smqp", "kind": "acked", "session": "alice:s1", "topic": "a",
                      "outcome": "acked", "sender": "alice:p1", "message_id": smuid, "bytes": 2,
                      "latency_us": 250_000, "queued_us": 0}]  # online when it was published: nothing queued
    assert [(d["session"], d["message_id"], d["latency_us"]) for d in delivered] == [("alice:s1", smuid, 0)]
    # forwarded to the core, which logs it as ``accepted`` with the same id
    [message] = [m for m in s.routed.messages if m.protocol == "smqp"]
    assert message.message_id == smuid and message.target == b"a"
    assert s.events.of("accepted") == []  # the core's record, not a second one


def test_an_outcome_of_a_message_no_longer_in_memory_is_read_from_the_store(s):
    subscriber, _ = s.login("s1")
    subscriber.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    publisher, pub_transport = s.login("p1")
    smuid = s.publish(publisher, pub_transport, b"m1")
    s.factory.service.published.clear()  # as after a restart
    s.clock.advance(2.0)
    subscriber.dataReceived(b"310 ACK\r\n")
    [acked] = s.events.of("acked")
    assert (acked["message_id"], acked["sender"], acked["bytes"], acked["latency_us"]) == (smuid, "alice:p1", 2, 2_000_000)


def test_the_memory_of_recent_messages_is_bounded(s, monkeypatch):
    from brokerd.core import outcomes

    monkeypatch.setattr(outcomes, "PUBLISHED_MEMORY", 3)
    publisher, pub_transport = s.login("p1")
    publisher.dataReceived(b"CREATE TOPIC /a\r\n")
    ids = [s.publish(publisher, pub_transport, b"m%d" % n) for n in range(5)]
    assert [p.message_id for p in s.factory.service.published.values()] == ids[2:]


def test_unacknowledged_deliveries_are_redelivered_given_up_and_trashed(s):
    subscriber, _ = s.login("s1")
    subscriber.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    publisher, pub_transport = s.login("p1")
    smuid = s.publish(publisher, pub_transport, b"m1")
    for _ in range(MAX_ATTEMPTS):
        s.clock.advance(RETRY_TIMEOUT)
    assert _outcomes(s.events) == (
        [("delivered", "alice:s1", None)]
        + [("redelivered", "alice:s1", None)] * (MAX_ATTEMPTS - 1)
        + [("dropped", "alice:s1", "unacknowledged"), ("trashed", None, "undeliverable")]
    )
    trashed = s.events.of("trashed")[0]
    assert trashed["message_id"] == smuid and trashed["topic"] == "a" and trashed["sender"] == "alice:p1"
    assert trashed["latency_us"] == int(MAX_ATTEMPTS * RETRY_TIMEOUT * 1_000_000)
    assert smuid not in [p.message_id for p in s.factory.service.published.values()]


def test_a_refused_delivery_offered_again_is_a_redelivery(s):
    subscriber, _ = s.login("s1")
    subscriber.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    publisher, pub_transport = s.login("p1")
    s.publish(publisher, pub_transport, b"m1")
    subscriber.dataReceived(b"416 Not available\r\n")
    s.clock.advance(RETRY_TIMEOUT)
    subscriber.dataReceived(b"310 ACK\r\n")
    assert _outcomes(s.events) == [("delivered", "alice:s1", None), ("redelivered", "alice:s1", None),
                                   ("acked", "alice:s1", None)]


def test_expiry_is_one_event_per_subscriber_still_pending_and_one_trashed(s):
    s.factory.startFactory()  # the expiry sweep
    first, _ = s.login("s1")
    second, _ = s.login("s2")
    for session in (first, second):
        session.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    publisher, pub_transport = s.login("p1")
    smuid = s.publish(publisher, pub_transport, b"m1", b"Timeout: 00:00:05\r\n")
    first.dataReceived(b"310 ACK\r\n")
    s.clock.advance(6.0)
    expired, trashed = s.events.of("expired"), s.events.of("trashed")
    assert [(e["session"], e["message_id"], e["reason"]) for e in expired] == [("alice:s2", smuid, "expired")]
    assert [(t["message_id"], t["reason"], t["topic"]) for t in trashed] == [(smuid, "expired", "a")]


def test_removed_recalled_and_replaced_messages_are_trashed_with_their_reason(s):
    publisher, transport = s.login("p1")
    publisher.dataReceived(b"CREATE TOPIC /a\r\n")
    removed = s.publish(publisher, transport, b"m1")
    publisher.dataReceived(f"REMOVE MESSAGE /a {removed}\r\n".encode())
    recalled = s.publish(publisher, transport, b"m2")
    publisher.dataReceived(PUB.replace(b"PUB MESSAGE /a", b"PUB MESSAGE RECALL /a")
                           % (b"C3", f"Smuid: {recalled}\r\n".encode(), b"xx"))
    replaced = s.publish(publisher, transport, b"m3")
    publisher.dataReceived(PUB.replace(b"PUB MESSAGE /a", b"PUB MESSAGE REPLACE /a")
                           % (b"C4", f"Smuid: {replaced}\r\n".encode(), b"m4"))
    assert [(t["message_id"], t["reason"]) for t in s.events.of("trashed")] == [
        (removed, "removed"), (recalled, "recalled"), (replaced, "replaced"),
    ]


def test_messages_the_core_does_not_route_are_accepted_here(s):
    receiver, _ = s.login("r1")
    publisher, transport = s.login("p1")
    transport.clear()
    publisher.dataReceived(b"PUB MESSAGE alice:r1@test.example C9\r\nCreated: D20020101T000000Z\r\n\r\n"
                           b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello\r\n.\r\n")
    smuid = transport.value().rstrip(b"\r\n").rsplit(b"\r\n", 1)[-1][4:].decode()
    publisher.dataReceived(b"CREATE TOPIC /a\r\n")
    s.publish_volatile(publisher, transport, b"vv")  # forwarded: the core logs it
    assert s.events.of("accepted") == [
        {"protocol": "smqp", "kind": "accepted", "session": "alice:p1", "topic": "accounts/alice/r1",
         "message": "multicast", "message_id": smuid, "bytes": 5, "fanout": 0, "outcome": "stored"}
    ]
    volatile = [m for m in s.routed.messages if m.payload == b"vv"]
    assert volatile and "/x" in volatile[0].message_id


def test_a_slow_session_loses_volatile_notifications_in_one_event(s, monkeypatch):
    monkeypatch.setattr(outbox_module, "MAX_VOLATILE", 2)
    subscriber, sub_transport = s.login("s1")
    subscriber.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    publisher, pub_transport = s.login("p1")
    s.publish(publisher, pub_transport, b"m1")  # in flight: volatile notifications wait behind it
    for n in range(5):
        s.publish_volatile(publisher, pub_transport, b"v%d" % n)
    assert s.events.of("dropped") == []
    subscriber.dataReceived(b"310 ACK\r\n")
    assert s.events.of("dropped") == [
        {"protocol": "smqp", "kind": "dropped", "session": "alice:s1", "reason": "queue_full", "dropped": 3,
         "outcome": "dropped"}
    ]
    for n in range(3):
        s.publish_volatile(publisher, pub_transport, b"w%d" % n)
    subscriber.connectionLost(None)
    assert [d["dropped"] for d in s.events.of("dropped")] == [3]  # nothing was lost this time
    # m1, the two volatile ones the queue held, and the three sent at once later
    assert sub_transport.value().count(b"NOTIFY MESSAGE /a ADD") == 6


def test_smqp_subscriptions_are_the_cores_durable_subscriptions(s):
    """No stand-in sessions: the core's durable service holds the subscription itself."""
    subscriber, _ = s.login("s1")
    subscriber.dataReceived(b"CREATE TOPIC /a\r\nSUB MESSAGE /a\r\n")
    assert s.factory.broker.sessions() == [subscriber]
    assert s.factory.broker.durable.covers(b"a") and not s.factory.broker.durable.covers(b"b")
    assert subscriber.protocol == "smqp"


def test_without_an_event_log_nothing_breaks(tmp_path):
    clock = Clock()
    factory = smqp_factory(Broker(), Settings(), clock, MemoryStore(), AccountsChecker(None, run=run_inline),
                                run=run_inline)
    factory.start()
    from brokerd.events.log import NULL_EVENT_LOG

    assert factory.events is NULL_EVENT_LOG and factory.service.events is NULL_EVENT_LOG

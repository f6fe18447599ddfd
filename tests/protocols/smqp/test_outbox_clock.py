"""SMQP's Outbox (and the Answers mixed into it) driven directly on a ``task.Clock``.

The retry timeout, the notification window, refusals, ONE messages and the volatile FIFO
are otherwise exercised end to end over sockets on the real clock (tests/integration/
test_smqp_messaging.py and test_smqp_window.py wait 0.2-0.3 s per retry).  Here the same
behaviours (the list in brokerd/protocols/smqp/outbox.py's docstring) are checked to the
second with ``clock.advance``, no sockets and no reactor time, over the real pieces: a
DurableService over a MemoryStore and a MessageService set up as SMQPServerFactory sets them
from its Settings.  Only the session is fake: it records what the outbox writes.

Each test asserts what was written and in which order, the service's counters and the
store's state (pending deliveries with their attempts, the topic's Trash).  The session's
part of an exchange is played by the test as brokerd/protocols/smqp/messaging.py plays it:
without a window it pumps the outbox once its ``310 ACK`` is written; with one it counts the
answer in ``unreplied`` and calls ``replied()`` once its reply is written.
"""
from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService
from brokerd.protocols.smqp import outbox as outbox_module
from brokerd.protocols.smqp.delivery import MessageService
from brokerd.protocols.smqp.outbox import Outbox
from brokerd.store.memory import MemoryStore
from brokerd.store.records import MessageRecord, trash_key
from tests.protocols.recording import RecordingEvents

SUBSCRIBER = "alice:s1"
TOPIC = "a"
RETRY = Settings.durable_retry_timeout
MAX_ATTEMPTS = Settings.durable_max_attempts
EPSILON = 2.0 ** -10
"""Exact in binary, so ``(RETRY - EPSILON) + EPSILON == RETRY`` on the Clock."""


def fired(d: Deferred) -> Any:
    """The result of a Deferred that has fired already (the MemoryStore's all have)."""
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


def notify(body: bytes) -> list[bytes]:
    """The parts the outbox writes for a stored message of TOPIC whose body is ``body``."""
    return [b"NOTIFY MESSAGE /a ADD\r\n", body]


class FakeSession:
    """The outbox's Session (outbox.Session), plus what else Outbox and the durable service
    touch: ``name`` (the outcome events' session) and ``window_timed_out`` (answers.py calls
    it when a window's notification or a ONE message went unanswered; the real session
    answers 421 and closes, after which it writes no notification)."""

    def __init__(self, subscriber: str = SUBSCRIBER) -> None:
        self.subscriber = subscriber
        self.name = subscriber
        self.written: list[list[bytes]] = []
        self.open = True
        self.timeouts = 0
        """Calls of window_timed_out."""

    def write_notify(self, parts: list[bytes]) -> None:
        assert self.open, "a notification written to a closed session"
        self.written.append(list(parts))

    def can_notify(self) -> bool:
        return self.open

    def window_timed_out(self) -> None:
        self.timeouts += 1
        self.open = False


class Rig:
    """A DurableService over a MemoryStore and a MessageService on a Clock, configured from
    ``settings`` as SMQPServerFactory does, and one logged-in subscriber."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.clock = Clock()
        self.store = MemoryStore()
        self.events = RecordingEvents()
        self.durable = Broker().use_durable(DurableService(self.store, self.clock, self.events, settings))
        self.service = MessageService(self.durable, None, None, lambda key: f"/{key}", self.events)
        self.service.max_queued_bytes = settings.smqp_max_queued_bytes
        self.service.max_one_held = settings.smqp_max_one_held
        fired(self.durable.start())
        self.session, self.outbox = self.login()

    @property
    def stats(self) -> dict[str, int]:
        return self.service.stats

    def login(self, subscriber: str = SUBSCRIBER) -> tuple[FakeSession, Outbox]:
        """A session of ``subscriber`` attached; its first pump reads its pending deliveries
        (what the real session does once its login reply is written)."""
        session = FakeSession(subscriber)
        outbox = self.service.attach(session)
        outbox.pump()
        return session, outbox

    def logout(self, outbox: Outbox) -> None:
        """The connection is lost (what the real session's connectionLost does)."""
        self.service.detach(outbox)

    def publish(self, body: bytes, mode: str = "ALL", subscribers: tuple[str, ...] = (SUBSCRIBER,)) -> int:
        """Store a message of TOPIC pending for ``subscribers``; the connected ones are
        offered it once committed.  Returns its seq."""
        seq = self.durable.next_seq()
        record = MessageRecord(self.service.smuid(seq, "T"), TOPIC, "alice:p1", f"C{seq}", self.clock.seconds(),
                               None, 1, body, seq, mode)
        return fired(self.durable.publish(record, [(name, "ADD") for name in subscribers], len(body)))

    def pending(self, subscriber: str = SUBSCRIBER) -> list[tuple[bytes, int]]:
        """(body, attempts) of each delivery the store has pending for ``subscriber``."""
        return [(d.data, d.attempts) for d in fired(self.store.pending(subscriber, 100))]

    def trash(self) -> list[bytes]:
        """The bodies in TOPIC's Trash."""
        return [record.data for record in fired(self.store.get_messages(trash_key(TOPIC)))]


def acknowledge(outbox: Outbox) -> None:
    """``310 ACK`` without a window: stored, then the server's 310 written, then a pump."""
    fired(outbox.acknowledge())
    outbox.pump()


def acknowledge_in_window(outbox: Outbox) -> None:
    """``310 ACK`` with a window: counted unreplied until the server's reply is written."""
    outbox.unreplied += 1
    fired(outbox.acknowledge())
    outbox.replied()


# ---------------------------------------------------------------------------- retry timeout

def test_an_unacknowledged_notification_is_sent_again_each_retry_timeout_then_given_up_to_the_trash() -> None:
    rig = Rig()
    rig.publish(b"m1")
    assert rig.session.written == [notify(b"m1")]
    for attempt in range(1, MAX_ATTEMPTS):
        rig.clock.advance(RETRY - EPSILON)
        assert len(rig.session.written) == attempt, "sent again before the retry timeout"
        rig.clock.advance(EPSILON)
        assert rig.session.written == [notify(b"m1")] * (attempt + 1)
        assert rig.pending() == [(b"m1", attempt)]
        assert rig.stats["redelivered"] == attempt
    assert rig.trash() == []
    rig.clock.advance(RETRY)  # the attempt of the last send is counted: max_attempts, given up
    assert rig.session.written == [notify(b"m1")] * MAX_ATTEMPTS
    assert rig.pending() == [] and rig.trash() == [b"m1"]
    assert fired(rig.store.get_messages(TOPIC)) == []
    assert {k: rig.stats[k] for k in ("delivered", "redelivered", "given_up", "trashed", "acked")} == {
        "delivered": 1, "redelivered": MAX_ATTEMPTS - 1, "given_up": 1, "trashed": 1, "acked": 0}
    assert [e["reason"] for e in rig.events.of("dropped")] == ["unacknowledged"]
    assert not rig.outbox.sent and rig.clock.getDelayedCalls() == []
    rig.clock.advance(10 * RETRY)
    assert len(rig.session.written) == MAX_ATTEMPTS


def test_an_acknowledgement_stops_the_retries_and_lets_the_next_delivery_out() -> None:
    rig = Rig()
    rig.publish(b"m1")
    rig.publish(b"m2")
    assert rig.session.written == [notify(b"m1")]  # one at a time without a window
    rig.clock.advance(RETRY)
    assert rig.session.written == [notify(b"m1"), notify(b"m1")]  # m1 again, not m2
    fired(rig.outbox.acknowledge())
    assert len(rig.session.written) == 2, "nothing before the server's 310 is written"
    assert rig.pending() == [(b"m2", 0)]
    rig.outbox.pump()
    assert rig.session.written == [notify(b"m1"), notify(b"m1"), notify(b"m2")]
    acknowledge(rig.outbox)
    assert rig.clock.getDelayedCalls() == []
    rig.clock.advance(3 * MAX_ATTEMPTS * RETRY)
    assert len(rig.session.written) == 3
    assert rig.pending() == [] and rig.trash() == []
    assert {k: rig.stats[k] for k in ("delivered", "redelivered", "acked", "given_up")} == {
        "delivered": 2, "redelivered": 1, "acked": 2, "given_up": 0}


# ---------------------------------------------------------------------------- notification window

def test_a_window_of_n_writes_n_notifications_and_each_answer_lets_one_more_out() -> None:
    rig = Rig()
    for n in range(5):
        rig.publish(b"m%d" % n)
    assert rig.session.written == [notify(b"m0")]
    rig.outbox.set_window(3)
    assert rig.session.written == [notify(b"m0"), notify(b"m1"), notify(b"m2")]  # 3, not 4
    assert len(rig.outbox.heap) == 2
    rig.outbox.unreplied += 1
    fired(rig.outbox.acknowledge())  # settles the oldest, m0
    assert len(rig.session.written) == 3, "the answer's reply is not written yet: still 3 outstanding"
    rig.outbox.replied()
    assert rig.session.written[3:] == [notify(b"m3")]
    acknowledge_in_window(rig.outbox)
    assert rig.session.written[4:] == [notify(b"m4")]
    acknowledge_in_window(rig.outbox)
    assert len(rig.session.written) == 5
    assert rig.pending() == [(b"m3", 0), (b"m4", 0)]
    assert rig.stats["acked"] == 3


def test_a_window_left_unanswered_closes_the_session_and_comes_again_on_the_next_login() -> None:
    rig = Rig()
    for n in range(3):
        rig.publish(b"m%d" % n)
    rig.outbox.set_window(3)
    acknowledge_in_window(rig.outbox)  # m0; m1 and m2 stay unanswered
    rig.clock.advance(RETRY - EPSILON)
    assert rig.session.timeouts == 0
    rig.clock.advance(EPSILON)
    # Not sent again on this connection (it would break the order of the answers): each
    # notification's attempt is counted and the session told (it closes on the first call).
    assert rig.session.written == [notify(b"m0"), notify(b"m1"), notify(b"m2")]
    assert rig.session.timeouts == 2
    assert rig.pending() == [(b"m1", 1), (b"m2", 1)]
    assert rig.stats["redelivered"] == 0 and rig.stats["given_up"] == 0
    rig.logout(rig.outbox)
    assert rig.clock.getDelayedCalls() == []
    rig.clock.advance(10 * RETRY)
    session, outbox = rig.login()
    assert session.written == [notify(b"m1")]
    acknowledge(outbox)
    assert session.written == [notify(b"m1"), notify(b"m2")]
    acknowledge(outbox)
    assert rig.pending() == [] and rig.trash() == []
    assert rig.stats["acked"] == 3 and rig.stats["redelivered"] == 2


def test_a_window_notification_whose_attempts_are_spent_is_given_up_then_the_session_closed() -> None:
    rig = Rig(Settings(durable_max_attempts=2))
    rig.publish(b"m0")
    rig.publish(b"m1")
    rig.outbox.set_window(2)
    rig.clock.advance(RETRY)
    assert rig.session.timeouts == 2 and rig.pending() == [(b"m0", 1), (b"m1", 1)]
    rig.logout(rig.outbox)
    session, outbox = rig.login()
    outbox.set_window(2)
    assert session.written == [notify(b"m0"), notify(b"m1")]
    rig.clock.advance(RETRY)
    assert session.timeouts == 2 and len(session.written) == 2
    assert rig.pending() == [] and rig.trash() == [b"m0", b"m1"]
    assert {k: rig.stats[k] for k in ("redelivered", "given_up", "trashed")} == {
        "redelivered": 2, "given_up": 2, "trashed": 2}
    assert not outbox.sent


# ---------------------------------------------------------------------------- 416

def test_a_refusal_offers_the_delivery_again_after_the_retry_timeout_counting_an_attempt() -> None:
    rig = Rig(Settings(durable_max_attempts=3))
    rig.publish(b"m1")
    fired(rig.outbox.refuse())
    rig.outbox.pump()
    assert rig.pending() == [(b"m1", 1)]
    rig.clock.advance(RETRY - EPSILON)
    assert rig.session.written == [notify(b"m1")]
    rig.clock.advance(EPSILON)
    assert rig.session.written == [notify(b"m1")] * 2
    assert rig.stats["redelivered"] == 1
    fired(rig.outbox.refuse())
    rig.clock.advance(RETRY)
    assert rig.session.written == [notify(b"m1")] * 3 and rig.pending() == [(b"m1", 2)]
    fired(rig.outbox.refuse())  # the third attempt: max_attempts, given up at once
    assert rig.pending() == [] and rig.trash() == [b"m1"]
    rig.clock.advance(10 * RETRY)
    assert len(rig.session.written) == 3
    assert {k: rig.stats[k] for k in ("redelivered", "given_up", "trashed", "acked")} == {
        "redelivered": 2, "given_up": 1, "trashed": 1, "acked": 0}


# ---------------------------------------------------------------------------- ONE messages

def test_one_messages_held_unanswered_are_bounded_and_the_rest_parked_until_an_answer() -> None:
    rig = Rig(Settings(smqp_max_one_held=2))
    seqs = [rig.publish(b"j%d" % n, mode="ONE") for n in range(4)]
    rig.outbox.set_window(4)
    assert rig.session.written == [notify(b"j0"), notify(b"j1")]
    assert sorted(rig.outbox.parked) == seqs[2:]
    assert sorted(rig.durable.claims) == seqs[:2]  # the parked ones are left to the others
    acknowledge_in_window(rig.outbox)
    assert rig.session.written[2:] == [notify(b"j2")]
    assert sorted(rig.outbox.parked) == seqs[3:] and sorted(rig.durable.claims) == seqs[1:3]
    acknowledge_in_window(rig.outbox)
    assert rig.session.written[3:] == [notify(b"j3")]
    acknowledge_in_window(rig.outbox)
    acknowledge_in_window(rig.outbox)
    assert len(rig.session.written) == 4
    assert rig.pending() == [] and rig.durable.claims == {} and rig.stats["acked"] == 4


def test_a_one_message_left_unanswered_closes_its_holder_and_goes_to_another_subscriber() -> None:
    rig = Rig()
    worker, worker_outbox = rig.login("alice:s2")
    rig.publish(b"job", mode="ONE", subscribers=(SUBSCRIBER, "alice:s2"))
    assert rig.session.written == [notify(b"job")] and worker.written == []
    rig.clock.advance(RETRY)
    assert rig.session.timeouts == 1 and len(rig.session.written) == 1  # not sent to it again
    assert rig.pending() == [(b"job", 1)]
    rig.logout(rig.outbox)
    assert worker.written == [notify(b"job")]
    acknowledge(worker_outbox)
    assert rig.pending() == [] and rig.pending("alice:s2") == []
    assert rig.stats["acked"] == 1 and rig.stats["redelivered"] == 0


def test_a_refused_one_message_goes_to_the_other_subscriber_at_once() -> None:
    rig = Rig()
    other, other_outbox = rig.login("alice:s2")
    rig.publish(b"job", mode="ONE", subscribers=(SUBSCRIBER, "alice:s2"))
    assert other.written == []
    fired(rig.outbox.refuse())
    assert other.written == [notify(b"job")] and rig.clock.seconds() == 0
    rig.clock.advance(RETRY)  # offered again to the refuser: the other one holds it
    assert rig.session.written == [notify(b"job")]
    acknowledge(other_outbox)
    assert rig.pending() == [] and rig.pending("alice:s2") == []
    rig.clock.advance(10 * RETRY)
    assert len(rig.session.written) == 1 and len(other.written) == 1


# ---------------------------------------------------------------------------- volatile FIFO

def test_the_volatile_fifo_is_bounded_by_bytes_and_its_drops_are_counted_and_logged_once() -> None:
    rig = Rig(Settings(smqp_max_queued_bytes=10))
    rig.publish(b"m1")  # in flight: the volatile notifications wait behind it
    for data in (b"v1..", b"v2..", b"v3..", b"v4.."):
        rig.outbox.offer_volatile(data)
    assert rig.session.written == [notify(b"m1")]
    assert rig.outbox.dropped == 2 and rig.service.counts["volatile_dropped"] == 2
    assert rig.events.of("dropped") == []  # logged once the queue drains
    acknowledge(rig.outbox)
    assert rig.session.written == [notify(b"m1"), [b"v1..", b"v2.."]]
    assert [(e["reason"], e["dropped"]) for e in rig.events.of("dropped")] == [("queue_full", 2)]
    rig.publish(b"m2")  # the volatile ones need no answer: m2 goes out at once
    assert rig.session.written[2:] == [notify(b"m2")]


def test_the_volatile_fifo_is_bounded_by_max_volatile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_module, "MAX_VOLATILE", 2)
    rig = Rig()
    rig.publish(b"m1")
    for n in range(5):
        rig.outbox.offer_volatile(b"v%d" % n)
    assert len(rig.outbox.volatile) == 2 and rig.outbox.dropped == 3
    assert rig.service.counts["volatile_dropped"] == 3
    acknowledge(rig.outbox)
    assert rig.session.written == [notify(b"m1"), [b"v0", b"v1"]]
    assert [e["dropped"] for e in rig.events.of("dropped")] == [3]


# ---------------------------------------------------------------------------- a store that is gone

def test_a_retry_due_after_the_store_closed_logs_nothing_and_stops() -> None:
    """The broker is stopping (its store closed) while a notification waits for its answer:
    the retry finds the store closed, logs nothing and arms no new timer (the delivery stays
    pending in the store for the next start).  The positive control: any other failure of
    the same call is logged with its traceback and retried after the retry timeout."""
    rig = Rig()
    rig.publish(b"m1")
    fired(rig.store.close())
    with capturedLogs() as events:
        rig.clock.advance(RETRY)
    assert [e for e in events if e.get("log_failure")] == []
    assert rig.clock.getDelayedCalls() == [] and rig.session.written == [notify(b"m1")]

    other = Rig()
    other.publish(b"m1")
    other.store.attempt = lambda *_: fail(RuntimeError("disk on fire"))  # type: ignore[method-assign]
    with capturedLogs() as events:
        other.clock.advance(RETRY)
    logged = [e for e in events if e.get("log_failure")]
    assert [e["log_format"] for e in logged] == ["Counting a delivery attempt"]
    assert logged[0]["log_failure"].check(RuntimeError)
    assert [call.getTime() for call in other.clock.getDelayedCalls()] == [2 * RETRY]

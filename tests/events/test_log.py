"""EventLog as the Broker's observer and the front ends' recorder (in memory, Clock-driven)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock
from zope.interface import implementer
from zope.interface.verify import verifyObject

from brokerd.core.broker import Broker
from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Details, Message
from brokerd.events import schema
from brokerd.events.log import ENCODE_INTERVAL, NULL_EVENT_LOG, EventLog, IEventRecorder
from brokerd.interfaces import IBrokerObserver, IWireFormat, WireFormat
from tests.support.sessions import RecordingSession as Session

NOW_US = 1_714_564_800_000_000  # 2024-05-01T12:00:00Z


@implementer(IWireFormat)
class Wire(WireFormat):
    def __init__(self, protocol: str, limit: int = 1024) -> None:
        self.protocol = protocol
        self.limit = limit

    def render_message(self, message: Message) -> bytes | None:
        return None if len(message.payload) > self.limit else message.payload

    def render_presence(self, topic, member, joined, presence):
        return None


class Ticker:
    """A clock_ns that advances one millisecond per call."""

    def __init__(self) -> None:
        self.now_ns = NOW_US * 1000

    def __call__(self) -> int:
        self.now_ns += 1_000_000
        return self.now_ns


def _records(data_dir: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((data_dir / "events").rglob("*.jsonl")):
        lines.extend(path.read_text("utf-8").splitlines())
    return [schema.decode(line) for line in lines]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _started(tmp_path: Path, clock: Clock, **options: Any) -> EventLog:
    log = EventLog(tmp_path, reactor=clock, broker_id="test-broker", clock_ns=Ticker(), **options)
    log.startService()
    return log


def test_it_provides_the_observer_and_recorder_interfaces(tmp_path: Path, clock: Clock) -> None:
    log = EventLog(tmp_path, reactor=clock, broker_id="b")
    assert verifyObject(IBrokerObserver, log) and verifyObject(IEventRecorder, log)
    assert verifyObject(IBrokerObserver, NULL_EVENT_LOG) and verifyObject(IEventRecorder, NULL_EVENT_LOG)


def test_routing_and_sessions_are_logged(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock)
    broker = Broker(observer=log)
    ssmp, mcchat = Wire("ssmp"), Wire("mcchat", limit=4)
    alice, bob, carol = Session(b"alice", ssmp), Session(b"bob", ssmp), Session(b"carol", mcchat)
    for session in (alice, bob, carol):
        broker.attach(session)
    broker.subscribe(bob, b"news")
    broker.subscribe(carol, b"news")
    broker.publish(Message(MULTICAST, b"news", b"hi", "ssmp", b"alice"), alice)
    broker.publish(Message(MULTICAST, b"news", b"too long for mcchat", "ssmp", b"alice"), alice)
    broker.publish_batch([Message(MULTICAST, b"news", b"x%d" % i, "ssmp", b"alice") for i in range(3)], alice)
    broker.publish(Message(MULTICAST, b"empty", b"nobody", "ssmp", b"alice"), alice)
    broker.unicast(Message(UNICAST, b"bob", b"psst", "ssmp", b"alice"), "ssmp")
    broker.broadcast(Message(BROADCAST, None, b"all", "mcchat", b"carol"), carol)
    broker.detach(bob)
    clock.advance(1.0)  # the timer hands the buffer to the writer thread
    log.writer.drain()
    records = _records(tmp_path)
    assert [r["kind"] for r in records] == (
        ["login"] * 3 + ["subscribed"] * 2 + ["accepted"] * 6 + ["unsubscribed", "logout"]
    )
    assert [(r["session"], r["topic"]) for r in records if r["kind"].endswith("subscribed")] == [
        ("bob", "news"), ("carol", "news"), ("bob", "news"),
    ]
    assert all(r["v"] == 1 and r["broker"] == "test-broker" for r in records)
    stamps = [r["ts"] for r in records]
    assert stamps == sorted(stamps) and stamps[0] == NOW_US + 1000
    accepted = records[5:11]
    assert [
        (r["topic"] if "topic" in r else r.get("recipient"), r.get("count"), r["fanout"], r.get("dropped"), r["outcome"])
        for r in accepted
    ] == [
        ("news", None, 2, None, "routed"),
        ("news", None, 1, 1, "partial"),
        ("news", 3, 2, None, "routed"),  # the run of three: one record, fan-out per message
        ("empty", None, 0, None, "unrouted"),
        ("bob", None, 1, None, "routed"),
        (None, None, 1, None, "routed"),
    ]
    assert accepted[2]["bytes"] == 6
    assert accepted[0]["session"] == "alice" and accepted[0]["bytes"] == 2 and accepted[0]["message"] == "multicast"
    assert accepted[4]["message"] == "unicast" and accepted[5]["message"] == "broadcast"
    assert accepted[5]["protocol"] == "mcchat" and "payload" not in accepted[0]
    assert records[-1] == {"v": 1, "ts": records[-1]["ts"], "broker": "test-broker", "protocol": "ssmp",
                           "kind": "logout", "session": "bob"}
    log.stopService()
    assert not log.writer.alive


def test_front_end_events_and_payloads(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock, include_payloads=True)
    session = Session(b"dave", Wire("smqp"))
    log.auth_failure("ssmp", b"mallory", source="127.0.0.1:5000", scheme=b"secret", reason="bad secret")
    log.delivery(schema.ACKED, session, topic=b"/orders", sender=b"erin", message_id=b"m-1", size=10, latency_us=1500)
    log.delivery(schema.TRASHED, session, topic=b"/orders", message_id=b"m-2", reason="expired")
    log.record(schema.DROPPED, "ssmp", session=b"bob", reason=schema.SLOW_CONSUMER)
    log.subscribed(session, b"/orders")
    log.unsubscribed(session, b"/orders")
    message = Message(MULTICAST, b"t", b"\x00binary\n", "ssmp", b"alice", True)
    message_with_time = Message(MULTICAST, b"t", b"x", "smqp", b"dave", details=Details(message_id=b"m-3"))
    log.message_routed(message, 0, 0)
    log.message_routed(message_with_time, 1, 0)
    log.stopService()  # a Clock has no threads: stopping writes everything synchronously
    records = _records(tmp_path)
    assert [r["kind"] for r in records] == ["auth_failure", "acked", "trashed", "dropped", "subscribed", "unsubscribed", "accepted", "accepted"]
    failure = records[0]
    assert (failure["session"], failure["source"], failure["scheme"], failure["reason"], failure["outcome"]) == (
        "mallory", "127.0.0.1:5000", "secret", "bad secret", "refused")
    acked = records[1]
    assert (acked["protocol"], acked["session"], acked["topic"], acked["sender"], acked["message_id"], acked["bytes"], acked["latency_us"]) == (
        "smqp", "dave", "/orders", "erin", "m-1", 10, 1500)
    assert records[3]["reason"] == "slow_consumer"
    assert schema.decode_payload(records[6]["payload"]) == b"\x00binary\n"
    assert records[7]["message_id"] == "m-3"


def test_records_with_unknown_kinds_or_fields_are_programming_errors(tmp_path: Path, clock: Clock) -> None:
    log = EventLog(tmp_path, reactor=clock, broker_id="b")
    with pytest.raises(ValueError):
        log.record("exploded", "ssmp")
    with pytest.raises(TypeError):
        log.record(schema.DROPPED, "ssmp", colour="red")


def test_buffer_is_handed_off_when_full_and_bounded_when_the_writer_is_stuck(tmp_path: Path, clock: Clock) -> None:
    log = EventLog(tmp_path, reactor=clock, broker_id="b", batch_limit=10, max_pending=2, clock_ns=Ticker())
    # not started: no thread drains the queue, like a writer stuck on a dead disk
    message = Message(MULTICAST, b"t", b"x", "ssmp", b"a")
    for _ in range(100):
        log.message_routed(message, 1, 0)
    stats = log.stats()
    assert stats["buffered"] == 0  # every 10th event handed the buffer off
    assert stats["overflowed"] == 80  # two batches queued, the rest dropped and counted
    log.startService()
    log.writer.drain()
    assert log.stats()["written"] == 20
    log.stopService()


def test_unwritable_directory_is_reported_once_and_delivery_goes_on(tmp_path: Path, clock: Clock) -> None:
    (tmp_path / "events").write_text("not a directory")
    log = _started(tmp_path, clock)
    broker = Broker(observer=log)
    wire = Wire("ssmp")
    alice, bob = Session(b"alice", wire), Session(b"bob", wire)
    broker.attach(alice)
    broker.attach(bob)
    broker.subscribe(bob, b"news")
    for second in range(3):
        assert broker.publish(Message(MULTICAST, b"news", b"m%d" % second, "ssmp", b"alice"), alice) == 1
        clock.advance(1.0)
        log.writer.drain()
    assert bob.received == [b"m0", b"m1", b"m2"]
    assert len(log.reports) == 1 and "cannot write" in log.reports[0]
    # two logins, one subscription, three messages: none could be written
    assert log.stats()["lost"] == 6 and log.stats()["failing"]
    log.stopService()


def test_runs_and_groups_across_an_hour_boundary(tmp_path: Path, clock: Clock) -> None:
    stamps = iter([NOW_US * 1000 - 2000, NOW_US * 1000 + 5000, NOW_US * 1000 + 9000, NOW_US * 1000 + 12000])
    log = EventLog(tmp_path, reactor=clock, broker_id="b", clock_ns=lambda: next(stamps))
    log.startService()
    same = [Message(MULTICAST, b"t%", b"x" * n, "ssmp", b"pub") for n in (1, 2)]
    log.message_routed(same[0], 3, 0)  # 11:59:59.999998
    log.message_routed(same[1], 3, 0)  # 12:00:00.000005: same shared fields, next hour
    run = [Message(MULTICAST, b"t%", b"y" * n, "ssmp", b"pub") for n in (5, 6, 7)]
    log.messages_routed(run, 2, 0)  # one entry, one record standing for three messages
    mixed = [Message(MULTICAST, b"t", b"z", "ssmp", b"a"), Message(MULTICAST, b"t", b"zz", "ssmp", b"b")]
    log.messages_routed(mixed, 1, 0)
    log.stopService()
    by_hour = {
        path.parent.name: [schema.decode(line) for line in path.read_text().splitlines()]
        for path in (tmp_path / "events").rglob("*.jsonl")
    }
    assert sorted(by_hour) == ["hour=11", "hour=12"]
    assert [(r["ts"], r["bytes"], r["fanout"], r["topic"]) for r in by_hour["hour=11"]] == [(NOW_US - 2, 1, 3, "t%")]
    later = by_hour["hour=12"]
    assert [(r["ts"], r["bytes"], r.get("count"), r["fanout"]) for r in later[:2]] == [
        (NOW_US + 5, 2, None, 3), (NOW_US + 9, 5 + 6 + 7, 3, 2)]
    # a run of several senders carries per-message fields: one record each
    assert [(r["session"], r["bytes"], r.get("count")) for r in later[2:]] == [("a", 1, None), ("b", 2, None)]
    assert log.stats()["written"] == 5


def test_a_plain_run_is_one_small_entry_and_keeps_no_message_alive(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock, batch_limit=10)
    broker = Broker(observer=log)
    wire = Wire("ssmp")
    bob = Session(b"bob", wire)
    broker.attach(bob)
    broker.subscribe(bob, b"news")
    run = [Message(MULTICAST, b"news", b"m%d" % i, "ssmp", b"alice") for i in range(8)]
    broker.publish_batch(run)
    assert len(log._buffer) == 3  # login, subscription, and the whole run as one summary
    assert not any(isinstance(field, Message) for entry in log._buffer for field in entry)
    clock.advance(1.0)
    log.writer.drain()
    accepted = [r for r in _records(tmp_path) if r["kind"] == "accepted"]
    assert [(r.get("count"), r["bytes"], r["fanout"]) for r in accepted] == [(8, 16, 1)]
    log.stopService()


def test_kept_runs_count_by_their_messages_towards_the_batch_limit(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock, batch_limit=10)
    broker = Broker(observer=log)
    wire = Wire("smqp")
    bob = Session(b"bob", wire)
    broker.attach(bob)  # one entry
    broker.subscribe(bob, b"news")  # two
    # messages with a message id are kept for one record each (their message_id)
    run = [Message(MULTICAST, b"news", b"m%d" % i, "smqp", b"alice", details=Details(message_id=str(i))) for i in range(8)]
    broker.publish_batch(run)
    assert log._buffer == []  # 2 + 8 kept messages reached the limit: handed to the writer at once
    log.writer.drain()
    accepted = [r for r in _records(tmp_path) if r["kind"] == "accepted"]
    assert [(r.get("count"), r["message_id"]) for r in accepted] == [(None, str(i)) for i in range(8)]
    log.stopService()


def test_an_idle_log_schedules_no_encoding_and_a_busy_one_encodes_soon(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock)
    assert len(clock.getDelayedCalls()) == 1  # only the flush timer: nothing to encode
    log.record(schema.SUBSCRIBED, "ssmp", session=b"bob", topic=b"news")
    log.record(schema.UNSUBSCRIBED, "ssmp", session=b"bob", topic=b"news")
    assert len(clock.getDelayedCalls()) == 2  # one encoding for both entries
    clock.advance(ENCODE_INTERVAL)
    assert log._buffer == [] and len(log._lines) == 2  # encoded, not yet handed to the writer
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(1.0)
    log.writer.drain()
    assert [r["kind"] for r in _records(tmp_path)] == [schema.SUBSCRIBED, schema.UNSUBSCRIBED]
    log.stopService()


def test_an_encoder_bug_loses_those_events_but_not_the_log(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock)
    encode = log.encoder

    def broken_once(batch: list[tuple]) -> Any:
        log.encoder = encode
        raise KeyError("boom")

    log.encoder = broken_once
    log.record(schema.SUBSCRIBED, "ssmp", session=b"bob", topic=b"news")
    log.record(schema.UNSUBSCRIBED, "ssmp", session=b"bob", topic=b"news")
    clock.advance(1.0)
    log.record(schema.SUBSCRIBED, "ssmp", session=b"bob", topic=b"later")
    clock.advance(1.0)
    log.writer.drain()
    assert log.stats()["lost"] == 2 and log.stats()["written"] == 1
    assert len(log.reports) == 1 and "could not encode 2 events" in log.reports[0]
    assert [r["topic"] for r in _records(tmp_path)] == ["later"]
    log.stopService()


def test_single_messages_after_a_kept_run_count_towards_the_same_limit(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock, batch_limit=10)
    kept = [Message(MULTICAST, b"news", b"m%d" % i, "smqp", b"alice", details=Details(message_id=str(i))) for i in range(8)]
    log.messages_routed(kept, 1, 0)
    log.message_routed(Message(MULTICAST, b"news", b"x", "smqp", b"alice", details=Details(message_id="8")), 1, 0)
    assert len(log._buffer) == 2  # 9 messages held
    log.message_routed(Message(MULTICAST, b"news", b"y", "smqp", b"alice", details=Details(message_id="9")), 1, 0)
    assert log._buffer == []  # the 10th message reached the limit: handed over at once
    log.writer.drain()
    assert len([r for r in _records(tmp_path) if r["kind"] == "accepted"]) == 10
    log.stopService()


def _written(root: Path) -> list[dict]:
    return [schema.decode(line) for path in sorted((root / "events").rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_a_run_summary_from_its_head_logs_what_the_run_logs(tmp_path: Path, clock: Clock) -> None:
    """A node of a cluster delivering a run from another node's rendered bytes logs it from the
    envelope's head: the same record as from the decoded messages."""
    run = [Message(MULTICAST, b"news", b"m" * (i + 1), "ssmp", b"alice") for i in range(4)]
    from_messages = _started(tmp_path / "a", clock)
    from_head = _started(tmp_path / "b", clock)
    assert from_head.summarizes_runs and NULL_EVENT_LOG.summarizes_runs
    from_messages.messages_routed(run, 5, 0)
    from_head.run_summary_routed("ssmp", b"alice", b"news", MULTICAST, 4, 1 + 2 + 3 + 4, 5, 0)
    from_messages.stopService()
    from_head.stopService()
    records = _written(tmp_path / "b")
    assert records == _written(tmp_path / "a")
    assert [(r["session"], r["topic"], r["bytes"], r["count"], r["fanout"]) for r in records] == [
        ("alice", "news", 10, 4, 5)]


def test_a_log_with_payloads_needs_the_messages(tmp_path: Path, clock: Clock) -> None:
    log = _started(tmp_path, clock, include_payloads=True)
    assert not log.summarizes_runs
    log.stopService()

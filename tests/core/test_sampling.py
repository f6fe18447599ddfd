"""The delivery-latency sampler with fake sessions, formats and a fake clock: one timed publish
per interval, one record per receiving protocol, writes held for the end of a read timed there,
queued formats left out, and routing unchanged by it."""
from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock

from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Message
from brokerd.core.sampling import DeliverySampler
from tests.core.test_broker import Format, Session


class Recorder:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, kind: str, protocol: str, **fields: Any) -> None:
        self.records.append({"kind": kind, "protocol": protocol, **fields})


class Ticks:
    """A nanosecond clock that advances 1 µs per reading."""

    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


class HeldFormat(Format):
    writes_after_read = True


class QueuedFormat(Format):
    queued_delivery = True


class Reads:
    """Stands for brokerd.protocols.flow: callbacks registered during a read run at its end."""

    def __init__(self) -> None:
        self.reading = False
        self.waiting: list[Any] = []

    def after_read(self, callback: Any) -> bool:
        if not self.reading:
            return False
        self.waiting.append(callback)
        return True

    def end(self, ticks: Ticks, micros: int) -> None:
        ticks.now += micros * 1_000
        self.reading = False
        for callback in self.waiting:
            callback()
        self.waiting.clear()


def msg(payload: bytes = b"x", topic: bytes = b"news") -> Message:
    return Message(MULTICAST, topic, payload, "ssmp", b"pub")


@pytest.fixture
def setup() -> Any:
    broker = Broker()
    recorder, clock, ticks, reads = Recorder(), Clock(), Ticks(), Reads()
    broker.sampler = DeliverySampler(broker, recorder, clock, interval=0.5, after_read=reads.after_read,
                                     clock_ns=ticks)
    plain, held, queued = Format("socketmq"), HeldFormat("ssmp"), QueuedFormat("smqp")
    sessions = [Session("w1", plain), Session("w2", plain), Session("s1", held), Session("q1", queued)]
    for session in sessions:
        broker.attach(session)
        broker.subscribe(session, b"news")
    broker.startService()
    return broker, recorder, clock, ticks, reads, sessions


def test_one_publish_per_interval_is_timed_per_receiving_protocol(setup: Any) -> None:
    broker, recorder, clock, ticks, _reads, sessions = setup
    assert broker.publish_batch([msg(b"a"), msg(b"b")]) == 8
    assert [(r["kind"], r["protocol"], r["fanout"], r["count"], r["sender"], r["topic"]) for r in recorder.records] == [
        ("latency", "socketmq", 2, 2, "ssmp:pub", b"news"), ("latency", "ssmp", 1, 2, "ssmp:pub", b"news")]
    assert all(r["latency_us"] > 0 for r in recorder.records)
    # routing is the same as without the sampler: every session got the run
    assert all(len(s.got) == 1 for s in sessions)
    assert broker.publish(msg(b"c")) == 4 and len(recorder.records) == 2  # not due yet
    clock.advance(0.5)
    assert broker.publish(msg(b"d")) == 4
    assert len(recorder.records) == 4 and recorder.records[-1]["count"] is None  # one message: no count
    assert all(len(s.got) == 3 for s in sessions)


def test_writes_held_for_the_end_of_the_read_are_timed_there(setup: Any) -> None:
    broker, recorder, _clock, ticks, reads, _sessions = setup
    reads.reading = True
    broker.publish(msg())
    assert [r["protocol"] for r in recorder.records] == ["socketmq"]  # SSMP's write comes later
    reads.end(ticks, micros=700)
    [plain, held] = recorder.records
    assert held["protocol"] == "ssmp" and held["latency_us"] >= 700 > plain["latency_us"]


def test_a_publish_nobody_gets_is_not_a_sample_and_the_next_one_is(setup: Any) -> None:
    broker, recorder, clock, _ticks, _reads, _sessions = setup
    assert broker.publish(msg(topic=b"empty")) == 0
    assert recorder.records == [] and broker.sampling
    broker.publish(msg())
    assert len(recorder.records) == 2 and not broker.sampling


def test_stopping_cancels_the_rearm(setup: Any) -> None:
    broker, _recorder, clock, _ticks, _reads, _sessions = setup
    broker.publish(msg())
    assert clock.getDelayedCalls()
    broker.stopService()
    assert not clock.getDelayedCalls() and not broker.sampling

"""A real broker (makeService, SSMP on a loopback socket) with the EventLog as its observer:
SSMP clients over real sockets produce the events the pipeline reads."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import threads

from brokerd.config import Settings
from brokerd.events import schema
from brokerd.events.log import EventLog
from brokerd.pipeline.ssmp import SSMPConnection, SSMPRefused
from brokerd.tap import makeService


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


def _records(data_dir: Path) -> list[dict[str, Any]]:
    lines: list[str] = []
    for path in sorted((data_dir / "events").rglob("*.jsonl")):
        lines.extend(path.read_text("utf-8").splitlines())
    return [schema.decode(line) for line in lines]


def _conversation(port: int) -> list[Any]:
    """Blocking SSMP clients (run on a thread while the reactor serves them)."""
    with SSMPConnection("127.0.0.1", port, b"sub1") as sub1, SSMPConnection("127.0.0.1", port, b"sub2") as sub2:
        sub1.subscribe(b"news")
        sub2.subscribe(b"news")
        with SSMPConnection("127.0.0.1", port, b"pub") as pub:
            assert pub.mcast_many([(b"news", b"m%d" % i) for i in range(5)] + [(b"other", b"lonely")]) == []
        got = [sub1.receive(5.0) for _ in range(5)]
    try:
        SSMPConnection("127.0.0.1", port, b"x", scheme=b"secret", credential=b"nope").connect()
    except SSMPRefused as refused:
        assert refused.code == b"401"
    return got


@pytest_twisted.ensureDeferred
async def test_ssmp_traffic_produces_events(tmp_path: Path) -> None:
    settings = Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, open_login=True, data_dir=tmp_path)
    service = makeService(settings, _reactor())
    log = EventLog(tmp_path, reactor=_reactor(), flush_interval=0.2)
    service.runtime.broker.observer = log
    log.startService()
    service.startService()
    try:
        listener = next(child for child in service if hasattr(child, "running_port"))
        port = listener.running_port.getHost().port
        received = await threads.deferToThread(_conversation, port)
        assert [event.content for event in received] == [b"m%d" % i for i in range(5)]
    finally:
        await service.stopService()
        await log.stopService()
    records = _records(tmp_path)
    accepted = [r for r in records if r["kind"] == "accepted"]
    # A run read in one go is one record with a count; how the five were read is up to TCP.
    news = [r for r in accepted if r["topic"] == "news"]
    assert sum(r.get("count", 1) for r in news) == 5 and sum(r["bytes"] for r in news) == 10
    assert {(r["session"], r["fanout"]) for r in news} == {("pub", 2)}
    assert [(r["session"], r["topic"], r["bytes"], r["fanout"]) for r in accepted if r["topic"] == "other"] == [
        ("pub", "other", 6, 0)]
    logins = sorted(r["session"] for r in records if r["kind"] == "login")
    logouts = sorted(r["session"] for r in records if r["kind"] == "logout")
    assert logins == logouts == ["pub", "sub1", "sub2"]
    assert all(r["source"].startswith("127.0.0.1:") for r in records if r["kind"] == "login")
    assert (tmp_path / "broker-id").read_text().strip() == records[0]["broker"]
    assert log.stats()["lost"] == 0 and log.stats()["overflowed"] == 0


@pytest_twisted.ensureDeferred
async def test_stopping_behind_a_stuck_disk_never_blocks_the_reactor(tmp_path: Path) -> None:
    """One batch is stuck in a write, one more fills the queue: stopService returns at once (it
    used to wait up to STOP_TIMEOUT for room in the queue, blocking the reactor, then give the
    queued events up), and once the disk moves everything is written and the writer stops."""
    import threading

    from brokerd.events.writer import HourlyFiles

    entered, release = threading.Event(), threading.Event()

    class StuckDisk(HourlyFiles):
        def write(self, stamps: list[int], lines: list[bytes]) -> int:
            entered.set()
            release.wait(30)
            return super().write(stamps, lines)

    log = EventLog(tmp_path, reactor=_reactor(), broker_id="b", max_pending=1)
    log.files = log.writer.files = StuckDisk(log.directory, "r")
    log.startService()
    log.record(schema.DROPPED, "ssmp", session=b"first", reason=schema.SLOW_CONSUMER)
    log.flush()
    assert entered.wait(10)  # the writer holds the first batch
    log.record(schema.DROPPED, "ssmp", session=b"second", reason=schema.SLOW_CONSUMER)
    log.flush()  # the queue (one batch) is full now
    log.record(schema.DROPPED, "ssmp", session=b"third", reason=schema.SLOW_CONSUMER)
    stopped = log.stopService()  # "third" is flushed now and dropped: the queue is full
    assert stopped is not None and not stopped.called
    assert log.reports == []
    _reactor().callLater(0, release.set)  # the disk moves once the reactor runs again
    await stopped
    log.writer.join(10)  # it called back as its last act
    assert not log.writer.alive
    assert [r["session"] for r in _records(tmp_path)] == ["first", "second"]
    assert log.stats()["overflowed"] == 1 and log.reports == []

"""format("brokerd") against real brokers over real sockets: the live source receives what an
SSMP client publishes; the sink's rows reach an SSMP subscriber; the event-log source reads
what the broker logged.  Plus the event-log reader's offsets without Spark."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="brokerd.pipeline.streaming needs PySpark (the 'pipeline' extra)")

from brokerd.events import schema  # noqa: E402
from brokerd.pipeline.report import run_report  # noqa: E402
from brokerd.pipeline.ssmp import SSMPConnection  # noqa: E402
from brokerd.pipeline.streaming import EventLogStreamReader, origin  # noqa: E402
from tests.pipeline.brokers import logging_broker, twistd_broker  # noqa: E402


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``condition()`` until true or ``timeout`` seconds passed: a streaming query's
    output has no event to wait on (its sink is a table the test reads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


TIMEOUT = 90.0
"""Seconds a streaming result may take on a loaded 2-core machine before the test fails."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with twistd_broker(tmp_path_factory.mktemp("broker")) as port:
        yield port


def _rows(spark: Any, table: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in spark.sql(f"SELECT * FROM {table}").collect()]


def _wait_for_presence(watcher: SSMPConnection, member: bytes, timeout: float) -> None:
    """Block until ``watcher`` (subscribed with PRESENCE) sees ``member`` join."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = watcher.receive(1.0)
        if event is not None and event.verb == b"SUBSCRIBE" and event.sender == member:
            return
    raise AssertionError(f"{member!r} never subscribed")


@pytest.mark.spark
@pytest.mark.slow
def test_live_source_receives_messages_published_over_ssmp(spark: Any, broker: int) -> None:
    stream = (
        spark.readStream.format("brokerd")
        .option("address", f"127.0.0.1:{broker}")
        .option("topics", "spark/in")
        .option("identity", "spark-src")
        .load()
    )
    query = stream.writeStream.format("memory").queryName("live_in").trigger(processingTime="500 milliseconds").start()
    try:
        with SSMPConnection("127.0.0.1", broker, b"watcher") as watcher:
            watcher._send(b"SUBSCRIBE spark/in PRESENCE\n")
            watcher._expect_ok("SUBSCRIBE")
            _wait_for_presence(watcher, b"spark-src", TIMEOUT)
        with SSMPConnection("127.0.0.1", broker, b"pub") as publisher:
            sent = [b"m%d" % i for i in range(9)] + [b"\x00binary\nline"]
            assert publisher.mcast_many([(b"spark/in", content) for content in sent]) == []
            assert publisher.mcast_many([(b"elsewhere", b"not for spark")]) == []
        assert wait_until(lambda: len(_rows(spark, "live_in")) >= 10, TIMEOUT), query.lastProgress
        rows = _rows(spark, "live_in")
        assert sorted(bytes(r["payload"]) for r in rows) == sorted(sent)
        assert {(r["topic"], r["sender"], r["protocol"]) for r in rows} == {("spark/in", "pub", "ssmp")}
        assert all(r["ts"] is not None for r in rows)
    finally:
        query.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_sink_rows_arrive_at_an_ssmp_subscriber(spark: Any, broker: int, tmp_path: Path) -> None:
    source = tmp_path / "rows"
    source.mkdir()
    rows = [{"topic": "spark/out", "payload": f"row {i}"} for i in range(5)]
    rows.append({"topic": "spark/out", "payload": "two\nlines"})
    (source / "part-0.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with SSMPConnection("127.0.0.1", broker, b"sub") as subscriber:
        subscriber.subscribe(b"spark/out")
        query = (
            spark.readStream.schema("topic string, payload string").json(str(source))
            .writeStream.format("brokerd")
            .option("address", f"127.0.0.1:{broker}")
            .option("identity", "sink")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(TIMEOUT)
        assert query.exception() is None
        received = [subscriber.receive(10.0) for _ in rows]
    assert all(event is not None for event in received)
    assert sorted(event.content for event in received) == sorted(r["payload"].encode() for r in rows)
    assert {event.target for event in received} == {b"spark/out"}
    assert all(event.sender.startswith(b"sink-") for event in received)


@pytest.mark.spark
@pytest.mark.slow
def test_sink_refuses_rows_ssmp_cannot_carry(spark: Any, broker: int) -> None:
    frame = spark.createDataFrame([("not a topic!", "x")], "topic string, payload string")
    with pytest.raises(Exception, match="cannot publish"):
        frame.write.format("brokerd").option("address", f"127.0.0.1:{broker}").mode("append").save()


@pytest.mark.spark
@pytest.mark.slow
def test_event_log_source_reads_what_the_broker_logged(spark: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with logging_broker(data_dir) as port:
        with SSMPConnection("127.0.0.1", port, b"logger") as publisher:
            assert publisher.mcast_many([(b"logged", b"first"), (b"other", b"skip me"), (b"logged", b"\x01second")]) == []
        stream = (
            spark.readStream.format("brokerd")
            .option("dataDir", str(data_dir))
            .option("topics", "logged")
            .option("startingOffsets", "earliest")
            .load()
        )
        query = stream.writeStream.format("memory").queryName("from_log").trigger(processingTime="500 milliseconds").start()
        try:
            assert wait_until(lambda: len(_rows(spark, "from_log")) >= 2, TIMEOUT), query.lastProgress
            with SSMPConnection("127.0.0.1", port, b"logger") as publisher:
                assert publisher.mcast_many([(b"logged", b"third")]) == []
            assert wait_until(lambda: len(_rows(spark, "from_log")) >= 3, TIMEOUT), query.lastProgress
        finally:
            query.stop()
    rows = _rows(spark, "from_log")
    assert [bytes(r["payload"]) for r in sorted(rows, key=lambda r: r["ts"])] == [b"first", b"\x01second", b"third"]
    assert {(r["topic"], r["sender"], r["protocol"]) for r in rows} == {("logged", "logger", "ssmp")}

    # the same real broker's log, through the report job
    summary = run_report(spark, str(data_dir), str(tmp_path / "report"))
    assert summary["quality"]["ok"] == summary["lines"] and summary["lines"] > 0
    assert {k: summary["events_by_kind"][k] for k in ("accepted", "login", "logout")} == {"accepted": 4, "login": 2, "logout": 2}
    assert [(p["session"], p["messages"]) for p in summary["top_publishers"]] == [("logger", 4)]


def _line(ts: int, topic: str, payload: bytes | None = None) -> str:
    return schema.encode({"v": 1, "ts": ts, "protocol": "ssmp", "kind": "accepted", "session": "p", "topic": topic,
                          "message": "multicast", "bytes": 1, "fanout": 0,
                          "payload": None if payload is None else schema.encode_payload(payload)})


def test_event_log_offsets_cover_complete_lines_only(tmp_path: Path) -> None:
    directory = tmp_path / "events" / "date=2024-05-01" / "hour=10"
    directory.mkdir(parents=True)
    log = directory / "events-b-r-1.jsonl"
    first, second = _line(1, "a", b"one"), _line(2, "b", b"two")
    log.write_text(first + "garbage\n" + second + _line(3, "a")[:20])
    reader = EventLogStreamReader({"dataDir": str(tmp_path), "startingOffsets": "earliest", "topics": "a"})
    start = reader.initialOffset()
    assert start == {"files": {}}
    end = reader.latestOffset(start, None)
    name = "date=2024-05-01/hour=10/events-b-r-1.jsonl"
    assert end == {"files": {name: len(first) + len("garbage\n") + len(second)}}
    [partition] = reader.partitions(start, end)
    rows = list(reader.read(partition))
    assert [(r[0], r[2], r[4]) for r in rows] == [("a", b"one", "ssmp")]
    with open(log, "a") as handle:  # the writer finishes the line
        handle.write(_line(3, "a")[20:])
    later = reader.latestOffset(end, None)
    [partition] = reader.partitions(end, later)
    assert [(r[0], r[2]) for r in reader.read(partition)] == [("a", None)]  # logged without payload
    assert reader.partitions(later, reader.latestOffset(later, None)) == []
    latest_reader = EventLogStreamReader({"dataDir": str(tmp_path)})
    assert latest_reader.initialOffset() == later  # 'latest' starts after what is there


def test_a_run_record_yields_one_row_per_message(tmp_path: Path) -> None:
    directory = tmp_path / "events" / "date=2024-05-01" / "hour=10"
    directory.mkdir(parents=True)
    run = json.loads(_line(1, "a"))
    run["count"], run["bytes"] = 3, 12  # three messages one publisher sent in one read
    (directory / "events-b-r-1.jsonl").write_text(schema.encode(run) + "\n" + _line(2, "a"))
    reader = EventLogStreamReader({"dataDir": str(tmp_path), "startingOffsets": "earliest"})
    start = reader.initialOffset()
    [partition] = reader.partitions(start, reader.latestOffset(start, None))
    rows = list(reader.read(partition))
    assert [(r[0], r[3].microsecond) for r in rows] == [("a", 1)] * 3 + [("a", 2)]


def test_sender_names_tell_the_origin_protocol() -> None:
    assert origin(b"alice") == ("alice", "ssmp")
    assert origin(b"mcchat:bob") == ("mcchat:bob", "mcchat")
    assert origin(b"smqp:orders_svc") == ("smqp:orders_svc", "smqp")
    assert origin(b"team:x") == ("team:x", "ssmp")

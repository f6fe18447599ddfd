"""Incremental compaction: closed hours become Parquet once; a second run changes nothing; a
run killed half-way shows no partial hour and the next run finishes it; a report on
compacted plus open hours equals a report on the raw JSON."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.pipeline.compact import COMPACTED_DIR, MARKER, TMP_PREFIX, compact
from brokerd.pipeline.generate import generate
from brokerd.pipeline.report import TABLES, run_report
from tests.pipeline.test_report import H0, write_log

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600 * 1_000_000


def rows(spark: Any, path: Path) -> list[str]:
    """A table's rows, order-independent and comparable."""
    return sorted(repr(sorted(row.asDict(recursive=True).items())) for row in spark.read.parquet(str(path)).collect())


def published(data_dir: Path) -> dict[str, list[str]]:
    """Every published hour directory and its files."""
    base = data_dir / COMPACTED_DIR
    return {
        str(hour.relative_to(base)): sorted(p.name for p in hour.iterdir())
        for hour in sorted(base.glob("date=*/hour=*"))
    }


def test_compacting_twice_is_the_same_as_once(spark: Any, tmp_path: Path) -> None:
    write_log(tmp_path)
    first = compact(spark, str(tmp_path))
    assert first.compacted == [("2024-05-01", "09"), ("2024-05-01", "10"), ("2024-05-01", "11"), ("2024-05-01", "12")]
    assert first.lines == 2 + 30 + 3 + 2  # every line, the bad ones included (with their status)
    files_before = published(tmp_path)
    assert all(MARKER in names and any(n.endswith(".parquet") for n in names) for names in files_before.values())
    table_before = rows(spark, tmp_path / COMPACTED_DIR)
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / COMPACTED_DIR).rglob("*")}

    second = compact(spark, str(tmp_path))
    assert second.compacted == [] and len(second.already) == 4
    assert published(tmp_path) == files_before
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / COMPACTED_DIR).rglob("*")} == mtimes
    assert rows(spark, tmp_path / COMPACTED_DIR) == table_before
    assert not list((tmp_path / COMPACTED_DIR).glob(TMP_PREFIX + "*"))
    # the JSON was kept (the default)
    assert len(list((tmp_path / "events").rglob("*.jsonl"))) == 5


def test_open_hours_stay_json_and_the_report_equals_one_on_raw_json(spark: Any, tmp_path: Path) -> None:
    raw_dir, mixed_dir = tmp_path / "raw", tmp_path / "mixed"
    write_log(raw_dir)
    shutil.copytree(raw_dir, mixed_dir)
    raw = run_report(spark, str(raw_dir), str(tmp_path / "out-raw"), compact=False)
    assert not (raw_dir / COMPACTED_DIR).exists()
    # at 11:30 hours 09 and 10 are closed, 11 is open, 12 is in the future
    now = H0 + HOUR + HOUR // 2
    mixed = run_report(spark, str(mixed_dir), str(tmp_path / "out-mixed"), now_us=now, delete_json=True)
    assert list(published(mixed_dir)) == ["date=2024-05-01/hour=09", "date=2024-05-01/hour=10"]
    assert mixed["compaction"] == {"compacted_now": 2, "already": 0, "open": 2, "deleted_json_files": 3}
    # the compacted hours' JSON is gone, the open hours' is still read
    assert not list((mixed_dir / "events" / "date=2024-05-01" / "hour=10").glob("*.jsonl"))
    assert list((mixed_dir / "events" / "date=2024-05-01" / "hour=11").glob("*.jsonl"))
    for key in ("quality", "events", "events_by_kind", "messages_by_protocol", "top_topics", "latency_by_protocol",
                "first_event", "last_event", "top_publishers", "top_subscribers", "auth_failures"):
        assert mixed[key] == raw[key], key
    for table in TABLES:
        assert rows(spark, tmp_path / "out-mixed" / table) == rows(spark, tmp_path / "out-raw" / table), table
    assert raw["events"] == 29 and raw["quality"]["malformed"] == 5


def _wait_for(condition: Any, what: str, process: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the compaction ended before {what}: {process.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.05)


def test_a_compaction_killed_half_way_is_finished_by_the_next_run(spark: Any, tmp_path: Path) -> None:
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    generate(killed, 20_000, hours=4, seed=3, workers=1)
    shutil.copytree(killed, clean)
    base = killed / COMPACTED_DIR
    process = subprocess.Popen(
        [sys.executable, "-m", "brokerd.pipeline", "compact", "--data-dir", str(killed), "--master", "local[1]",
         "--hours-per-job", "1", "--driver-memory", "1g", "--quiet", "--engine", "spark"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        # the first hour is published, and the next one's Spark job is writing: kill it there
        _wait_for(lambda: list(base.glob("date=*/hour=*/" + MARKER)), "first published hour", process)
        _wait_for(lambda: any(base.glob(TMP_PREFIX + "*/data")), "a second job's output", process)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    left = published(killed)
    assert 1 <= len(left) < 4, left  # killed half-way
    assert list(base.glob(TMP_PREFIX + "*"))  # its unfinished work, invisible to readers
    assert all(MARKER in names for names in left.values())  # nothing partial is published
    # a reader sees whole hours only: those published are read as Parquet, the rest as JSON
    mid = run_report(spark, str(killed), str(tmp_path / "out-mid"), compact=False)
    assert mid["events"] == mid["lines"] == 20_000

    again = compact(spark, str(killed))
    assert len(again.already) == len(left) and len(again.compacted) == 4 - len(left)
    assert not list(base.glob(TMP_PREFIX + "*"))
    compact(spark, str(clean))
    assert list(published(killed)) == list(published(clean))
    assert rows(spark, base) == rows(spark, clean / COMPACTED_DIR)
    assert rows(spark, base)  # not two empty tables


M = 60 * 1_000_000


def _subscription_log(data_dir: Path) -> None:
    """Three hours in which a subscriber comes, goes, comes back and logs out mid-hour, with
    its own messages (not routed to it) and another's around each endpoint."""
    from tests.pipeline.test_report import rec

    h = [H0 + n * HOUR for n in range(3)]
    hours = [
        [
            rec(h[0], "ssmp", "login", session="s1", source="127.0.0.1:1000", outcome="ok"),
            rec(h[0] + 5 * M, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=1, fanout=0),
            rec(h[0] + 10 * M + 10_000_000, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=2, fanout=0),
            rec(h[0] + 10 * M + 30_000_000, "ssmp", "subscribed", session="s1", topic="a"),
            rec(h[0] + 10 * M + 40_000_000, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=4, fanout=1, count=2),
            rec(h[0] + 15 * M, "ssmp", "accepted", session="s1", topic="a", message="multicast", bytes=8, fanout=0),
            rec(h[0] + 20 * M, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=16, fanout=1),
            rec(h[0] + 21 * M, "smqp", "acked", session="s1", topic="a", latency_us=7),
        ],
        [
            rec(h[1] + 1 * M, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=32, fanout=1),
            rec(h[1] + 30 * M + 10_000_000, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=64, fanout=1),
            rec(h[1] + 30 * M + 15_000_000, "ssmp", "unsubscribed", session="s1", topic="a"),
            rec(h[1] + 30 * M + 20_000_000, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=128, fanout=0),
            rec(h[1] + 40 * M, "ssmp", "subscribed", session="s1", topic="a"),
            rec(h[1] + 45 * M, "ssmp", "accepted", session="s1", topic="a", message="multicast", bytes=256, fanout=0),
            rec(h[1] + 50 * M, "smqp", "acked", session="s1", topic="a", latency_us=3),
        ],
        [
            rec(h[2] + 1 * M, "socketmq", "login", session="s2", source="127.0.0.1:2000", outcome="ok"),
            rec(h[2] + 1 * M, "socketmq", "subscribed", session="s2", topic="a"),
            rec(h[2] + 2 * M, "ssmp", "accepted", session="s1", topic="a", message="multicast", bytes=512, fanout=1),
            rec(h[2] + 5 * M, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=1024, fanout=2),
            rec(h[2] + 10 * M + 20_000_000, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=2048, fanout=2),
            rec(h[2] + 10 * M + 30_000_000, "ssmp", "logout", session="s1"),
            rec(h[2] + 10 * M + 40_000_000, "mcchat", "accepted", session="p", topic="a", message="multicast", bytes=4096, fanout=1),
            rec(h[2] + 11 * M, "smqp", "acked", session="s1", topic="a", latency_us=5),
        ],
    ]
    for n, lines in enumerate(hours):
        directory = data_dir / "events" / "date=2024-05-01" / f"hour={10 + n}"
        directory.mkdir(parents=True)
        (directory / "events-b1-run1-1.jsonl").write_text("".join(lines), "utf-8")


def test_a_report_over_compacted_hours_reads_their_stored_summaries(spark: Any, tmp_path: Path) -> None:
    raw_dir, stored_dir = tmp_path / "raw", tmp_path / "stored"
    _subscription_log(raw_dir)
    shutil.copytree(raw_dir, stored_dir)
    keys = ("quality", "events", "events_by_kind", "messages_by_protocol", "top_topics", "latency_by_protocol",
            "first_event", "last_event", "top_publishers", "top_subscribers", "cross_protocol")

    def same(a: str, b: str) -> None:
        for table in TABLES:
            assert rows(spark, tmp_path / a / table) == rows(spark, tmp_path / b / table), table

    raw = run_report(spark, str(raw_dir), str(tmp_path / "out-raw"), compact=False)
    assert raw["summarized_hours"] == 0
    # s1: p's 5 messages in its first subscription (a run of 2 among them; its own at 10:15
    # not routed to it) and 2 in its second (until its logout); s2: p's 3 and s1's one since 12:01
    assert [(r["session"], r["messages"]) for r in raw["top_subscribers"]] == [("s1", 7), ("s2", 4)]
    assert sorted((r["publishing"], r["receiving"], r["messages"]) for r in raw["cross_protocol"]) == [
        ("mcchat", "socketmq", 3), ("mcchat", "ssmp", 7), ("ssmp", "socketmq", 1),
    ]
    assert [(r["protocol"], r["p50_us"], r["max_us"]) for r in raw["latency_by_protocol"]] == [("smqp", 5, 7)]
    stored = run_report(spark, str(stored_dir), str(tmp_path / "out-stored"))
    assert stored["compaction"]["compacted_now"] == 3 and stored["summarized_hours"] == 3
    # a window cutting hours 10 and 12: those two from their Parquet rows, hour 11 from its summaries
    since, until = H0 + 10 * M + 35_000_000, H0 + 2 * HOUR + 10 * M + 25_000_000
    cut_raw = run_report(spark, str(raw_dir), str(tmp_path / "cut-raw"), compact=False, since_us=since, until_us=until)
    cut = run_report(spark, str(stored_dir), str(tmp_path / "cut-stored"), since_us=since, until_us=until)
    assert cut["summarized_hours"] == 1
    # the hours' rows deleted, only their markers and summaries left: still the same report
    for data in (stored_dir / COMPACTED_DIR).glob("date=*/hour=*/*.parquet"):
        data.unlink()
    again = run_report(spark, str(stored_dir), str(tmp_path / "out-again"))
    assert again["summarized_hours"] == 3 and again["compaction"]["already"] == 3
    for summary in (stored, again):
        for key in keys:
            assert summary[key] == raw[key], key
    for key in keys:
        assert cut[key] == cut_raw[key], key
    same("out-raw", "out-stored")
    same("out-raw", "out-again")
    same("cut-raw", "cut-stored")
    # in the window s1 subscribed once (11:40, its logout after the window) and s2 from 12:01
    assert [(r["session"], r["messages"]) for r in cut_raw["top_subscribers"]] == [("s2", 3), ("s1", 2)]


def _samples_log(data_dir: Path) -> None:
    """Three hours of the records the delivery-latency and queue tables read: sampled
    ``latency`` records, SMQP outcomes with and without ``queued_us``, ``gauge`` readings.
    Hour 11 has a line pyarrow cannot parse, so only Spark's compaction converts it; equal
    values in different hours test the merge."""
    from tests.pipeline.test_report import rec

    h = [H0 + n * HOUR for n in range(3)]
    hours = [
        [
            rec(h[0] + 1 * M, "ssmp", "latency", sender="ssmp:a", topic="t", message="multicast", fanout=2, latency_us=40),
            rec(h[0] + 2 * M, "mcchat", "latency", sender="ssmp:a", topic="t", message="multicast", fanout=1, latency_us=80),
            rec(h[0] + 3 * M, "ssmp", "latency", sender="ssmp:a", topic="t", message="multicast", fanout=2, latency_us=60),
            rec(h[0] + 4 * M, "smqp", "gauge", pending=3, unacknowledged=0, trash=0),
            # kept 643 s for a subscriber who was away, delivered in 2 ms, acknowledged 5 ms later
            rec(h[0] + 20 * M, "smqp", "delivered", session="e:c1", topic="t", sender="ssmp:a",
                latency_us=643_002_000, queued_us=643_000_000),
            rec(h[0] + 21 * M, "smqp", "acked", session="e:c1", topic="t", sender="ssmp:a",
                latency_us=643_007_000, queued_us=643_000_000),
        ],
        [
            rec(h[1] + 1 * M, "socketmq", "latency", sender="ssmp:a", topic="t", message="multicast", fanout=1, latency_us=120),
            rec(h[1] + 2 * M, "ssmp", "latency", sender="ssmp:a", topic="t", message="multicast", fanout=1, latency_us=40),
            rec(h[1] + 3 * M, "smqp", "gauge", pending=1, unacknowledged=2, trash=0),
            rec(h[1] + 4 * M, "smqp", "delivered", session="e:c1", topic="t", sender="ssmp:a", latency_us=3_000, queued_us=0),
            # from before queued_us existed: in delivery_latency, not in the split
            rec(h[1] + 5 * M, "smqp", "delivered", session="e:c1", topic="t", sender="ssmp:a", latency_us=2_500),
            "{not json\n",
        ],
        [
            rec(h[2] + 1 * M, "mcchat", "latency", sender="ssmp:a", topic="t", message="multicast", fanout=1, latency_us=90),
            rec(h[2] + 2 * M, "smqp", "delivered", session="e:c1", topic="t", sender="ssmp:a", latency_us=2_000, queued_us=0),
            rec(h[2] + 3 * M, "smqp", "acked", session="e:c1", topic="t", sender="ssmp:a", latency_us=7_000, queued_us=0),
            rec(h[2] + 4 * M, "smqp", "gauge", pending=0, unacknowledged=0, trash=2),
        ],
    ]
    for n, lines in enumerate(hours):
        directory = data_dir / "events" / "date=2024-05-01" / f"hour={10 + n}"
        directory.mkdir(parents=True)
        (directory / "events-b1-run1-1.jsonl").write_text("".join(lines), "utf-8")


def test_latency_samples_smqp_split_and_gauges_are_the_same_from_stored_summaries(spark: Any, tmp_path: Path) -> None:
    from brokerd.pipeline.summaries import SUMMARY_VERSION

    raw_dir, stored_dir = tmp_path / "raw", tmp_path / "stored"
    _samples_log(raw_dir)
    shutil.copytree(raw_dir, stored_dir)
    new_tables = ("delivery_latency", "smqp_latency_split", "queue_gauges")
    keys = ("quality", "latency_by_protocol", "delivery_latency", "smqp_latency_split", "queue_gauge_readings",
            "queue_gauge_last")

    raw = run_report(spark, str(raw_dir), str(tmp_path / "out-raw"), compact=False)
    assert raw["summarized_hours"] == 0 and raw["quality"]["malformed"] == 1
    assert [(r["protocol"], r["source"], r["count"], r["p50_us"], r["max_us"]) for r in raw["delivery_latency"]] == [
        ("mcchat", "sampled write", 2, 80, 90),
        ("smqp", "delivered, once online", 4, 2_000, 3_000),  # 2,000 twice (hours 10 and 12), 2,500 unsplit
        ("socketmq", "sampled write", 1, 120, 120),
        ("ssmp", "sampled write", 3, 40, 60),
    ]
    assert [(r["kind"], r["part"], r["count"], r["p50_us"], r["max_us"]) for r in raw["smqp_latency_split"]] == [
        ("acked", "queued", 2, 0, 643_000_000),
        ("acked", "online", 2, 7_000, 7_000),
        ("delivered", "queued", 3, 0, 643_000_000),
        ("delivered", "online", 3, 2_000, 3_000),
    ]
    assert raw["queue_gauge_readings"] == 3 and raw["queue_gauge_last"]["trash"] == 2

    # hours 10 and 12 converted and summarised in this process (pyarrow); hour 11, with its bad
    # line, is left for Spark, which converts and summarises it on its executors
    assert compact(None, str(stored_dir), hours_per_job=2).unconvertible == [("2024-05-01", "11")]
    stored = run_report(spark, str(stored_dir), str(tmp_path / "out-stored"))
    assert stored["compaction"]["compacted_now"] == 1 and stored["summarized_hours"] == 3
    hours = {n: stored_dir / COMPACTED_DIR / "date=2024-05-01" / f"hour={n}" for n in (10, 11, 12)}
    assert [(hours[n] / "part-00000-arrow.parquet").exists() for n in (10, 11, 12)] == [True, False, True]
    for hour in hours.values():
        marker = json.loads((hour / MARKER).read_text("utf-8"))["summaries"]
        assert marker["version"] == SUMMARY_VERSION and {"smqp_latency", "rare"} <= set(marker["tables"]), marker
    # a window cutting hours 10 and 12: those from their Parquet rows, hour 11 from its summaries
    since, until = H0 + 10 * M, H0 + 2 * HOUR + 150_000_000
    cut_raw = run_report(spark, str(raw_dir), str(tmp_path / "cut-raw"), compact=False, since_us=since, until_us=until)
    cut = run_report(spark, str(stored_dir), str(tmp_path / "cut-stored"), since_us=since, until_us=until)
    assert cut["summarized_hours"] == 1
    assert [(r["kind"], r["part"], r["count"]) for r in cut_raw["smqp_latency_split"]] == [
        ("acked", "queued", 1), ("acked", "online", 1), ("delivered", "queued", 3), ("delivered", "online", 3),
    ]
    # the hours' rows deleted, only their markers and summaries left: still the same report
    for data in (stored_dir / COMPACTED_DIR).glob("date=*/hour=*/*.parquet"):
        data.unlink()
    again = run_report(spark, str(stored_dir), str(tmp_path / "out-again"))
    assert again["summarized_hours"] == 3
    for summary in (stored, again):
        for key in keys:
            assert summary[key] == raw[key], key
    for key in keys:
        assert cut[key] == cut_raw[key], key
    for a, b in (("out-raw", "out-stored"), ("out-raw", "out-again"), ("cut-raw", "cut-stored")):
        for table in TABLES:
            assert rows(spark, tmp_path / a / table) == rows(spark, tmp_path / b / table), (a, b, table)
        assert all(rows(spark, tmp_path / a / table) for table in new_tables), a

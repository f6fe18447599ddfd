"""A local report (in this process, pyarrow, no JVM) and the same report distributed by Spark
(local[2]: the JSON parsed by Spark, the summaries computed on its executors, the tables in its
driver) are the same: every table (rows and Spark-read schema) and every summary.json field, on the logs the
compaction and report tests use (bad lines, hours outside the window, subscriptions spanning
hours, a window cutting hours, open hours, the latency and gauge records, a generated log, an
empty log), on the raw JSON and on compacted hours; a log pyarrow cannot parse is left to
Spark; the command line runs a local report with no JVM at all."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.pipeline.localfs import usable
from brokerd.pipeline.arrowjson import NotConvertible
from brokerd.pipeline.compact import COMPACTED_DIR, compact
from brokerd.pipeline.generate import generate
from brokerd.pipeline.report import TABLES, run_report
from tests.pipeline.test_compact import HOUR, M, _samples_log, _subscription_log, rows
from tests.pipeline.test_report import H0, LATENCY_LOG, S, rec, write_log

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PER_RUN = ("generated", "data_dir", "events_path", "out", "html")
"""summary.json fields that name the run, not the log."""


def _schema(spark: Any, path: Path) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in spark.read.parquet(str(path)).schema.fields]


def assert_same(spark: Any, by_spark: tuple[Path, dict[str, Any]], by_arrow: tuple[Path, dict[str, Any]],
                also: tuple[str, ...] = ()) -> None:
    """Every table and every summary field of the two reports are equal (but those naming
    the run, and ``also``: what the runs did, when they did not do the same)."""
    (spark_out, spark_summary), (arrow_out, arrow_summary) = by_spark, by_arrow
    ignored = (*PER_RUN, *also)
    for table in TABLES:
        assert _schema(spark, arrow_out / table) == _schema(spark, spark_out / table), table
        assert rows(spark, arrow_out / table) == rows(spark, spark_out / table), table
    assert set(arrow_summary) == set(spark_summary)
    for key in spark_summary:
        if key not in ignored:
            assert arrow_summary[key] == spark_summary[key], key
    written = json.loads((arrow_out / "summary.json").read_text("utf-8"))
    expected = json.loads((spark_out / "summary.json").read_text("utf-8"))
    assert {k: v for k, v in written.items() if k not in ignored} == {k: v for k, v in expected.items() if k not in ignored}


def _internal_log(data_dir: Path) -> None:
    """test_report's internal-session log, with a drop after hand-off and an unrenderable."""
    hour = data_dir / "events" / "date=2024-05-01" / "hour=10"
    hour.mkdir(parents=True)
    hour.joinpath("events-b1-run1-1.jsonl").write_text("".join([
        rec(H0 + S, "smqp", "login", session="bridge:news", outcome="ok"),
        rec(H0 + S, "smqp", "subscribed", session="bridge:news", topic="news"),
        rec(H0 + S, "mcchat", "login", session="carol", outcome="ok", source="127.0.0.1:4000"),
        rec(H0 + S, "mcchat", "subscribed", session="carol", topic="news"),
        rec(H0 + 2 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=10, fanout=2, count=2),
        rec(H0 + 3 * S, "socketmq", "accepted", session="sam", topic="news", message="multicast", bytes=4, fanout=2, dropped=1),
        rec(H0 + 4 * S, "mcchat", "dropped", session="carol", topic="news", reason="slow_consumer", dropped=3),
        rec(H0 + 5 * S, "ssmp", "dropped", session="alice", reason="no_recipient"),
        rec(H0 + 6 * S, "ssmp", "auth_failure", session="eve", source="[::1]:7000", scheme="open"),
        rec(H0 + 7 * S, "ssmp", "auth_failure", session="eve", source="unix", scheme="secret"),
        rec(H0 + 8 * S, "ssmp", "auth_failure", session="mallory", scheme="secret"),
        rec(H0 + 70 * S, "smqp", "delivered", session="erin:c1", topic="news", bytes=9, latency_us=5, queued_us=1),
        *LATENCY_LOG,
    ]), "utf-8")


def _null_fields_log(data_dir: Path) -> None:
    """Records a broker does not write but a damaged or hand-made log may hold: endpoints and
    messages without a topic, a logout without its login, a delivery without a session."""
    hour = data_dir / "events" / "date=2024-05-01" / "hour=10"
    hour.mkdir(parents=True)
    hour.joinpath("events-b1-run1-1.jsonl").write_text("".join([
        rec(H0 + S, "ssmp", "login", session="bob", outcome="ok", source="127.0.0.1:5000"),
        rec(H0 + S, "ssmp", "subscribed", session="bob"),
        rec(H0 + S, "ssmp", "subscribed", session="bob", topic="news"),
        rec(H0 + 2 * S, "ssmp", "accepted", session="alice", message="multicast", bytes=3, fanout=1),
        rec(H0 + 3 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=5, fanout=1),
        rec(H0 + 4 * S, "mcchat", "unsubscribed", session="bob"),
        rec(H0 + 5 * S, "mcchat", "logout", session="ghost"),
        rec(H0 + 6 * S, "ssmp", "delivered", topic="news", bytes=5, latency_us=7),
        rec(H0 + 7 * S, "ssmp", "unsubscribed", session="bob", topic="news"),
    ]), "utf-8")


def _generated_log(data_dir: Path) -> None:
    generate(data_dir, 30_000, hours=3, seed=11, workers=1)


def _empty_log(data_dir: Path) -> None:
    (data_dir / "events").mkdir(parents=True)


LOGS: dict[str, tuple[Callable[[Path], None], dict[str, int]]] = {
    # name: (writer, a window cutting hours)
    "bad lines": (write_log, {"since_us": H0 + 30 * S, "until_us": H0 + HOUR + 30 * M}),
    "subscriptions": (_subscription_log, {"since_us": H0 + 10 * M + 35_000_000, "until_us": H0 + 2 * HOUR + 10 * M + 25_000_000}),
    "samples": (_samples_log, {"since_us": H0 + 10 * M, "until_us": H0 + 2 * HOUR + 150_000_000}),
    "internal sessions": (_internal_log, {"since_us": H0 + 2 * S, "until_us": H0 + 100 * S}),
    "null fields": (_null_fields_log, {"since_us": H0 + 2 * S, "until_us": H0 + 5 * S}),
    "generated": (_generated_log, {"since_us": 1_714_521_600_000_000 + 30 * M, "until_us": 1_714_521_600_000_000 + 150 * M}),
    "empty": (_empty_log, {"since_us": H0, "until_us": H0 + HOUR}),
}


def _arrow(data_dir: Path, out: Path, **options: Any) -> tuple[Path, dict[str, Any]]:
    return out, run_report(None, str(data_dir), str(out), **options)


def _spark(spark: Any, data_dir: Path, out: Path, **options: Any) -> tuple[Path, dict[str, Any]]:
    return out, run_report(spark, str(data_dir), str(out), **options)


@pytest.mark.parametrize("log", list(LOGS))
def test_a_local_report_equals_the_one_spark_distributes(spark: Any, tmp_path: Path, log: str) -> None:
    write, window = LOGS[log]
    raw, by_spark, by_arrow = tmp_path / "raw", tmp_path / "by-spark", tmp_path / "by-arrow"
    write(raw)
    shutil.copytree(raw, by_spark)
    shutil.copytree(raw, by_arrow)

    # the raw JSON, not compacted: pyarrow reads it unless a line only Spark can mark malformed
    spark_raw = _spark(spark, raw, tmp_path / "spark-raw", compact=False)
    convertible = not list(raw.rglob("*.jsonl")) or log not in ("bad lines", "samples")
    if convertible:
        assert_same(spark, spark_raw, _arrow(raw, tmp_path / "arrow-raw", compact=False))
    else:
        with pytest.raises(NotConvertible):
            _arrow(raw, tmp_path / "arrow-raw", compact=False)
        assert not (tmp_path / "arrow-raw").exists()  # nothing written
        assert not (raw / COMPACTED_DIR).exists()

    # compacted: by the Spark engine's run on one copy, by pyarrow alone on the other (the
    # hours pyarrow cannot parse are then compacted by Spark, as --engine auto would)
    stored = _spark(spark, by_spark, tmp_path / "spark-stored")
    if convertible:
        assert_same(spark, stored, _arrow(by_arrow, tmp_path / "arrow-stored"))
    else:
        with pytest.raises(NotConvertible):  # after compacting the hours it can parse
            _arrow(by_arrow, tmp_path / "arrow-stored")
        done = compact(spark, str(by_arrow))
        assert done.compacted and done.already
        arrow = _arrow(by_arrow, tmp_path / "arrow-stored")
        hours = len(done.compacted) + len(done.already)
        assert arrow[1]["compaction"] == {"compacted_now": 0, "already": hours, "open": 0, "deleted_json_files": 0}
        assert_same(spark, stored, arrow, also=("compaction",))

    # a window cutting hours: those hours from their compacted rows, the others from summaries
    assert_same(spark, _spark(spark, by_spark, tmp_path / "spark-cut", **window),
                _arrow(by_arrow, tmp_path / "arrow-cut", **window))


def test_open_hours_are_read_from_json_and_compacted_by_pyarrow(spark: Any, tmp_path: Path) -> None:
    """Hours 10 and 11 closed (compacted by pyarrow, no JVM), hour 12 open (its JSON read, an
    empty file among it)."""
    raw, mixed = tmp_path / "raw", tmp_path / "mixed"
    _subscription_log(raw)
    (raw / "events" / "date=2024-05-01" / "hour=12" / "events-b1-run2-1.jsonl").touch()  # just opened: no line yet
    shutil.copytree(raw, mixed)
    now = H0 + 2 * HOUR + 30 * M
    arrow = _arrow(mixed, tmp_path / "arrow", now_us=now, delete_json=True)
    assert arrow[1]["compaction"] == {"compacted_now": 2, "already": 0, "open": 1, "deleted_json_files": 2}
    assert arrow[1]["summarized_hours"] == 2
    assert sorted(p.name for p in (mixed / COMPACTED_DIR / "date=2024-05-01").iterdir()) == ["hour=10", "hour=11"]
    assert_same(spark, _spark(spark, raw, tmp_path / "spark", compact=False), arrow, also=("compaction", "summarized_hours"))


def test_usable_only_with_a_local_master_and_local_paths() -> None:
    assert usable(None, "/data", "out")
    assert usable("local[*]", "file:///data", "/out")
    assert usable("local[2]", "/data", "/out") and usable("local", "/data", "/out")
    assert not usable("spark://127.0.0.1:7077", "/data", "/out")
    assert not usable("yarn", "/data", "/out")
    assert not usable("local[*]", "hdfs:///data", "/out")
    assert not usable("local[*]", "/data", "s3a://reports/b1")


def _no_java_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which starting a JVM fails: no java on PATH, JAVA_HOME empty."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    return {**os.environ, "PATH": str(bin_dir), "JAVA_HOME": str(tmp_path / "no-java"), "SPARK_HOME": str(tmp_path / "no-spark")}


def test_the_command_line_runs_a_local_report_without_a_jvm(tmp_path: Path) -> None:
    written = generate(tmp_path / "data", 6000, hours=2, seed=7, workers=1)
    command = [sys.executable, "-m", "brokerd.pipeline", "report", "--data-dir", str(tmp_path / "data"),
               "--out", str(tmp_path / "out"), "--master", "local[2]"]
    env = _no_java_env(tmp_path)
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "compacting closed hours (pyarrow)" in result.stderr and "deriving the tables" in result.stderr
    assert f"{written:,} valid of {written:,} lines" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["events"] == written and summary["compaction"]["compacted_now"] == 2
    # a second report reads the stored summaries; --quiet prints only the summary
    quiet = subprocess.run(command + ["--quiet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["summarized_hours"] == 2
    # with --engine spark the same command needs the JVM: it fails here, so the runs above had none
    failed = subprocess.run(command + ["--engine", "spark"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0


def test_with_a_cluster_master_a_local_log_is_reported_here_and_spark_starts_only_when_needed(tmp_path: Path) -> None:
    """Under ``auto`` a ``spark://`` master with local paths runs the job in this process: no JVM
    can start here and nothing listens at the master, so a session would fail the command."""
    written = generate(tmp_path / "data", 3000, hours=1, seed=3, workers=1)
    master = ["--master", "spark://127.0.0.1:9", "--data-dir", str(tmp_path / "data")]
    env = _no_java_env(tmp_path)
    compacted = subprocess.run([sys.executable, "-m", "brokerd.pipeline", "compact", *master], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=300)
    assert compacted.returncode == 0, compacted.stderr[-2000:]
    assert compacted.stdout.startswith(f"compacted 1 hour(s) ({written:,} lines)")
    assert "pyarrow in this process first, Spark on spark://127.0.0.1:9 only for" in compacted.stderr
    report = [sys.executable, "-m", "brokerd.pipeline", "report", *master, "--out", str(tmp_path / "out")]
    result = subprocess.run(report + ["--quiet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["events"] == written
    # what pyarrow cannot parse still goes to that master: here the session cannot start
    open_hour = tmp_path / "data" / "events" / "date=2099-01-01" / "hour=00"
    open_hour.mkdir(parents=True)
    (open_hour / "events-b1-run1-1.jsonl").write_text("{not json\n")
    failed = subprocess.run(report + ["--no-compact"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0 and "running on Spark" in failed.stderr, failed.stderr[-2000:]


def test_the_compact_command_compacts_a_local_log_in_process_as_spark_does(spark: Any, tmp_path: Path) -> None:
    """``compact`` on a local log runs in this process (no JVM can start here) and publishes the
    rows, markers and stored summaries Spark's compaction of the same log does."""
    raw, by_spark = tmp_path / "raw", tmp_path / "by-spark"
    generate(raw, 20_000, hours=3, seed=5, workers=1)
    _subscription_log(raw)  # hours 10-12: subscriptions spanning hours
    shutil.copytree(raw, by_spark)
    command = [sys.executable, "-m", "brokerd.pipeline", "compact", "--data-dir", str(raw), "--master", "local[2]"]
    result = subprocess.run(command, cwd=ROOT, env=_no_java_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("compacted 6 hour(s)") and "compacting 6 hour(s)" in result.stderr
    assert compact(spark, str(by_spark)).compacted == sorted(compact(None, str(raw)).already)
    hours = sorted(p.relative_to(raw / COMPACTED_DIR) for p in (raw / COMPACTED_DIR).glob("date=*/hour=*"))
    assert hours == sorted(p.relative_to(by_spark / COMPACTED_DIR) for p in (by_spark / COMPACTED_DIR).glob("date=*/hour=*"))
    assert rows(spark, raw / COMPACTED_DIR) == rows(spark, by_spark / COMPACTED_DIR)
    for hour in hours:
        markers = [json.loads((root / COMPACTED_DIR / hour / "_compacted.json").read_text()) for root in (raw, by_spark)]
        assert [{k: v for k, v in m.items() if k != "compacted_at_us"} for m in markers] == [
            {k: v for k, v in markers[1].items() if k != "compacted_at_us"}] * 2
        assert markers[0]["summaries"]["tables"], hour
        for name in markers[0]["summaries"]["tables"]:
            summary = Path(COMPACTED_DIR, hour, "_summary", name)
            assert rows(spark, raw / summary) == rows(spark, by_spark / summary), summary
    assert list((raw / COMPACTED_DIR / hours[0]).glob("*-arrow.parquet"))  # pyarrow wrote them
    assert not list((by_spark / COMPACTED_DIR / hours[0]).glob("*-arrow.parquet"))


def test_auto_falls_back_to_spark_and_arrow_says_why(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_log(data)
    base = [sys.executable, "-m", "brokerd.pipeline", "report", "--data-dir", str(data), "--master", "local[1]",
            "--driver-memory", "1g"]
    forced = subprocess.run(base + ["--out", str(tmp_path / "forced"), "--engine", "arrow"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert forced.returncode == 1 and "pyarrow cannot read the log" in forced.stderr, forced.stderr[-2000:]
    assert "--engine spark or auto" in forced.stderr
    # it published the one hour pyarrow parses, and no table
    assert [p.name for p in (data / COMPACTED_DIR).glob("date=*/hour=*")] == ["hour=11"]
    assert not (tmp_path / "forced" / "traffic").exists()
    auto = subprocess.run(base + ["--out", str(tmp_path / "auto")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert auto.returncode == 0, auto.stderr[-2000:]
    assert "running on Spark" in auto.stderr
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["quality"]["malformed"] == 5
    assert summary["compaction"] == {"compacted_now": 3, "already": 1, "open": 0, "deleted_json_files": 0}
    remote = subprocess.run(base + ["--out", "hdfs:///reports", "--engine", "arrow"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert remote.returncode == 2 and "--engine arrow needs a local master" in remote.stderr


def test_past_its_memory_bound_arrow_refuses_and_auto_runs_on_spark(tmp_path: Path) -> None:
    written = generate(tmp_path / "data", 4000, hours=2, seed=11, workers=1)
    base = [sys.executable, "-m", "brokerd.pipeline", "report", "--data-dir", str(tmp_path / "data"),
            "--master", "local[1]", "--driver-memory", "1g"]
    bad = subprocess.run(base + ["--out", str(tmp_path / "bad"), "--arrow-max-memory", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected a positive byte count" in bad.stderr
    forced = subprocess.run(base + ["--out", str(tmp_path / "forced"), "--engine", "arrow", "--arrow-max-memory", "1k"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert forced.returncode == 1 and "more than --arrow-max-memory (1,024 bytes)" in forced.stderr, forced.stderr[-2000:]
    assert not (tmp_path / "forced" / "traffic").exists()
    auto = subprocess.run(base + ["--out", str(tmp_path / "auto"), "--arrow-max-memory", "1k"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert auto.returncode == 0 and "running on Spark" in auto.stderr, auto.stderr[-2000:]
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["events"] == written
    # within the default bound the same log is reported by pyarrow, with no fallback
    within = subprocess.run(base + ["--out", str(tmp_path / "within"), "--engine", "arrow"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert within.returncode == 0 and "running on Spark" not in within.stderr, within.stderr[-2000:]
    assert json.loads((tmp_path / "within" / "summary.json").read_text())["events"] == written


@pytest.mark.parametrize("log", ["subscriptions", "generated"])
def test_summaries_of_hours_split_across_partitions_give_the_same_tables(spark: Any, tmp_path: Path, log: str) -> None:
    """Spark summarises each partition's records where they are (no shuffle by hour); with
    every hour split across several partitions, in an order of Spark's choosing, the merged
    parts give the tables one summary per hour gives."""
    from pyspark.sql import functions as F

    from brokerd.pipeline import sparkio, tables
    from brokerd.pipeline.read import OK, _summarize_by_hour
    from brokerd.pipeline.summaries import RECORD_COLUMNS, merge, record_schema

    raw = tmp_path / "raw"
    LOGS[log][0](raw)
    events = str(raw / "events")
    records = sparkio.read_json(spark, events, [events]).filter(F.col("status") == OK).select(*RECORD_COLUMNS)
    whole = records.toArrow().select(list(RECORD_COLUMNS)).cast(record_schema())
    split = records.repartition(5)
    assert split.rdd.getNumPartitions() == 5
    parts = sparkio.collect(sparkio.summarize(split))
    assert len(parts["kinds"]) > len(set(whole.column("ts").to_numpy() // 3_600_000_000))  # hours in parts
    by_parts = tables.compute(merge(parts), 0)
    by_hour = tables.compute(merge(_summarize_by_hour(whole)), 0)
    assert set(by_parts) == set(by_hour)
    for name in by_hour:
        assert by_parts[name].to_pylist() == by_hour[name].to_pylist(), name


def test_compaction_here_then_on_spark_publishes_what_spark_alone_does(spark: Any, tmp_path: Path) -> None:
    """What ``--engine auto`` does whatever the master: the hours pyarrow parses are compacted
    in this process, then the others by Spark; what is published is what Spark alone
    publishes (hours, rows, markers, stored summaries)."""
    both, by_spark = tmp_path / "both", tmp_path / "by-spark"
    write_log(both)
    shutil.copytree(both, by_spark)
    here = compact(None, str(both))
    assert [hour for _date, hour in here.compacted] == ["11"] and len(here.unconvertible) == 3
    rest = compact(spark, str(both))
    assert sorted(here.compacted + rest.compacted) == compact(spark, str(by_spark)).compacted
    by_pyarrow = (both / COMPACTED_DIR).glob("date=*/hour=*/*-arrow.parquet")
    assert [path.parent.name for path in by_pyarrow] == ["hour=11"]  # the one hour without a bad line
    assert rows(spark, both / COMPACTED_DIR) == rows(spark, by_spark / COMPACTED_DIR)
    for hour in sorted(p.relative_to(both / COMPACTED_DIR) for p in (both / COMPACTED_DIR).glob("date=*/hour=*")):
        markers = [json.loads((root / COMPACTED_DIR / hour / "_compacted.json").read_text()) for root in (both, by_spark)]
        assert [{k: v for k, v in m.items() if k != "compacted_at_us"} for m in markers] == [
            {k: v for k, v in markers[1].items() if k != "compacted_at_us"}] * 2
        for name in (markers[0]["summaries"] or {}).get("tables", []):
            summary = Path(COMPACTED_DIR, hour, "_summary", name)
            assert rows(spark, both / summary) == rows(spark, by_spark / summary), summary


def test_tables_spark_writes_to_cluster_storage_read_back_as_the_local_ones(spark: Any, tmp_path: Path) -> None:
    """A local ``--out`` is written by the driver even on Spark; Spark's writer (for cluster
    URIs) gives every table the same rows and Spark types."""
    from brokerd.pipeline import sparkio, tables
    from brokerd.pipeline.read import read_summaries
    from brokerd.pipeline.report import write_table

    generate(tmp_path / "log", 20_000, hours=2, seed=3, workers=1)
    found = tables.compute(read_summaries(str(tmp_path / "log")).summaries, 100)
    assert set(found) == set(TABLES)
    for name, table in found.items():
        write_table(table, str(tmp_path / "local" / name))
        sparkio.write_table(spark, table, str(tmp_path / "spark" / name))
        assert not list((tmp_path / "spark" / name).glob("*-arrow.parquet"))  # Spark's files
        assert _schema(spark, tmp_path / "spark" / name) == _schema(spark, tmp_path / "local" / name), name
        assert rows(spark, tmp_path / "spark" / name) == rows(spark, tmp_path / "local" / name), name

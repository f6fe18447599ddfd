"""The report job: event log in, Parquet tables + HTML report + summary out.

One pipeline, two places to run it.  The records are reduced once to the per-hour summaries
(brokerd.pipeline.summaries; read as stored for compacted hours) and every table is derived
from the merged summaries (brokerd.pipeline.tables.TABLES), which are small by construction
(per minute, per top-N); summary.json and the HTML come from those tables.

- Locally (``spark`` None: a local master, data dir and out), all of it runs in this process
  with pyarrow, no JVM: compaction, reading (brokerd.pipeline.arrowread), the tables.
- Distributed (a Spark session: a cluster, or ``--engine spark``), Spark parses the JSON, runs
  the summary function on its executors and stores what compaction writes; the merged
  summaries are collected into the driver (brokerd.pipeline.sparkio) and the same table
  functions run there; Spark writes the tables (to any Hadoop URI).

Profiled on 10 M events (docs/pipeline.md), a second report whose tables Spark computed spent
30 of its 43 s in Spark's fixed costs (the JVM start, the first query's warm-up, dozens of short
jobs per table) on about 1 M summary rows; pyarrow derives the same tables in under a second.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from brokerd.events import schema
from brokerd.pipeline import gauges, html, sparkio, tables
from brokerd.pipeline.arrowbase import sort_by
from brokerd.pipeline.arrowread import DEFAULT_MAX_MEMORY, read_summaries
from brokerd.pipeline.compact import compact as compact_log
from brokerd.pipeline.localfs import local_path
from brokerd.pipeline.read import OK
from brokerd.pipeline.session import Progress
from brokerd.pipeline.timespec import format_time

TABLES = tuple(name for name, _table in tables.TABLES)
MAX_PLOT_POINTS = 1500
"""Buckets of the messages/s plot; the bucket grows (in whole minutes) for longer logs."""
HTML_NAME = "report.html"
SUMMARY_NAME = "summary.json"


def local_dir(out: str) -> Path | None:
    """``out`` as a local path, or None when it is a cluster URI (hdfs://, s3a://, ...)."""
    parsed = urlparse(out)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # C:\ on Windows
        return Path(parsed.path if parsed.scheme == "file" else out)
    return None


def _datetime(us: int) -> datetime:
    """A timestamp for the summary and the plots (naive, the machine's local time)."""
    return datetime.fromtimestamp(us // 1_000_000).replace(microsecond=us % 1_000_000)


def rows(table: Any) -> list[dict[str, Any]]:
    """``table``'s rows as dicts: timestamps as naive datetimes, maps as dicts, arrays as lists."""
    columns: dict[str, list[Any]] = {}
    for field in table.schema:
        column = table.column(field.name)
        if pa.types.is_timestamp(field.type):
            values = [None if v is None else _datetime(v) for v in column.cast(pa.int64()).to_pylist()]
        elif pa.types.is_map(field.type):
            values = [None if v is None else dict(v) for v in column.to_pylist()]
        else:
            values = column.to_pylist()
        columns[field.name] = values
    return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else []


def write_table(table: Any, directory: str) -> None:
    """``table`` as ``directory`` (replaced, local), a Parquet directory as Spark writes one."""
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    pq.write_table(table, os.path.join(directory, "part-00000-arrow.parquet"))
    open(os.path.join(directory, "_SUCCESS"), "wb").close()


def run_report(
    spark: Any,
    data_dir: str,
    out: str,
    *,
    since_us: int | None = None,
    until_us: int | None = None,
    top: int = 100,
    html_dir: str | None = None,
    progress: Any = None,
    compact: bool = True,
    delete_json: bool = False,
    now_us: int | None = None,
    max_memory: int | None = None,
) -> dict[str, Any]:
    """Run the whole job; return the summary (also written as summary.json).  First the
    closed hours not compacted yet are compacted (unless ``compact`` is false).

    ``spark`` None: in this process (local data dir and out); raises arrowjson.NotConvertible
    (before writing any table) when an input needs Spark's reader, arrowread.TooLarge when the
    inputs take more than ``max_memory`` bytes (default arrowread.DEFAULT_MAX_MEMORY).  With a
    Spark session: distributed by Spark (any Hadoop URI; ``max_memory`` does not apply)."""
    progress = progress or Progress(spark, enabled=False)
    step = progress.step
    where = "pyarrow" if spark is None else "Spark"
    out = out.rstrip("/") or "/"
    compaction = None
    if compact:
        step(f"compacting closed hours ({where})")
        compaction = compact_log(spark, data_dir, now_us=now_us, delete_json=delete_json, progress=progress)
    step(f"reading the event log: the stored summaries, and the other hours' records summarised ({where})")
    if spark is None:
        log = read_summaries(data_dir, since_us, until_us, DEFAULT_MAX_MEMORY if max_memory is None else max_memory)
    else:
        log = sparkio.read_log(spark, data_dir, since_us, until_us)
    s = log.summaries
    step(f"deriving the tables from {len(log.summarized)} hour(s) of stored summaries and the others' (pyarrow)")
    found = tables.compute(s, top)
    step("writing the tables")
    for name, table in found.items():
        if spark is None:
            write_table(table, os.path.join(local_path(out) or out, name))
        else:
            sparkio.write_table(spark, table, f"{out}/{name}")

    step("summarising")
    kinds = s["kinds"].group_by("kind", use_threads=False).aggregate([("n", "sum"), ("first_ts", "min"), ("last_ts", "max")])
    events_by_kind = {kind: int(n) for kind, n in zip(kinds.column("kind").to_pylist(), kinds.column("n_sum").to_pylist())}
    first = pc.min(kinds.column("first_ts_min")).as_py() if len(kinds) else None
    last = pc.max(kinds.column("last_ts_max")).as_py() if len(kinds) else None
    traffic = found["traffic"]
    span_minutes = 1 if first is None else max(1, math.ceil((last - first + 1) / 60_000_000))
    bucket_seconds = max(1, math.ceil(span_minutes / MAX_PLOT_POINTS)) * 60
    moving = traffic.filter(pc.greater(traffic.column("messages"), 0))
    minute_us = moving.column("minute").cast(pa.int64())
    bucket_us = pc.multiply(pc.divide(minute_us, bucket_seconds * 1_000_000), bucket_seconds * 1_000_000)  # ts > 0
    rates = pa.table({"bucket": bucket_us, "protocol": moving.column("protocol"), "messages": moving.column("messages")})
    rates = rates.group_by(["bucket", "protocol"], use_threads=False).aggregate([("messages", "sum")])
    series: dict[str, list[tuple[datetime, float]]] = {}
    for bucket, protocol, messages in zip(*[rates.column(c).to_pylist() for c in ("bucket", "protocol", "messages_sum")]):
        series.setdefault(protocol, []).append((_datetime(bucket), messages / bucket_seconds))
    per_protocol = traffic.group_by("protocol", use_threads=False).aggregate([("messages", "sum")])
    messages_by_protocol = {
        protocol: int(m) for protocol, m in zip(per_protocol.column("protocol").to_pylist(),
                                                 per_protocol.column("messages_sum").to_pylist()) if m
    }
    named = traffic.filter(pc.is_valid(traffic.column("topic")))
    topics = named.group_by("topic", use_threads=False).aggregate([("messages", "sum")])
    topics = topics.filter(pc.greater(topics.column("messages_sum"), 0))
    topics = sort_by(topics, [("messages_sum", "descending"), ("topic", "ascending")]).slice(0, 15)
    top_topics = [(t, int(m)) for t, m in zip(topics.column("topic").to_pylist(), topics.column("messages_sum").to_pylist())]
    latency_by_protocol = rows(tables.latency(s, keys=("protocol", "kind")))
    auth = rows(sort_by(found["auth_failures"], [("failures", "descending"), ("source", "ascending"),
                                                            ("protocol", "ascending")]).slice(0, 10))
    slow = found["slow_consumers"]
    slow_rows = rows(sort_by(slow, [("time", "descending")]).slice(0, 20))
    delivery_rows = rows(sort_by(found["delivery_latency"], [("protocol", "ascending"), ("source", "ascending")]))
    split_rows = rows(sort_by(found["smqp_latency_split"], [("kind", "ascending"), ("part", "descending")]))
    gauge_rows = rows(sort_by(found["queue_gauges"], [("time", "ascending")]))
    dead = sum(events_by_kind.get(kind, 0) for kind in schema.DEAD_LETTER_KINDS)
    summary = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "data_dir": data_dir,
        "events_path": log.path,
        "log_found": log.found,
        "out": out,
        "since": None if since_us is None else format_time(since_us),
        "until": None if until_us is None else format_time(until_us),
        "first_event": None if first is None else format_time(first),
        "last_event": None if last is None else format_time(last),
        "quality": log.quality,
        "lines": sum(log.quality.values()),
        "events": sum(events_by_kind.values()),
        "events_by_kind": events_by_kind,
        "messages": sum(messages_by_protocol.values()),  # weighted by count, unlike events_by_kind
        "messages_by_protocol": messages_by_protocol,
        "top_topics": top_topics,
        "latency_by_protocol": latency_by_protocol,
        "top_publishers": rows(found["top_publishers"].slice(0, 10)),
        "top_subscribers": rows(found["top_subscribers"].slice(0, 10)),
        "dead_letters": dead,
        "auth_failure_count": events_by_kind.get("auth_failure", 0),
        "auth_failures": auth,
        "cross_protocol": rows(found["cross_protocol"]),
        "slow_consumer_episodes": len(slow),
        "slow_consumers": slow_rows,
        "delivery_latency": delivery_rows,
        "smqp_latency_split": split_rows,
        "queue_gauge_readings": len(gauge_rows),
        "queue_gauge_last": gauge_rows[-1] if gauge_rows else None,
        "tables": list(TABLES),
        "summarized_hours": len(log.summarized),
        "bucket_seconds": bucket_seconds,
        "compaction": None if compaction is None else {
            "compacted_now": len(compaction.compacted), "already": len(compaction.already),
            "open": len(compaction.open), "deleted_json_files": compaction.deleted_files,
        },
    }
    step("drawing the HTML report")
    write_outputs(summary, series, gauge_rows, out, html_dir)
    return summary


def write_outputs(summary: dict[str, Any], series: dict[str, list[tuple[datetime, float]]],
                  gauge_rows: list[dict[str, Any]], out: str, html_dir: str | None) -> None:
    """Draw the plots, write report.html and summary.json (next to the tables when ``out`` is
    local, else in ``html_dir``) and set ``summary["html"]``."""
    delivery_rows, split_rows = summary["delivery_latency"], summary["smqp_latency_split"]
    plots = {
        "rate": html.rate_plot(series, summary["bucket_seconds"]),
        "latency": html.latency_plot(summary["latency_by_protocol"]),
        "topics": html.topics_plot(summary["top_topics"]),
        "delivery_latency": html.latency_plot([{**row, "kind": row["source"]} for row in delivery_rows],
                                              "Delivery latency percentiles, by receiving protocol"),
        "smqp_split": html.latency_plot([{**row, "protocol": row["kind"], "kind": row["part"]} for row in split_rows],
                                        "SMQP latency: queued while away vs. once online"),
        "queue": gauges.queue_plot(gauge_rows),
    }
    target = local_dir(out) or Path(html_dir or ".")
    target.mkdir(parents=True, exist_ok=True)
    (target / HTML_NAME).write_text(html.render(summary, plots), "utf-8")
    summary["html"] = str(target / HTML_NAME)
    (target / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=_json_default) + "\n", "utf-8")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def text_summary(summary: dict[str, Any], elapsed: float | None = None) -> str:
    """The summary printed on stdout."""
    quality = summary["quality"]
    bad = {k: v for k, v in quality.items() if k != OK and v}
    lines = [
        f"brokerd report: {summary['events_path']}" + ("" if summary["log_found"] else " (no event log found)"),
        f"  window        {summary['since'] or 'start'} .. {summary['until'] or 'end'}",
        f"  events        {summary['events']:,} valid of {summary['lines']:,} lines"
        + (f"; skipped {sum(bad.values()):,} bad lines ({', '.join(f'{k} {v:,}' for k, v in bad.items())})" if bad else ""),
        f"  time range    {summary['first_event'] or '-'} .. {summary['last_event'] or '-'}",
        "  messages      "
        + (", ".join(f"{p} {n:,}" for p, n in sorted(summary["messages_by_protocol"].items())) or "none"),
    ]
    if summary["top_topics"]:
        lines.append("  top topics    " + ", ".join(f"{t} ({n:,})" for t, n in summary["top_topics"][:5]))
    for row in summary["latency_by_protocol"]:
        lines.append(
            f"  latency       {row['protocol']} {row['kind']}: p50 {row['p50_us']} us, p90 {row['p90_us']} us, "
            f"p99 {row['p99_us']} us, max {row['max_us']} us ({row['count']:,})"
        )
    lines.append(f"  dead letters  {summary['dead_letters']:,}")
    lines.append(f"  auth failures {summary['auth_failure_count']:,}"
                 + (f" (top source {summary['auth_failures'][0]['source']})" if summary["auth_failures"] else ""))
    compaction = summary.get("compaction")
    if compaction:
        lines.append(f"  compaction    {compaction['compacted_now']} hour(s) compacted now, "
                     f"{compaction['already']} before, {compaction['open']} still open (read as JSON)")
    lines.append(f"  tables        {summary['out']}/{{{','.join(summary['tables'])}}}")
    lines.append(f"  html          {summary['html']}")
    if elapsed is not None:
        lines.append(f"  took          {elapsed:.1f} s")
    return "\n".join(lines)


def timed(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = function(*args, **kwargs)
    return result, time.monotonic() - started

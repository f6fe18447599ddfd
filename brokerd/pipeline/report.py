"""The report job: event log in, Parquet tables + HTML report + summary out.

One pipeline, two places to run it.  The records are reduced once to the per-hour summaries
(brokerd.pipeline.summaries; stored with compacted hours), every table is derived from the
merged summaries (brokerd.pipeline.tables.TABLES), and summary.json and the HTML from those.

- Locally (``spark`` None: a local data dir and out; under ``--engine auto`` whatever the
  master, brokerd.pipeline.cli), all of it runs in this process with pyarrow, no JVM:
  compaction, reading (brokerd.pipeline.read), the tables.
- Distributed (a Spark session: cluster storage, ``--engine spark``, or what the local run
  could not parse or hold), Spark parses the JSON, runs the summary function on its executors
  and stores what compaction writes; the merged summaries are collected into the driver
  (brokerd.pipeline.sparkio) and the same table functions run there.  What the driver sees is
  done there, as Spark's fixed costs (a job per file read or table written) exceed the work:
  a local log's stored summaries and a local ``--out``.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.pipeline import html, sparkio, tables
from brokerd.pipeline.arrowbase import sort_by
from brokerd.pipeline.arrowjson import NotConvertible, write_parquet
from brokerd.pipeline.compact import compact as compact_log
from brokerd.pipeline.localfs import local_path
from brokerd.pipeline.read import DEFAULT_MAX_MEMORY, OK, Log, read_summaries
from brokerd.pipeline.session import Progress
from brokerd.pipeline.summaries import group, sums
from brokerd.pipeline.timespec import format_time

TABLES = tuple(name for name, _table in tables.TABLES)
MAX_PLOT_POINTS = 1500
"""Buckets of the messages/s plot; the bucket grows (in whole minutes) for longer logs."""
HTML_NAME = "report.html"
SUMMARY_NAME = "summary.json"


def _datetime(us: int) -> datetime:
    """A timestamp for the summary and the plots (naive, the machine's local time)."""
    return datetime.fromtimestamp(us // 1_000_000).replace(microsecond=us % 1_000_000)


def rows(table: Any) -> list[dict[str, Any]]:
    """``table``'s rows as dicts: timestamps as naive datetimes, maps as dicts, arrays as lists."""
    columns: dict[str, list[Any]] = {}
    for field in table.schema:
        column = table.column(field.name)
        values: list[Any]
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
    write_parquet(table, directory)
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
    (before writing any table) when an input needs Spark's reader, read.TooLarge when the
    inputs take more than ``max_memory`` bytes (default read.DEFAULT_MAX_MEMORY).  With a
    Spark session: distributed by Spark (any Hadoop URI; ``max_memory`` does not apply)."""
    step = (progress or Progress(spark, enabled=False)).step
    where = "pyarrow" if spark is None else "Spark"
    out = out.rstrip("/") or "/"
    compaction = None
    if compact:
        step(f"compacting closed hours ({where})")
        compaction = compact_log(spark, data_dir, now_us=now_us, delete_json=delete_json, progress=progress)
        if compaction.unconvertible:
            raise NotConvertible("pyarrow cannot parse the JSON of "
                                 + ", ".join(f"{date} {hour}:00" for date, hour in compaction.unconvertible))
    step(f"reading the event log: the stored summaries, and the other hours' records summarised ({where})")
    if spark is None:
        log = read_summaries(data_dir, since_us, until_us, DEFAULT_MAX_MEMORY if max_memory is None else max_memory)
    else:
        log = sparkio.read_log(spark, data_dir, since_us, until_us)
    step(f"deriving the tables from {len(log.summarized)} hour(s) of stored summaries and the others' (pyarrow)")
    found = tables.compute(log.summaries, top)
    step("writing the tables")
    local_out = local_path(out)  # a local --out is written here, with or without Spark
    for name, table in found.items():
        if local_out is not None:
            write_table(table, os.path.join(local_out, name))
        else:
            sparkio.write_table(spark, table, f"{out}/{name}")
    step("summarising")
    figures, gauge_rows = _figures(log, found)
    summary = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "data_dir": data_dir,
        "events_path": log.path, "log_found": log.found, "out": out,
        "since": None if since_us is None else format_time(since_us),
        "until": None if until_us is None else format_time(until_us),
        **figures,
        "compaction": None if compaction is None else {
            "compacted_now": len(compaction.compacted), "already": len(compaction.already),
            "open": len(compaction.open), "deleted_json_files": compaction.deleted_files,
        },
    }
    step("drawing the HTML report")
    write_outputs(summary, _rates(found["traffic"], summary["bucket_seconds"]), gauge_rows, out, html_dir)
    return summary


def _figures(log: Log, found: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary's figures, from the merged summaries and the tables, and the gauge rows."""
    kinds = group(log.summaries["kinds"], ["kind"], [("n", "sum", "n"), ("first_ts", "min", "first"),
                                                     ("last_ts", "max", "last")])
    events_by_kind = dict(zip(kinds.column("kind").to_pylist(), kinds.column("n").to_pylist()))
    first = pc.min(kinds.column("first")).as_py()
    last = pc.max(kinds.column("last")).as_py()
    traffic = found["traffic"]
    per_protocol = group(traffic, ["protocol"], sums("messages"))
    protocols = zip(per_protocol.column("protocol").to_pylist(), per_protocol.column("messages").to_pylist())
    messages_by_protocol = {protocol: messages for protocol, messages in protocols if messages}
    topics = group(traffic.filter(pc.is_valid(traffic.column("topic"))), ["topic"], sums("messages"))
    topics = sort_by(topics.filter(pc.greater(topics.column("messages"), 0)),
                     [("messages", "descending"), ("topic", "ascending")]).slice(0, 15)
    slow = found["slow_consumers"]
    gauge_rows = rows(sort_by(found["queue_gauges"], [("time", "ascending")]))
    span_minutes = 1 if first is None else max(1, math.ceil((last - first + 1) / 60_000_000))
    return {
        "first_event": None if first is None else format_time(first),
        "last_event": None if last is None else format_time(last),
        "quality": log.quality,
        "lines": sum(log.quality.values()),
        "events": sum(events_by_kind.values()),
        "events_by_kind": events_by_kind,
        "messages": sum(messages_by_protocol.values()),  # weighted by count, unlike events_by_kind
        "messages_by_protocol": messages_by_protocol,
        "top_topics": list(zip(topics.column("topic").to_pylist(), topics.column("messages").to_pylist())),
        "latency_by_protocol": rows(tables.percentiles(log.summaries["latency"], ["protocol", "kind"], "latency_us")),
        "top_publishers": rows(found["top_publishers"].slice(0, 10)),
        "top_subscribers": rows(found["top_subscribers"].slice(0, 10)),
        "dead_letters": sum(events_by_kind.get(kind, 0) for kind in schema.DEAD_LETTER_KINDS),
        "auth_failure_count": events_by_kind.get("auth_failure", 0),
        "auth_failures": rows(sort_by(found["auth_failures"], [("failures", "descending"), ("source", "ascending"),
                                                               ("protocol", "ascending")]).slice(0, 10)),
        "cross_protocol": rows(found["cross_protocol"]),
        "slow_consumer_episodes": len(slow),
        "slow_consumers": rows(sort_by(slow, [("time", "descending")]).slice(0, 20)),
        "delivery_latency": rows(sort_by(found["delivery_latency"], [("protocol", "ascending"),
                                                                     ("source", "ascending")])),
        "smqp_latency_split": rows(sort_by(found["smqp_latency_split"], [("kind", "ascending"),
                                                                         ("part", "descending")])),
        "queue_gauge_readings": len(gauge_rows),
        "queue_gauge_last": gauge_rows[-1] if gauge_rows else None,
        "tables": list(TABLES),
        "summarized_hours": len(log.summarized),
        "bucket_seconds": max(1, math.ceil(span_minutes / MAX_PLOT_POINTS)) * 60,
    }, gauge_rows


def _rates(traffic: Any, bucket_seconds: int) -> dict[str, list[tuple[datetime, float]]]:
    """Messages per second per protocol and bucket of ``bucket_seconds``, for the plot."""
    moving = traffic.filter(pc.greater(traffic.column("messages"), 0))
    bucket_us = bucket_seconds * 1_000_000
    rates = group(pa.table({  # ts > 0: integer division
        "bucket": pc.multiply(pc.divide(moving.column("minute").cast(pa.int64()), bucket_us), bucket_us),
        "protocol": moving.column("protocol"), "messages": moving.column("messages"),
    }), ["bucket", "protocol"], sums("messages"))
    series: dict[str, list[tuple[datetime, float]]] = {}
    for bucket, protocol, messages in zip(*[rates.column(c).to_pylist() for c in ("bucket", "protocol", "messages")]):
        series.setdefault(protocol, []).append((_datetime(bucket), messages / bucket_seconds))
    return series


def write_outputs(summary: dict[str, Any], series: dict[str, list[tuple[datetime, float]]],
                  gauge_rows: list[dict[str, Any]], out: str, html_dir: str | None) -> None:
    """Draw the plots, write report.html and summary.json (next to the tables when ``out`` is
    local, else in ``html_dir``) and set ``summary["html"]``."""
    delivery_rows, split_rows = summary["delivery_latency"], summary["smqp_latency_split"]
    plots = {name: html.png(figure) for name, figure in {
        "rate": html.rate_figure(series, summary["bucket_seconds"]),
        "latency": html.latency_figure(summary["latency_by_protocol"]),
        "topics": html.topics_figure(summary["top_topics"]),
        "delivery_latency": html.latency_figure([{**row, "kind": row["source"]} for row in delivery_rows],
                                                "Delivery latency percentiles, by receiving protocol"),
        "smqp_split": html.latency_figure([{**row, "protocol": row["kind"], "kind": row["part"]} for row in split_rows],
                                          "SMQP latency: queued while away vs. once online"),
        "queue": html.queue_figure(gauge_rows),
    }.items()}
    local = local_path(out)
    target = Path(local if local is not None else html_dir or ".")
    target.mkdir(parents=True, exist_ok=True)
    (target / HTML_NAME).write_text(html.render(summary, plots), "utf-8")
    summary["html"] = str(target / HTML_NAME)
    (target / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=_json_default) + "\n", "utf-8")


def _json_default(value: object) -> str:
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

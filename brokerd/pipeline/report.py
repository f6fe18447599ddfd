"""The report job: event log in, Parquet tables + HTML report + summary out.

Spark does the heavy part: the records are reduced once to the per-hour summaries
(brokerd.pipeline.summaries; read as stored for compacted hours), every table is derived from
them (brokerd.pipeline.tables.TABLES), and what the HTML and the text summary show is
collected from the written tables, which are small by construction (per minute, per top-N).
brokerd.pipeline.arrowreport is the same job with pyarrow in the driver (no JVM) for local
reports; both build summary.json and the HTML with :func:`make_summary` and
:func:`write_outputs`.
"""
from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from brokerd.events import schema
from brokerd.pipeline import gauges, html, summaries, tables
from brokerd.pipeline.read import OK, read_events
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


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def run_report(
    spark: Any,
    data_dir: str,
    out: str,
    *,
    since_us: int | None = None,
    until_us: int | None = None,
    top: int = 100,
    html_dir: str | None = None,
    progress: Progress | None = None,
    compact: bool = True,
    delete_json: bool = False,
    now_us: int | None = None,
) -> dict[str, Any]:
    """Run the whole job; return the summary (also written as summary.json).  First the
    closed hours not compacted yet are compacted (unless ``compact`` is false)."""
    from pyspark.sql import functions as F

    from brokerd.pipeline.compact import compact as compact_log

    progress = progress or Progress(spark, enabled=False)
    out = out.rstrip("/") or "/"
    compaction = None
    if compact:
        progress.step("compacting closed hours")
        compaction = compact_log(spark, data_dir, now_us=now_us, delete_json=delete_json, progress=progress)
    progress.step("reading the event log")
    log = read_events(spark, data_dir, since_us, until_us, summaries=True)
    progress.step(f"summarising {len(log.summarized)} hour(s) from stored summaries"
                  + (", the others from their records" if log.has_records else ""))
    merged = summaries.merge(spark, log.summarized, log.records if log.has_records else None)
    if log.has_records:  # the hours read as records: reduce them once, not once per table
        merged.frames = {name: merged.cached(f"summary:{name}", lambda _s, f=frame: f) for name, frame in merged.frames.items()}
    for name, table in tables.TABLES:
        progress.step(f"writing table {name}")
        table(merged, top).write.mode("overwrite").parquet(f"{out}/{name}")

    progress.step("summarising")
    totals = merged["kinds"].groupBy("kind").agg(
        F.sum("n").alias("n"), F.min("first_ts").alias("lo"), F.max("last_ts").alias("hi")
    ).collect()
    events_by_kind = {row["kind"]: int(row["n"]) for row in totals}
    first = min((row["lo"] for row in totals), default=None)
    last = max((row["hi"] for row in totals), default=None)
    traffic = spark.read.parquet(f"{out}/traffic")
    span_minutes = 1 if first is None else max(1, math.ceil((last - first + 1) / 60_000_000))
    bucket_minutes = max(1, math.ceil(span_minutes / MAX_PLOT_POINTS))
    bucket_seconds = bucket_minutes * 60
    bucket = F.timestamp_seconds(F.floor(F.unix_timestamp("minute") / bucket_seconds) * bucket_seconds)
    rate_rows = (
        traffic.filter(F.col("messages") > 0)
        .groupBy(bucket.alias("bucket"), "protocol")
        .agg(F.sum("messages").alias("messages"))
        .collect()
    )
    series: dict[str, list[tuple[datetime, float]]] = {}
    for row in rate_rows:
        series.setdefault(row["protocol"], []).append((row["bucket"], row["messages"] / bucket_seconds))
    messages_by_protocol = {
        row["protocol"]: int(row["m"])
        for row in traffic.groupBy("protocol").agg(F.sum("messages").alias("m")).collect()
        if row["m"]
    }
    top_topics = [
        (row["topic"], int(row["m"]))
        for row in traffic.filter(F.col("topic").isNotNull())
        .groupBy("topic").agg(F.sum("messages").alias("m"))
        .filter(F.col("m") > 0)
        .orderBy(F.col("m").desc(), "topic").limit(15).collect()
    ]
    latency_by_protocol = _rows(tables.latency(merged, keys=("protocol", "kind")))
    auth = _rows(spark.read.parquet(f"{out}/auth_failures").orderBy(F.col("failures").desc(), "source", "protocol").limit(10))

    slow = spark.read.parquet(f"{out}/slow_consumers")
    slow_count = slow.count()
    slow_rows = _rows(slow.orderBy(F.col("time").desc()).limit(20))

    delivery_rows = _rows(spark.read.parquet(f"{out}/delivery_latency").orderBy("protocol", "source"))
    split_rows = _rows(spark.read.parquet(f"{out}/smqp_latency_split").orderBy("kind", F.col("part").desc()))
    gauge_rows = _rows(spark.read.parquet(f"{out}/queue_gauges").orderBy("time"))
    summary = make_summary(
        data_dir=data_dir, path=log.path, found=log.found, out=out, since_us=since_us, until_us=until_us,
        first=first, last=last, quality=log.quality, events_by_kind=events_by_kind,
        messages_by_protocol=messages_by_protocol, top_topics=top_topics, latency_by_protocol=latency_by_protocol,
        top_publishers=_rows(spark.read.parquet(f"{out}/top_publishers").orderBy("rank").limit(10)),
        top_subscribers=_rows(spark.read.parquet(f"{out}/top_subscribers").orderBy("rank").limit(10)),
        auth=auth, cross_protocol=_rows(spark.read.parquet(f"{out}/cross_protocol").orderBy("publishing", "receiving")),
        slow_count=slow_count, slow_rows=slow_rows, delivery_rows=delivery_rows, split_rows=split_rows,
        gauge_rows=gauge_rows, summarized_hours=len(log.summarized), bucket_seconds=bucket_seconds,
        compaction=compaction,
    )
    merged.release()
    progress.step("drawing the HTML report")
    write_outputs(summary, series, gauge_rows, out, html_dir)
    return summary


def make_summary(
    *, data_dir: str, path: str, found: bool, out: str, since_us: int | None, until_us: int | None,
    first: int | None, last: int | None, quality: dict[str, int], events_by_kind: dict[str, int],
    messages_by_protocol: dict[str, int], top_topics: list[tuple[str, int]], latency_by_protocol: list[dict[str, Any]],
    top_publishers: list[dict[str, Any]], top_subscribers: list[dict[str, Any]], auth: list[dict[str, Any]],
    cross_protocol: list[dict[str, Any]], slow_count: int, slow_rows: list[dict[str, Any]],
    delivery_rows: list[dict[str, Any]], split_rows: list[dict[str, Any]], gauge_rows: list[dict[str, Any]],
    summarized_hours: int, bucket_seconds: int, compaction: Any,
) -> dict[str, Any]:
    """summary.json's content, from the figures either engine collected."""
    dead = sum(events_by_kind.get(kind, 0) for kind in schema.DEAD_LETTER_KINDS)
    return {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "data_dir": data_dir,
        "events_path": path,
        "log_found": found,
        "out": out,
        "since": None if since_us is None else format_time(since_us),
        "until": None if until_us is None else format_time(until_us),
        "first_event": None if first is None else format_time(first),
        "last_event": None if last is None else format_time(last),
        "quality": quality,
        "lines": sum(quality.values()),
        "events": sum(events_by_kind.values()),
        "events_by_kind": events_by_kind,
        "messages": sum(messages_by_protocol.values()),  # weighted by count, unlike events_by_kind
        "messages_by_protocol": messages_by_protocol,
        "top_topics": top_topics,
        "latency_by_protocol": latency_by_protocol,
        "top_publishers": top_publishers,
        "top_subscribers": top_subscribers,
        "dead_letters": dead,
        "auth_failure_count": events_by_kind.get("auth_failure", 0),
        "auth_failures": auth,
        "cross_protocol": cross_protocol,
        "slow_consumer_episodes": slow_count,
        "slow_consumers": slow_rows,
        "delivery_latency": delivery_rows,
        "smqp_latency_split": split_rows,
        "queue_gauge_readings": len(gauge_rows),
        "queue_gauge_last": gauge_rows[-1] if gauge_rows else None,
        "tables": list(TABLES),
        "summarized_hours": summarized_hours,
        "bucket_seconds": bucket_seconds,
        "compaction": None if compaction is None else {
            "compacted_now": len(compaction.compacted), "already": len(compaction.already),
            "open": len(compaction.open), "deleted_json_files": compaction.deleted_files,
        },
    }


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

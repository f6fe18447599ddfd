"""The report job on the Arrow engine: compaction, summaries, tables and HTML with pyarrow in
the driver, no JVM.

Profiled on 10 M events (docs/pipeline.md), a second report spent 30 of its 43 s in Spark's
fixed costs (the JVM start, the first query's warm-up, dozens of short jobs per table) on
about 1 M summary rows; the first report added a JVM start to a compaction already done by
pyarrow.  When everything is local (``local[*]`` master, local data dir and out) and every
input parses with pyarrow, this module produces the same tables (brokerd.pipeline.arrowtables),
summary.json and HTML as report.run_report, which stays the engine for clusters and for logs
with lines only Spark's reader can mark ``malformed`` (arrowjson.NotConvertible).
"""
from __future__ import annotations

import math
import os
import shutil
from datetime import datetime
from typing import Any

from brokerd.pipeline import arrowtables
from brokerd.pipeline.arrowbase import sort_by
from brokerd.pipeline.localfs import local_path
from brokerd.pipeline.report import MAX_PLOT_POINTS, make_summary, write_outputs

LOCAL_MASTER_PREFIX = "local"


def usable(master: str | None, data_dir: str, out: str) -> bool:
    """Whether the Arrow engine may run this report: a local master (``local``,
    ``local[*]``, ``local[N]``) or none, and local paths (whether the inputs parse is known
    only when they are read)."""
    import re

    local_master = master is None or re.fullmatch(r"local(\[(\*|[0-9]+)\])?", master) is not None
    return local_master and local_path(data_dir) is not None and local_path(out) is not None


def _datetime(us: int) -> datetime:
    """A timestamp as Spark's ``collect`` gives it (naive, the machine's local time)."""
    return datetime.fromtimestamp(us // 1_000_000).replace(microsecond=us % 1_000_000)


def rows(table: Any) -> list[dict[str, Any]]:
    """``table``'s rows as Spark's ``Row.asDict(recursive=True)`` gives them: timestamps as
    naive datetimes, maps as dicts, arrays as lists."""
    import pyarrow as pa

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
    """``table`` as ``directory`` (replaced), a Parquet directory as Spark writes one."""
    import pyarrow.parquet as pq

    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    pq.write_table(table, os.path.join(directory, "part-00000-arrow.parquet"))
    open(os.path.join(directory, "_SUCCESS"), "wb").close()


def run_report(
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
    """report.run_report's job with pyarrow: the same tables under ``out``, summary.json and
    report.html; returns the summary.  Raises arrowjson.NotConvertible (before writing any
    table) when an input needs Spark's reader, arrowread.TooLarge when the inputs take more
    than ``max_memory`` bytes (default arrowread.DEFAULT_MAX_MEMORY)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from brokerd.pipeline.arrowread import DEFAULT_MAX_MEMORY, read_summaries
    from brokerd.pipeline.compact import compact as compact_log

    step = progress.step if progress is not None else (lambda _name: None)
    out = out.rstrip("/") or "/"
    compaction = None
    if compact:
        step("compacting closed hours (pyarrow)")
        compaction = compact_log(None, data_dir, now_us=now_us, delete_json=delete_json, progress=progress)
    step("reading the stored summaries and the other hours' records (pyarrow)")
    log = read_summaries(data_dir, since_us, until_us, DEFAULT_MAX_MEMORY if max_memory is None else max_memory)
    s = log.summaries
    step(f"deriving the tables from {len(log.summarized)} hour(s) of stored summaries (pyarrow)")
    found = arrowtables.compute(s, top)
    step("writing the tables")
    target = local_path(out) or out
    for name, table in found.items():
        write_table(table, os.path.join(target, name))

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
    latency_by_protocol = rows(arrowtables.latency(s, keys=("protocol", "kind")))
    auth = rows(sort_by(found["auth_failures"], [("failures", "descending"), ("source", "ascending"),
                                                            ("protocol", "ascending")]).slice(0, 10))
    slow = found["slow_consumers"]
    slow_rows = rows(sort_by(slow, [("time", "descending")]).slice(0, 20))
    delivery_rows = rows(sort_by(found["delivery_latency"], [("protocol", "ascending"), ("source", "ascending")]))
    split_rows = rows(sort_by(found["smqp_latency_split"], [("kind", "ascending"), ("part", "descending")]))
    gauge_rows = rows(sort_by(found["queue_gauges"], [("time", "ascending")]))
    summary = make_summary(
        data_dir=data_dir, path=log.path, found=log.found, out=out, since_us=since_us, until_us=until_us,
        first=first, last=last, quality=log.quality, events_by_kind=events_by_kind,
        messages_by_protocol=messages_by_protocol, top_topics=top_topics, latency_by_protocol=latency_by_protocol,
        top_publishers=rows(found["top_publishers"].slice(0, 10)), top_subscribers=rows(found["top_subscribers"].slice(0, 10)),
        auth=auth, cross_protocol=rows(found["cross_protocol"]), slow_count=len(slow), slow_rows=slow_rows,
        delivery_rows=delivery_rows, split_rows=split_rows, gauge_rows=gauge_rows,
        summarized_hours=len(log.summarized), bucket_seconds=bucket_seconds, compaction=compaction,
    )
    step("drawing the HTML report")
    write_outputs(summary, series, gauge_rows, out, html_dir)
    return summary

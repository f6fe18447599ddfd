"""Incremental compaction: closed hours of the JSON event log converted once into Parquet.

Parsing JSON is most of a report's cost, and the broker never changes an hour once it has
ended, so each closed hour is parsed once and kept as Parquet under
``DATA_DIR/events-compacted/date=YYYY-MM-DD/hour=HH/`` (outside ``events/``, so the broker's
retention never touches it).  A compacted row has every field of ``brokerd.events.schema``
plus ``status`` (``ok``, ``malformed``, ...), so bad lines stay counted after the JSON is gone.

Crash safety: a run writes into ``events-compacted/_tmp-<id>/`` (Spark skips ``_`` names), puts
a marker file ``_compacted.json`` (the hour's line count per status and its JSON files) into
each finished hour there, and publishes the hour with
one directory rename.  An hour is compacted exactly when its directory (with the marker) is in
place; a run killed at any point leaves only a stale temporary directory, which the next run
deletes before compacting what is still missing.  Two compactions of one data dir must not run
at the same time (the report runs one before reading).

Two ways, the same result: with no Spark session (a local report) a local data dir is
compacted in this process, pyarrow parsing the JSON (brokerd.pipeline.arrowjson) and computing
the summaries (brokerd.pipeline.summaries), the files handled by brokerd.pipeline.localfs; an
hour pyarrow cannot parse raises arrowjson.NotConvertible (Spark's reader is needed for it).
With a Spark session, Spark parses (marking exactly the bad lines ``malformed``) and its
executors run the same summary function (brokerd.pipeline.sparkio), through Hadoop's
FileSystem, so cluster URIs work as local paths do.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from brokerd.events import schema
from brokerd.pipeline import sparkio
from brokerd.pipeline.arrowjson import NotConvertible, convert_hour
from brokerd.pipeline.localfs import LocalFS, local_path
from brokerd.pipeline.read import COMPACTED_DIR, MARKER, TMP_PREFIX, Hour, compacted_path, events_path, hour_start_us
from brokerd.pipeline.summaries import SUMMARY_DIR, SUMMARY_VERSION, schemas, summarize_table

__all__ = ["COMPACTED_DIR", "MARKER", "TMP_PREFIX", "Compaction", "compact", "file_system", "is_closed"]

CLOSE_GRACE_US = 120 * 1_000_000
"""An hour is closed this long after it ended: the broker's writer flushes every second, so
nothing arrives for an hour later than this."""
HOURS_PER_JOB = 24
"""Hours converted (one Spark job each) before they are published together: a long backlog
is published in steps."""


@dataclass
class Compaction:
    """What a run did: hours published now, hours already compacted, hours still open."""

    compacted: list[Hour] = field(default_factory=list)
    already: list[Hour] = field(default_factory=list)
    open: list[Hour] = field(default_factory=list)
    lines: int = 0
    deleted_files: int = 0


def is_closed(hour: Hour, now_us: int, grace_us: int = CLOSE_GRACE_US) -> bool:
    return hour_start_us(hour) + schema.HOUR_US + grace_us <= now_us


def now_micros() -> int:
    return time.time_ns() // 1000


def compact(
    spark: Any,
    data_dir: str,
    *,
    now_us: int | None = None,
    grace_us: int = CLOSE_GRACE_US,
    delete_json: bool = False,
    hours_per_job: int = HOURS_PER_JOB,
    progress: Any = None,
) -> Compaction:
    """Compact every closed hour of ``data_dir``'s log not compacted yet; with
    ``delete_json``, remove an hour's JSON files once its Parquet is published.  ``spark``
    None: pyarrow only (a local data dir; NotConvertible for an hour it cannot parse)."""
    now_us = now_micros() if now_us is None else now_us
    events, target = events_path(data_dir), compacted_path(data_dir)
    fs = file_system(spark, data_dir)
    result = Compaction()
    if not fs.exists(events):
        return result
    for stale in fs.glob(f"{target}/{TMP_PREFIX}*"):  # what a killed run left
        fs.delete(stale.getPath().toString())
    raw = fs.hours(events)
    done = fs.hours(target, MARKER)
    for hour in sorted(raw):
        if hour in done:
            result.already.append(hour)
        elif not is_closed(hour, now_us, grace_us):
            result.open.append(hour)
    todo = [hour for hour in sorted(raw) if hour not in done and is_closed(hour, now_us, grace_us)]
    for first in range(0, len(todo), max(1, hours_per_job)):
        batch = todo[first:first + max(1, hours_per_job)]
        if progress is not None:
            progress.step(f"compacting {len(batch)} hour(s) from {batch[0][0]} {batch[0][1]}:00")
        listings = {hour: fs.files(raw[hour], schema.FILE_SUFFIX) for hour in batch}
        tmp = f"{target}/{TMP_PREFIX}{uuid.uuid4().hex}"
        fs.mkdirs(tmp)
        statuses, stored = _convert(spark, fs, events, tmp, raw, [hour for hour in batch if listings[hour]])
        counts = {hour: sum(by_status.values()) for hour, by_status in statuses.items()}
        for hour in batch:
            staged = f"{tmp}/data/date={hour[0]}/hour={hour[1]}"
            fs.mkdirs(staged)
            fs.write_text(f"{staged}/{MARKER}", json.dumps({
                "date": hour[0], "hour": hour[1], "lines": counts.get(hour, 0), "statuses": statuses.get(hour, {}),
                "json_files": [{"name": name, "bytes": size} for name, size in listings[hour]],
                "compacted_at_us": now_micros(), "schema_version": schema.SCHEMA_VERSION,
                "summaries": {"version": SUMMARY_VERSION, "tables": sorted(stored[hour])} if hour in stored else None,
            }) + "\n")
            published = f"{target}/date={hour[0]}/hour={hour[1]}"
            if fs.exists(published):  # a directory without its marker: never published by us
                fs.delete(published)
            fs.mkdirs(f"{target}/date={hour[0]}")
            if not fs.rename(staged, published):
                raise OSError(f"could not publish {published}")
            result.compacted.append(hour)
            result.lines += counts.get(hour, 0)
            if delete_json:
                for name, _size in listings[hour]:
                    fs.delete(f"{raw[hour]}/{name}", False)
                    result.deleted_files += 1
        fs.delete(tmp)
    return result


def nothing_to_compact(data_dir: str, *, now_us: int | None = None,
                       grace_us: int = CLOSE_GRACE_US) -> Compaction | None:
    """For a local ``data_dir``: what :func:`compact` would report when it has nothing to do
    (no closed hour left to compact, no stale temporary directory), found without Spark;
    None when there is work, or for cluster storage (only Spark's FileSystem can tell)."""
    if local_path(data_dir) is None:
        return None
    now_us = now_micros() if now_us is None else now_us
    fs = LocalFS()
    events, target = events_path(data_dir), compacted_path(data_dir)
    result = Compaction()
    if not fs.exists(events):
        return result
    if fs.glob(f"{target}/{TMP_PREFIX}*"):
        return None
    done = fs.hours(target, MARKER)
    for hour in sorted(fs.hours(events)):
        if hour in done:
            result.already.append(hour)
        elif is_closed(hour, now_us, grace_us):
            return None
        else:
            result.open.append(hour)
    return result


def file_system(spark: Any, root: str) -> Any:
    """Hadoop's FileSystem for ``root`` through ``spark``, or the local one without Spark."""
    return LocalFS() if spark is None else sparkio.HadoopFS(spark, root)


def _convert(
    spark: Any, fs: Any, events: str, tmp: str, raw: dict[Hour, str], hours: list[Hour]
) -> tuple[dict[Hour, dict[str, int]], dict[Hour, set[str]]]:
    """Convert ``hours`` into ``tmp/data/date=/hour=`` and store their summaries in
    ``tmp/data/date=/hour=/_summary/<name>``: in this process with pyarrow (``spark`` None),
    else with Spark's reader and the summaries computed on its executors.

    Returns each hour's line count per status and, for the hours whose valid records all lie
    in the hour (the broker writes them so), the summaries that have rows in it: the
    subscription counts key their pieces by the records' own hour, so an hour holding another
    hour's records is summarised from its Parquet at report time instead."""
    statuses: dict[Hour, dict[str, int]] = {hour: {} for hour in hours}
    stored: dict[Hour, set[str]] = {}
    if not hours:
        return statuses, stored
    bounds: dict[Hour, tuple[int, int] | None] = {}
    if spark is None:
        local_tmp = local_path(tmp)
        if local_tmp is None or any(local_path(raw[hour]) is None for hour in hours):
            raise ValueError(f"{events}: compaction without Spark needs a local data dir")
        left = _convert_with_arrow(fs, raw, local_tmp, hours, statuses, bounds, stored)
        if left:
            raise NotConvertible("pyarrow cannot parse the JSON of " + ", ".join(f"{d} {h}:00" for d, h in left))
        return statuses, stored
    sparkio.convert_hours(spark, events, tmp, raw, hours, statuses, bounds)
    aligned = [hour for hour in hours if _aligned(hour, bounds.get(hour))]
    if aligned:
        stored.update(sparkio.store_summaries(spark, fs, f"{tmp}/data", f"{tmp}/summary", aligned))
    return statuses, stored


def _aligned(hour: Hour, bounds: tuple[int, int] | None) -> bool:
    """Whether every valid record of the hour's directory lies in the hour (it does unless
    the broker's clock jumped)."""
    start = hour_start_us(hour)
    return bounds is None or (start <= bounds[0] and bounds[1] < start + schema.HOUR_US)


def _convert_with_arrow(
    fs: Any, raw: dict[Hour, str], local_tmp: str, hours: list[Hour],
    statuses: dict[Hour, dict[str, int]], bounds: dict[Hour, tuple[int, int] | None], stored: dict[Hour, set[str]],
) -> list[Hour]:
    """Convert and summarise with pyarrow (brokerd.pipeline.arrowjson, .summaries) the
    hours whose every line parses, filling ``statuses``, ``bounds`` and ``stored``; returns
    the others."""
    import pyarrow.parquet as pq

    target_schemas = schemas()

    def one(hour: Hour) -> bool:
        """Convert and summarise one hour; False if pyarrow cannot parse it."""
        staged = os.path.join(local_tmp, "data", f"date={hour[0]}", f"hour={hour[1]}")
        os.makedirs(staged)
        try:
            statuses[hour], bounds[hour], valid = convert_hour(files[hour], os.path.join(staged, "part-00000-arrow.parquet"))
        except NotConvertible:
            shutil.rmtree(staged)
            return False
        if _aligned(hour, bounds[hour]):
            names = set()
            for name, table in summarize_table(valid).items():
                if len(table):
                    os.makedirs(os.path.join(staged, SUMMARY_DIR, name))
                    table = table.select(target_schemas[name].names).cast(target_schemas[name])
                    pq.write_table(table, os.path.join(staged, SUMMARY_DIR, name, "part-00000-arrow.parquet"))
                    names.add(name)
            stored[hour] = names
        return True

    files = {  # listed here: the threads below make no JVM calls
        hour: [os.path.join(local_path(raw[hour]) or "", name) for name, _size in fs.files(raw[hour], schema.FILE_SUFFIX)]
        for hour in hours
    }
    # pyarrow releases the GIL while it parses, aggregates and writes: an hour per core
    with ThreadPoolExecutor(max(1, min(len(hours), os.cpu_count() or 1))) as pool:
        done = list(pool.map(one, hours))
    left = [hour for hour, converted in zip(hours, done) if not converted]
    return left

"""Incremental compaction: closed hours of the JSON event log converted once into Parquet.

Parsing JSON is most of a report's cost, and the broker never changes an hour once it has
ended, so each closed hour is parsed once and kept as Parquet under
``DATA_DIR/events-compacted/date=YYYY-MM-DD/hour=HH/`` (outside ``events/``, so the broker's
retention never touches it).  A compacted row has every field of ``brokerd.events.schema``
plus ``status`` (``ok``, ``malformed``, ...), so bad lines stay counted after the JSON is gone.

Crash safety: a run writes into ``events-compacted/_tmp-<id>/`` (Spark skips ``_`` names), puts
a marker file ``_compacted.json`` (the hour's line count per status and its JSON files) into
each finished hour there, and publishes the hour with one directory rename.  An hour is
compacted exactly when its directory (with the marker) is in place; a run killed at any point
leaves only a stale temporary directory, which the next run deletes first.  Two compactions of
one data dir must not run at the same time (the report runs one before reading).

Two ways, the same result.  In this process (a local data dir), with no JVM: pyarrow parses
the JSON (brokerd.pipeline.arrowjson), this process computes the summaries
(brokerd.pipeline.summaries) and handles the files (brokerd.pipeline.localfs); an hour pyarrow
cannot parse is left as JSON, in :attr:`Compaction.unconvertible`.  With a Spark session
(cluster storage, ``--engine spark``, or what pyarrow left), Spark parses, marking exactly the
bad lines ``malformed``, and its executors run the same summary function
(brokerd.pipeline.sparkio), through Hadoop's FileSystem.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.pipeline import sparkio
from brokerd.pipeline.arrowjson import OK, NotConvertible, parse_files, status_counts, write_parquet
from brokerd.pipeline.localfs import LocalFS, local_path
from brokerd.pipeline.read import (
    COMPACTED_DIR, MARKER, TMP_PREFIX, Hour, WritableFileSystem, compacted_path, events_path, hour_start_us,
    list_hours,
)
from brokerd.pipeline.summaries import SUMMARY_DIR, SUMMARY_VERSION, summarize_table

__all__ = ["COMPACTED_DIR", "MARKER", "TMP_PREFIX", "Compaction", "compact", "is_closed"]

CLOSE_GRACE_US = 120 * 1_000_000
"""An hour is closed this long after it ended: the broker's writer flushes every second, so
nothing arrives for an hour later than this."""
HOURS_PER_JOB = 24
"""Hours converted (one Spark job, or a pool of threads) before they are published together:
a long backlog is published in steps."""

Converted = dict[Hour, tuple[dict[str, int], set[str] | None]]
"""Per hour converted: its line count per status and the summaries stored with it (None:
none, as the hour holds records of another hour)."""


@dataclass
class Compaction:
    """What a run did: hours published now, hours already compacted, hours still open, and
    hours pyarrow could not parse (left as JSON, for Spark)."""

    compacted: list[Hour] = field(default_factory=list)
    already: list[Hour] = field(default_factory=list)
    open: list[Hour] = field(default_factory=list)
    lines: int = 0
    deleted_files: int = 0
    unconvertible: list[Hour] = field(default_factory=list)


def is_closed(hour: Hour, now_us: int, grace_us: int = CLOSE_GRACE_US) -> bool:
    return hour_start_us(hour) + schema.HOUR_US + grace_us <= now_us


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
    None: in this process with pyarrow (a local data dir; ValueError for cluster storage),
    the hours it cannot parse left in ``unconvertible``.  With a Spark session, Spark
    compacts every hour not compacted yet (under ``--engine auto``: those pyarrow left)."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    if spark is None:
        if local_path(data_dir) is None:
            raise ValueError(f"{data_dir}: compaction without Spark needs a local data dir")
        fs: WritableFileSystem = LocalFS()
        data_dir = local_path(data_dir) or data_dir
    else:
        fs = sparkio.HadoopFS(spark, data_dir)
    events, target = events_path(data_dir), compacted_path(data_dir)
    result = Compaction()
    if not fs.exists(events):
        return result
    for stale in fs.glob(target, f"{TMP_PREFIX}*"):  # what a killed run left
        fs.delete(stale)
    raw = list_hours(fs, events)
    done = list_hours(fs, target, MARKER)
    for hour in sorted(raw):
        if hour in done:
            result.already.append(hour)
        elif not is_closed(hour, now_us, grace_us):
            result.open.append(hour)
    todo = [hour for hour in sorted(raw) if hour not in done and is_closed(hour, now_us, grace_us)]
    step = max(1, hours_per_job)
    for batch in (todo[first:first + step] for first in range(0, len(todo), step)):
        if progress is not None:
            progress.step(f"compacting {len(batch)} hour(s) from {batch[0][0]} {batch[0][1]}:00")
        listings = {hour: fs.files(raw[hour], schema.FILE_SUFFIX) for hour in batch}
        tmp = f"{target}/{TMP_PREFIX}{uuid.uuid4().hex}"
        fs.mkdirs(tmp)
        with_files = {hour: raw[hour] for hour in batch if listings[hour]}
        if spark is None:
            converted = _convert_with_arrow(tmp, {
                hour: [os.path.join(path, name) for name, _size in listings[hour]] for hour, path in with_files.items()})
        else:
            converted = _convert_with_spark(spark, fs, events, tmp, with_files)
        for hour in batch:
            if hour in with_files and hour not in converted:
                result.unconvertible.append(hour)
                continue
            statuses, stored = converted.get(hour, ({}, None))
            _publish(fs, tmp, target, hour, statuses, stored, listings[hour], now_us=time.time_ns() // 1000)
            result.compacted.append(hour)
            result.lines += sum(statuses.values())
            if delete_json:
                for name, _size in listings[hour]:
                    fs.delete(f"{raw[hour]}/{name}", False)
                    result.deleted_files += 1
        fs.delete(tmp)
    return result


def _publish(fs: WritableFileSystem, tmp: str, target: str, hour: Hour, statuses: dict[str, int],
             stored: set[str] | None, listing: list[tuple[str, int]], now_us: int) -> None:
    """Write the hour's marker into its staged directory and move it into place (one rename)."""
    staged = f"{tmp}/data/date={hour[0]}/hour={hour[1]}"
    fs.mkdirs(staged)
    fs.write_text(f"{staged}/{MARKER}", json.dumps({
        "date": hour[0], "hour": hour[1], "lines": sum(statuses.values()), "statuses": statuses,
        "json_files": [{"name": name, "bytes": size} for name, size in listing],
        "compacted_at_us": now_us, "schema_version": schema.SCHEMA_VERSION,
        "summaries": None if stored is None else {"version": SUMMARY_VERSION, "tables": sorted(stored)},
    }) + "\n")
    published = f"{target}/date={hour[0]}/hour={hour[1]}"
    if fs.exists(published):  # a directory without its marker: never published by us
        fs.delete(published)
    fs.mkdirs(f"{target}/date={hour[0]}")
    if not fs.rename(staged, published):
        raise OSError(f"could not publish {published}")


def _aligned(hour: Hour, bounds: tuple[int, int] | None) -> bool:
    """Whether every valid record of the hour's directory lies in the hour (it does unless
    the broker's clock jumped): only then are its summaries stored, as the subscription
    counts key their pieces by the records' own hour."""
    start = hour_start_us(hour)
    return bounds is None or (start <= bounds[0] and bounds[1] < start + schema.HOUR_US)


def _convert_with_spark(spark: Any, fs: WritableFileSystem, events: str, tmp: str, paths: dict[Hour, str]) -> Converted:
    """Spark's reader parses the hours (in one read); its executors store their summaries."""
    if not paths:
        return {}
    parsed = sparkio.convert_hours(spark, events, tmp, paths)
    aligned = [hour for hour, (_statuses, bounds) in parsed.items() if _aligned(hour, bounds)]
    stored = sparkio.store_summaries(spark, fs, f"{tmp}/data", f"{tmp}/summary", aligned) if aligned else {}
    return {hour: (statuses, stored.get(hour)) for hour, (statuses, _bounds) in parsed.items()}


def _convert_with_arrow(tmp: str, files: dict[Hour, list[str]]) -> Converted:
    """pyarrow parses each hour into ``tmp/data/date=/hour=`` and this process stores its
    summaries there; an hour it cannot parse is left out."""

    def one(hour: Hour) -> tuple[dict[str, int], set[str] | None] | None:
        try:
            table = parse_files(files[hour])
        except NotConvertible:
            return None
        staged = os.path.join(tmp, "data", f"date={hour[0]}", f"hour={hour[1]}")
        write_parquet(table, staged)
        counts = status_counts(table)
        valid = table.filter(pc.equal(table.column("status"), OK)).drop_columns(["status", "payload"])
        del table  # the payloads, most of an hour's bytes, freed before the summaries run
        bounds = pc.min_max(valid.column("ts")).as_py()
        if len(valid) and not _aligned(hour, (bounds["min"], bounds["max"])):
            return counts, None
        stored = set()
        for name, summary in summarize_table(valid).items():
            if len(summary):
                write_parquet(summary, os.path.join(staged, SUMMARY_DIR, name))
                stored.add(name)
        return counts, stored

    # pyarrow releases the GIL while it parses, aggregates and writes: an hour per core
    with ThreadPoolExecutor(max(1, min(len(files), os.cpu_count() or 1))) as pool:
        found = dict(zip(files, pool.map(one, files)))
    return {hour: converted for hour, converted in found.items() if converted is not None}

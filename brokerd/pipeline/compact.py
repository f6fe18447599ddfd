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

Everything goes through Hadoop's FileSystem, so cluster URIs work as local paths do; with no
Spark session (the Arrow engine, brokerd.pipeline.arrowreport) a local data dir is compacted
with pyarrow alone, through brokerd.pipeline.localfs, and an hour pyarrow cannot parse raises
arrowjson.NotConvertible (Spark's reader is needed for it).
"""
from __future__ import annotations

import calendar
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from brokerd.events import schema
from brokerd.pipeline.localfs import LocalFS, local_path
from brokerd.pipeline.summaries import SUMMARY_DIR, SUMMARY_VERSION, summarize

COMPACTED_DIR = "events-compacted"
MARKER = "_compacted.json"
TMP_PREFIX = "_tmp-"
CLOSE_GRACE_US = 120 * 1_000_000
"""An hour is closed this long after it ended: the broker's writer flushes every second, so
nothing arrives for an hour later than this."""
HOURS_PER_JOB = 24
"""Hours converted (one Spark job each) before they are published together: a long backlog
is published in steps."""

Hour = tuple[str, str]


@dataclass
class Compaction:
    """What a run did: hours published now, hours already compacted, hours still open."""

    compacted: list[Hour] = field(default_factory=list)
    already: list[Hour] = field(default_factory=list)
    open: list[Hour] = field(default_factory=list)
    lines: int = 0
    deleted_files: int = 0


class HadoopFS:
    """The few FileSystem calls compaction and reading need, on ``spark``'s Hadoop config."""

    def __init__(self, spark: Any, root: str) -> None:
        self._jvm = spark.sparkContext._jvm
        self.fs = self.path(root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(name)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def glob(self, pattern: str) -> list[Any]:
        found = self.fs.globStatus(self.path(pattern))
        return [] if found is None else list(found)

    def hours(self, base: str, marker: str | None = None) -> dict[Hour, str]:
        """``date=/hour=`` directories under ``base`` (with ``marker`` in them, if given)."""
        result: dict[Hour, str] = {}
        for status in self.glob(f"{base}/date=*/hour=*"):
            if not status.isDirectory():
                continue
            path = status.getPath()
            hour = path.getName().partition("=")[2]
            date = path.getParent().getName().partition("=")[2]
            location = f"{base}/date={date}/hour={hour}"
            if marker is None or self.exists(f"{location}/{marker}"):
                result[(date, hour)] = location
        return result

    def files(self, directory: str, suffix: str) -> list[tuple[str, int]]:
        return sorted(
            (status.getPath().getName(), int(status.getLen()))
            for status in self.glob(f"{directory}/*{suffix}")
            if status.isFile()
        )

    def read_text(self, name: str) -> str:
        stream = self.fs.open(self.path(name))
        try:
            reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
            lines = []
            line = reader.readLine()
            while line is not None:
                lines.append(line)
                line = reader.readLine()
            return "\n".join(lines)
        finally:
            stream.close()

    def write_text(self, name: str, text: str) -> None:
        stream = self.fs.create(self.path(name), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def mkdirs(self, name: str) -> None:
        self.fs.mkdirs(self.path(name))

    def rename(self, source: str, target: str) -> bool:
        return bool(self.fs.rename(self.path(source), self.path(target)))

    def delete(self, name: str, recursive: bool = True) -> None:
        self.fs.delete(self.path(name), recursive)


def compacted_path(data_dir: str) -> str:
    return data_dir.rstrip("/") + "/" + COMPACTED_DIR


def hour_start_us(hour: Hour) -> int:
    date, hh = hour
    return calendar.timegm(time.strptime(f"{date} {hh}", "%Y-%m-%d %H")) * 1_000_000


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
    from brokerd.pipeline.read import events_path

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
    from brokerd.pipeline.read import events_path

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


_local = local_path


def file_system(spark: Any, root: str) -> Any:
    """Hadoop's FileSystem for ``root`` through ``spark``, or the local one without Spark."""
    return LocalFS() if spark is None else HadoopFS(spark, root)


def _convert(
    spark: Any, fs: Any, events: str, tmp: str, raw: dict[Hour, str], hours: list[Hour]
) -> tuple[dict[Hour, dict[str, int]], dict[Hour, set[str]]]:
    """Convert ``hours`` into ``tmp/data/date=/hour=``: with pyarrow's JSON reader where the
    log is local and every line of the hour parses (brokerd.pipeline.arrowjson), else with
    Spark's; then compute every hour's summaries (one Spark job per summary for the whole
    batch) into ``tmp/data/date=/hour=/_summary/<name>``.

    Returns each hour's line count per status and, for the hours whose valid records all lie
    in the hour (the broker writes them so), the summaries that have rows in it: the
    subscription counts key their pieces by the records' own hour, so an hour holding another
    hour's records is summarised from its Parquet at report time instead."""
    statuses: dict[Hour, dict[str, int]] = {hour: {} for hour in hours}
    stored: dict[Hour, set[str]] = {}
    if not hours:
        return statuses, stored
    bounds: dict[Hour, tuple[int, int] | None] = {}
    by_spark = list(hours)
    local_tmp = _local(tmp)
    if local_tmp is not None and all(_local(raw[hour]) is not None for hour in hours):
        by_spark = _convert_with_arrow(fs, raw, local_tmp, hours, statuses, bounds, stored)
    if by_spark and spark is None:
        from brokerd.pipeline.arrowjson import NotConvertible

        raise NotConvertible("pyarrow cannot parse the JSON of " + ", ".join(f"{d} {h}:00" for d, h in by_spark))
    if by_spark:
        _convert_with_spark(spark, events, tmp, raw, by_spark, statuses, bounds)
    aligned = {hour for hour in by_spark if _aligned(hour, bounds.get(hour))}
    if not aligned:
        return statuses, stored
    from pyspark.sql import functions as F

    from brokerd.pipeline.read import OK, compacted_struct

    data = f"{tmp}/data"
    rows = spark.read.schema(compacted_struct()).option("basePath", data).parquet(
        *[f"{data}/date={hour[0]}/hour={hour[1]}" for hour in sorted(aligned)]
    )
    valid = rows.filter(F.col("status") == OK).drop("status", "payload")
    for name, frame in summarize(valid, ("date", "hour")).items():
        written = f"{tmp}/summary/{name}"
        frame.write.partitionBy("date", "hour").parquet(written)
        for hour in sorted(aligned):
            stored.setdefault(hour, set())
            part = f"{written}/date={hour[0]}/hour={hour[1]}"
            if fs.exists(part):
                target = f"{data}/date={hour[0]}/hour={hour[1]}/{SUMMARY_DIR}"
                fs.mkdirs(target)
                if not fs.rename(part, f"{target}/{name}"):
                    raise OSError(f"could not move {part}")
                stored[hour].add(name)
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
    """Convert and summarise with pyarrow (brokerd.pipeline.arrowjson, .arrowsummaries) the
    hours whose every line parses, filling ``statuses``, ``bounds`` and ``stored``; returns
    the others."""
    import os
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from brokerd.pipeline.arrowjson import NotConvertible, convert_hour
    from brokerd.pipeline.arrowsummaries import schemas as summary_schemas
    from brokerd.pipeline.arrowsummaries import summarize_table

    schemas = summary_schemas()

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
                    table = table.select(schemas[name].names).cast(schemas[name])
                    pq.write_table(table, os.path.join(staged, SUMMARY_DIR, name, "part-00000-arrow.parquet"))
                    names.add(name)
            stored[hour] = names
        return True

    files = {  # listed here: the threads below make no JVM calls
        hour: [os.path.join(_local(raw[hour]) or "", name) for name, _size in fs.files(raw[hour], schema.FILE_SUFFIX)]
        for hour in hours
    }
    # pyarrow releases the GIL while it parses, aggregates and writes: an hour per core
    with ThreadPoolExecutor(max(1, min(len(hours), os.cpu_count() or 1))) as pool:
        done = list(pool.map(one, hours))
    left = [hour for hour, converted in zip(hours, done) if not converted]
    return left


def _convert_with_spark(
    spark: Any, events: str, tmp: str, raw: dict[Hour, str], hours: list[Hour],
    statuses: dict[Hour, dict[str, int]], bounds: dict[Hour, tuple[int, int] | None],
) -> None:
    """Parse the JSON of ``hours`` once (all in one read, so both cores work even on small
    hours), keep the rows in memory and write each hour's Parquet (one write per hour: its
    rows need no sort by partition, as partitionBy would do)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from brokerd.pipeline.read import OK, json_reader, with_status

    parsed = with_status(json_reader(spark, events).json([raw[hour] for hour in hours])).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counted = parsed.groupBy("date", "hour", "status").agg(
            F.count(F.lit(1)).alias("count"), F.min("ts").alias("lo"), F.max("ts").alias("hi")
        )
        for row in counted.collect():
            hour = (row["date"], row["hour"])
            statuses[hour][row["status"]] = int(row["count"])
            if row["status"] == OK:
                bounds[hour] = (row["lo"], row["hi"])
        for hour in hours:
            staged = f"{tmp}/data/date={hour[0]}/hour={hour[1]}"
            parsed.filter((F.col("date") == hour[0]) & (F.col("hour") == hour[1])).drop("date", "hour").write.parquet(staged)
    finally:
        parsed.unpersist()

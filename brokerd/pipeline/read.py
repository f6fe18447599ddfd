"""Reading the event log into a DataFrame of valid records, counting the bad lines.

The log is read with Spark's JSON reader against the schema in ``brokerd.events.schema``
(no inference: a field of the wrong type makes the line malformed instead of changing the
table).  Hours already compacted (brokerd.pipeline.compact) are read from their Parquet
instead, which holds the same rows with their status.  ``date=``/``hour=`` directories are
listed first, so ``--since``/``--until`` prune whole hours before any file is opened; the
exact bounds then apply to ``ts``.

Every line ends up in exactly one status: ``ok``; ``malformed`` (not JSON, cut short by a
crash, or a field of the wrong type); ``unsupported_version``; ``invalid`` (a required field
missing or an unknown kind).  Only ``ok`` records within the bounds reach the tables.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import reduce
from operator import or_
from typing import Any

from brokerd.events import schema

CORRUPT = "_corrupt"
OK = "ok"
STATUSES = (OK, schema.MALFORMED, schema.UNSUPPORTED_VERSION, schema.INVALID)
_SPARK_TYPES = {"int": "IntegerType", "long": "LongType", "string": "StringType"}


def event_struct() -> Any:
    """The Spark schema of one record (every version-1 field) plus the corrupt-line column."""
    from pyspark.sql import types

    fields = [
        types.StructField(name, getattr(types, _SPARK_TYPES[kind])(), True) for name, kind in schema.FIELDS
    ]
    fields.append(types.StructField(CORRUPT, types.StringType(), True))
    return types.StructType(fields)


@dataclass
class EventLog:
    """What was read: ``records`` (valid, in bounds, with a ``time`` timestamp column) and
    the count of lines of each status in the partitions read."""

    records: Any
    quality: dict[str, int] = field(default_factory=dict)
    path: str = ""
    found: bool = True
    summarized: dict[str, list[str]] = field(default_factory=dict)
    """Compacted hours wholly inside the window whose stored summaries stand in for their
    records (not in ``records``): hour directory -> the summaries stored there."""
    has_records: bool = True
    """False when every hour read is in ``summarized`` (``records`` is then empty)."""

    @property
    def bad_lines(self) -> int:
        return sum(count for status, count in self.quality.items() if status != OK)


def events_path(data_dir: str) -> str:
    return data_dir.rstrip("/") + "/" + schema.EVENTS_DIR


def hour_in_window(hour: tuple[str, str], since_us: int | None, until_us: int | None) -> bool:
    """Whether the hour overlaps [since, until): hours outside are never opened."""
    if since_us is not None and hour < schema.partition_of(since_us):
        return False
    if until_us is not None and hour > schema.partition_of(until_us - 1):
        return False
    return True


def json_reader(spark: Any, base_path: str) -> Any:
    """Spark's JSON reader for log files under ``base_path``: the schema given (no inference),
    bad lines kept in the corrupt column, only ``*.jsonl`` files."""
    return (
        spark.read.schema(event_struct())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("pathGlobFilter", "*" + schema.FILE_SUFFIX)
        .option("basePath", base_path)
    )


def with_status(raw: Any) -> Any:
    """Every schema field (payload too), ``status``, ``date`` and ``hour`` of each line read."""
    from pyspark.sql import functions as F

    kinds = sorted(schema.KINDS)
    status = (
        F.when(F.col(CORRUPT).isNotNull(), F.lit(schema.MALFORMED))
        .when(F.col("v").isNull() | ~F.col("v").isin(sorted(schema.SUPPORTED_VERSIONS)), F.lit(schema.UNSUPPORTED_VERSION))
        .when(
            reduce(or_, [F.col(name).isNull() for name in schema.REQUIRED if name != "v"]) | ~F.col("kind").isin(kinds),
            F.lit(schema.INVALID),
        )
        .otherwise(F.lit(OK))
    )
    return raw.select(*schema.FIELD_NAMES, status.alias("status"), "date", "hour")


def compacted_struct() -> Any:
    """The Parquet schema of compacted hours (``with_status``'s columns)."""
    from pyspark.sql import types

    struct = event_struct()
    fields = [f for f in struct.fields if f.name != CORRUPT]
    fields += [types.StructField(name, types.StringType(), True) for name in ("status", "date", "hour")]
    return types.StructType(fields)


def empty_records(spark: Any) -> Any:
    from pyspark.sql import functions as F

    struct = event_struct()
    frame = spark.createDataFrame([], struct).drop(CORRUPT, "payload")
    return frame.withColumn("time", F.timestamp_micros(F.col("ts")))


def hour_inside(hour: tuple[str, str], since_us: int | None, until_us: int | None) -> bool:
    """Whether the whole hour is in [since, until): only then its stored summaries apply."""
    from brokerd.pipeline.compact import hour_start_us

    start = hour_start_us(hour)
    return (since_us is None or since_us <= start) and (until_us is None or start + schema.HOUR_US <= until_us)


@dataclass
class HourPlan:
    """Which hours of a log a report reads, and how (both engines plan the same way)."""

    path: str
    """The JSON log's directory."""
    compacted: str
    """The compacted log's directory."""
    found: bool
    parquet_hours: dict[tuple[str, str], str]
    """Compacted hours in the window -> their directory."""
    json_hours: dict[tuple[str, str], str]
    """Hours in the window not compacted (open, or not yet compacted) -> their directory."""
    counts: dict[str, int]
    """Line statuses of the compacted hours, from their markers (no scan)."""
    summarized: dict[str, list[str]]
    """Compacted hours wholly in the window with stored summaries of this version -> the
    summaries their marker lists (these hours are not read as records)."""


def plan_hours(fs: Any, data_dir: str, since_us: int | None, until_us: int | None, *,
               summaries: bool = True) -> HourPlan:
    """The :class:`HourPlan` of ``data_dir`` for [since, until), from the directory listing
    and the compacted hours' markers; ``fs`` is compact.HadoopFS or localfs.LocalFS."""
    from brokerd.pipeline.compact import MARKER, compacted_path
    from brokerd.pipeline.summaries import SUMMARY_VERSION

    path, compacted = events_path(data_dir), compacted_path(data_dir)
    found = fs.exists(path) or fs.exists(compacted)
    parquet_hours = {h: p for h, p in fs.hours(compacted, MARKER).items() if hour_in_window(h, since_us, until_us)}
    json_hours = {
        h: p for h, p in fs.hours(path).items() if h not in parquet_hours and hour_in_window(h, since_us, until_us)
    }
    counts: dict[str, int] = {}
    summarized: dict[str, list[str]] = {}
    for hour, location in sorted(parquet_hours.items()):
        marker = json.loads(fs.read_text(f"{location}/{MARKER}"))
        for status_name, n in marker.get("statuses", {}).items():
            counts[status_name] = counts.get(status_name, 0) + int(n)
        stored = marker.get("summaries") or {}
        if summaries and stored.get("version") == SUMMARY_VERSION and hour_inside(hour, since_us, until_us):
            summarized[location] = list(stored.get("tables", []))
    return HourPlan(path, compacted, found, parquet_hours, json_hours, counts, summarized)


def read_events(
    spark: Any, data_dir: str, since_us: int | None = None, until_us: int | None = None, *, summaries: bool = False
) -> EventLog:
    """Read ``data_dir``'s event log: Parquet for compacted hours, JSON for the others;
    never raises for bad or missing data (an absent or empty log is an empty EventLog).
    With ``summaries``, compacted hours wholly in the window whose marker lists summaries of
    this version are left out of ``records`` and listed in ``summarized`` instead."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from brokerd.pipeline.compact import HadoopFS

    fs = HadoopFS(spark, data_dir)
    plan = plan_hours(fs, data_dir, since_us, until_us, summaries=summaries)
    path, compacted, found = plan.path, plan.compacted, plan.found
    counts, summarized = plan.counts, plan.summarized
    json_paths = [p for h, p in sorted(plan.json_hours.items()) if fs.files(p, schema.FILE_SUFFIX)]
    # compacted hours: the statuses counted when they were compacted (no scan); open hours:
    # counted here, from the persisted JSON rows (a few hours at most)
    parquet_paths = [p for _h, p in sorted(plan.parquet_hours.items()) if p not in summarized]
    parts = []
    if parquet_paths:
        parts.append(spark.read.schema(compacted_struct()).option("basePath", compacted).parquet(*parquet_paths))
    if json_paths:
        parts.append(with_status(json_reader(spark, path).json(json_paths)))
    if not parts:
        quality = {status_name: int(counts.get(status_name, 0)) for status_name in STATUSES}
        return EventLog(empty_records(spark), quality, path, found=found, summarized=summarized, has_records=False)
    columns = [name for name in schema.FIELD_NAMES if name != "payload"]
    selected = [part.select(*columns, "status") for part in parts]
    if json_paths:
        selected[-1] = selected[-1].persist(StorageLevel.MEMORY_AND_DISK)
        for row in selected[-1].groupBy("status").count().collect():
            counts[row["status"]] = counts.get(row["status"], 0) + int(row["count"])
    quality = {status_name: int(counts.get(status_name, 0)) for status_name in STATUSES}
    raw = reduce(lambda a, b: a.unionByName(b), selected)
    records = raw.filter(F.col("status") == OK).drop("status")
    if since_us is not None:
        records = records.filter(F.col("ts") >= since_us)
    if until_us is not None:
        records = records.filter(F.col("ts") < until_us)
    records = records.withColumn("time", F.timestamp_micros(F.col("ts")))
    return EventLog(records, quality, path, found=found, summarized=summarized)

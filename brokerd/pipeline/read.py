"""Where a report's records come from: the log's directory layout, the line statuses, and
which hours a report reads as stored summaries, as compacted rows or as JSON.

The log is ``DATA_DIR/events/date=YYYY-MM-DD/hour=HH/*.jsonl``; compaction
(brokerd.pipeline.compact) converts closed hours into Parquet under
``DATA_DIR/events-compacted/``, each published hour holding the marker :data:`MARKER` (its
line count per status, its summaries).  ``date=``/``hour=`` directories are listed first, so
``--since``/``--until`` prune whole hours before any file is opened; the exact bounds then
apply to ``ts``.

Every line ends up in exactly one status: ``ok``; ``malformed`` (not JSON, cut short by a
crash, or a field of the wrong type); ``unsupported_version``; ``invalid`` (a required field
missing or an unknown kind).  Only ``ok`` records within the bounds reach the tables.

Both ways of reading plan the same way (:func:`plan_hours`) and give a :class:`Log`: pyarrow
in the report's process (:func:`read_summaries`, for a local log, with no JVM) and Spark
(brokerd.pipeline.sparkio.read_log): stored summaries for the compacted hours wholly inside
the window, and the other hours' records summarised per hour of ``ts`` by the same function.
"""
from __future__ import annotations

import calendar
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.pipeline.arrowjson import parse_files, read_parquet, status_counts
from brokerd.pipeline.localfs import COMPACTED_DIR, LocalFS, local_path
from brokerd.pipeline.summaries import (
    NAMES, RECORD_COLUMNS, SUMMARY_DIR, SUMMARY_VERSION, merge, record_schema, schemas, summarize_table,
)

OK = "ok"
STATUSES = (OK, schema.MALFORMED, schema.UNSUPPORTED_VERSION, schema.INVALID)
MARKER = "_compacted.json"
TMP_PREFIX = "_tmp-"

Hour = tuple[str, str]


class FileSystem(Protocol):
    """What listing and planning need of a filesystem: localfs.LocalFS or sparkio.HadoopFS."""

    def exists(self, name: str) -> bool: ...

    def glob(self, base: str, pattern: str, directories: bool = False) -> list[str]: ...

    def read_text(self, name: str) -> str: ...


class WritableFileSystem(FileSystem, Protocol):
    """What compaction also needs of a filesystem: localfs.LocalFS or sparkio.HadoopFS."""

    def files(self, directory: str, suffix: str) -> list[tuple[str, int]]: ...

    def write_text(self, name: str, text: str) -> None: ...

    def mkdirs(self, name: str) -> None: ...

    def rename(self, source: str, target: str) -> bool: ...

    def delete(self, name: str, recursive: bool = True) -> None: ...


def list_hours(fs: FileSystem, base: str, marker: str | None = None) -> dict[Hour, str]:
    """``date=/hour=`` directories under ``base`` (with ``marker`` in them, if given)."""
    result: dict[Hour, str] = {}
    for path in fs.glob(base, "date=*/hour=*", directories=True):
        date, hour = (part.partition("=")[2] for part in path.rstrip("/").split("/")[-2:])
        location = f"{base}/date={date}/hour={hour}"
        if marker is None or fs.exists(f"{location}/{marker}"):
            result[(date, hour)] = location
    return result


@dataclass
class Log:
    """What a report read: the merged summaries (name -> Arrow table, several rows per key:
    re-aggregate) and the count of lines of each status in the hours read."""

    summaries: dict[str, Any]
    quality: dict[str, int] = field(default_factory=dict)
    path: str = ""
    found: bool = True
    summarized: dict[str, list[str]] = field(default_factory=dict)
    """Compacted hours wholly inside the window whose stored summaries were read: hour
    directory -> the summaries stored there."""


def events_path(data_dir: str) -> str:
    return data_dir.rstrip("/") + "/" + schema.EVENTS_DIR


def compacted_path(data_dir: str) -> str:
    return data_dir.rstrip("/") + "/" + COMPACTED_DIR


def hour_start_us(hour: Hour) -> int:
    date, hh = hour
    return calendar.timegm(time.strptime(f"{date} {hh}", "%Y-%m-%d %H")) * 1_000_000


def hour_in_window(hour: Hour, since_us: int | None, until_us: int | None) -> bool:
    """Whether the hour overlaps [since, until): hours outside are never opened."""
    if since_us is not None and hour < schema.partition_of(since_us):
        return False
    if until_us is not None and hour > schema.partition_of(until_us - 1):
        return False
    return True


def hour_inside(hour: Hour, since_us: int | None, until_us: int | None) -> bool:
    """Whether the whole hour is in [since, until): only then its stored summaries apply."""
    start = hour_start_us(hour)
    return (since_us is None or since_us <= start) and (until_us is None or start + schema.HOUR_US <= until_us)


@dataclass
class HourPlan:
    """Which hours of a log a report reads, and how."""

    path: str
    """The JSON log's directory."""
    compacted: str
    """The compacted log's directory."""
    found: bool
    parquet_hours: dict[Hour, str]
    """Compacted hours in the window -> their directory."""
    json_hours: dict[Hour, str]
    """Hours in the window not compacted (open, or not yet compacted) -> their directory."""
    counts: dict[str, int]
    """Line statuses of the compacted hours, from their markers (no scan)."""
    summarized: dict[str, list[str]]
    """Compacted hours wholly in the window with stored summaries of this version -> the
    summaries their marker lists (these hours are not read as records)."""

    def record_hours(self) -> list[str]:
        """The compacted hours read as rows: those without usable stored summaries."""
        return [p for _h, p in sorted(self.parquet_hours.items()) if p not in self.summarized]

    def quality(self) -> dict[str, int]:
        return {status_name: int(self.counts.get(status_name, 0)) for status_name in STATUSES}


def plan_hours(fs: FileSystem, data_dir: str, since_us: int | None, until_us: int | None) -> HourPlan:
    """The :class:`HourPlan` of ``data_dir`` for [since, until), from the directory listing
    and the compacted hours' markers."""
    path, compacted = events_path(data_dir), compacted_path(data_dir)
    found = fs.exists(path) or fs.exists(compacted)
    parquet_hours = {h: p for h, p in list_hours(fs, compacted, MARKER).items() if hour_in_window(h, since_us, until_us)}
    json_hours = {
        h: p for h, p in list_hours(fs, path).items() if h not in parquet_hours and hour_in_window(h, since_us, until_us)
    }
    counts: dict[str, int] = {}
    summarized: dict[str, list[str]] = {}
    for hour, location in sorted(parquet_hours.items()):
        marker = json.loads(fs.read_text(f"{location}/{MARKER}"))
        for status_name, n in marker.get("statuses", {}).items():
            counts[status_name] = counts.get(status_name, 0) + int(n)
        stored = marker.get("summaries") or {}
        if stored.get("version") == SUMMARY_VERSION and hour_inside(hour, since_us, until_us):
            summarized[location] = list(stored.get("tables", []))
    return HourPlan(path, compacted, found, parquet_hours, json_hours, counts, summarized)


DEFAULT_MAX_MEMORY = 2 << 30
"""Bytes of Arrow memory the engine may hold while reading (``--arrow-max-memory``)."""


class TooLarge(Exception):
    """The summaries and records a report would hold in this process exceed its bound: the
    report needs Spark, which spills to disk."""


def _check_memory(limit: int | None) -> None:
    """Raise TooLarge once the Arrow memory in use passes ``limit`` (checked after each
    file read, so the overshoot is at most one file's table)."""
    if limit is not None and pa.total_allocated_bytes() > limit:
        raise TooLarge(f"the log's summaries and open hours take more than --arrow-max-memory "
                       f"({limit:,} bytes) in memory")


def _summarize_by_hour(records: Any) -> dict[str, list[Any]]:
    """The summaries of ``records``, each hour of ``ts`` on its own (the subscription
    summaries count the messages of an endpoint's own hour only)."""
    found: dict[str, list[Any]] = {}
    if not len(records):
        return found
    hour = pc.divide(records.column("ts"), schema.HOUR_US)
    for index in np.unique(hour.to_numpy()).tolist():
        part = records.filter(pc.equal(hour, index))
        for name, table in summarize_table(part).items():
            found.setdefault(name, []).append(table)
    return found


def read_stored(plan: HourPlan, max_memory: int | None = None) -> dict[str, list[Any]]:
    """The stored summaries ``plan`` reads, by name, read here (a log on a local filesystem)."""
    stored: dict[str, list[Any]] = {name: [] for name in NAMES}
    for location, names in sorted(plan.summarized.items()):
        for name in names:
            for table in read_parquet(os.path.join(local_path(location) or location, SUMMARY_DIR, name),
                                      schemas()[name].names):
                stored[name].append(table)
                _check_memory(max_memory)
    return stored


def read_summaries(data_dir: str, since_us: int | None = None, until_us: int | None = None,
                   max_memory: int | None = DEFAULT_MAX_MEMORY) -> Log:
    """The merged summaries of ``data_dir``'s log in [since, until) (a local data dir).
    Raises arrowjson.NotConvertible when an open hour has a line pyarrow cannot parse, and
    TooLarge when what it reads takes more than ``max_memory`` bytes (None: no bound)."""
    local = local_path(data_dir)
    if local is None:
        raise ValueError(f"{data_dir}: the Arrow engine reads local data dirs only")
    fs = LocalFS()
    plan = plan_hours(fs, local, since_us, until_us)
    columns = [*RECORD_COLUMNS, "status"]
    parts = []
    for location in plan.record_hours():
        for table in read_parquet(location, columns):
            parts.append(table)
            _check_memory(max_memory)
    for _hour, location in sorted(plan.json_hours.items()):
        files = [os.path.join(location, name) for name, _size in fs.files(location, schema.FILE_SUFFIX)]
        if files:
            parts.append(parse_files(files).select(columns))
            for status, n in status_counts(parts[-1]).items():
                plan.counts[status] = plan.counts.get(status, 0) + n
            _check_memory(max_memory)
    merged = read_stored(plan, max_memory)
    if parts:
        with_status = pa.schema([*record_schema(), pa.field("status", pa.string())])
        records = pa.concat_tables([part.select(with_status.names).cast(with_status) for part in parts])
        keep = pc.equal(records.column("status"), OK)
        if since_us is not None:
            keep = pc.and_(keep, pc.greater_equal(records.column("ts"), since_us))
        if until_us is not None:
            keep = pc.and_(keep, pc.less(records.column("ts"), until_us))
        for name, tables in _summarize_by_hour(records.filter(keep).drop_columns(["status"])).items():
            merged[name] += tables
    return Log(merge(merged), plan.quality(), plan.path, found=plan.found, summarized=plan.summarized)

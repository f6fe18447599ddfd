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
in the report's process (brokerd.pipeline.arrowread) and Spark (brokerd.pipeline.sparkio).
"""
from __future__ import annotations

import calendar
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from brokerd.events import schema
from brokerd.pipeline.summaries import SUMMARY_VERSION

OK = "ok"
STATUSES = (OK, schema.MALFORMED, schema.UNSUPPORTED_VERSION, schema.INVALID)
COMPACTED_DIR = "events-compacted"
MARKER = "_compacted.json"
TMP_PREFIX = "_tmp-"

Hour = tuple[str, str]


class FileSystem(Protocol):
    """What planning needs of a filesystem: localfs.LocalFS or sparkio.HadoopFS."""

    def exists(self, name: str) -> bool: ...

    def hours(self, base: str, marker: str | None = None) -> dict[Hour, str]: ...

    def read_text(self, name: str) -> str: ...


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

    @property
    def bad_lines(self) -> int:
        return sum(count for status, count in self.quality.items() if status != OK)


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
        if stored.get("version") == SUMMARY_VERSION and hour_inside(hour, since_us, until_us):
            summarized[location] = list(stored.get("tables", []))
    return HourPlan(path, compacted, found, parquet_hours, json_hours, counts, summarized)

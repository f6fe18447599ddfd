"""The Arrow engine's reading: a local event log into merged summaries, with no JVM.

What brokerd.pipeline.read.read_events and summaries.merge do with Spark, done with pyarrow:
compacted hours wholly inside the window contribute their stored ``_summary`` Parquet;
the other compacted hours (cut by ``--since``/``--until``, or stored without summaries) their
Parquet rows, and open hours their JSON (arrowjson.parse_files, which raises NotConvertible
for a file with a line it cannot parse: the caller then uses Spark).  Those records are
summarised per hour of their ``ts`` by arrowsummaries.summarize_table, as Spark's summaries
key them, so the merged summaries are the ones the Spark engine derives its tables from.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from brokerd.events import schema
from brokerd.pipeline.arrowsummaries import schemas, summarize_table
from brokerd.pipeline.localfs import LocalFS, local_path
from brokerd.pipeline.read import OK, STATUSES, plan_hours
from brokerd.pipeline.summaries import RECORD_COLUMNS, SUMMARIES, SUMMARY_DIR


DEFAULT_MAX_MEMORY = 2 << 30
"""Bytes of Arrow memory the engine may hold while reading (``--arrow-max-memory``)."""


class TooLarge(Exception):
    """The summaries and records a report would hold in this process exceed its bound: the
    report needs Spark, which spills to disk."""


def _check_memory(limit: int | None) -> None:
    """Raise TooLarge once the Arrow memory in use passes ``limit`` (checked after each
    file read, so the overshoot is at most one file's table)."""
    import pyarrow as pa

    if limit is not None and pa.total_allocated_bytes() > limit:
        raise TooLarge(f"the log's summaries and open hours take more than --arrow-max-memory "
                       f"({limit:,} bytes) in memory")


@dataclass
class ArrowLog:
    """The merged summaries (name -> Arrow table, several rows per key: re-aggregate) and
    what read.EventLog says of the lines read."""

    summaries: dict[str, Any]
    quality: dict[str, int] = field(default_factory=dict)
    path: str = ""
    found: bool = True
    summarized: dict[str, list[str]] = field(default_factory=dict)


def _parquet_files(directory: str) -> list[str]:
    """The data files of a directory written by Spark or pyarrow (``_``/``.`` names are
    markers and checksums)."""
    if not os.path.isdir(directory):
        return []
    return sorted(
        os.path.join(directory, name) for name in os.listdir(directory)
        if name.endswith(".parquet") and not name.startswith(("_", "."))
    )


def _read(files: list[str], columns: list[str], limit: int | None = None) -> list[Any]:
    import pyarrow.parquet as pq

    tables = []
    for name in files:
        tables.append(pq.read_table(name, columns=columns))
        _check_memory(limit)
    return tables


def _conform(tables: list[Any], target: Any) -> Any:
    """One table of ``target``'s schema (columns by name) from ``tables``."""
    import pyarrow as pa

    parts = [table.select(target.names).cast(target) for table in tables if len(table)]
    return pa.concat_tables(parts) if parts else target.empty_table()


def _summarize_by_hour(records: Any) -> dict[str, list[Any]]:
    """The summaries of ``records``, each hour of ``ts`` on its own (the subscription
    summaries count the messages of an endpoint's own hour only)."""
    import numpy as np
    import pyarrow.compute as pc

    found: dict[str, list[Any]] = {}
    if not len(records):
        return found
    hour = pc.divide(records.column("ts"), schema.HOUR_US)
    for index in np.unique(hour.to_numpy()).tolist():
        part = records.filter(pc.equal(hour, index))
        for name, table in summarize_table(part).items():
            found.setdefault(name, []).append(table)
    return found


def read_summaries(data_dir: str, since_us: int | None = None, until_us: int | None = None,
                   max_memory: int | None = DEFAULT_MAX_MEMORY) -> ArrowLog:
    """The merged summaries of ``data_dir``'s log in [since, until) (a local data dir).
    Raises arrowjson.NotConvertible when an open hour has a line pyarrow cannot parse, and
    TooLarge when what it reads takes more than ``max_memory`` bytes (None: no bound)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from brokerd.pipeline.arrowjson import parse_files

    if local_path(data_dir) is None:
        raise ValueError(f"{data_dir}: the Arrow engine reads local data dirs only")
    fs = LocalFS()
    plan = plan_hours(fs, data_dir, since_us, until_us)
    path, found, counts, summarized = plan.path, plan.found, plan.counts, plan.summarized
    parquet_hours, json_hours = plan.parquet_hours, plan.json_hours
    columns = [*RECORD_COLUMNS, "status"]
    parts = []
    for _hour, location in sorted(parquet_hours.items()):
        if location not in summarized:
            parts += _read(_parquet_files(local_path(location) or location), columns, max_memory)
    for _hour, location in sorted(json_hours.items()):
        files = [os.path.join(local_path(location) or location, name) for name, _size in fs.files(location, schema.FILE_SUFFIX)]
        if files:
            rows = parse_files(files).select(columns)
            for row in pc.value_counts(rows.column("status")).to_pylist():
                counts[row["values"]] = counts.get(row["values"], 0) + int(row["counts"])
            parts.append(rows)
            _check_memory(max_memory)
    merged: dict[str, list[Any]] = {name: [] for name, _function in SUMMARIES}
    for location, names in sorted(summarized.items()):
        for name in names:
            directory = os.path.join(local_path(location) or location, SUMMARY_DIR, name)
            merged[name] += _read(_parquet_files(directory), schemas()[name].names, max_memory)
    if parts:
        record_schema = pa.schema([(f.name, f.type) for f in schemas()["rare"]] + [("status", pa.string())])
        records = _conform(parts, record_schema)
        keep = pc.equal(records.column("status"), OK)
        if since_us is not None:
            keep = pc.and_(keep, pc.greater_equal(records.column("ts"), since_us))
        if until_us is not None:
            keep = pc.and_(keep, pc.less(records.column("ts"), until_us))
        for name, tables in _summarize_by_hour(records.filter(keep).drop_columns(["status"])).items():
            merged[name] += tables
    quality = {status_name: int(counts.get(status_name, 0)) for status_name in STATUSES}
    frames = {name: _conform(tables, schemas()[name]) for name, tables in merged.items()}
    return ArrowLog(frames, quality, path, found=found, summarized=summarized)

"""The local reading: a local event log into merged summaries, in this process, with no JVM.

What brokerd.pipeline.sparkio.read_log does through Spark, done with pyarrow: compacted hours wholly inside the window contribute their stored ``_summary`` Parquet;
the other compacted hours (cut by ``--since``/``--until``, or stored without summaries) their
Parquet rows, and open hours their JSON (arrowjson.parse_files, which raises NotConvertible
for a file with a line it cannot parse: the caller then uses Spark).  Those records are
summarised per hour of their ``ts`` by summaries.summarize_table, the function Spark runs on
its executors for the same hours.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from brokerd.events import schema
from brokerd.pipeline.arrowjson import parse_files
from brokerd.pipeline.localfs import LocalFS, local_path
from brokerd.pipeline.read import OK, Log, plan_hours
from brokerd.pipeline.summaries import NAMES, RECORD_COLUMNS, SUMMARY_DIR, merge, record_schema, schemas, summarize_table


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
    tables = []
    for name in files:
        tables.append(pq.read_table(name, columns=columns))
        _check_memory(limit)
    return tables


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


def read_summaries(data_dir: str, since_us: int | None = None, until_us: int | None = None,
                   max_memory: int | None = DEFAULT_MAX_MEMORY) -> Log:
    """The merged summaries of ``data_dir``'s log in [since, until) (a local data dir).
    Raises arrowjson.NotConvertible when an open hour has a line pyarrow cannot parse, and
    TooLarge when what it reads takes more than ``max_memory`` bytes (None: no bound)."""
    if local_path(data_dir) is None:
        raise ValueError(f"{data_dir}: the Arrow engine reads local data dirs only")
    fs = LocalFS()
    plan = plan_hours(fs, data_dir, since_us, until_us)
    counts, summarized = plan.counts, plan.summarized
    columns = [*RECORD_COLUMNS, "status"]
    parts = []
    for location in plan.record_hours():
        parts += _read(_parquet_files(local_path(location) or location), columns, max_memory)
    for _hour, location in sorted(plan.json_hours.items()):
        files = [os.path.join(local_path(location) or location, name) for name, _size in fs.files(location, schema.FILE_SUFFIX)]
        if files:
            rows = parse_files(files).select(columns)
            for row in pc.value_counts(rows.column("status")).to_pylist():
                counts[row["values"]] = counts.get(row["values"], 0) + int(row["counts"])
            parts.append(rows)
            _check_memory(max_memory)
    merged: dict[str, list[Any]] = {name: [] for name in NAMES}
    for location, names in sorted(summarized.items()):
        for name in names:
            directory = os.path.join(local_path(location) or location, SUMMARY_DIR, name)
            merged[name] += _read(_parquet_files(directory), schemas()[name].names, max_memory)
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
    return Log(merge(merged), plan.quality(), plan.path, found=plan.found, summarized=summarized)

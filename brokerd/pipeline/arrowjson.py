"""Compaction's fast path: an hour of JSON lines into Parquet with pyarrow's JSON reader.

Spark's JSON reader parses a line at a time through Jackson on the JVM: on 2 cores it was
most of a compaction (46 s of the first report's 126 s for 10 M events).  pyarrow's reader is
C++, multi-threaded and column-oriented, and about 20 times cheaper in CPU on the broker's
lines; the hour's Parquet is written straight from its Arrow table.  The schema is the one in
``brokerd.events.schema`` (no inference), and the rows and statuses are the ones Spark's path
(brokerd.pipeline.read.with_status) gives, with one difference in how bad lines are handled:
pyarrow rejects a whole file for one line it cannot parse (not JSON, cut short, a field of the
wrong type), so such an hour raises :class:`NotConvertible` and compaction converts it with
Spark instead, which marks exactly the bad lines ``malformed``.

Local files only (pyarrow does not go through Hadoop's FileSystem): compaction uses Spark for
data dirs on cluster storage.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from brokerd.events import schema

_ARROW_TYPES = {"int": "int32", "long": "int64", "string": "string"}
OK = "ok"


class NotConvertible(Exception):
    """pyarrow could not parse a file of the hour (a malformed line): use Spark's reader."""


def arrow_schema() -> Any:
    return pa.schema([(name, getattr(pa, _ARROW_TYPES[kind])()) for name, kind in schema.FIELDS])


def _status(table: Any) -> Any:
    """``unsupported_version``, ``invalid`` or ``ok`` per row, as ``read.with_status`` decides
    for lines that parsed."""
    version = table.column("v")
    bad_version = pc.or_kleene(
        pc.is_null(version), pc.invert(pc.is_in(version, value_set=pa.array(sorted(schema.SUPPORTED_VERSIONS), pa.int32())))
    )
    missing = pc.invert(pc.is_in(table.column("kind"), value_set=pa.array(sorted(schema.KINDS))))
    for name in schema.REQUIRED:
        if name != "v":
            missing = pc.or_(pc.fill_null(missing, True), pc.is_null(table.column(name)))
    invalid = pc.fill_null(missing, True)
    bad_version = pc.fill_null(bad_version, True)
    return pc.if_else(bad_version, schema.UNSUPPORTED_VERSION, pc.if_else(invalid, schema.INVALID, OK))


def parse_files(files: Sequence[str]) -> Any:
    """``files`` (``.jsonl``) as one Arrow table: every schema field and ``status``.  Raises
    NotConvertible if a file does not parse as a whole.  An empty file (the broker has just
    opened it) has no lines: pyarrow would reject it, so it is skipped."""
    import os

    options = pj.ParseOptions(explicit_schema=arrow_schema(), unexpected_field_behavior="ignore")
    tables = []
    for name in files:
        if os.path.getsize(name) == 0:
            continue
        try:
            tables.append(pj.read_json(name, parse_options=options))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, UnicodeDecodeError) as exc:
            raise NotConvertible(f"{name}: {exc}") from exc
    table = pa.concat_tables(tables) if tables else arrow_schema().empty_table()
    table = table.select(list(schema.FIELD_NAMES))
    status = _status(table)
    return table.append_column("status", status)


def convert_hour(files: Sequence[str], target: str) -> tuple[dict[str, int], tuple[int, int] | None, Any]:
    """Parse ``files`` (one hour's ``.jsonl``) and write them with a ``status`` column as
    ``target`` (a Parquet file).  Returns the line count per status, the lowest and highest
    ``ts`` of the valid rows (None if there are none) and the valid rows (an Arrow table, no
    payload).  Raises NotConvertible if a file does not parse as a whole."""
    table = parse_files(files)
    status = table.column("status")
    pq.write_table(table, target)
    counts = {row["values"]: int(row["counts"]) for row in pc.value_counts(status).to_pylist()}
    valid = table.filter(pc.equal(status, OK)).drop_columns(["status", "payload"])
    if len(valid) == 0:
        return counts, None, valid
    bounds = pc.min_max(valid.column("ts")).as_py()
    return counts, (bounds["min"], bounds["max"]), valid

"""Local parsing and writing: the log's JSON lines into Arrow with pyarrow's JSON reader, and
Arrow tables into Parquet, in this process (local files only: pyarrow does not go through
Hadoop's FileSystem).

pyarrow's reader is C++, multi-threaded and column-oriented: about 20 times cheaper in CPU on
the broker's lines than Spark's, which parses a line at a time through Jackson on the JVM.  The
schema is the one in ``brokerd.events.schema`` (no inference).  The line statuses have one
definition, :func:`line_status`, which Spark's reading applies too (brokerd.pipeline.sparkio),
but pyarrow rejects a whole file for one line it cannot parse (not JSON, cut short, a field of
the wrong type): such a file raises :class:`NotConvertible`, and Spark's reader, which marks
exactly the bad lines ``malformed``, reads it instead.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from brokerd.events import schema
from brokerd.pipeline.summaries import record_schema

OK = "ok"
PART = "part-00000-arrow.parquet"
"""The data file of a Parquet directory written here (Spark reads it as one of its own)."""


class NotConvertible(Exception):
    """pyarrow could not parse a file of the log (a malformed line): use Spark's reader."""


def line_status(table: Any) -> Any:
    """``unsupported_version``, ``invalid`` or ``ok`` per parsed line of ``table`` (the log's
    fields; a line that did not parse is ``malformed`` before it gets here)."""
    version = table.column("v")
    supported = pa.array(sorted(schema.SUPPORTED_VERSIONS), pa.int32())
    unsupported = pc.or_kleene(pc.is_null(version), pc.invert(pc.is_in(version, value_set=supported)))
    invalid = pc.invert(pc.is_in(table.column("kind"), value_set=pa.array(sorted(schema.KINDS))))
    for name in schema.REQUIRED:
        if name != "v":
            invalid = pc.or_(pc.fill_null(invalid, True), pc.is_null(table.column(name)))
    invalid = pc.if_else(pc.fill_null(invalid, True), schema.INVALID, OK)
    return pc.if_else(pc.fill_null(unsupported, True), schema.UNSUPPORTED_VERSION, invalid)


def parse_files(files: Sequence[str]) -> Any:
    """``files`` (``.jsonl``) as one Arrow table: every schema field and ``status``.  Raises
    NotConvertible if a file does not parse as a whole.  An empty file (the broker has just
    opened it) has no lines: pyarrow would reject it, so it is skipped."""
    options = pj.ParseOptions(explicit_schema=record_schema(payload=True), unexpected_field_behavior="ignore")
    tables = []
    for name in files:
        if os.path.getsize(name) == 0:
            continue
        try:
            tables.append(pj.read_json(name, parse_options=options))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, UnicodeDecodeError) as exc:
            raise NotConvertible(f"{name}: {exc}") from exc
    table = pa.concat_tables(tables) if tables else record_schema(payload=True).empty_table()
    table = table.select(list(schema.FIELD_NAMES))
    return table.append_column("status", line_status(table))


def status_counts(table: Any) -> dict[str, int]:
    """The line count per status of a table with ``status``."""
    return {row["values"]: int(row["counts"]) for row in pc.value_counts(table.column("status")).to_pylist()}


def write_parquet(table: Any, directory: str) -> None:
    """``table`` as the Parquet directory ``directory`` (created if need be)."""
    os.makedirs(directory, exist_ok=True)
    pq.write_table(table, os.path.join(directory, PART))


def read_parquet(directory: str, columns: Sequence[str]) -> Iterator[Any]:
    """``columns`` of each data file of a Parquet directory written by Spark or here (``_`` and
    ``.`` names are markers and checksums); none for a directory that is not there."""
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".parquet") and not name.startswith(("_", ".")):
                yield pq.read_table(os.path.join(directory, name), columns=list(columns))

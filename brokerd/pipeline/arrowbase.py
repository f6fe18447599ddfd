"""What the table modules (tables, subscribers) share: the tables' Arrow schemas (the types
Spark reads back) and small helpers over pyarrow's compute kernels (sort order with nulls
first or last, null keys grouped together, exact running sums per group).
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Summaries = dict[str, Any]
"""Summary name -> the merged Arrow table (summaries.merge)."""


@functools.lru_cache(maxsize=1)
def schemas() -> dict[str, Any]:
    """Each table's Arrow schema: what Spark writes (timestamps in UTC, ``rank`` int)."""
    s, i, t = pa.string(), pa.int64(), pa.timestamp("us", tz="UTC")
    pct = [("count", i), ("p50_us", i), ("p90_us", i), ("p99_us", i), ("max_us", i)]
    return {
        "traffic": pa.schema([("minute", t), ("topic", s), ("protocol", s), ("messages", i), ("bytes", i), ("fanout", i),
                              ("max_fanout", i), ("deliveries", i), ("drops", i), ("drops_by_reason", pa.map_(s, i))]),
        "latency": pa.schema([("topic", s), ("protocol", s), ("kind", s), *pct]),
        "top_publishers": pa.schema([("session", s), ("protocol", s), ("messages", i), ("bytes", i), ("topics", i),
                                     ("fanout", i), ("first_seen", t), ("last_seen", t), ("rank", pa.int32())]),
        "top_subscribers": pa.schema([("session", s), ("protocol", s), ("messages", i), ("bytes", i), ("topics", i),
                                      ("rank", pa.int32())]),
        "dead_letters": pa.schema([("time", t), ("kind", s), ("protocol", s), ("topic", s), ("session", s), ("sender", s),
                                   ("message_id", s), ("bytes", i), ("reason", s), ("broker", s)]),
        "auth_failures": pa.schema([("source", s), ("protocol", s), ("failures", i), ("identities", pa.list_(s)),
                                    ("schemes", pa.list_(s)), ("first_seen", t), ("last_seen", t)]),
        "cross_protocol": pa.schema([("publishing", s), ("receiving", s), ("messages", i), ("bytes", i)]),
        "slow_consumers": pa.schema([("time", t), ("protocol", s), ("session", s), ("topic", s), ("reason", s),
                                     ("dropped", i)]),
        "delivery_latency": pa.schema([("protocol", s), ("source", s), *pct]),
        "smqp_latency_split": pa.schema([("kind", s), ("part", s), *pct]),
        "queue_gauges": pa.schema([("time", t), ("broker", s), ("protocol", s), ("pending", i), ("unacknowledged", i),
                                   ("trash", i)]),
    }


def timestamps(column: Any) -> Any:
    """µs since the epoch as Spark's ``timestamp_micros`` (UTC)."""
    return column.cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def is_in(column: Any, values: Sequence[str]) -> Any:
    return pc.fill_null(pc.is_in(column, value_set=pa.array(list(values), pa.string())), False)


def sort_by(table: Any, keys: Sequence[tuple[str, str]], nulls: str = "at_start") -> Any:
    """``table`` sorted by ``keys`` ((name, "ascending"/"descending")), stable."""
    if not len(table):
        return table
    return table.take(pc.sort_indices(table, sort_keys=[(name, order, nulls) for name, order in keys]))


def conform(table: Any, name: str) -> Any:
    return table.select(schemas()[name].names).cast(schemas()[name])


def run_starts(table: Any, keys: Sequence[str]) -> Any:
    """Per row of ``table`` (sorted by ``keys``, not empty): whether it starts a run of equal
    keys (null equals null), as a numpy bool array."""
    new = np.zeros(len(table), dtype=bool)
    new[0] = True
    for key in keys:
        column = table.column(key).combine_chunks()
        before, after = column.slice(0, len(column) - 1), column.slice(1)
        equal = pc.or_(pc.fill_null(pc.equal(before, after), False), pc.and_(pc.is_null(before), pc.is_null(after)))
        new[1:] |= np.asarray(pc.invert(equal).to_numpy(zero_copy_only=False), dtype=bool)
    return new


def ranked(frame: Any, order: Sequence[tuple[str, str]], top: int) -> Any:
    """The first ``top`` rows by ``order`` (session nulls last), ranked."""
    limited = sort_by(frame, order, nulls="at_end").slice(0, top)
    return limited.append_column("rank", pa.array(range(1, len(limited) + 1), pa.int32()))


RANKING = (("messages", "descending"), ("bytes", "descending"), ("session", "ascending"), ("protocol", "ascending"))


def strings(values: Iterable[str | None]) -> Any:
    return pa.array(list(values), pa.string())


def longs(values: Iterable[int | None]) -> Any:
    return pa.array(list(values), pa.int64())


NULL_KEY = "\x00"
"""Stands for a null string key in joins (Arrow's joins never match nulls, Spark's groupBy
groups them): never a topic, session or protocol, which are printable."""


def joinable(table: Any, keys: Sequence[str]) -> Any:
    """``table`` with NULL_KEY for nulls in its string ``keys`` (the others are never null)."""
    for key in keys:
        if pa.types.is_string(table.schema.field(key).type):
            table = table.set_column(table.column_names.index(key), key, pc.fill_null(table.column(key), NULL_KEY))
    return table


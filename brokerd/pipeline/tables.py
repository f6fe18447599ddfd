"""The report's tables, each derived from the merged summaries (brokerd.pipeline.summaries),
never from the raw records: the messages are reduced once, per hour, and every table
re-aggregates the small summaries with pyarrow's kernels (group_by, sort, filter, a join for
the drop maps) and numpy running sums, in the report's process: locally, and in Spark's
driver once the merged summaries are collected (brokerd.pipeline.sparkio), so each table has
one definition.  The columns and types are :func:`arrowbase.schemas` (the types Spark reads
back).

Definitions (docs/pipeline.md repeats them for readers of the Parquet files):

traffic          per minute x topic x protocol (the publisher's protocol for accepted
                 messages, the recipient's for per-recipient outcomes; topic null for unicast
                 and broadcast): messages, bytes, fanout (sessions the core handed them to),
                 max_fanout, deliveries (fanout + ``delivered`` events - drops after hand-off),
                 drops and drops_by_reason (``accepted.dropped`` counts as ``unrenderable``).
latency          per topic x protocol x kind, over records with latency_us: count, p50, p90,
                 p99 (exact: the smallest value with at least that fraction of the values at
                 or below it) and max.
top_publishers   sessions by accepted messages: messages, bytes, topics, fanout, first/last.
top_subscribers  sessions by messages routed to them: multicast messages accepted on a topic
                 while they were subscribed to it (from their ``subscribed`` event to the
                 ``unsubscribed`` or ``logout`` after it; a session's own messages excluded)
                 plus ``delivered`` events naming them.
dead_letters     every ``expired`` and ``trashed`` record.
auth_failures    per source host x protocol: failures, identities and schemes tried, first/last.
cross_protocol   publishing x receiving protocol: multicast copies routed to subscribers.
slow_consumers   every congestion episode.
delivery_latency per receiving protocol x source, exact percentiles as ``latency``: SSMP,
                 MCCHAT and socket.mq from the broker's sampled ``latency`` records (``rare``),
                 SMQP from its ``delivered`` records less the time queued (``smqp_latency``).
smqp_latency_split
                 per SMQP outcome kind x part (``queued``, ``online``) of the records with
                 ``queued_us`` (``smqp_latency``).
queue_gauges     every ``gauge`` reading (``rare``).

:data:`TABLES` lists them in the order they are written: the one place to register a table.
Per-row Python runs only on small inputs: the ``rare`` records of the subscription counts
(brokerd.pipeline.subscribers) and the per-group lists of the auth failures.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.pipeline.gauges import SERIES
from brokerd.pipeline.latency import SAMPLED, SMQP_ONLINE
from brokerd.pipeline.arrowbase import (
    RANKING, Summaries, conform, differs, group, is_in, joinable, ranked, sort_by, timestamps,
)
from brokerd.pipeline.subscribers import cross_protocol, routes_of, top_subscribers
from brokerd.pipeline.summaries import ONLINE, QUEUED, UNSPLIT

PERCENTILES = (0.5, 0.9, 0.99)

def traffic(s: Summaries, top: int = 0) -> Any:
    """The traffic and drops summaries re-aggregated per key, the drops
    per reason in a map sorted by reason (empty for keys without drops)."""
    keys = ["minute", "topic", "protocol"]
    sums = ["messages", "bytes", "fanout", "delivered", "after_handoff"]
    flows = group(s["traffic"], keys, [*[(n, "sum", n) for n in sums], ("max_fanout", "max", "max_fanout")])
    reasons = group(s["drops"], [*keys, "reason"], [("n", "sum", "n")])
    by_key = group(reasons, keys, [("n", "sum", "drops")])
    # every drops key is a traffic key; still, a key only in drops gets zeros, as Spark's union does
    zeros = {name: pa.array([0] * len(by_key), pa.int64()) for name in sums}
    only_drops = pa.table({**{k: by_key.column(k) for k in keys}, **zeros,
                           "max_fanout": pa.nulls(len(by_key), pa.int64()), "drops": by_key.column("drops")})
    flows = flows.append_column("drops", pa.array([0] * len(flows), pa.int64()))
    merged = group(pa.concat_tables([flows.select(only_drops.column_names), only_drops]), keys,
                    [*[(n, "sum", n) for n in [*sums, "drops"]], ("max_fanout", "max", "max_fanout")])
    merged = sort_by(merged, [("minute", "ascending"), ("topic", "ascending"), ("protocol", "ascending")])
    drops_by_reason = _reason_maps(merged, reasons, keys)
    table = pa.table({
        "minute": timestamps(merged.column("minute")), "topic": merged.column("topic"),
        "protocol": merged.column("protocol"), "messages": merged.column("messages"), "bytes": merged.column("bytes"),
        "fanout": merged.column("fanout"), "max_fanout": merged.column("max_fanout"),
        "deliveries": pc.subtract(pc.add(merged.column("fanout"), merged.column("delivered")), merged.column("after_handoff")),
        "drops": merged.column("drops"), "drops_by_reason": drops_by_reason,
    })
    return conform(table, "traffic")


def _reason_maps(merged: Any, reasons: Any, keys: list[str]) -> Any:
    """Per row of ``merged``: its rows of ``reasons`` as a map reason -> n, sorted by reason."""
    if not len(reasons):
        return pa.array([[]] * len(merged), pa.map_(pa.string(), pa.int64()))
    rows = joinable(merged.select(keys), keys).append_column("row", pa.array(np.arange(len(merged), dtype=np.int64)))
    located = joinable(reasons, keys).join(rows, keys, join_type="inner", use_threads=False)
    located = sort_by(located, [("row", "ascending"), ("reason", "ascending")])
    lengths = np.bincount(located.column("row").to_numpy(), minlength=len(merged))
    offsets = pa.array(np.concatenate(([0], np.cumsum(lengths))).astype(np.int32))
    return pa.MapArray.from_arrays(offsets, located.column("reason").combine_chunks(), located.column("n").combine_chunks())


def percentiles(counts: Any, keys: Sequence[str], value: str) -> Any:
    """Count, p50_us, p90_us, p99_us, max_us per ``keys`` from value
    counts, exact (per group, the smallest value whose running count reaches ``p * count``),
    groups sorted by their keys (nulls first)."""
    values = group(counts, [*keys, value], [("n", "sum", "n")])
    values = sort_by(values, [*[(k, "ascending") for k in keys], (value, "ascending")])
    names = [f"p{round(q * 100)}_us" for q in PERCENTILES]
    if not len(values):
        return pa.table({**{k: values.column(k) for k in keys}, "count": pa.array([], pa.int64()),
                         **{n: pa.array([], pa.int64()) for n in names}, "max_us": pa.array([], pa.int64())})
    new = np.zeros(len(values), dtype=bool)
    new[0] = True
    for key in keys:
        new[1:] |= differs(values.column(key).combine_chunks())
    starts = np.flatnonzero(new)
    n = values.column("n").to_numpy().astype(np.int64)
    v = values.column(value).to_numpy().astype(np.int64)
    running = np.cumsum(n)
    before = np.concatenate(([0], running[starts[1:] - 1]))
    member = np.cumsum(new) - 1  # each row's group
    upto = running - before[member]
    total = np.add.reduceat(n, starts)
    result = {k: values.column(k).take(pa.array(starts)) for k in keys}
    result["count"] = pa.array(total, pa.int64())
    for q, name in zip(PERCENTILES, names):
        reached = upto >= q * total[member].astype(np.float64)
        result[name] = pa.array(np.minimum.reduceat(np.where(reached, v, np.iinfo(np.int64).max), starts), pa.int64())
    result["max_us"] = pa.array(np.maximum.reduceat(v, starts), pa.int64())
    return pa.table(result)


def latency(s: Summaries, top: int = 0, keys: tuple[str, ...] = ("topic", "protocol", "kind")) -> Any:
    return percentiles(s["latency"], keys, "latency_us")


def top_publishers(s: Summaries, top: int = 100) -> Any:
    publishing = s["publishing"]
    frame = group(publishing, ["session", "protocol"], [
        ("messages", "sum", "messages"), ("bytes", "sum", "bytes"), ("topic", "count_distinct", "topics"),
        ("fanout", "sum", "fanout"), ("first_ts", "min", "first_seen"), ("last_ts", "max", "last_seen"),
    ])
    frame = frame.set_column(frame.column_names.index("first_seen"), "first_seen", timestamps(frame.column("first_seen")))
    frame = frame.set_column(frame.column_names.index("last_seen"), "last_seen", timestamps(frame.column("last_seen")))
    return conform(ranked(frame, RANKING, top), "top_publishers")


def _records(s: Summaries, where: Any, columns: Sequence[Any], order: Sequence[str], name: str) -> Any:
    """Rows of ``rare`` (``where``: a mask of it) with ``time``, sorted by ``order``."""
    rare = s["rare"].filter(where)
    rare = rare.append_column("time", timestamps(rare.column("ts")))
    table = pa.table({column if isinstance(column, str) else column[0]:
                      rare.column(column) if isinstance(column, str) else column[1](rare) for column in columns})
    return conform(sort_by(table, [(key, "ascending") for key in order]), name)


def _dropped(rare: Any) -> Any:
    return pc.fill_null(rare.column("dropped"), 1).cast(pa.int64())


def slow_consumers(s: Summaries, top: int = 0) -> Any:
    rare = s["rare"]
    where = pc.and_(is_in(rare.column("kind"), [schema.DROPPED]), is_in(rare.column("reason"), [schema.SLOW_CONSUMER, schema.QUEUE_FULL]))
    return _records(s, where, ["time", "protocol", "session", "topic", "reason", ("dropped", _dropped)],
                    ["time", "session"], "slow_consumers")


def dead_letters(s: Summaries, top: int = 0) -> Any:
    rare = s["rare"]
    return _records(s, is_in(rare.column("kind"), sorted(schema.DEAD_LETTER_KINDS)),
                    ["time", "kind", "protocol", "topic", "session", "sender", "message_id", "bytes", "reason", "broker"],
                    ["time", "message_id"], "dead_letters")


def queue_gauges(s: Summaries, top: int = 0) -> Any:
    rare = s["rare"]
    return _records(s, is_in(rare.column("kind"), [schema.GAUGE]),
                    ["time", "broker", "protocol", *[(n, lambda r, n=n: pc.fill_null(r.column(n), 0)) for n, _l, _c in SERIES]],
                    ["time", "broker"], "queue_gauges")


def auth_failures(s: Summaries, top: int = 0) -> Any:
    """Per source host (the port stripped) x protocol."""
    rare = s["rare"]
    failures = rare.filter(is_in(rare.column("kind"), [schema.AUTH_FAILURE]))
    host = pc.struct_field(pc.extract_regex(failures.column("source"), r"^\[?(?P<host>.*?)\]?:[0-9]+$"), [0])
    usable = pc.fill_null(pc.not_equal(host, ""), False)
    source = pc.if_else(usable, host, failures.column("source"))
    failures = failures.set_column(failures.column_names.index("source"), "source", source)
    grouped = group(failures, ["source", "protocol"], [
        ("ts", "count", "failures"), ("session", "distinct", "identities"), ("scheme", "distinct", "schemes"),
        ("ts", "min", "first_seen"), ("ts", "max", "last_seen"),
    ])

    def sorted_lists(column: Any, limit: int | None) -> Any:
        return pa.array([sorted(v for v in values if v is not None)[:limit] for values in column.to_pylist()], pa.list_(pa.string()))

    table = pa.table({
        "source": grouped.column("source"), "protocol": grouped.column("protocol"),
        "failures": grouped.column("failures").cast(pa.int64()),
        "identities": sorted_lists(grouped.column("identities"), 20), "schemes": sorted_lists(grouped.column("schemes"), None),
        "first_seen": timestamps(grouped.column("first_seen")), "last_seen": timestamps(grouped.column("last_seen")),
    })
    return conform(sort_by(table, [("failures", "descending"), ("source", "ascending"), ("protocol", "ascending")],
                          nulls="at_end"), "auth_failures")


def delivery_latency(s: Summaries, top: int = 0) -> Any:
    """The sampled ``latency`` records and SMQP's deliveries
    once online, per receiving protocol and source."""
    rare = s["rare"]
    sampled = rare.filter(pc.and_(is_in(rare.column("kind"), [schema.LATENCY]), pc.is_valid(rare.column("latency_us"))))
    smqp = s["smqp_latency"]
    smqp = smqp.filter(pc.and_(is_in(smqp.column("kind"), [schema.DELIVERED]), is_in(smqp.column("part"), [ONLINE, UNSPLIT])))
    counts = pa.concat_tables([
        pa.table({"protocol": sampled.column("protocol"), "source": pa.array([SAMPLED] * len(sampled), pa.string()),
                  "value_us": sampled.column("latency_us").cast(pa.int64()), "n": pa.array([1] * len(sampled), pa.int64())}),
        pa.table({"protocol": pa.array(["smqp"] * len(smqp), pa.string()), "source": pa.array([SMQP_ONLINE] * len(smqp), pa.string()),
                  "value_us": smqp.column("value_us"), "n": smqp.column("n")}),
    ])
    return conform(percentiles(counts, ["protocol", "source"], "value_us"), "delivery_latency")


def smqp_latency_split(s: Summaries, top: int = 0) -> Any:
    smqp = s["smqp_latency"]
    return conform(percentiles(smqp.filter(is_in(smqp.column("part"), [QUEUED, ONLINE])), ["kind", "part"], "value_us"),
                    "smqp_latency_split")


def latency_table(s: Summaries, top: int = 0) -> Any:
    return conform(latency(s), "latency")


Table = Callable[..., Any]
TABLES: tuple[tuple[str, Table], ...] = (
    ("traffic", traffic),
    ("latency", latency_table),
    ("top_publishers", top_publishers),
    ("top_subscribers", top_subscribers),
    ("dead_letters", dead_letters),
    ("auth_failures", auth_failures),
    ("cross_protocol", cross_protocol),
    ("slow_consumers", slow_consumers),
    ("delivery_latency", delivery_latency),
    ("smqp_latency_split", smqp_latency_split),
    ("queue_gauges", queue_gauges),
)
"""tables.TABLES's tables, in its order (a test checks that the names are the same)."""


def compute(s: Summaries, top: int) -> dict[str, Any]:
    """Every table; the subscription counts are computed once for the two that need them."""
    routes = routes_of(s)
    return {
        name: table(s, top, routing=routes) if table in (top_subscribers, cross_protocol) else table(s, top)
        for name, table in TABLES
    }


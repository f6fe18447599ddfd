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
from brokerd.pipeline.html import SAMPLED, SERIES, SMQP_ONLINE
from brokerd.pipeline.arrowbase import (
    RANKING, Summaries, conform, is_in, joinable, ranked, run_starts, sort_by, timestamps,
)
from brokerd.pipeline.subscribers import cross_protocol, routes_of, top_subscribers
from brokerd.pipeline.summaries import ONLINE, QUEUED, UNSPLIT, group, sums

PERCENTILES = (0.5, 0.9, 0.99)

def traffic(s: Summaries, top: int = 0) -> Any:
    """The traffic and drops summaries re-aggregated per key, the drops per reason in a map
    sorted by reason (empty for keys without drops: every drops key is a traffic key, as
    both come from the same records)."""
    keys = ["minute", "topic", "protocol"]
    merged = group(s["traffic"], keys, [*sums("messages", "bytes", "fanout", "delivered", "after_handoff"),
                                        ("max_fanout", "max", "max_fanout")])
    merged = sort_by(merged, [(key, "ascending") for key in keys])
    reasons = group(s["drops"], [*keys, "reason"], sums("n"))
    rows = joinable(merged.select(keys), keys).append_column("row", pa.array(np.arange(len(merged), dtype=np.int64)))
    located = joinable(reasons, keys).join(rows, keys, join_type="inner", use_threads=False)
    located = sort_by(located, [("row", "ascending"), ("reason", "ascending")])
    row, n = located.column("row").to_numpy(), located.column("n").to_numpy()
    offsets = pa.array(np.concatenate(([0], np.cumsum(np.bincount(row, minlength=len(merged))))).astype(np.int32))
    drops = np.zeros(len(merged), dtype=np.int64)
    np.add.at(drops, row, n)
    column = merged.column
    return conform(pa.table({
        "minute": timestamps(column("minute")), "topic": column("topic"), "protocol": column("protocol"),
        "messages": column("messages"), "bytes": column("bytes"), "fanout": column("fanout"),
        "max_fanout": column("max_fanout"),
        "deliveries": pc.subtract(pc.add(column("fanout"), column("delivered")), column("after_handoff")),
        "drops": pa.array(drops, pa.int64()), "drops_by_reason": pa.MapArray.from_arrays(
            offsets, located.column("reason").combine_chunks(), located.column("n").combine_chunks()),
    }), "traffic")


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
    new = run_starts(values, keys)
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


def latency(s: Summaries, top: int = 0) -> Any:
    return conform(percentiles(s["latency"], ["topic", "protocol", "kind"], "latency_us"), "latency")


def top_publishers(s: Summaries, top: int = 100) -> Any:
    frame = group(s["publishing"], ["session", "protocol"], [
        ("messages", "sum", "messages"), ("bytes", "sum", "bytes"), ("topic", "count_distinct", "topics"),
        ("fanout", "sum", "fanout"), ("first_ts", "min", "first_seen"), ("last_ts", "max", "last_seen"),
    ])
    for name in ("first_seen", "last_seen"):
        frame = frame.set_column(frame.column_names.index(name), name, timestamps(frame.column(name)))
    return conform(ranked(frame, RANKING, top), "top_publishers")


def _records(s: Summaries, kinds: Sequence[str], order: Sequence[str], name: str, where: Any = True,
             **computed: Callable[[Any], Any]) -> Any:
    """The ``rare`` records of ``kinds`` (and ``where``, a mask) as table ``name``: with
    ``time``, the ``computed`` columns replaced, sorted by ``order``."""
    rare = s["rare"]
    rare = rare.filter(pc.and_(is_in(rare.column("kind"), kinds), where))
    rare = rare.append_column("time", timestamps(rare.column("ts")))
    for column, compute in computed.items():
        rare = rare.set_column(rare.column_names.index(column), column, compute(rare))
    return conform(sort_by(rare, [(key, "ascending") for key in order]), name)


def slow_consumers(s: Summaries, top: int = 0) -> Any:
    congestion = is_in(s["rare"].column("reason"), [schema.SLOW_CONSUMER, schema.QUEUE_FULL])
    return _records(s, [schema.DROPPED], ["time", "session"], "slow_consumers", congestion,
                    dropped=lambda rare: pc.fill_null(rare.column("dropped"), 1))


def dead_letters(s: Summaries, top: int = 0) -> Any:
    return _records(s, sorted(schema.DEAD_LETTER_KINDS), ["time", "message_id"], "dead_letters")


def queue_gauges(s: Summaries, top: int = 0) -> Any:
    return _records(s, [schema.GAUGE], ["time", "broker"], "queue_gauges",
                    **{n: lambda rare, n=n: pc.fill_null(rare.column(n), 0) for n, _label, _colour in SERIES})


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
        pa.table({"protocol": sampled.column("protocol"), "source": pa.repeat(SAMPLED, len(sampled)),
                  "value_us": sampled.column("latency_us").cast(pa.int64()), "n": pa.repeat(1, len(sampled))}),
        pa.table({"protocol": pa.repeat("smqp", len(smqp)), "source": pa.repeat(SMQP_ONLINE, len(smqp)),
                  "value_us": smqp.column("value_us"), "n": smqp.column("n")}),
    ])
    return conform(percentiles(counts, ["protocol", "source"], "value_us"), "delivery_latency")


def smqp_latency_split(s: Summaries, top: int = 0) -> Any:
    smqp = s["smqp_latency"]
    return conform(percentiles(smqp.filter(is_in(smqp.column("part"), [QUEUED, ONLINE])), ["kind", "part"], "value_us"),
                    "smqp_latency_split")


TABLES: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("traffic", traffic),
    ("latency", latency),
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
"""Every table, in the order they are written."""


def compute(s: Summaries, top: int) -> dict[str, Any]:
    """Every table; the subscription counts are computed once for the two that need them."""
    routes = routes_of(s)
    return {
        name: table(s, top, routing=routes) if table in (top_subscribers, cross_protocol) else table(s, top)
        for name, table in TABLES
    }


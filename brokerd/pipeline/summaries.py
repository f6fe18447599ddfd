"""Per-hour summaries: the small, mergeable tables every report table is derived from.

The valid records are reduced once to these tables, each keyed so that summaries of different
hours (or parts of an hour) merge by a union and a second aggregation, and
brokerd.pipeline.tables derives every report table from them instead of scanning the messages.
One function over an Arrow table of an hour's records computes them (:func:`summarize_table`,
pyarrow's kernels): in the report's process, or on Spark's executors (brokerd.pipeline.sparkio).

Compaction (brokerd.pipeline.compact) stores an hour's summaries next to its Parquet, under
``hour=HH/_summary/<name>/`` (published with the hour by the same rename), so a report over
compacted hours reads thousands of rows instead of millions; hours still open, hours cut by
``--since``/``--until`` and hours compacted before summaries existed are summarised on the fly
from their records by the same function.  Nothing here is approximate:

kinds         kind: events, first and last ``ts``.
traffic       minute x topic x protocol: the ``traffic`` table's sums before the drops join.
drops         minute x topic x protocol x reason: copies lost (``accepted.dropped`` as
              ``unrenderable``).
publishing    hour x topic x session x protocol x message kind, accepted messages: messages,
              bytes, fanout, first and last ``ts``.
delivered     session x protocol: ``delivered`` events and their bytes.
latency       topic x protocol x kind x latency value: how many records had it (exact
              percentiles by a running sum at report time).
smqp_latency  SMQP ``delivered``/``acked`` kind x part x value: how many records had it, where
              a record with ``queued_us`` counts once in part ``queued`` (``queued_us``) and
              once in ``online`` (``latency_us - queued_us``, at least 0), one without it once
              in ``unsplit`` (``latency_us``, at least 0): the parts are apart in the records
              only, so value counts of ``latency_us`` alone cannot give them.
rare          the records of the kinds the tables list one by one (subscriptions, logouts,
              broker-run logins, expiries, trash, auth failures, congestion drops) and the
              broker's few ``latency`` samples and ``gauge`` readings, every field.
before_topic  per subscription endpoint instant ``at`` (the ``ts`` of a ``subscribed``,
              ``unsubscribed`` or ``logout`` record) x topic x publishing protocol: multicast
              messages of ``at``'s hour strictly before ``at``.  An MQTT filter's endpoints
              (``#``, ``sensors/+``) count for every topic the filter matches.
before_own    per endpoint ``at`` x its session x protocol x topic: that session's own multicast
              messages of ``at``'s hour strictly before ``at``.

With ``publishing`` (whole hours) and ``before_*`` (the part of the endpoint's own hour), the
messages routed to a subscription ``[start, end)`` are counted exactly without the messages.

To add a table: add what it needs here (its schema in :func:`schemas` and its computation in
:func:`summarize_table`, keyed so that a union of hours re-aggregates), bump
:data:`SUMMARY_VERSION` (hours compacted with an older version are summarised from their
Parquet again), and derive the table in tables.py.  The subscription summaries
(``before_topic``, ``before_own``) use running sums and a binary search per topic: no join.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.events.filters import has_wildcard, matches

SUMMARY_VERSION = 3
"""Stored in each compacted hour's marker; hours with another version are summarised on the fly."""
SUMMARY_DIR = "_summary"
MINUTE_US = 60_000_000
HOUR_US = schema.HOUR_US
RECORD_COLUMNS = tuple(name for name in schema.FIELD_NAMES if name != "payload")
ENDPOINT_KINDS = (schema.SUBSCRIBED, schema.UNSUBSCRIBED, schema.LOGOUT)
SAMPLE_KINDS = (schema.LATENCY, schema.GAUGE)
"""Kinds kept whole in ``rare``: sampled (at most ~10 a second) or logged on change only."""
SMQP_OUTCOMES = (schema.DELIVERED, schema.ACKED)
QUEUED, ONLINE, UNSPLIT = "queued", "online", "unsplit"
"""``smqp_latency.part`` values."""

_ARROW_TYPES = {"int": "int32", "long": "int64", "string": "string"}

FILTER_PROTOCOLS = ("mqtt",)
"""Protocols whose subscriptions may be topic filters: a ``subscribed`` record's topic with a
wildcard level is then the filter (the other protocols' topics may hold ``+`` literally)."""


def is_filter(protocol: str | None, topic: str | None) -> bool:
    """Whether a subscription to ``topic`` over ``protocol`` is a topic filter."""
    return protocol in FILTER_PROTOCOLS and topic is not None and has_wildcard(topic.encode("utf-8"))


def filter_matches(topic_filter: str, topic: str) -> bool:
    """Whether the filter reaches ``topic``: the core's rules (brokerd.events.filters)."""
    return matches(topic_filter.encode("utf-8"), topic.encode("utf-8"))


def record_schema(payload: bool = False) -> Any:
    """The Arrow form of the log's fields (brokerd.events.schema): what pyarrow's JSON reader
    parses against (with ``payload``) and what :func:`summarize_table` reads (without)."""
    return pa.schema([(name, getattr(pa, _ARROW_TYPES[kind])()) for name, kind in schema.FIELDS
                      if payload or name != "payload"])


@functools.lru_cache(maxsize=1)
def schemas() -> dict[str, Any]:
    """Each summary's Arrow schema: what :func:`summarize_table` gives, cast to it, and what
    compaction stores (Spark reads the stored files with the same schema)."""
    s, i = pa.string(), pa.int64()
    return {
        "kinds": pa.schema([("kind", s), ("n", i), ("first_ts", i), ("last_ts", i)]),
        "traffic": pa.schema([("minute", i), ("topic", s), ("protocol", s), ("messages", i), ("bytes", i),
                              ("fanout", i), ("max_fanout", i), ("delivered", i), ("after_handoff", i)]),
        "drops": pa.schema([("minute", i), ("topic", s), ("protocol", s), ("reason", s), ("n", i)]),
        "publishing": pa.schema([("hour_index", i), ("topic", s), ("session", s), ("protocol", s), ("message", s),
                                 ("messages", i), ("bytes", i), ("fanout", i), ("first_ts", i), ("last_ts", i)]),
        "delivered": pa.schema([("session", s), ("protocol", s), ("n", i), ("bytes", i)]),
        "latency": pa.schema([("topic", s), ("protocol", s), ("kind", s), ("latency_us", i), ("n", i)]),
        "smqp_latency": pa.schema([("kind", s), ("part", s), ("value_us", i), ("n", i)]),
        "rare": record_schema(),
        "before_topic": pa.schema([("at", i), ("topic", s), ("publishing", s), ("n", i), ("nb", i)]),
        "before_own": pa.schema([("at", i), ("session", s), ("protocol", s), ("topic", s), ("n", i), ("nb", i)]),
    }


def group(table: Any, keys: Sequence[str], aggregations: Sequence[tuple[str, str, str]]) -> Any:
    """``table`` grouped by ``keys`` (nulls form a group, as in Spark's groupBy):
    ``aggregations`` are (column, function, output name)."""
    result = table.group_by(list(keys), use_threads=False).aggregate([(column, fn) for column, fn, _name in aggregations])
    names = {f"{column}_{fn}": name for column, fn, name in aggregations}
    return result.rename_columns([names.get(name, name) for name in result.column_names])


def sums(*names: str) -> list[tuple[str, str, str]]:
    return [(name, "sum", name) for name in names]


def _zero(column: Any) -> Any:
    return pc.fill_null(column, 0)


def _is(table: Any, *kinds: str) -> Any:
    return pc.fill_null(pc.is_in(table.column("kind"), value_set=pa.array(kinds, pa.string())), False)


def summarize_table(records: Any, endpoints: Any = None) -> dict[str, Any]:
    """Every summary of ``records`` (an Arrow table of one hour's valid records, the
    schema's fields), as Arrow tables in the summaries' schemas.  Or a part of the hour, whose
    summaries merge with the other parts' as hours do, with ``endpoints``: all the hour's
    records of :data:`ENDPOINT_KINDS` (else taken from ``records``)."""
    column = records.column
    count = pc.fill_null(column("count"), 1)
    keys = {"minute": pc.multiply(pc.divide(column("ts"), MINUTE_US), MINUTE_US),  # ts > 0: integer division
            "topic": column("topic"), "protocol": column("protocol")}
    out: dict[str, Any] = {}
    out["kinds"] = group(records, ["kind"], [("ts", "count", "n"), ("ts", "min", "first_ts"), ("ts", "max", "last_ts")])

    accepted = _is(records, schema.ACCEPTED)
    reason = column("reason")
    after_handoff = pc.and_(_is(records, schema.DROPPED), pc.fill_null(
        pc.is_in(reason, value_set=pa.array(sorted(schema.AFTER_HANDOFF_REASONS))), False))
    traffic = pa.table({
        **keys, "messages": pc.if_else(accepted, count, 0), "bytes": pc.if_else(accepted, _zero(column("bytes")), 0),
        "fanout": pc.if_else(accepted, pc.multiply(_zero(column("fanout")), count), 0),
        "max_fanout": pc.if_else(accepted, column("fanout"), pa.scalar(None, pa.int64())),
        "delivered": pc.if_else(_is(records, schema.DELIVERED), 1, 0).cast(pa.int64()),
        "after_handoff": pc.if_else(after_handoff, pc.fill_null(column("dropped"), 1), 0),
    }).filter(_is(records, schema.ACCEPTED, schema.DELIVERED, schema.DROPPED))
    out["traffic"] = group(traffic, list(keys), [*sums("messages", "bytes", "fanout", "delivered", "after_handoff"),
                                                 ("max_fanout", "max", "max_fanout")])

    unrenderable = pc.and_(accepted, pc.fill_null(pc.greater(column("dropped"), 0), False))
    drops = pa.concat_tables([
        pa.table({**keys, "reason": pa.repeat(schema.UNRENDERABLE, len(records)),
                  "n": pc.multiply(_zero(column("dropped")), count)}).filter(unrenderable),
        pa.table({**keys, "reason": pc.fill_null(reason, "unknown"),
                  "n": pc.fill_null(column("dropped"), 1)}).filter(_is(records, schema.DROPPED)),
    ])
    out["drops"] = group(drops, [*keys, "reason"], sums("n"))

    publishing = pa.table({
        "hour_index": pc.divide(column("ts"), HOUR_US), "topic": column("topic"), "session": column("session"),
        "protocol": column("protocol"), "message": column("message"), "messages": count,
        "bytes": _zero(column("bytes")), "fanout": pc.multiply(_zero(column("fanout")), count), "ts": column("ts"),
    }).filter(accepted)
    out["publishing"] = group(publishing, ["hour_index", "topic", "session", "protocol", "message"],
                              [*sums("messages", "bytes", "fanout"), ("ts", "min", "first_ts"), ("ts", "max", "last_ts")])

    delivered = records.filter(_is(records, schema.DELIVERED))
    delivered = delivered.set_column(delivered.column_names.index("bytes"), "bytes", _zero(delivered.column("bytes")))
    out["delivered"] = group(delivered, ["session", "protocol"], [("ts", "count", "n"), ("bytes", "sum", "bytes")])

    timed = records.filter(pc.is_valid(column("latency_us")))
    out["latency"] = group(timed, ["topic", "protocol", "kind", "latency_us"], [("ts", "count", "n")])
    out["smqp_latency"] = _smqp_latency(timed)

    source_less_login = pc.and_(_is(records, schema.LOGIN), pc.is_null(column("source")))
    congestion = pc.and_(_is(records, schema.DROPPED), pc.fill_null(
        pc.is_in(reason, value_set=pa.array([schema.SLOW_CONSUMER, schema.QUEUE_FULL])), False))
    listed = _is(records, *ENDPOINT_KINDS, *SAMPLE_KINDS, schema.AUTH_FAILURE, *sorted(schema.DEAD_LETTER_KINDS))
    out["rare"] = records.filter(pc.or_(pc.or_(listed, congestion), source_less_login)).select(list(RECORD_COLUMNS))

    out["before_topic"], out["before_own"] = _before(records, out["rare"] if endpoints is None else endpoints)
    return {name: table.select(schemas()[name].names).cast(schemas()[name]) for name, table in out.items()}


def _smqp_latency(timed: Any) -> Any:
    """``smqp_latency`` of the records with ``latency_us`` (as summaries.smqp_latency: a record
    with ``queued_us`` in parts ``queued`` and ``online``, one without in ``unsplit``)."""
    smqp = pc.fill_null(pc.equal(timed.column("protocol"), "smqp"), False)
    outcomes = timed.filter(pc.and_(_is(timed, *SMQP_OUTCOMES), smqp))
    latency, queued = outcomes.column("latency_us"), outcomes.column("queued_us")
    split = pc.is_valid(queued)

    def part(name: str, value: Any, where: Any) -> Any:
        return pa.table({
            "kind": outcomes.column("kind"), "part": pa.repeat(name, len(outcomes)),
            "value_us": pc.max_element_wise(value, 0).cast(pa.int64()),
        }).filter(where)

    parts = pa.concat_tables([
        part(QUEUED, queued, split),
        part(ONLINE, pc.subtract(latency, queued), split),
        part(UNSPLIT, latency, pc.invert(split)),
    ])
    return group(parts, ["kind", "part", "value_us"], [("value_us", "count", "n")])


def _before(records: Any, rare: Any) -> tuple[Any, Any]:
    """``before_topic`` and ``before_own``: per endpoint instant (of ``rare``), the multicast
    messages of ``records`` strictly before it (per topic and publishing protocol; per topic of
    the endpoint's own session), from each group's running sums and a binary search."""
    ends = rare.filter(pc.is_in(rare.column("kind"), value_set=pa.array(list(ENDPOINT_KINDS)))).to_pylist()
    topic_out: dict[str, list[Any]] = {name: [] for name in ("at", "topic", "publishing", "n", "nb")}
    own_out: dict[str, list[Any]] = {name: [] for name in ("at", "session", "protocol", "topic", "n", "nb")}
    if ends:
        multicast = pc.and_(pc.and_(_is(records, schema.ACCEPTED), pc.fill_null(
            pc.equal(records.column("message"), "multicast"), False)), pc.is_valid(records.column("topic")))
        messages = pa.table({
            "topic": records.column("topic"), "session": records.column("session"), "protocol": records.column("protocol"),
            "ts": records.column("ts"), "c": pc.fill_null(records.column("count"), 1),
            "b": _zero(records.column("bytes")),
        }).filter(multicast)
        logouts = sorted({end["ts"] for end in ends if end["kind"] == schema.LOGOUT})
        per_topic: dict[str, set[int]] = {}
        per_filter: dict[str, set[int]] = {}
        for end in ends:
            if end["kind"] != schema.LOGOUT:
                named = per_filter if is_filter(end["protocol"], end["topic"]) else per_topic
                named.setdefault(end["topic"], set()).add(end["ts"])
        for (topic, publishing), ts, c, b in _groups(messages, ["topic", "protocol"]):
            wanted = per_topic.get(topic, set()).union(logouts)
            for topic_filter, at in per_filter.items():
                if filter_matches(topic_filter, topic):
                    wanted |= at
            instants = np.array(sorted(wanted), dtype=np.int64)
            _emit(topic_out, instants, ts, c, b, {"topic": topic, "publishing": publishing})
        owners: dict[tuple[str, str], set[int]] = {}
        for end in ends:
            if end["session"] is not None:
                owners.setdefault((end["session"], end["protocol"]), set()).add(end["ts"])
        sessions = pa.array(sorted({s for s, _p in owners}), pa.string())
        own = messages.filter(pc.fill_null(pc.is_in(messages.column("session"), value_set=sessions), False))
        for (session, protocol, topic), ts, c, b in _groups(own, ["session", "protocol", "topic"]):
            instants = np.array(sorted(owners.get((session, protocol), set())), dtype=np.int64)
            _emit(own_out, instants, ts, c, b, {"session": session, "protocol": protocol, "topic": topic})
    return pa.table(topic_out), pa.table(own_out)


def _groups(messages: Any, keys: list[str]) -> Any:
    """(key values, ts, counts, bytes) per group of ``messages`` (keys never null), each
    sorted by ``ts``: group codes from the keys' dictionary encoding, one numpy sort."""
    if not len(messages):
        return
    codes = np.zeros(len(messages), dtype=np.int64)
    dictionaries = []
    for key in keys:
        encoded = messages.column(key).combine_chunks().dictionary_encode()
        dictionaries.append(encoded.dictionary.to_pylist())
        codes = codes * (len(dictionaries[-1]) + 1) + encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    ts = messages.column("ts").to_numpy()
    order = np.lexsort((ts, codes))
    codes, ts = codes[order], ts[order]
    c = messages.column("c").to_numpy()[order]
    b = messages.column("b").to_numpy()[order]
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(codes)) + 1, [len(codes)]))
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        code, values = int(codes[start]), []
        for dictionary in reversed(dictionaries):
            code, index = divmod(code, len(dictionary) + 1)
            values.append(dictionary[index])
        yield tuple(reversed(values)), ts[start:stop], c[start:stop], b[start:stop]


def _emit(out: dict[str, list[Any]], instants: Any, ts: Any, c: Any, b: Any, fixed: dict[str, Any]) -> None:
    """Append a row per instant with messages before it: their count and bytes."""
    if not len(instants):
        return
    before = np.searchsorted(ts, instants, side="left")  # messages with ts < instant
    running_c = np.concatenate(([0], np.cumsum(c)))
    running_b = np.concatenate(([0], np.cumsum(b)))
    for at, k in zip(instants.tolist(), before.tolist()):
        if k:
            out["at"].append(at)
            for name, value in fixed.items():
                out[name].append(value)
            out["n"].append(int(running_c[k]))
            out["nb"].append(int(running_b[k]))


NAMES = tuple(schemas())
"""Every summary, by name."""


def merge(parts: Mapping[str, Iterable[Any]]) -> dict[str, Any]:
    """One Arrow table per summary from ``parts`` (name -> tables of several hours, in the
    summary's schema or castable to it: columns are taken by name), several rows per key:
    the tables re-aggregate.  A summary with no part is an empty table of its schema."""
    merged = {}
    for name in NAMES:
        target = schemas()[name]
        tables = [table.select(target.names).cast(target) for table in parts.get(name, ()) if len(table)]
        merged[name] = pa.concat_tables(tables) if tables else target.empty_table()
    return merged


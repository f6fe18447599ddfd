"""Per-hour summaries: the small, mergeable tables every report table is derived from.

A report used to scan the accepted messages once per table (traffic, publishers, subscribers,
the cross-protocol matrix, the summary).  Instead the valid records are reduced once to the
tables in :data:`SUMMARIES`, each keyed so that summaries of different hours merge by a union
and a second aggregation, and brokerd.pipeline.tables derives every report table from them.

Compaction (brokerd.pipeline.compact) stores an hour's summaries next to its Parquet, under
``hour=HH/_summary/<name>/`` (published with the hour by the same rename), so a report over
compacted hours reads thousands of rows instead of millions; hours still open, hours cut by
``--since``/``--until`` and hours compacted before summaries existed are summarised on the fly
from their records by the same functions.  Nothing here is approximate:

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
              messages of ``at``'s hour strictly before ``at``.
before_own    per endpoint ``at`` x its session x protocol x topic: that session's own multicast
              messages of ``at``'s hour strictly before ``at``.

With ``publishing`` (whole hours) and ``before_*`` (the part of the endpoint's own hour), the
messages routed to a subscription ``[start, end)`` are counted exactly without the messages.

To add a table: add what it needs here (a function and an entry in :data:`SUMMARIES`, keyed so
that a union of hours re-aggregates), bump :data:`SUMMARY_VERSION` (hours compacted with an
older version are summarised from their Parquet again), and derive the table in tables.py.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from brokerd.events import schema

SUMMARY_VERSION = 2
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


def _f() -> Any:
    from pyspark.sql import functions as F

    return F


def _count() -> Any:
    """How many messages an ``accepted`` record stands for (a run is one record)."""
    F = _f()
    return F.coalesce(F.col("count"), F.lit(1))


def minute_of(column: str = "ts") -> Any:
    F = _f()
    return (F.floor(F.col(column) / MINUTE_US) * MINUTE_US).cast("long")


def hour_of(column: str = "ts") -> Any:
    """The hour index (``ts // HOUR_US``) the pieces of a subscription count are keyed by."""
    F = _f()
    return F.floor(F.col(column) / HOUR_US).cast("long")


def kinds(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    return records.groupBy(*by, "kind").agg(
        F.count(F.lit(1)).cast("long").alias("n"), F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts")
    )


def traffic(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    kind = F.col("kind")
    accepted = kind == schema.ACCEPTED
    count = _count()
    return (
        records.filter(kind.isin(schema.ACCEPTED, schema.DELIVERED, schema.DROPPED))
        .groupBy(*by, minute_of().alias("minute"), "topic", "protocol")
        .agg(
            F.sum(F.when(accepted, count).otherwise(0)).cast("long").alias("messages"),
            F.sum(F.when(accepted, F.coalesce(F.col("bytes"), F.lit(0))).otherwise(0)).cast("long").alias("bytes"),
            F.sum(F.when(accepted, F.coalesce(F.col("fanout"), F.lit(0)) * count).otherwise(0)).cast("long").alias("fanout"),
            F.max(F.when(accepted, F.col("fanout"))).cast("long").alias("max_fanout"),
            F.sum(F.when(kind == schema.DELIVERED, 1).otherwise(0)).cast("long").alias("delivered"),
            F.sum(
                F.when(
                    (kind == schema.DROPPED) & F.col("reason").isin(sorted(schema.AFTER_HANDOFF_REASONS)),
                    F.coalesce(F.col("dropped"), F.lit(1)),
                ).otherwise(0)
            ).cast("long").alias("after_handoff"),
        )
    )


def drops(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    kind = F.col("kind")
    keys = [*by, minute_of().alias("minute"), "topic", "protocol"]
    unrenderable = records.filter((kind == schema.ACCEPTED) & (F.col("dropped") > 0)).select(
        *keys, F.lit(schema.UNRENDERABLE).alias("reason"), (F.col("dropped") * _count()).cast("long").alias("n")
    )
    reported = records.filter(kind == schema.DROPPED).select(
        *keys,
        F.coalesce(F.col("reason"), F.lit("unknown")).alias("reason"),
        F.coalesce(F.col("dropped"), F.lit(1)).cast("long").alias("n"),
    )
    return (
        unrenderable.unionByName(reported)
        .groupBy(*by, "minute", "topic", "protocol", "reason")
        .agg(F.sum("n").cast("long").alias("n"))
    )


def publishing(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    return (
        records.filter(F.col("kind") == schema.ACCEPTED)
        .groupBy(*by, hour_of().alias("hour_index"), "topic", "session", "protocol", "message")
        .agg(
            F.sum(_count()).cast("long").alias("messages"),
            F.sum(F.coalesce(F.col("bytes"), F.lit(0))).cast("long").alias("bytes"),
            F.sum(F.coalesce(F.col("fanout"), F.lit(0)) * _count()).cast("long").alias("fanout"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
        )
    )


def delivered(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    return (
        records.filter(F.col("kind") == schema.DELIVERED)
        .groupBy(*by, "session", "protocol")
        .agg(
            F.count(F.lit(1)).cast("long").alias("n"),
            F.sum(F.coalesce(F.col("bytes"), F.lit(0))).cast("long").alias("bytes"),
        )
    )


def latency(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    return (
        records.filter(F.col("latency_us").isNotNull())
        .groupBy(*by, "topic", "protocol", "kind", "latency_us")
        .agg(F.count(F.lit(1)).cast("long").alias("n"))
    )


def smqp_latency(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    latency, queued = F.col("latency_us"), F.col("queued_us")
    zero = F.lit(0).cast("long")

    def part(name: str, value: Any) -> Any:
        return F.struct(F.lit(name).alias("part"), F.greatest(value, zero).cast("long").alias("value_us"))

    parts = F.when(queued.isNull(), F.array(part(UNSPLIT, latency))).otherwise(
        F.array(part(QUEUED, queued), part(ONLINE, latency - queued))
    )
    return (
        records.filter(F.col("kind").isin(*SMQP_OUTCOMES) & (F.col("protocol") == "smqp") & latency.isNotNull())
        .select(*by, "kind", F.explode(parts).alias("p"))
        .groupBy(*by, "kind", F.col("p.part").alias("part"), F.col("p.value_us").alias("value_us"))
        .agg(F.count(F.lit(1)).cast("long").alias("n"))
    )


def rare(records: Any, by: Sequence[str]) -> Any:
    F = _f()
    kind = F.col("kind")
    wanted = (
        kind.isin(*ENDPOINT_KINDS, *SAMPLE_KINDS, schema.AUTH_FAILURE, *sorted(schema.DEAD_LETTER_KINDS))
        | ((kind == schema.DROPPED) & F.col("reason").isin(schema.SLOW_CONSUMER, schema.QUEUE_FULL))
        | ((kind == schema.LOGIN) & F.col("source").isNull())
    )
    return records.filter(wanted).select(*by, *RECORD_COLUMNS)


def _multicast(records: Any) -> Any:
    F = _f()
    return records.filter(
        (F.col("kind") == schema.ACCEPTED) & (F.col("message") == "multicast") & F.col("topic").isNotNull()
    )


def before_topic(records: Any, by: Sequence[str]) -> Any:
    """Per endpoint instant and topic: messages of the instant's hour before it, per publishing
    protocol.  A ``logout`` ends subscriptions to any topic, so its instant gets every topic;
    the whole minutes come from per-minute sums, only the endpoint's own minute from the
    messages (both joins have the few endpoints on the broadcast side)."""
    F = _f()
    ends = records.filter(F.col("kind").isin(*ENDPOINT_KINDS)).select(
        *by, F.col("ts").alias("at"), F.when(F.col("kind") != schema.LOGOUT, F.col("topic")).alias("e_topic")
    ).distinct()
    any_topic = ends.filter(F.col("e_topic").isNull()).select(*by, "at")
    # an instant that is also a logout's needs no per-topic row: the logout's covers every topic
    one_topic = ends.filter(F.col("e_topic").isNotNull()).join(any_topic.select("at"), "at", "left_anti")
    messages = _multicast(records).select(
        "topic", F.col("protocol").alias("publishing"), "ts", minute_of().alias("minute"), hour_of().alias("hour_index"),
        _count().cast("long").alias("c"), F.coalesce(F.col("bytes"), F.lit(0)).cast("long").alias("b"),
    )
    minutes = messages.groupBy("hour_index", "minute", "topic", "publishing").agg(
        F.sum("c").alias("c"), F.sum("b").alias("b")
    )
    parts = []
    for frame, on_topic in ((one_topic, True), (any_topic, False)):
        e = F.broadcast(frame.select(
            *by, "at", *(["e_topic"] if on_topic else []), minute_of("at").alias("e_minute"), hour_of("at").alias("e_hour")
        )).alias("e")
        topic_match = [F.col("e.e_topic") == F.col("m.topic")] if on_topic else []
        whole = e.join(
            minutes.alias("m"),
            [F.col("e.e_hour") == F.col("m.hour_index"), F.col("m.minute") < F.col("e.e_minute"), *topic_match],
        )
        topic_match = [F.col("e.e_topic") == F.col("m.topic")] if on_topic else []
        partial = e.join(
            messages.alias("m"),
            [F.col("e.e_minute") == F.col("m.minute"), F.col("m.ts") < F.col("e.at"), *topic_match],
        )
        for joined in (whole, partial):
            parts.append(joined.select(*[F.col(f"e.{k}") for k in by], "e.at", "m.topic", "m.publishing", "m.c", "m.b"))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union.groupBy(*by, "at", "topic", "publishing").agg(
        F.sum("c").cast("long").alias("n"), F.sum("b").cast("long").alias("nb")
    )


def before_own(records: Any, by: Sequence[str]) -> Any:
    """Per endpoint instant and the endpoint's session: its own multicast messages of the
    instant's hour before it, per topic (they are not routed to its own subscriptions)."""
    F = _f()
    ends = F.broadcast(
        records.filter(F.col("kind").isin(*ENDPOINT_KINDS))
        .select(*by, F.col("ts").alias("at"), F.col("session").alias("e_session"), F.col("protocol").alias("e_protocol"))
        .distinct()
        .withColumn("e_hour", hour_of("at"))
    ).alias("e")
    messages = _multicast(records).select(
        "topic", "session", "protocol", "ts", hour_of().alias("hour_index"),
        _count().cast("long").alias("c"), F.coalesce(F.col("bytes"), F.lit(0)).cast("long").alias("b"),
    ).alias("m")
    joined = ends.join(messages, [
        F.col("e.e_session") == F.col("m.session"), F.col("e.e_protocol") == F.col("m.protocol"),
        F.col("e.e_hour") == F.col("m.hour_index"), F.col("m.ts") < F.col("e.at"),
    ])
    return joined.groupBy(*[F.col(f"e.{k}") for k in by], "e.at", "m.session", "m.protocol", "m.topic").agg(
        F.sum("m.c").cast("long").alias("n"), F.sum("m.b").cast("long").alias("nb")
    )


Summary = Callable[[Any, Sequence[str]], Any]
SUMMARIES: tuple[tuple[str, Summary], ...] = (
    ("kinds", kinds),
    ("traffic", traffic),
    ("drops", drops),
    ("publishing", publishing),
    ("delivered", delivered),
    ("latency", latency),
    ("smqp_latency", smqp_latency),
    ("rare", rare),
    ("before_topic", before_topic),
    ("before_own", before_own),
)
"""Every summary, by name: the one list to extend."""


def summarize(records: Any, by: Sequence[str] = ()) -> dict[str, Any]:
    """Every summary of ``records`` (valid records, ``ts`` and the schema's fields), grouped
    additionally by the columns ``by`` (compaction passes ``date``, ``hour``)."""
    return {name: function(records, tuple(by)) for name, function in SUMMARIES}


def summary_schemas(spark: Any) -> dict[str, Any]:
    """The Spark schema of each summary (of no records: nothing is computed)."""
    from brokerd.pipeline.read import empty_records

    return {name: frame.schema for name, frame in summarize(empty_records(spark)).items()}


class Summaries:
    """The merged summaries a report derives its tables from: ``frames[name]`` is the union of
    the stored hours' and the on-the-fly summaries (several rows per key: re-aggregate).
    ``cached`` keeps a derived frame that more than one table needs."""

    def __init__(self, frames: dict[str, Any]) -> None:
        self.frames = frames
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        return self.frames[name]

    def records(self) -> Any:
        """The ``rare`` records with their ``time`` column, as the row-level tables want them."""
        F = _f()
        return self.frames["rare"].withColumn("time", F.timestamp_micros(F.col("ts")))

    def cached(self, name: str, build: Callable[[Summaries], Any]) -> Any:
        from pyspark import StorageLevel

        if name not in self._cache:
            self._cache[name] = build(self).persist(StorageLevel.MEMORY_AND_DISK)
        return self._cache[name]

    def release(self) -> None:
        for frame in self._cache.values():
            frame.unpersist()
        self._cache.clear()


def merge(spark: Any, stored: dict[str, Sequence[str]], records: Any | None) -> Summaries:
    """The summaries of the stored hours (``stored``: hour directory -> the summaries that have
    rows there, as its marker lists them) plus those of ``records`` (the hours without stored
    summaries; None: there are none)."""
    schemas = summary_schemas(spark)
    computed = summarize(records) if records is not None else {}
    frames = {}
    for name, _function in SUMMARIES:
        parts = []
        paths = [f"{location}/{SUMMARY_DIR}/{name}" for location, names in sorted(stored.items()) if name in names]
        if paths:
            parts.append(spark.read.schema(schemas[name]).parquet(*paths))
        if name in computed:
            parts.append(computed[name])
        if not parts:
            parts.append(spark.createDataFrame([], schemas[name]))
        frame = parts[0]
        for part in parts[1:]:
            frame = frame.unionByName(part)
        frames[name] = frame
    return Summaries(frames)

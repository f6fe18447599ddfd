"""The report's tables, each derived from the merged summaries (brokerd.pipeline.summaries),
never from the raw records: the messages are reduced once, per hour, and every table
re-aggregates the small summaries.

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
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from brokerd.events import schema
from brokerd.pipeline.gauges import SERIES
from brokerd.pipeline.latency import SAMPLED, SMQP_ONLINE
from brokerd.pipeline.summaries import HOUR_US, ONLINE, QUEUED, UNSPLIT, Summaries

FAR_FUTURE_US = 1 << 62
"""Stands for "still subscribed at the end of the log"."""


def _f() -> Any:
    from pyspark.sql import functions as F

    return F


def traffic(s: Summaries, top: int = 0) -> Any:
    """One aggregation over the traffic and drops summaries together (no join: every drops
    key is a traffic key, both coming from the same records); the drops are first summed per
    reason, so each reason is one entry of the key's map."""
    F = _f()
    keys = ["minute", "topic", "protocol"]
    sums = ["messages", "bytes", "fanout", "delivered", "after_handoff"]
    zero = F.lit(0).cast("long")
    flows = s["traffic"].select(*keys, *sums, "max_fanout", F.lit(None).cast("string").alias("reason"), zero.alias("n"))
    drops = (
        s["drops"].groupBy(*keys, "reason").agg(F.sum("n").cast("long").alias("n"))
        .select(*keys, *[zero.alias(name) for name in sums], F.lit(None).cast("long").alias("max_fanout"), "reason", "n")
    )
    merged = flows.unionByName(drops).groupBy(*keys).agg(
        *[F.sum(name).cast("long").alias(name) for name in sums],
        F.max("max_fanout").cast("long").alias("max_fanout"),
        F.sum("n").cast("long").alias("drops"),
        F.map_from_entries(F.array_sort(F.collect_list(F.when(F.col("reason").isNotNull(), F.struct("reason", "n")))))
        .alias("drops_by_reason"),
    )
    return merged.select(
        F.timestamp_micros(F.col("minute")).alias("minute"),
        "topic",
        "protocol",
        "messages",
        "bytes",
        "fanout",
        "max_fanout",
        (F.col("fanout") + F.col("delivered") - F.col("after_handoff")).alias("deliveries"),
        "drops",
        "drops_by_reason",
    ).orderBy("minute", F.col("topic").asc_nulls_first(), "protocol")


PERCENTILES = (0.5, 0.9, 0.99)


def percentiles(counts: Any, keys: Sequence[str], value: str) -> Any:
    """count, p50_us, p90_us, p99_us, max_us per ``keys`` from value counts (``counts``: the
    keys, ``value`` and ``n``, several rows per value allowed), exact: per group, the smallest
    value whose running count reaches ``ceil(p * count)`` (as Spark's percentile_approx
    defines its answer)."""
    from pyspark.sql import Window

    F = _f()
    values = counts.groupBy(*keys, value).agg(F.sum("n").alias("n"))
    group = Window.partitionBy(*keys)
    running = F.sum("n").over(group.orderBy(value).rowsBetween(Window.unboundedPreceding, Window.currentRow))
    ranked = values.select(*keys, value, running.alias("upto"), F.sum("n").over(group).alias("total"))
    quantiles = [
        F.min(F.when(F.col("upto") >= F.lit(q) * F.col("total"), F.col(value))).alias(f"p{round(q * 100)}_us")
        for q in PERCENTILES
    ]
    return (
        ranked.groupBy(*keys)
        .agg(F.max("total").cast("long").alias("count"), *quantiles, F.max(value).alias("max_us"))
        .select(*keys, "count", *[f"p{round(q * 100)}_us" for q in PERCENTILES], "max_us")
        .orderBy(*[F.col(key).asc_nulls_first() for key in keys])
    )


def latency(s: Summaries, top: int = 0, keys: tuple[str, ...] = ("topic", "protocol", "kind")) -> Any:
    """Every record with ``latency_us``, per ``keys``: exact percentiles of the value counts."""
    return percentiles(s["latency"], keys, "latency_us")


def _ranked(frame: Any, order: list[Any], top: int) -> Any:
    from pyspark.sql import Window

    F = _f()
    limited = frame.orderBy(*order).limit(top)
    return limited.withColumn("rank", F.row_number().over(Window.orderBy(*order))).orderBy("rank")


def top_publishers(s: Summaries, top: int = 100) -> Any:
    F = _f()
    frame = s["publishing"].groupBy("session", "protocol").agg(
        F.sum("messages").cast("long").alias("messages"),
        F.sum("bytes").cast("long").alias("bytes"),
        F.countDistinct("topic").alias("topics"),
        F.sum("fanout").cast("long").alias("fanout"),
        F.timestamp_micros(F.min("first_ts")).alias("first_seen"),
        F.timestamp_micros(F.max("last_ts")).alias("last_seen"),
    )
    order = [F.col("messages").desc(), F.col("bytes").desc(), F.col("session").asc_nulls_last(), F.col("protocol")]
    return _ranked(frame, order, top)


def subscription_intervals(records: Any) -> Any:
    """One row per subscription: session, protocol, topic, start, end (µs; FAR_FUTURE_US
    when it lasted to the end of the log)."""
    F = _f()
    kind = F.col("kind")
    subs = records.filter(kind == schema.SUBSCRIBED).select("session", "protocol", "topic", F.col("ts").alias("start"))
    leaves = records.filter(kind == schema.UNSUBSCRIBED).select(
        F.col("session").alias("u_session"), F.col("protocol").alias("u_protocol"), F.col("topic").alias("u_topic"),
        F.col("ts").alias("u_end"),
    )
    logouts = records.filter(kind == schema.LOGOUT).select(
        F.col("session").alias("l_session"), F.col("protocol").alias("l_protocol"), F.col("ts").alias("l_end")
    )
    keys = ["session", "protocol", "topic", "start"]
    with_leave = (
        subs.join(
            leaves,
            (F.col("session") == F.col("u_session")) & (F.col("protocol") == F.col("u_protocol"))
            & (F.col("topic") == F.col("u_topic")) & (F.col("u_end") > F.col("start")),
            "left",
        )
        .groupBy(*keys)
        .agg(F.min("u_end").alias("u_end"))
    )
    with_logout = (
        with_leave.join(
            logouts,
            (F.col("session") == F.col("l_session")) & (F.col("protocol") == F.col("l_protocol"))
            & (F.col("l_end") > F.col("start")),
            "left",
        )
        .groupBy(*keys, "u_end")
        .agg(F.min("l_end").alias("l_end"))
    )
    end = F.coalesce(F.least(F.col("u_end"), F.col("l_end")), F.lit(FAR_FUTURE_US))
    return with_logout.select(*keys, end.alias("end")).withColumn("interval", F.monotonically_increasing_id())


def internal_sessions(records: Any) -> Any:
    """(session, protocol) of sessions the broker itself runs (SMQP's topic bridges): their
    ``login`` has no ``source``, as they have no connection of their own."""
    F = _f()
    return (
        records.filter((F.col("kind") == schema.LOGIN) & F.col("source").isNull())
        .select("session", "protocol").distinct()
    )


def _subscriptions(s: Summaries) -> Any:
    """The subscriptions of sessions that are not the broker's own, with an ``interval`` id."""
    rare = s.records()
    return subscription_intervals(rare).join(internal_sessions(rare), ["session", "protocol"], "left_anti")


def _routed(s: Summaries) -> Any:
    """Per subscription (``interval``) and publishing protocol: the multicast messages (and
    bytes) accepted on its topic in ``[start, end)``, its session's own excluded.

    The count before an endpoint is the whole hours before the endpoint's hour (``publishing``)
    plus the part of its own hour before it (``before_topic``, ``before_own``, kept per endpoint
    instant); the count in the interval is the count before its end minus before its start.
    """
    F = _f()
    intervals = s.cached("subscriptions", _subscriptions)
    ends = None
    for edge, sign in (("start", -1), ("end", 1)):
        part = intervals.select(
            "interval", "topic", "session", "protocol", F.col(edge).alias("at"), F.lit(sign).alias("sign")
        )
        ends = part if ends is None else ends.unionByName(part)
    ends = F.broadcast(ends.withColumn("e_hour", F.floor(F.col("at") / HOUR_US).cast("long"))).alias("e")
    multicast = s["publishing"].filter((F.col("message") == "multicast") & F.col("topic").isNotNull())
    hourly = multicast.groupBy("hour_index", "topic", F.col("protocol").alias("publishing")).agg(
        F.sum("messages").alias("n"), F.sum("bytes").alias("nb")
    ).alias("h")
    own_hourly = (
        multicast.join(intervals.select("session", "protocol", "topic").distinct(), ["session", "protocol", "topic"], "left_semi")
        .groupBy("hour_index", "topic", "session", "protocol")
        .agg(F.sum("messages").alias("n"), F.sum("bytes").alias("nb"))
        .alias("o")
    )
    before_topic, before_own = s["before_topic"].alias("t"), s["before_own"].alias("w")
    topic = F.col("e.topic")

    def own(alias: str) -> list[Any]:
        return [F.col("e.session") == F.col(f"{alias}.session"), F.col("e.protocol") == F.col(f"{alias}.protocol")]

    pieces = [
        ends.join(hourly, [topic == F.col("h.topic"), F.col("h.hour_index") < F.col("e.e_hour")])
        .select("e.interval", "h.publishing", (F.col("e.sign") * F.col("h.n")).alias("n"), (F.col("e.sign") * F.col("h.nb")).alias("nb")),
        ends.join(before_topic, [topic == F.col("t.topic"), F.col("e.at") == F.col("t.at")])
        .select("e.interval", "t.publishing", (F.col("e.sign") * F.col("t.n")).alias("n"), (F.col("e.sign") * F.col("t.nb")).alias("nb")),
        ends.join(own_hourly, [topic == F.col("o.topic"), *own("o"), F.col("o.hour_index") < F.col("e.e_hour")])
        .select("e.interval", F.col("e.protocol").alias("publishing"),
                (-F.col("e.sign") * F.col("o.n")).alias("n"), (-F.col("e.sign") * F.col("o.nb")).alias("nb")),
        ends.join(before_own, [topic == F.col("w.topic"), *own("w"), F.col("e.at") == F.col("w.at")])
        .select("e.interval", F.col("e.protocol").alias("publishing"),
                (-F.col("e.sign") * F.col("w.n")).alias("n"), (-F.col("e.sign") * F.col("w.nb")).alias("nb")),
    ]
    union = pieces[0]
    for piece in pieces[1:]:
        union = union.unionByName(piece)
    return union.groupBy("interval", "publishing").agg(
        F.sum("n").cast("long").alias("messages"), F.sum("nb").cast("long").alias("bytes")
    )


def top_subscribers(s: Summaries, top: int = 100) -> Any:
    F = _f()
    intervals = s.cached("subscriptions", _subscriptions)
    routed_by = s.cached("routed", _routed)
    per_interval = intervals.join(
        routed_by.groupBy("interval").agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")),
        "interval", "left",
    ).select(
        "session", "protocol", "topic",
        F.coalesce(F.col("messages"), F.lit(0)).alias("messages"),
        F.coalesce(F.col("bytes"), F.lit(0)).alias("bytes"),
    )
    routed = per_interval.groupBy("session", "protocol").agg(
        F.sum("messages").cast("long").alias("routed"),
        F.sum("bytes").cast("long").alias("routed_bytes"),
        F.countDistinct("topic").alias("topics"),
    )
    delivered = s["delivered"].groupBy("session", "protocol").agg(
        F.sum("n").cast("long").alias("delivered"), F.sum("bytes").cast("long").alias("delivered_bytes")
    )
    zero = F.lit(0).cast("long")
    frame = routed.join(delivered, ["session", "protocol"], "full_outer").select(
        "session",
        "protocol",
        (F.coalesce(F.col("routed"), zero) + F.coalesce(F.col("delivered"), zero)).alias("messages"),
        (F.coalesce(F.col("routed_bytes"), zero) + F.coalesce(F.col("delivered_bytes"), zero)).alias("bytes"),
        F.coalesce(F.col("topics"), zero).alias("topics"),
    )
    frame = frame.join(internal_sessions(s.records()), ["session", "protocol"], "left_anti")
    order = [F.col("messages").desc(), F.col("bytes").desc(), F.col("session").asc_nulls_last(), F.col("protocol")]
    return _ranked(frame, order, top)


def cross_protocol(s: Summaries, top: int = 0) -> Any:
    """Publishing protocol x receiving protocol: multicast copies routed to subscribers (as
    top_subscribers counts them: while subscribed, a session's own messages excluded) and
    their bytes.  Deliveries outside the fan-out (``delivered``) carry no sender protocol and
    are not in it."""
    F = _f()
    intervals = s.cached("subscriptions", _subscriptions)
    return (
        s.cached("routed", _routed).join(intervals.select("interval", F.col("protocol").alias("receiving")), "interval")
        .groupBy("publishing", "receiving")
        .agg(F.sum("messages").cast("long").alias("messages"), F.sum("bytes").cast("long").alias("bytes"))
        .filter(F.col("messages") > 0)
        .orderBy("publishing", "receiving")
    )


def slow_consumers(s: Summaries, top: int = 0) -> Any:
    """Congestion episodes: ``dropped`` records for a full output buffer or queue (one record
    per episode, ``dropped`` copies lost)."""
    F = _f()
    return (
        s.records().filter((F.col("kind") == schema.DROPPED) & F.col("reason").isin(schema.SLOW_CONSUMER, schema.QUEUE_FULL))
        .select("time", "protocol", "session", "topic", "reason", F.coalesce(F.col("dropped"), F.lit(1)).cast("long").alias("dropped"))
        .orderBy("time", "session")
    )


def dead_letters(s: Summaries, top: int = 0) -> Any:
    F = _f()
    return (
        s.records().filter(F.col("kind").isin(sorted(schema.DEAD_LETTER_KINDS)))
        .select("time", "kind", "protocol", "topic", "session", "sender", "message_id", "bytes", "reason", "broker")
        .orderBy("time", "message_id")
    )


def auth_failures(s: Summaries, top: int = 0) -> Any:
    F = _f()
    host = F.regexp_extract(F.col("source"), r"^\[?(.*?)\]?:[0-9]+$", 1)
    source = F.when(host != "", host).otherwise(F.col("source"))
    return (
        s.records().filter(F.col("kind") == schema.AUTH_FAILURE)
        .withColumn("source", source)
        .groupBy("source", "protocol")
        .agg(
            F.count(F.lit(1)).alias("failures"),
            F.slice(F.sort_array(F.collect_set("session")), 1, 20).alias("identities"),
            F.sort_array(F.collect_set("scheme")).alias("schemes"),
            F.min("time").alias("first_seen"),
            F.max("time").alias("last_seen"),
        )
        .orderBy(F.col("failures").desc(), F.col("source").asc_nulls_last(), "protocol")
    )


def delivery_latency(s: Summaries, top: int = 0) -> Any:
    """Per receiving protocol: the broker's sampled ``latency`` records (few: they are kept
    whole in ``rare``) and SMQP's ``delivered`` records counted from the moment the subscriber
    was there (``latency_us - queued_us``; all of ``latency_us`` for records without
    ``queued_us``), so a message kept for a subscriber who was away is not a slow delivery."""
    F = _f()
    sampled = s.records().filter((F.col("kind") == schema.LATENCY) & F.col("latency_us").isNotNull()).select(
        "protocol", F.lit(SAMPLED).alias("source"), F.col("latency_us").cast("long").alias("value_us"),
        F.lit(1).cast("long").alias("n"),
    )
    smqp = s["smqp_latency"].filter((F.col("kind") == schema.DELIVERED) & F.col("part").isin(ONLINE, UNSPLIT)).select(
        F.lit("smqp").alias("protocol"), F.lit(SMQP_ONLINE).alias("source"), "value_us", "n"
    )
    return percentiles(sampled.unionByName(smqp), ["protocol", "source"], "value_us")


def smqp_latency_split(s: Summaries, top: int = 0) -> Any:
    """Per SMQP outcome kind: the time queued while the subscriber was away and the rest, of
    the records with ``queued_us`` (logs from before it existed have none: left out)."""
    F = _f()
    return percentiles(s["smqp_latency"].filter(F.col("part").isin(QUEUED, ONLINE)), ["kind", "part"], "value_us")


def queue_gauges(s: Summaries, top: int = 0) -> Any:
    """One row per ``gauge`` record (logged only on change, so few; kept whole in ``rare``):
    time, broker, protocol, pending, unacknowledged, trash."""
    F = _f()
    return (
        s.records().filter(F.col("kind") == schema.GAUGE)
        .select("time", "broker", "protocol", *[F.coalesce(F.col(n), F.lit(0)).cast("long").alias(n) for n, _l, _c in SERIES])
        .orderBy("time", "broker")
    )


Table = Callable[[Summaries, int], Any]
TABLES: tuple[tuple[str, Table], ...] = (
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
"""Every table the report writes, by name, as a function of the summaries and ``--top``."""

"""The report's tables, each a function of the valid records (brokerd.pipeline.read).

Definitions (docs/pipeline.md repeats them for readers of the Parquet files):

traffic          per minute x topic x protocol (the publisher's protocol for accepted
                 messages, the recipient's for per-recipient outcomes; topic null for unicast
                 and broadcast): messages, bytes, fanout (sessions the core handed them to),
                 max_fanout, deliveries (fanout + ``delivered`` events - drops after hand-off),
                 drops and drops_by_reason (``accepted.dropped`` counts as ``unrenderable``).
latency          per topic x protocol x kind, over records with latency_us: count, p50, p90,
                 p99 (Spark's percentile_approx, accuracy 10000: the smallest value with at
                 least that fraction of values at or below it, exact for groups under ~10000
                 values) and max.
top_publishers   sessions by accepted messages: messages, bytes, topics, fanout, first/last.
top_subscribers  sessions by messages routed to them: multicast messages accepted on a topic
                 while they were subscribed to it (from their ``subscribed`` event to the
                 ``unsubscribed`` or ``logout`` after it; a session's own messages excluded)
                 plus ``delivered`` events naming them.
dead_letters     every ``expired`` and ``trashed`` record.
auth_failures    per source host x protocol: failures, identities and schemes tried, first/last.
"""
from __future__ import annotations

from typing import Any

from brokerd.events import schema

FAR_FUTURE_US = 1 << 62
"""Stands for "still subscribed at the end of the log"."""


def _f() -> Any:
    from pyspark.sql import functions as F

    return F


def _count() -> Any:
    """How many messages an ``accepted`` record stands for (a run is one record)."""
    F = _f()
    return F.coalesce(F.col("count"), F.lit(1))


def traffic(records: Any) -> Any:
    F = _f()
    kind = F.col("kind")
    keys = ["minute", "topic", "protocol"]
    base = records.filter(kind.isin(schema.ACCEPTED, schema.DELIVERED, schema.DROPPED)).withColumn(
        "minute", F.date_trunc("minute", F.col("time"))
    )
    accepted = kind == schema.ACCEPTED
    count = _count()
    main = base.groupBy(*keys).agg(
        F.sum(F.when(accepted, count).otherwise(0)).cast("long").alias("messages"),
        F.sum(F.when(accepted, F.coalesce(F.col("bytes"), F.lit(0))).otherwise(0)).cast("long").alias("bytes"),
        F.sum(F.when(accepted, F.coalesce(F.col("fanout"), F.lit(0)) * count).otherwise(0)).cast("long").alias("fanout"),
        F.max(F.when(accepted, F.col("fanout"))).cast("long").alias("max_fanout"),
        F.sum(F.when(kind == schema.DELIVERED, 1).otherwise(0)).cast("long").alias("_delivered"),
        F.sum(
            F.when(
                (kind == schema.DROPPED) & F.col("reason").isin(sorted(schema.AFTER_HANDOFF_REASONS)),
                F.coalesce(F.col("dropped"), F.lit(1)),
            ).otherwise(0)
        ).cast("long").alias("_after_handoff"),
    )
    unrenderable = base.filter(accepted & (F.col("dropped") > 0)).select(
        *keys, F.lit(schema.UNRENDERABLE).alias("reason"), (F.col("dropped") * count).cast("long").alias("n")
    )
    reported = base.filter(kind == schema.DROPPED).select(
        *keys,
        F.coalesce(F.col("reason"), F.lit("unknown")).alias("reason"),
        F.coalesce(F.col("dropped"), F.lit(1)).cast("long").alias("n"),
    )
    drops = (
        unrenderable.unionByName(reported)
        .groupBy(*keys, "reason")
        .agg(F.sum("n").alias("n"))
        .groupBy(*keys)
        .agg(
            F.sum("n").cast("long").alias("drops"),
            F.map_from_entries(F.array_sort(F.collect_list(F.struct("reason", "n")))).alias("drops_by_reason"),
        )
    )
    m, d = main.alias("m"), drops.alias("d")
    joined = m.join(d, [F.col(f"m.{key}").eqNullSafe(F.col(f"d.{key}")) for key in keys], "left")
    empty_map = F.create_map().cast("map<string,bigint>")
    return joined.select(
        *[F.col(f"m.{key}").alias(key) for key in keys],
        "m.messages",
        "m.bytes",
        "m.fanout",
        "m.max_fanout",
        (F.col("m.fanout") + F.col("m._delivered") - F.col("m._after_handoff")).alias("deliveries"),
        F.coalesce(F.col("d.drops"), F.lit(0).cast("long")).alias("drops"),
        F.coalesce(F.col("d.drops_by_reason"), empty_map).alias("drops_by_reason"),
    ).orderBy("minute", F.col("topic").asc_nulls_first(), "protocol")


PERCENTILES = (0.5, 0.9, 0.99)
ACCURACY = 10_000


def latency(records: Any, keys: tuple[str, ...] = ("topic", "protocol", "kind")) -> Any:
    F = _f()
    values = F.percentile_approx(F.col("latency_us"), list(PERCENTILES), ACCURACY)
    return (
        records.filter(F.col("latency_us").isNotNull())
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("count"), values.alias("_p"), F.max("latency_us").alias("max_us"))
        .select(
            *keys,
            "count",
            F.col("_p")[0].alias("p50_us"),
            F.col("_p")[1].alias("p90_us"),
            F.col("_p")[2].alias("p99_us"),
            "max_us",
        )
        .orderBy(*[F.col(key).asc_nulls_first() for key in keys])
    )


def _ranked(frame: Any, order: list[Any], top: int) -> Any:
    from pyspark.sql import Window

    F = _f()
    limited = frame.orderBy(*order).limit(top)
    return limited.withColumn("rank", F.row_number().over(Window.orderBy(*order))).orderBy("rank")


def top_publishers(records: Any, top: int = 100) -> Any:
    F = _f()
    frame = (
        records.filter(F.col("kind") == schema.ACCEPTED)
        .groupBy("session", "protocol")
        .agg(
            F.sum(_count()).cast("long").alias("messages"),
            F.sum(F.coalesce(F.col("bytes"), F.lit(0))).cast("long").alias("bytes"),
            F.countDistinct("topic").alias("topics"),
            F.sum(F.coalesce(F.col("fanout"), F.lit(0)) * _count()).cast("long").alias("fanout"),
            F.min("time").alias("first_seen"),
            F.max("time").alias("last_seen"),
        )
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


COUNT_BUCKET_US = 60_000_000
"""Messages are summed per minute before they meet the subscription endpoints."""


def _counts_between(messages: Any, intervals: Any, keys: list[str]) -> Any:
    """Per interval: messages (and bytes) with ``keys`` equal and ``start <= ts < end``.

    The count at an endpoint is the messages strictly before it: the whole minutes before the
    endpoint's minute (from per-minute sums, a hash aggregation) plus the messages of its own
    minute before it (a broadcast join with the few endpoints).  No sort of the messages.
    """
    F = _f()
    ends = None
    for edge in ("start", "end"):
        part = intervals.select(*keys, "interval", F.col(edge).alias("at"), F.lit(edge).alias("edge"))
        ends = part if ends is None else ends.unionByName(part)
    ends = F.broadcast(ends.withColumn("bucket", F.floor(F.col("at") / COUNT_BUCKET_US)))
    minutes = messages.groupBy(*keys, F.floor(F.col("ts") / COUNT_BUCKET_US).alias("m_bucket")).agg(
        F.sum("c").cast("long").alias("n"), F.sum("b").cast("long").alias("nb")
    )
    e, m = ends.alias("e"), minutes.alias("m")
    same = [F.col(f"e.{key}") == F.col(f"m.{key}") for key in keys]
    whole = e.join(m, same + [F.col("m.m_bucket") < F.col("e.bucket")], "inner").select(
        "e.interval", "e.edge", "m.n", "m.nb"
    )
    t = messages.select(*keys, "ts", F.col("c").cast("long").alias("n"), F.col("b").cast("long").alias("nb")).alias("t")
    same = [F.col(f"e.{key}") == F.col(f"t.{key}") for key in keys]
    partial = e.join(
        t, same + [F.floor(F.col("t.ts") / COUNT_BUCKET_US) == F.col("e.bucket"), F.col("t.ts") < F.col("e.at")], "inner"
    ).select("e.interval", "e.edge", "t.n", "t.nb")
    sign = F.when(F.col("edge") == "end", 1).otherwise(-1)
    return (
        whole.unionByName(partial)
        .groupBy("interval")
        .agg((F.sum(sign * F.col("n"))).alias("messages"), (F.sum(sign * F.col("nb"))).alias("bytes"))
    )


def internal_sessions(records: Any) -> Any:
    """(session, protocol) of sessions the broker itself runs (SMQP's topic bridges): their
    ``login`` has no ``source``, as they have no connection of their own."""
    F = _f()
    return (
        records.filter((F.col("kind") == schema.LOGIN) & F.col("source").isNull())
        .select("session", "protocol").distinct()
    )


def top_subscribers(records: Any, top: int = 100) -> Any:
    F = _f()
    intervals = subscription_intervals(records).join(internal_sessions(records), ["session", "protocol"], "left_anti").persist()
    multicast = records.filter(
        (F.col("kind") == schema.ACCEPTED) & (F.col("message") == "multicast") & F.col("topic").isNotNull()
    ).select("topic", "ts", F.coalesce(F.col("bytes"), F.lit(0)).alias("b"), _count().alias("c"), "session", "protocol")
    on_topic = _counts_between(multicast.select("topic", "ts", "b", "c"), intervals, ["topic"])
    # the subscriber's own messages on the topic while subscribed are not routed to it
    own_messages = multicast.join(
        intervals.select("session", "protocol", "topic").distinct(), ["session", "protocol", "topic"], "left_semi"
    )
    own = _counts_between(own_messages, intervals, ["topic", "session", "protocol"]).select(
        "interval", F.col("messages").alias("own_messages"), F.col("bytes").alias("own_bytes")
    )
    per_interval = (
        intervals.join(on_topic, "interval", "left")
        .join(own, "interval", "left")
        .select(
            "session", "protocol", "topic",
            (F.coalesce(F.col("messages"), F.lit(0)) - F.coalesce(F.col("own_messages"), F.lit(0))).alias("messages"),
            (F.coalesce(F.col("bytes"), F.lit(0)) - F.coalesce(F.col("own_bytes"), F.lit(0))).alias("bytes"),
        )
    )
    routed = per_interval.groupBy("session", "protocol").agg(
        F.sum("messages").cast("long").alias("routed"),
        F.sum("bytes").cast("long").alias("routed_bytes"),
        F.countDistinct("topic").alias("topics"),
    )
    delivered = (
        records.filter(F.col("kind") == schema.DELIVERED)
        .groupBy("session", "protocol")
        .agg(
            F.count(F.lit(1)).cast("long").alias("delivered"),
            F.sum(F.coalesce(F.col("bytes"), F.lit(0))).cast("long").alias("delivered_bytes"),
        )
    )
    zero = F.lit(0).cast("long")
    frame = routed.join(delivered, ["session", "protocol"], "full_outer").select(
        "session",
        "protocol",
        (F.coalesce(F.col("routed"), zero) + F.coalesce(F.col("delivered"), zero)).alias("messages"),
        (F.coalesce(F.col("routed_bytes"), zero) + F.coalesce(F.col("delivered_bytes"), zero)).alias("bytes"),
        F.coalesce(F.col("topics"), zero).alias("topics"),
    )
    frame = frame.join(internal_sessions(records), ["session", "protocol"], "left_anti")
    order = [F.col("messages").desc(), F.col("bytes").desc(), F.col("session").asc_nulls_last(), F.col("protocol")]
    return _ranked(frame, order, top)


def cross_protocol(records: Any) -> Any:
    """Publishing protocol x receiving protocol: multicast copies routed to subscribers (as
    top_subscribers counts them: while subscribed, a session's own messages excluded) and
    their bytes.  Deliveries outside the fan-out (``delivered``) carry no sender protocol and
    are not in it."""
    F = _f()
    multicast = records.filter(
        (F.col("kind") == schema.ACCEPTED) & (F.col("message") == "multicast") & F.col("topic").isNotNull()
    ).select(
        "topic", "ts", F.coalesce(F.col("bytes"), F.lit(0)).alias("b"), _count().alias("c"), "session", "protocol",
        F.col("protocol").alias("publishing"),
    )
    subscribers = subscription_intervals(records).join(internal_sessions(records), ["session", "protocol"], "left_anti")
    per = (
        subscribers.crossJoin(multicast.select("publishing").distinct())
        .withColumn("interval", F.xxhash64("interval", "publishing"))
        .persist()
    )
    keys = ["topic", "publishing"]
    on_topic = _counts_between(multicast.select(*keys, "ts", "b", "c"), per, keys)
    own_messages = multicast.join(subscribers.select("session", "protocol", "topic").distinct(), ["session", "protocol", "topic"], "left_semi")
    own = _counts_between(own_messages, per, ["topic", "session", "protocol", "publishing"]).select(
        "interval", F.col("messages").alias("own_messages"), F.col("bytes").alias("own_bytes")
    )
    return (
        per.join(on_topic, "interval", "left").join(own, "interval", "left")
        .groupBy("publishing", F.col("protocol").alias("receiving"))
        .agg(
            F.sum(F.coalesce(F.col("messages"), F.lit(0)) - F.coalesce(F.col("own_messages"), F.lit(0))).cast("long").alias("messages"),
            F.sum(F.coalesce(F.col("bytes"), F.lit(0)) - F.coalesce(F.col("own_bytes"), F.lit(0))).cast("long").alias("bytes"),
        )
        .filter(F.col("messages") > 0)
        .orderBy("publishing", "receiving")
    )


def slow_consumers(records: Any) -> Any:
    """Congestion episodes: ``dropped`` records for a full output buffer or queue (one record
    per episode, ``dropped`` copies lost)."""
    F = _f()
    return (
        records.filter((F.col("kind") == schema.DROPPED) & F.col("reason").isin(schema.SLOW_CONSUMER, schema.QUEUE_FULL))
        .select("time", "protocol", "session", "topic", "reason", F.coalesce(F.col("dropped"), F.lit(1)).cast("long").alias("dropped"))
        .orderBy("time", "session")
    )


def dead_letters(records: Any) -> Any:
    F = _f()
    return (
        records.filter(F.col("kind").isin(sorted(schema.DEAD_LETTER_KINDS)))
        .select("time", "kind", "protocol", "topic", "session", "sender", "message_id", "bytes", "reason", "broker")
        .orderBy("time", "message_id")
    )


def auth_failures(records: Any) -> Any:
    F = _f()
    host = F.regexp_extract(F.col("source"), r"^\[?(.*?)\]?:[0-9]+$", 1)
    source = F.when(host != "", host).otherwise(F.col("source"))
    return (
        records.filter(F.col("kind") == schema.AUTH_FAILURE)
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

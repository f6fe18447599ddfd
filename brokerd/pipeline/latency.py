"""Delivery latency per receiving protocol, and SMQP's latency split into its two parts.

Two tables, from records that carry ``latency_us`` (docs/events.md):

delivery_latency     per receiving protocol: count, p50/p90/p99/max in µs.  SSMP, MCCHAT and
                     socket.mq from the broker's sampled ``latency`` records (acceptance by the
                     core to the write to the recipients' connections, a few samples a second);
                     SMQP from its ``delivered`` records, counted from the moment the
                     subscriber was there (``latency_us - queued_us``), so a message kept for a
                     subscriber who was away does not read as a slow delivery.
smqp_latency_split   per SMQP outcome kind (delivered, acked) and part: ``queued`` (the time the
                     message waited for its subscriber to come online, ``queued_us``) and
                     ``online`` (the rest: delivery, or delivery and acknowledgement, once it
                     was there).  Records from before ``queued_us`` existed are left out.

Percentiles are Spark's percentile_approx (brokerd.pipeline.tables.PERCENTILES, ACCURACY).
"""
from __future__ import annotations

from typing import Any

from brokerd.events import schema
from brokerd.pipeline.tables import ACCURACY, PERCENTILES

PROTOCOLS = ("ssmp", "mcchat", "socketmq", "smqp")
"""Every front end: the report has a latency section for each, with or without data."""
SAMPLED = "sampled write"
"""``delivery_latency.source`` of the broker's ``latency`` samples."""
SMQP_ONLINE = "delivered, once online"
"""``delivery_latency.source`` of SMQP's ``delivered`` records."""


def _f() -> Any:
    from pyspark.sql import functions as F

    return F


def percentiles(frame: Any, keys: list[str], value: str) -> Any:
    """count, p50_us, p90_us, p99_us, max_us of column ``value`` per ``keys``."""
    F = _f()
    values = F.percentile_approx(F.col(value), list(PERCENTILES), ACCURACY)
    return (
        frame.groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("count"), values.alias("_p"), F.max(value).alias("max_us"))
        .select(*keys, "count", F.col("_p")[0].alias("p50_us"), F.col("_p")[1].alias("p90_us"),
                F.col("_p")[2].alias("p99_us"), "max_us")
        .orderBy(*keys)
    )


def delivery_latency(records: Any) -> Any:
    F = _f()
    kind = F.col("kind")
    sampled = records.filter((kind == schema.LATENCY) & F.col("latency_us").isNotNull()).select(
        "protocol", F.lit(SAMPLED).alias("source"), F.col("latency_us").alias("value")
    )
    smqp = records.filter(
        (kind == schema.DELIVERED) & (F.col("protocol") == "smqp") & F.col("latency_us").isNotNull()
    ).select(
        "protocol", F.lit(SMQP_ONLINE).alias("source"),
        F.greatest(F.col("latency_us") - F.coalesce(F.col("queued_us"), F.lit(0)), F.lit(0)).alias("value"),
    )
    return percentiles(sampled.unionByName(smqp), ["protocol", "source"], "value")


def smqp_latency_split(records: Any) -> Any:
    F = _f()
    outcomes = records.filter(
        F.col("kind").isin(schema.DELIVERED, schema.ACKED) & (F.col("protocol") == "smqp")
        & F.col("latency_us").isNotNull() & F.col("queued_us").isNotNull()
    )
    queued = outcomes.select("kind", F.lit("queued").alias("part"), F.col("queued_us").alias("value"))
    online = outcomes.select(
        "kind", F.lit("online").alias("part"), F.greatest(F.col("latency_us") - F.col("queued_us"), F.lit(0)).alias("value")
    )
    return percentiles(queued.unionByName(online), ["kind", "part"], "value")


def sections_html(rows: list[dict[str, Any]], split: list[dict[str, Any]], plot: str, split_plot: str) -> str:
    """The report's delivery-latency part: a plot, then one section per protocol (each says
    what its figures measure, or that the log has none), then SMQP's split."""
    import html

    by_protocol: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_protocol.setdefault(row["protocol"], []).append(row)
    parts = [f'<img alt="delivery latency by protocol" src="{plot}">']
    for protocol in PROTOCOLS:
        found = by_protocol.get(protocol, [])
        if found:
            body = "".join(
                f"<tr><td>{html.escape(r['source'])}</td><td>{r['count']:,}</td><td>{r['p50_us']:,}</td>"
                f"<td>{r['p90_us']:,}</td><td>{r['p99_us']:,}</td><td>{r['max_us']:,}</td></tr>" for r in found
            )
            content = ("<table><thead><tr><th>measured</th><th>count</th><th>p50 µs</th><th>p90 µs</th>"
                       f"<th>p99 µs</th><th>max µs</th></tr></thead><tbody>{body}</tbody></table>")
        else:
            content = "<p class=empty>no latency records for this protocol in this log</p>"
        parts.append(f'<section class="latency" id="latency-{protocol}"><h3>{protocol}</h3>{content}</section>')
    parts.append('<h3 id="smqp-split">SMQP: queued while the subscriber was away vs. delivered once online</h3>')
    if split:
        parts.append(f'<img alt="SMQP latency split" src="{split_plot}">')
        body = "".join(
            f"<tr><td>{html.escape(r['kind'])}</td><td>{html.escape(r['part'])}</td><td>{r['count']:,}</td>"
            f"<td>{r['p50_us']:,}</td><td>{r['p90_us']:,}</td><td>{r['p99_us']:,}</td><td>{r['max_us']:,}</td></tr>"
            for r in split
        )
        parts.append('<table id="smqp-split-table"><thead><tr><th>outcome</th><th>part</th><th>count</th><th>p50 µs</th>'
                     f"<th>p90 µs</th><th>p99 µs</th><th>max µs</th></tr></thead><tbody>{body}</tbody></table>")
    else:
        parts.append("<p class=empty>no SMQP outcomes with queued_us in this log</p>")
    return "\n".join(parts)

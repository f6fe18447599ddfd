"""The report's delivery-latency part: per receiving protocol, and SMQP's latency split.

Two tables, derived in brokerd.pipeline.tables from the per-hour summaries (docs/events.md
for the records):

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

Percentiles are exact (brokerd.pipeline.tables.percentiles).  This module names the tables'
sources and renders their section of the HTML.
"""
from __future__ import annotations

from typing import Any

PROTOCOLS = ("ssmp", "mcchat", "socketmq", "smqp")
"""Every front end: the report has a latency section for each, with or without data."""
SAMPLED = "sampled write"
"""``delivery_latency.source`` of the broker's ``latency`` samples."""
SMQP_ONLINE = "delivered, once online"
"""``delivery_latency.source`` of SMQP's ``delivered`` records."""


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

"""The HTML report: one self-contained file, plots embedded as ``data:image/png;base64``.

It is built from the small, already-collected results of the report job (plain Python
values), so it neither needs nor touches Spark.  Plots are drawn with matplotlib's
object API on an Agg canvas (no pyplot, no display).

Its delivery-latency part has a section per receiving protocol (:data:`PROTOCOLS`), with or
without data (the tables and their sources: brokerd.pipeline.tables).  SMQP's queue readings
are logged only when a figure changed: a reading holds until the next one, drawn as a step.
"""
from __future__ import annotations

import base64
import html
import io
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PROTOCOLS = ("ssmp", "mcchat", "socketmq", "smqp")
"""Every front end: the report has a latency section for each, with or without data."""
SAMPLED = "sampled write"
"""``delivery_latency.source`` of the broker's ``latency`` samples."""
SMQP_ONLINE = "delivered, once online"
"""``delivery_latency.source`` of SMQP's ``delivered`` records."""
SERIES = (("pending", "pending (never sent)", "#1f77b4"), ("unacknowledged", "sent, not acknowledged", "#ff7f0e"),
          ("trash", "in the Trash", "#7f7f7f"))
"""The ``queue_gauges`` columns: their labels and colours in the plot."""


def literal(text: object) -> str:
    """``text`` as matplotlib must show it: literally.  matplotlib reads a string with an even
    number of unescaped ``$`` as mathtext, where ``_``, ``^`` and ``\\`` are commands and a bad
    one fails the whole figure (a topic ``$\\nope$`` stopped the report); an escaped ``\\$``
    is drawn as ``$`` and stops that.  Every string that comes from the log (topics,
    protocols, kinds) goes through here on its way into a plot, once."""
    return str(text).replace("$", "\\$")


PROTOCOL_COLOURS = {"ssmp": "#1f77b4", "mcchat": "#ff7f0e", "smqp": "#2ca02c", "socketmq": "#d62728",
                    "mqtt": "#9467bd", "sys": "#8c564b"}
"""One colour per protocol of the log (the ``protocol`` field of brokerd.events.schema, and
``sys`` for the broker's statistics topics), none of them another's."""
OTHER_PROTOCOL_COLOUR = "#7f7f7f"
"""A protocol without its own colour (a newer broker's): grey, not matplotlib's next colour,
which is SSMP's."""


def png(figure: Figure) -> str:
    """``figure`` as a ``data:`` URI of a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(width: float = 9.0, height: float = 3.6) -> tuple[Figure, Any]:
    """A figure and its one plot.  The plot is untyped: matplotlib's hints leave out the
    datetimes its unit converters take (the time axes' step lines)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    return figure, figure.add_subplot(1, 1, 1)


def _no_data(axes: Axes, what: str) -> None:
    axes.text(0.5, 0.5, f"no {what} in this log", ha="center", va="center", transform=axes.transAxes, color="#666")
    axes.set_xticks([])
    axes.set_yticks([])


def legend_beside(axes: Axes) -> None:
    """The legend right of the plot, outside it, so that it never covers a line or a bar (the
    PNG is cut to fit with ``bbox_inches="tight"``, which keeps it)."""
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def axis_from_zero(axes: Axes, values: list[float]) -> None:
    """A vertical axis from zero; when every value is zero, from 0 to 1 with whole ticks
    (matplotlib would otherwise span a hair's width around zero: 0.00 to 0.05)."""
    from matplotlib.ticker import MaxNLocator

    if max(values, default=0) <= 0:
        axes.set_ylim(0, 1)
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        axes.set_ylim(bottom=0)


def rate_figure(series: dict[str, list[tuple[datetime, float]]], bucket_seconds: int) -> Figure:
    """Messages per second over time, one step line per protocol: a bucket's rate is drawn
    flat across the bucket, so a few buckets read as bars, not as a line between points."""
    figure, axes = _figure()
    if not any(series.values()):
        _no_data(axes, "accepted messages")
    else:
        width = timedelta(seconds=bucket_seconds)
        for protocol, points in sorted(series.items()):
            times, rates = _steps(sorted(points), width)
            axes.step(times, rates, where="post", label=literal(protocol), color=PROTOCOL_COLOURS.get(protocol, OTHER_PROTOCOL_COLOUR),
                      linewidth=1.4)
        axis_from_zero(axes, [rate for points in series.values() for _at, rate in points])
        axes.set_ylabel("messages/s")
        axes.set_xlabel(f"time (UTC), {bucket_seconds} s buckets")
        legend_beside(axes)
        axes.grid(alpha=0.3)
        figure.autofmt_xdate()
    axes.set_title("Accepted messages per second, by protocol")
    return figure


def _steps(points: list[tuple[datetime, float]], width: timedelta) -> tuple[list[datetime], list[float]]:
    """Corners of a ``where="post"`` step line: each bucket's rate held across the bucket, zero
    in the buckets without messages (which the table leaves out) and after the last one."""
    times: list[datetime] = []
    rates: list[float] = []
    for index, (at, rate) in enumerate(points):
        times.append(at)
        rates.append(rate)
        end = at + width
        if index + 1 == len(points) or points[index + 1][0] > end:
            times.append(end)
            rates.append(0.0)
    return times, rates


LOG_SCALE_RATIO = 100
"""Latency bars use a log axis when the largest value is this many times the smallest."""
LOG_FLOOR = 0.5
"""The bottom of a log axis: below 1 µs, so that a bar of 0 (drawn 1 µs tall) shows."""


def latency_figure(rows: list[dict[str, Any]], title: str = "Latency percentiles, by protocol and kind") -> Figure:
    """p50/p90/p99/max per protocol and kind: a linear axis from zero, or a log axis when the
    values span orders of magnitude (said in the axis label)."""
    figure, axes = _figure()
    if not rows:
        _no_data(axes, "latency measurements")
    else:
        labels = [literal(f"{row['protocol']} {row['kind']}") for row in rows]
        width = 0.2
        keys = (("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("max_us", "max"))
        values = [row[key] for row in rows for key, _ in keys if row[key] is not None]
        positive = [v for v in values if v > 0]
        log = bool(positive) and max(positive) >= LOG_SCALE_RATIO * min(positive)
        for offset, (key, name) in enumerate(keys):
            places = [i + (offset - 1.5) * width for i in range(len(rows))]
            heights = [max(1, row[key] or 0) if log else (row[key] or 0) for row in rows]
            axes.bar(places, heights, width, label=name)
            if log:  # a log axis has no zero: such a bar is 1 µs tall over a floor below it, and says 0
                for place, row in zip(places, rows):
                    if not row[key]:
                        axes.text(place, 1, "0", ha="center", va="bottom", fontsize=7)
        axes.set_xlim(-0.6, len(rows) - 0.4)
        axes.set_xticks(range(len(rows)))
        axes.set_xticklabels(labels, rotation=20, ha="right")
        if log:
            axes.set_yscale("log")
            axes.set_ylim(bottom=LOG_FLOOR)
            axes.set_ylabel("microseconds (log scale)")
        else:
            axis_from_zero(axes, values)
            axes.set_ylabel("microseconds")
        legend_beside(axes)
        axes.grid(alpha=0.3, axis="y")
    axes.set_title(literal(title))
    return figure


def cross_protocol_table(rows: list[dict[str, Any]]) -> str:
    """Publishing protocol (rows) x receiving protocol (columns): messages and bytes."""
    if not rows:
        return "<p class=empty>no multicast messages reached a subscriber</p>"
    publishing = sorted({row["publishing"] for row in rows})
    receiving = sorted({row["receiving"] for row in rows})
    cells = {(row["publishing"], row["receiving"]): row for row in rows}
    head = "<th>published on ↓, received on →</th>" + "".join(f"<th>{html.escape(r)}</th>" for r in receiving)
    body = ""
    for p in publishing:
        body += f"<tr><th>{html.escape(p)}</th>"
        for r in receiving:
            cell = cells.get((p, r))
            body += "<td>—</td>" if cell is None else f"<td>{cell['messages']:,} msgs<br>{cell['bytes']:,} B</td>"
        body += "</tr>"
    return f'<table class="matrix" id="cross-protocol"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def topics_figure(rows: list[tuple[str, int]]) -> Figure:
    """The busiest topics by accepted messages."""
    figure, axes = _figure(height=max(2.5, 0.35 * len(rows) + 1))
    if not rows:
        _no_data(axes, "topics")
    else:
        names = [literal(name) for name, _ in rows][::-1]
        axes.barh(names, [count for _, count in rows][::-1], color="#4c72b0")
        axes.set_xlabel("messages")
        axes.grid(alpha=0.3, axis="x")
    axes.set_title("Top topics")
    return figure


def _table(rows: list[dict[str, Any]], columns: list[str], headers: list[str] | None = None,
           attributes: str = "") -> str:
    if not rows:
        return "<p class=empty>none</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in headers or columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
    )
    return f"<table{attributes}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in sorted(value.items()))
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; }
th { background: #f5f5f5; } .empty { color: #888; } img { max-width: 100%; } .bad { color: #b00; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; } dt { font-weight: 600; }
"""


def render(report: dict[str, Any], plots: dict[str, str]) -> str:
    """The whole page.  ``report`` is the collected summary (see brokerd.pipeline.report);
    ``plots`` maps plot names to data: URIs."""
    quality = report["quality"]
    bad = sum(v for k, v in quality.items() if k != "ok")
    facts = [
        ("data dir", report["data_dir"]),
        ("window", f"{report['since'] or 'start of log'} — {report['until'] or 'end of log'}"),
        ("first / last event", f"{report['first_event'] or '—'} / {report['last_event'] or '—'}"),
        ("events", f"{report['events']:,}"),
        ("accepted messages", f"{report['messages']:,}"),
        ("bad lines skipped", f"{bad:,} ({', '.join(f'{k}: {v:,}' for k, v in quality.items() if k != 'ok')})"),
        ("dead letters", f"{report['dead_letters']:,}"),
        ("auth failures", f"{report['auth_failure_count']:,}"),
    ]
    facts_html = "".join(f"<dt>{html.escape(k)}</dt><dd{' class=bad' if k.startswith('bad') and bad else ''}>{html.escape(v)}</dd>" for k, v in facts)
    by_kind = _table([{"kind": k, "events": v} for k, v in sorted(report["events_by_kind"].items())], ["kind", "events"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>brokerd report</title><style>{_STYLE}</style></head>
<body>
<h1>brokerd event log report</h1>
<p>Generated {html.escape(report['generated'])} by brokerd-report from {html.escape(report['events_path'])}.</p>
<dl>{facts_html}</dl>
<h2>Messages per second</h2>
<img alt="messages per second by protocol" src="{plots['rate']}">
<h2>Latency</h2>
<img alt="latency percentiles" src="{plots['latency']}">
{_table(report['latency_by_protocol'], ['protocol', 'kind', 'count', 'p50_us', 'p90_us', 'p99_us', 'max_us'])}
<p class=note>Every record with <code>latency_us</code>, by the protocol and kind that logged it: SMQP's
acknowledgements count from acceptance, time queued while the subscriber was away included.</p>
<h2>Delivery latency by protocol</h2>
{latency_sections(report.get('delivery_latency', []), report.get('smqp_latency_split', []),
                  plots['delivery_latency'], plots['smqp_split'])}
<h2>SMQP queue depth and Trash</h2>
<img alt="SMQP queue depth and Trash" src="{plots['queue']}">
<h2>Cross-protocol traffic</h2>
{cross_protocol_table(report.get('cross_protocol', []))}
<h2>Slow consumers</h2>
<p>{report.get('slow_consumer_episodes', 0):,} congestion episode(s) (a full output buffer or queue); the latest:</p>
{_table(report.get('slow_consumers', []), ['time', 'protocol', 'session', 'topic', 'reason', 'dropped'])}
<h2>Top topics</h2>
<img alt="top topics" src="{plots['topics']}">
{_table([{"topic": name, "messages": count} for name, count in report['top_topics']], ['topic', 'messages'])}
<h2>Top publishers</h2>
{_table(report['top_publishers'], ['rank', 'session', 'protocol', 'messages', 'bytes', 'topics'])}
<h2>Top subscribers</h2>
{_table(report['top_subscribers'], ['rank', 'session', 'protocol', 'messages', 'bytes', 'topics'])}
<h2>Auth failures by source</h2>
{_table(report['auth_failures'], ['source', 'protocol', 'failures', 'identities', 'first_seen', 'last_seen'])}
<h2>Events by kind</h2>
{by_kind}
<h2>Tables</h2>
<p>Parquet tables under {html.escape(report['out'])}: {', '.join(html.escape(t) for t in report['tables'])}.</p>
</body></html>
"""


def queue_figure(rows: list[dict[str, Any]]) -> Figure:
    """Pending, unacknowledged and Trash counts over time, as steps (axis from zero)."""
    figure, axes = _figure()
    if not rows:
        _no_data(axes, "SMQP queue readings")
    else:
        times: list[datetime] = [row["time"] for row in rows]
        for name, label, colour in SERIES:
            values = [row[name] for row in rows]
            axes.step(times + [times[-1]], values + [values[-1]], where="post", label=label, color=colour, linewidth=1.4)
        axis_from_zero(axes, [row[name] for row in rows for name, _label, _colour in SERIES])
        axes.set_ylabel("messages")
        axes.set_xlabel("time (UTC)")
        legend_beside(axes)
        axes.grid(alpha=0.3)
        figure.autofmt_xdate()
    axes.set_title("SMQP queue depth and Trash")
    return figure


_PERCENTILES = ["count", "p50_us", "p90_us", "p99_us", "max_us"]
_PERCENTILE_HEADERS = ["count", "p50 µs", "p90 µs", "p99 µs", "max µs"]


def latency_sections(rows: list[dict[str, Any]], split: list[dict[str, Any]], plot: str, split_plot: str) -> str:
    """The report's delivery-latency part: a plot, then one section per protocol (each says
    what its figures measure, or that the log has none), then SMQP's split."""
    by_protocol: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_protocol.setdefault(row["protocol"], []).append(row)
    parts = [f'<img alt="delivery latency by protocol" src="{plot}">']
    for protocol in PROTOCOLS:
        found = by_protocol.get(protocol, [])
        content = (_table(found, ["source", *_PERCENTILES], ["measured", *_PERCENTILE_HEADERS]) if found
                   else "<p class=empty>no latency records for this protocol in this log</p>")
        parts.append(f'<section class="latency" id="latency-{protocol}"><h3>{protocol}</h3>{content}</section>')
    parts.append('<h3 id="smqp-split">SMQP: queued while the subscriber was away vs. delivered once online</h3>')
    if split:
        parts.append(f'<img alt="SMQP latency split" src="{split_plot}">')
        parts.append(_table(split, ["kind", "part", *_PERCENTILES], ["outcome", "part", *_PERCENTILE_HEADERS],
                            ' id="smqp-split-table"'))
    else:
        parts.append("<p class=empty>no SMQP outcomes with queued_us in this log</p>")
    return "\n".join(parts)

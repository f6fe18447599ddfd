"""An MQTT filter subscription (``#``, ``sensors/+``) counts the messages of every topic it
matches in the report's subscriber tables, as the broker routes them; the plots give each
protocol a colour of its own and keep zero-valued bars on a log axis.  In process, with
pyarrow (the summaries and tables both engines share)."""
from __future__ import annotations

from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.pipeline.summaries import merge, record_schema, summarize_table
from brokerd.pipeline.tables import compute
from tests.pipeline.test_report import H0, S

HOUR = 3600 * S


def record(ts: int, protocol: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "ts": ts, "broker": "b1", "protocol": protocol, "kind": kind, **fields}


def published(ts: int, protocol: str, session: str, topic: str) -> dict[str, Any]:
    return record(ts, protocol, "accepted", session=session, topic=topic, message="multicast", bytes=10, fanout=1)


HOUR_10 = [
    record(H0 + 1 * S, "mqtt", "login", session="wild", source="127.0.0.1:1"),
    record(H0 + 1 * S, "mqtt", "login", session="plus", source="127.0.0.1:2"),
    record(H0 + 1 * S, "ssmp", "login", session="literal", source="127.0.0.1:3"),
    published(H0 + 1 * S, "ssmp", "alice", "news"),  # before every subscription: nobody's
    record(H0 + 2 * S, "mqtt", "subscribed", session="wild", topic="#"),
    record(H0 + 2 * S, "mqtt", "subscribed", session="plus", topic="sensors/+"),
    record(H0 + 2 * S, "ssmp", "subscribed", session="literal", topic="news"),
    published(H0 + 10 * S, "ssmp", "alice", "news"),  # wild, literal
    published(H0 + 20 * S, "ssmp", "alice", "sensors/kitchen"),  # wild, plus
    published(H0 + 25 * S, "ssmp", "alice", "$internal/x"),  # '#' does not reach '$' topics
    published(H0 + 30 * S, "mqtt", "wild", "news"),  # literal; not wild, its own
    record(H0 + 40 * S, "mqtt", "unsubscribed", session="plus", topic="sensors/+"),
    published(H0 + 50 * S, "ssmp", "alice", "sensors/hall"),  # wild only: plus has left
]
HOUR_11 = [
    published(H0 + HOUR + 5 * S, "socketmq", "sam", "news"),  # wild, literal: the hours before add up
    published(H0 + HOUR + 6 * S, "ssmp", "alice", "sensors/kitchen/deep"),  # wild; '+' is one level
]


def tables(hours: list[list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    parts: dict[str, list[Any]] = {}
    for hour in hours:
        for name, table in summarize_table(pa.Table.from_pylist(hour, schema=record_schema())).items():
            parts.setdefault(name, []).append(table)
    return {name: table.to_pylist() for name, table in compute(merge(parts), 10).items()}


def test_a_filter_subscriber_counts_every_topic_its_filter_matches() -> None:
    found = tables([HOUR_10, HOUR_11])
    subscribers = {(row["session"], row["protocol"]): row["messages"] for row in found["top_subscribers"]}
    assert subscribers == {("wild", "mqtt"): 5, ("plus", "mqtt"): 1, ("literal", "ssmp"): 3}
    cross = {(row["publishing"], row["receiving"]): row["messages"] for row in found["cross_protocol"]}
    assert cross == {("ssmp", "mqtt"): 5, ("socketmq", "mqtt"): 1, ("ssmp", "ssmp"): 1, ("mqtt", "ssmp"): 1,
                     ("socketmq", "ssmp"): 1}


def test_the_same_counts_when_the_hour_is_summarised_in_parts() -> None:
    """Summaries of parts of an hour merge as hours do (the endpoints given to each part)."""
    endpoints = pa.Table.from_pylist([r for r in HOUR_10 if r["kind"] in ("subscribed", "unsubscribed", "logout")],
                                     schema=record_schema())
    parts: dict[str, list[Any]] = {}
    for part in (HOUR_10[:6], HOUR_10[6:], HOUR_11):
        table = pa.Table.from_pylist(part, schema=record_schema())
        given = endpoints if part is not HOUR_11 else None
        for name, summary in summarize_table(table, given).items():
            parts.setdefault(name, []).append(summary)
    found = {name: table.to_pylist() for name, table in compute(merge(parts), 10).items()}
    assert found["top_subscribers"] == tables([HOUR_10, HOUR_11])["top_subscribers"]


def test_every_protocol_has_a_colour_of_its_own_and_zero_bars_show_on_a_log_axis() -> None:
    pytest.importorskip("matplotlib")
    from datetime import datetime, timedelta, timezone

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from brokerd.pipeline.html import PROTOCOL_COLOURS, latency_figure, rate_figure

    protocols = ["ssmp", "mcchat", "smqp", "socketmq", "mqtt", "sys", "newer"]
    start = datetime(2024, 5, 1, tzinfo=timezone.utc)
    figure = rate_figure({p: [(start + timedelta(seconds=10 * i), float(i)) for i in range(5)] for p in protocols}, 10)
    colours = {line.get_label(): line.get_color() for line in figure.axes[0].get_lines()}
    assert set(colours) == set(protocols)
    assert len(set(colours.values())) == len(protocols), colours  # mqtt's is not ssmp's
    assert all(colours[p] == PROTOCOL_COLOURS[p] for p in protocols if p != "newer")

    rows = [{"protocol": "mqtt", "kind": "deliver", "p50_us": 0, "p90_us": 0, "p99_us": 5, "max_us": 90_000}]
    figure = latency_figure(rows)
    axes = figure.axes[0]
    FigureCanvasAgg(figure).draw()
    assert axes.get_yscale() == "log"
    bottom = axes.get_ylim()[0]
    bars = [patch for patch in axes.patches]
    assert len(bars) == 4
    assert all(patch.get_height() > bottom for patch in bars)  # the zero bars reach above the floor
    assert [text.get_text() for text in axes.texts] == ["0", "0"]  # and say what they are

"""The report job on local Spark: a log with known contents (and bad lines, and hours outside
the window) gives tables whose every figure is asserted; the HTML report has its plots; an
empty or missing log gives an empty report."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.events import schema
from brokerd.pipeline.report import run_report
from brokerd.pipeline.timespec import parse_time

pytestmark = [pytest.mark.spark, pytest.mark.slow]

H0 = 1_714_557_600_000_000  # 2024-05-01T10:00:00Z
S = 1_000_000


def _t(minute: int, second: int = 0) -> datetime:
    return datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc).replace(hour=10 + minute // 60, minute=minute % 60, second=second)


def rec(ts: int, protocol: str, kind: str, **fields: Any) -> str:
    return schema.encode({"v": 1, "ts": ts, "broker": "b1", "protocol": protocol, "kind": kind, **fields})


HOUR_10 = [
    rec(H0 + 1 * S, "ssmp", "login", session="alice", source="127.0.0.1:1000", outcome="ok"),
    rec(H0 + 1 * S, "ssmp", "login", session="bob", source="127.0.0.1:1001", outcome="ok"),
    rec(H0 + 2 * S, "ssmp", "subscribed", session="bob", topic="news"),
    rec(H0 + 2 * S, "mcchat", "login", session="carol", source="127.0.0.1:1002", outcome="ok"),
    rec(H0 + 2 * S, "mcchat", "subscribed", session="carol", topic="news"),
    rec(H0 + 10 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=10, fanout=2),
    rec(H0 + 20 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=20, fanout=1, dropped=1),
    rec(H0 + 30 * S, "ssmp", "accepted", session="bob", topic="news", message="multicast", bytes=5, fanout=1),
    rec(H0 + 61 * S, "smqp", "accepted", session="dave", topic="orders", message="multicast", bytes=100, fanout=0, latency_us=50),
    rec(H0 + 25 * S, "ssmp", "dropped", session="bob", topic="news", reason="slow_consumer"),
    rec(H0 + 70 * S, "ssmp", "dropped", session="alice", reason="no_recipient"),
    rec(H0 + 62 * S, "smqp", "acked", session="erin", topic="orders", latency_us=100),
    rec(H0 + 63 * S, "smqp", "acked", session="erin", topic="orders", latency_us=300),
    rec(H0 + 64 * S, "smqp", "acked", session="frank", topic="orders", latency_us=200),
    rec(H0 + 65 * S, "smqp", "delivered", session="erin", topic="orders", bytes=100),
    rec(H0 + 90 * S, "ssmp", "unsubscribed", session="bob", topic="news"),
    rec(H0 + 100 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=7, fanout=1),
    rec(H0 + 120 * S, "smqp", "expired", session="frank", sender="dave", topic="orders", message_id="m-1", bytes=100, reason="expired"),
    rec(H0 + 121 * S, "smqp", "trashed", session="frank", sender="dave", topic="orders", message_id="m-1", bytes=100, reason="expired"),
    rec(H0 + 130 * S, "ssmp", "auth_failure", session="mallory", source="192.0.2.1:5555", scheme="secret"),
    rec(H0 + 131 * S, "mcchat", "auth_failure", session="mallory", source="192.0.2.1:5556", scheme="password"),
    rec(H0 + 132 * S, "ssmp", "auth_failure", session="eve", source="192.0.2.1:6000", scheme="secret"),
    rec(H0 + 133 * S, "ssmp", "auth_failure", session="trudy", source="[::1]:7000", scheme="open"),
    rec(H0 + 200 * S, "mcchat", "logout", session="carol"),
]
BAD_10 = [
    "this is not json\n",
    rec(H0, "ssmp", "accepted").replace('"v":1', '"v":2'),
    rec(H0, "ssmp", "exploded"),
    '{"v":1,"protocol":"ssmp","kind":"login"}\n',
    '{"v":1,"ts":"soon","protocol":"ssmp","kind":"login"}\n',
]
TRUNCATED = rec(H0 + 300 * S, "ssmp", "accepted")[:25]  # a crash mid-line: no LF, cut short
HOUR_11 = [
    rec(H0 + 3605 * S, "mcchat", "accepted", session="carol", topic="news", message="multicast", bytes=3, fanout=1),
    rec(H0 + 3606 * S, "ssmp", "accepted", session="alice", recipient="bob", message="unicast", bytes=4, fanout=1),
    rec(H0 + 7201 * S, "ssmp", "accepted", session="late", topic="news", message="multicast", bytes=1, fanout=0),
]
OUTSIDE = {  # whole hours outside --since/--until: pruned, so even their garbage is not read
    "date=2024-05-01/hour=09": [rec(H0 - 60 * S, "ssmp", "accepted", session="early", topic="news", bytes=1, fanout=0), "garbage\n"],
    "date=2024-05-01/hour=12": [rec(H0 + 7300 * S, "ssmp", "accepted", session="late", topic="news", bytes=1, fanout=0), "garbage\n"],
}


def write_log(data_dir: Path) -> None:
    events = data_dir / "events"
    hour10 = events / "date=2024-05-01" / "hour=10"
    hour10.mkdir(parents=True)
    (hour10 / "events-b1-run1-1.jsonl").write_text("".join(HOUR_10[:12] + BAD_10), "utf-8")
    (hour10 / "events-b1-run2-1.jsonl").write_text("".join(HOUR_10[12:]) + TRUNCATED, "utf-8")
    (hour10 / "notes.txt").write_text("not a log file\n")
    hour11 = events / "date=2024-05-01" / "hour=11"
    hour11.mkdir(parents=True)
    (hour11 / "events-b1-run2-1.jsonl").write_text("".join(HOUR_11), "utf-8")
    for partition, lines in OUTSIDE.items():
        (events / partition).mkdir(parents=True)
        (events / partition / "events-b1-run0-1.jsonl").write_text("".join(lines), "utf-8")


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("data")
    out = tmp_path_factory.mktemp("out")
    write_log(data_dir)
    summary = run_report(
        spark, str(data_dir), str(out),
        since_us=parse_time("2024-05-01T10:00Z"), until_us=parse_time("2024-05-01T12:00:00+00:00"), top=10,
    )
    return {"summary": summary, "out": out, "spark": spark}


def _table(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    frame = report["spark"].read.parquet(str(report["out"] / name))
    return [row.asDict(recursive=True) for row in frame.collect()]


def test_bad_lines_are_counted_and_skipped_and_pruned_hours_not_read(report: dict[str, Any]) -> None:
    summary = report["summary"]
    assert summary["quality"] == {"ok": 27, "malformed": 3, "unsupported_version": 1, "invalid": 2}
    assert summary["events"] == 26  # the 27th valid record lies after --until
    assert summary["events_by_kind"] == {
        "login": 3, "subscribed": 2, "accepted": 7, "dropped": 2, "acked": 3, "delivered": 1,
        "unsubscribed": 1, "expired": 1, "trashed": 1, "auth_failure": 4, "logout": 1,
    }
    assert summary["first_event"] == "2024-05-01T10:00:01.000000Z"
    assert summary["last_event"] == "2024-05-01T11:00:06.000000Z"


def test_traffic_per_minute_topic_and_protocol(report: dict[str, Any]) -> None:
    rows = sorted(_table(report, "traffic"), key=lambda r: (r["minute"], r["topic"] or "", r["protocol"]))
    got = [
        (r["minute"].astimezone(timezone.utc), r["topic"], r["protocol"], r["messages"], r["bytes"], r["fanout"],
         r["max_fanout"], r["deliveries"], r["drops"], dict(r["drops_by_reason"]))
        for r in rows
    ]
    assert got == [
        (_t(0), "news", "ssmp", 3, 35, 4, 2, 3, 2, {"slow_consumer": 1, "unrenderable": 1}),
        (_t(1), None, "ssmp", 0, 0, 0, None, 0, 1, {"no_recipient": 1}),
        (_t(1), "news", "ssmp", 1, 7, 1, 1, 1, 0, {}),
        (_t(1), "orders", "smqp", 1, 100, 0, 0, 1, 0, {}),
        (_t(60), None, "ssmp", 1, 4, 1, 1, 1, 0, {}),
        (_t(60), "news", "mcchat", 1, 3, 1, 1, 1, 0, {}),
    ]


def test_latency_percentiles(report: dict[str, Any]) -> None:
    rows = _table(report, "latency")
    assert sorted((r["topic"], r["protocol"], r["kind"], r["count"], r["p50_us"], r["p90_us"], r["p99_us"], r["max_us"]) for r in rows) == [
        ("orders", "smqp", "accepted", 1, 50, 50, 50, 50),
        ("orders", "smqp", "acked", 3, 200, 300, 300, 300),
    ]


def test_top_publishers_and_subscribers(report: dict[str, Any]) -> None:
    publishers = sorted(_table(report, "top_publishers"), key=lambda r: r["rank"])
    assert [(r["rank"], r["session"], r["protocol"], r["messages"], r["bytes"], r["topics"], r["fanout"]) for r in publishers] == [
        (1, "alice", "ssmp", 4, 41, 1, 5),
        (2, "dave", "smqp", 1, 100, 1, 0),
        (3, "bob", "ssmp", 1, 5, 1, 1),
        (4, "carol", "mcchat", 1, 3, 1, 1),
    ]
    subscribers = sorted(_table(report, "top_subscribers"), key=lambda r: r["rank"])
    # carol: 4 news messages while subscribed (until her logout); bob: 3 until he left, less
    # his own; erin: one SMQP delivery outside the fan-out
    assert [(r["rank"], r["session"], r["protocol"], r["messages"], r["bytes"], r["topics"]) for r in subscribers] == [
        (1, "carol", "mcchat", 4, 42, 1),
        (2, "bob", "ssmp", 2, 30, 1),
        (3, "erin", "smqp", 1, 100, 0),
    ]


def test_dead_letters_and_auth_failures(report: dict[str, Any]) -> None:
    dead = _table(report, "dead_letters")
    assert [(r["kind"], r["topic"], r["session"], r["sender"], r["message_id"], r["bytes"], r["reason"]) for r in dead] == [
        ("expired", "orders", "frank", "dave", "m-1", 100, "expired"),
        ("trashed", "orders", "frank", "dave", "m-1", 100, "expired"),
    ]
    failures = _table(report, "auth_failures")
    assert [(r["source"], r["protocol"], r["failures"], r["identities"], r["schemes"]) for r in failures] == [
        ("192.0.2.1", "ssmp", 2, ["eve", "mallory"], ["secret"]),
        ("192.0.2.1", "mcchat", 1, ["mallory"], ["password"]),
        ("::1", "ssmp", 1, ["trudy"], ["open"]),
    ]


def test_html_report_is_self_contained_with_the_plots(report: dict[str, Any]) -> None:
    page = (report["out"] / "report.html").read_text("utf-8")
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert [alt for alt, _ in images] == ["messages per second by protocol", "latency percentiles",
                                          "delivery latency by protocol", "SMQP queue depth and Trash", "top topics"]
    import base64

    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for _, data in images)
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere
    assert "mallory" in page and "alice" in page
    summary = json.loads((report["out"] / "summary.json").read_text())
    assert summary["messages_by_protocol"] == {"ssmp": 5, "smqp": 1, "mcchat": 1}
    assert summary["top_topics"] == [["news", 5], ["orders", 1]]


def test_a_run_record_counts_as_the_messages_it_stands_for(spark: Any, tmp_path: Path) -> None:
    hour = tmp_path / "data" / "events" / "date=2024-05-01" / "hour=10"
    hour.mkdir(parents=True)
    hour.joinpath("events-b1-run1-1.jsonl").write_text(
        rec(H0 + S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=12, fanout=2, count=3)
        + rec(H0 + 2 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=5, fanout=2),
        "utf-8",
    )
    summary = run_report(spark, str(tmp_path / "data"), str(tmp_path / "out"))
    assert summary["events_by_kind"] == {"accepted": 2}
    assert summary["messages"] == 4 and summary["messages_by_protocol"] == {"ssmp": 4}
    traffic = [row.asDict() for row in spark.read.parquet(str(tmp_path / "out" / "traffic")).collect()]
    assert [(r["topic"], r["messages"], r["bytes"], r["fanout"]) for r in traffic] == [("news", 4, 17, 8)]


def test_an_empty_or_missing_log_gives_an_empty_report(spark: Any, tmp_path: Path) -> None:
    missing = run_report(spark, str(tmp_path / "nothing-here"), str(tmp_path / "out1"))
    assert not missing["log_found"] and missing["events"] == 0 and missing["lines"] == 0
    (tmp_path / "empty" / "events").mkdir(parents=True)
    empty = run_report(spark, str(tmp_path / "empty"), str(tmp_path / "out2"))
    assert empty["log_found"] and empty["events"] == 0
    for out in ("out1", "out2"):
        assert spark.read.parquet(str(tmp_path / out / "traffic")).count() == 0
        page = (tmp_path / out / "report.html").read_text()
        assert page.count("data:image/png;base64,") == 5  # the SMQP split has no plot without data
        for protocol in ("ssmp", "mcchat", "socketmq", "smqp"):
            assert f'id="latency-{protocol}"><h3>{protocol}</h3><p class=empty>' in page


def test_cross_protocol_matrix(report: dict[str, Any]) -> None:
    # bob (ssmp) got alice's two news messages before he left; carol (mcchat) got alice's three
    # and bob's one; nobody subscribed to orders
    matrix = sorted((r["publishing"], r["receiving"], r["messages"], r["bytes"]) for r in _table(report, "cross_protocol"))
    assert matrix == [("ssmp", "mcchat", 4, 42), ("ssmp", "ssmp", 2, 30)]
    assert report["summary"]["slow_consumer_episodes"] == 1


def test_internal_sessions_are_never_subscribers_and_slow_consumers_are_listed(spark: Any, tmp_path: Path) -> None:
    hour = tmp_path / "data" / "events" / "date=2024-05-01" / "hour=10"
    hour.mkdir(parents=True)
    hour.joinpath("events-b1-run1-1.jsonl").write_text("".join([
        rec(H0 + S, "smqp", "login", session="bridge:news", outcome="ok"),  # no connection: the broker's own
        rec(H0 + S, "smqp", "subscribed", session="bridge:news", topic="news"),
        rec(H0 + S, "mcchat", "login", session="carol", outcome="ok", source="127.0.0.1:4000"),
        rec(H0 + S, "mcchat", "subscribed", session="carol", topic="news"),
        rec(H0 + 2 * S, "ssmp", "accepted", session="alice", topic="news", message="multicast", bytes=10, fanout=2, count=2),
        rec(H0 + 3 * S, "socketmq", "accepted", session="sam", topic="news", message="multicast", bytes=4, fanout=2),
        rec(H0 + 4 * S, "mcchat", "dropped", session="carol", topic="news", reason="slow_consumer", dropped=3),
        rec(H0 + 5 * S, "ssmp", "dropped", session="alice", reason="no_recipient"),
    ]), "utf-8")
    summary = run_report(spark, str(tmp_path / "data"), str(tmp_path / "out"))
    assert [(r["session"], r["messages"]) for r in summary["top_subscribers"]] == [("carol", 3)]
    assert sorted((r["publishing"], r["receiving"], r["messages"], r["bytes"]) for r in summary["cross_protocol"]) == [
        ("socketmq", "mcchat", 1, 4), ("ssmp", "mcchat", 2, 10),
    ]
    assert summary["slow_consumer_episodes"] == 1
    assert [(r["session"], r["reason"], r["dropped"]) for r in summary["slow_consumers"]] == [("carol", "slow_consumer", 3)]
    page = (tmp_path / "out" / "report.html").read_text("utf-8")
    assert "bridge:news" not in page and "carol" in page


LATENCY_LOG = [
    rec(H0 + 1 * S, "ssmp", "latency", sender="ssmp:alice", topic="news", message="multicast", fanout=2, latency_us=40),
    rec(H0 + 2 * S, "ssmp", "latency", sender="ssmp:alice", topic="news", message="multicast", fanout=2, latency_us=60),
    rec(H0 + 1 * S, "mcchat", "latency", sender="ssmp:alice", topic="news", message="multicast", fanout=1, latency_us=80),
    rec(H0 + 3 * S, "socketmq", "latency", sender="smqp:bob:c1", topic="news", message="multicast", fanout=5,
        latency_us=120),
    # kept 643 s for a subscriber who was away, then delivered in 2 ms and acknowledged 5 ms later
    rec(H0 + 650 * S, "smqp", "delivered", session="erin:c1", topic="news", sender="ssmp:alice",
        latency_us=643_002_000, queued_us=643_000_000),
    rec(H0 + 651 * S, "smqp", "acked", session="erin:c1", topic="news", sender="ssmp:alice",
        latency_us=643_007_000, queued_us=643_000_000),
    # online when it came: nothing queued
    rec(H0 + 700 * S, "smqp", "delivered", session="erin:c1", topic="news", sender="ssmp:alice", latency_us=3_000,
        queued_us=0),
    rec(H0 + 5 * S, "smqp", "gauge", pending=3, unacknowledged=0, trash=0),
    rec(H0 + 60 * S, "smqp", "gauge", pending=1, unacknowledged=2, trash=0),
    rec(H0 + 120 * S, "smqp", "gauge", pending=0, unacknowledged=0, trash=2),
]


def test_delivery_latency_per_protocol_smqp_split_and_queue_gauges(spark: Any, tmp_path: Path) -> None:
    hour = tmp_path / "data" / "events" / "date=2024-05-01" / "hour=10"
    hour.mkdir(parents=True)
    hour.joinpath("events-b1-run1-1.jsonl").write_text("".join(LATENCY_LOG), "utf-8")
    out = tmp_path / "out"
    summary = run_report(spark, str(tmp_path / "data"), str(out))
    assert summary["quality"]["ok"] == len(LATENCY_LOG)
    delivery = [(r["protocol"], r["source"], r["count"], r["p50_us"], r["max_us"]) for r in summary["delivery_latency"]]
    assert delivery == [
        ("mcchat", "sampled write", 1, 80, 80),
        ("smqp", "delivered, once online", 2, 2_000, 3_000),  # not 643 s: the queued part is apart
        ("socketmq", "sampled write", 1, 120, 120),
        ("ssmp", "sampled write", 2, 40, 60),
    ]
    split = [(r["kind"], r["part"], r["count"], r["p50_us"], r["max_us"]) for r in summary["smqp_latency_split"]]
    assert split == [
        ("acked", "queued", 1, 643_000_000, 643_000_000),
        ("acked", "online", 1, 7_000, 7_000),
        ("delivered", "queued", 2, 0, 643_000_000),
        ("delivered", "online", 2, 2_000, 3_000),
    ]
    gauges = [row.asDict() for row in spark.read.parquet(str(out / "queue_gauges")).orderBy("time").collect()]
    assert [(g["pending"], g["unacknowledged"], g["trash"]) for g in gauges] == [(3, 0, 0), (1, 2, 0), (0, 0, 2)]
    assert summary["queue_gauge_readings"] == 3 and summary["queue_gauge_last"]["trash"] == 2
    page = (out / "report.html").read_text("utf-8")
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert images == ["messages per second by protocol", "latency percentiles", "delivery latency by protocol",
                      "SMQP latency split", "SMQP queue depth and Trash", "top topics"]
    for protocol in ("ssmp", "mcchat", "socketmq", "smqp"):
        section = re.search(f'<section class="latency" id="latency-{protocol}">(.*?)</section>', page).group(1)
        assert "<table>" in section and "no latency records" not in section
    assert "<td>delivered, once online</td><td>2</td><td>2,000</td>" in page
    assert '<table id="smqp-split-table">' in page

"""Strings from the log reach the report's plots literally: a topic such as ``$\\nope$``
(which matplotlib would read as mathtext and fail on) or ``a_b^c`` gives a report, exit 0,
on both engines, with the topic drawn as written and listed in the HTML."""
from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.pipeline import html as report_html
from brokerd.pipeline.report import run_report
from tests.pipeline.test_report import H0, S, rec

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ("$\\nope$", "a_b^c", "back\\slash", "$x$_{y}$", "plain")


def write_topics_log(data_dir: Path) -> None:
    """Anonymous MCCHAT messages on the topics above, one SSMP message on ``plain``."""
    hour = data_dir / "events" / "date=2024-05-01" / "hour=10"
    hour.mkdir(parents=True)
    lines = [rec(H0 + S, "mcchat", "login", session="anon", outcome="ok", source="127.0.0.1:4000")]
    for n, topic in enumerate(TOPICS):
        for k in range(n + 1):
            lines.append(rec(H0 + (2 + n) * S + k, "mcchat", "accepted", session="anon", topic=topic,
                             message="multicast", bytes=3, fanout=0))
    hour.joinpath("events-b1-run1-1.jsonl").write_text("".join(lines), "utf-8")


def listed_topics(page: str) -> list[str]:
    """The topics of the report's "Top topics" table, unescaped."""
    section = page.partition("<h2>Top topics</h2>")[2].partition("<h2>")[0]
    return [html.unescape(cell) for cell in re.findall(r"<tr><td>(.*?)</td>", section)]


def svg_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every plot the report draws is also rendered as SVG with its text kept as text; the
    list fills with the SVG documents."""
    from matplotlib import rc_context

    drawn: list[str] = []
    png = report_html.png

    def also_svg(figure: Any) -> str:
        import io

        with rc_context({"svg.fonttype": "none"}):
            buffer = io.StringIO()
            figure.savefig(buffer, format="svg")
        drawn.append(buffer.getvalue())
        return png(figure)

    monkeypatch.setattr(report_html, "png", also_svg)
    return drawn


def test_topics_are_drawn_literally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_topics_log(tmp_path / "data")
    drawn = svg_texts(monkeypatch)
    summary = run_report(None, str(tmp_path / "data"), str(tmp_path / "out"))
    assert [topic for topic, _count in summary["top_topics"]] == list(reversed(TOPICS))
    texts = [html.unescape(t) for svg in drawn for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    for topic in TOPICS:
        assert topic in texts, (topic, texts)
    assert "Top topics" in texts  # a control: the titles are there the same way
    page = Path(summary["html"]).read_text("utf-8")
    assert listed_topics(page) == list(reversed(TOPICS))


@pytest.mark.slow
def test_the_report_command_exits_0_on_such_a_log(tmp_path: Path) -> None:
    write_topics_log(tmp_path / "data")
    result = subprocess.run(
        [sys.executable, "-m", "brokerd.pipeline", "report", "--data-dir", str(tmp_path / "data"),
         "--out", str(tmp_path / "out"), "--engine", "arrow"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "$\\nope$" in result.stdout  # the top topics line of the summary
    assert listed_topics((tmp_path / "out" / "report.html").read_text("utf-8")) == list(reversed(TOPICS))


@pytest.mark.spark
@pytest.mark.slow
def test_the_spark_engine_reports_such_a_log(spark: Any, tmp_path: Path) -> None:
    write_topics_log(tmp_path / "data")
    summary = run_report(spark, str(tmp_path / "data"), str(tmp_path / "out"))
    assert [topic for topic, _count in summary["top_topics"]] == list(reversed(TOPICS))
    page = Path(summary["html"]).read_text("utf-8")
    assert listed_topics(page) == list(reversed(TOPICS))
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["top_topics"][0][0] == "plain"

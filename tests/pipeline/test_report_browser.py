"""The HTML report looked at in headless Chromium: every plot is an image the browser decoded,
the latency, cross-protocol and slow-consumer sections are there with their figures, and the
broker's internal sessions are nowhere on the page, with either engine.  The screenshots are
saved as test-artifacts/pipeline-report.png (Spark) and pipeline-report-arrow.png."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.pipeline.compact import compact
from brokerd.pipeline.report import run_report
from tests.browser.cdp import Chromium, chromium_or_skip
from tests.pipeline.test_report import H0, LATENCY_LOG, S, rec, write_log

pytestmark = [pytest.mark.spark, pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ENGINE_SCREENSHOT = {"spark": "pipeline-report.png", "arrow": "pipeline-report-arrow.png"}


@pytest.fixture(scope="module", params=["spark", "arrow"])
def report_file(request: pytest.FixtureRequest, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of each engine (the log's malformed lines need Spark's reader: for the
    Arrow engine, the hours are compacted first, as ``--engine auto`` would do)."""
    chromium_or_skip()  # before the Spark work
    data_dir = tmp_path_factory.mktemp("data")
    write_log(data_dir)
    hour = data_dir / "events" / "date=2024-05-01" / "hour=10"
    (hour / "events-b1-run3-1.jsonl").write_text(
        rec(H0 + 1 * S, "smqp", "login", session="bridge:news", outcome="ok")
        + rec(H0 + 1 * S, "smqp", "subscribed", session="bridge:news", topic="news"),
        "utf-8",
    )
    (hour / "events-b1-run4-1.jsonl").write_text("".join(LATENCY_LOG), "utf-8")
    out = tmp_path_factory.mktemp(f"out-{request.param}-")
    if request.param == "spark":
        run_report(spark, str(data_dir), str(out))
    else:
        compact(spark, str(data_dir))
        run_report(None, str(data_dir), str(out))
    return out / "report.html"


@pytest_twisted.ensureDeferred
async def test_the_report_reads_well_in_a_browser(report_file: Path, tmp_path: Path) -> None:
    binary = chromium_or_skip()
    browser = await Chromium.launch(tmp_path, binary)
    try:
        page = await browser.page()
        await page.call("Page.navigate", url=report_file.as_uri())
        assert await page.wait_for("document.readyState === 'complete' && document.images.length === 6")
        images = await page.evaluate(
            "Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 300 && i.naturalHeight > 100])")
        assert images == [["messages per second by protocol", True], ["latency percentiles", True],
                          ["delivery latency by protocol", True], ["SMQP latency split", True],
                          ["SMQP queue depth and Trash", True], ["top topics", True]]
        headings = await page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
        for section in ("Latency", "Delivery latency by protocol", "SMQP queue depth and Trash", "Cross-protocol traffic", "Slow consumers", "Top subscribers", "Auth failures by source"):
            assert section in headings
        latency = await page.evaluate(
            "Array.from(document.querySelectorAll('h2 + img[alt=\"latency percentiles\"] + table tbody tr')).map(r => r.cells[0].textContent + ' ' + r.cells[1].textContent)")
        assert latency == ["mcchat latency", "smqp accepted", "smqp acked", "smqp delivered", "socketmq latency",
                           "ssmp latency"]
        sections = await page.evaluate(
            "Array.from(document.querySelectorAll('section.latency')).map(s => [s.id, s.querySelectorAll('tbody tr').length])")
        assert sections == [["latency-ssmp", 1], ["latency-mcchat", 1], ["latency-socketmq", 1], ["latency-smqp", 1]]
        split = await page.evaluate(
            "Array.from(document.querySelectorAll('#smqp-split-table tbody tr')).map(r => r.cells[0].textContent + ' ' + r.cells[1].textContent)")
        assert split == ["acked queued", "acked online", "delivered queued", "delivered online"]
        matrix = await page.evaluate(
            "Array.from(document.querySelectorAll('#cross-protocol tbody tr')).map(r => Array.from(r.cells).map(c => c.innerText))")
        assert matrix == [["ssmp", "4 msgs\n42 B", "2 msgs\n30 B"]]
        topics = await page.evaluate(
            "Array.from(document.querySelectorAll('h2 + img[alt=\"top topics\"] + table tbody tr')).map(r => r.cells[0].textContent)")
        assert topics[0] == "news"
        text = await page.evaluate("document.body.innerText")
        assert "bridge:news" not in text  # the broker's own session is no subscriber
        assert "carol" in text and "192.0.2.1" in text
        await page.call("Emulation.setDeviceMetricsOverride", width=1000, height=2400, deviceScaleFactor=1, mobile=False)
        png = await page.screenshot()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / ENGINE_SCREENSHOT[report_file.parent.name.split("-")[1]]).write_bytes(png)
    finally:
        browser.close()

"""The admin dashboard in a real browser: headless Chromium opens ``/#token=...`` on an
in-process broker's admin listener, the page follows /api/events, and after a scripted run of
SSMP traffic it shows the counts, the topic, the refused login, and its rate chart has moved;
SMQP runs beside it with its store (the commit-latency histogram's +Inf bucket once made every
update unreadable) and the page shows its queues.
The screenshot is saved as test-artifacts/admin-dashboard.png (docs/admin-dashboard.png is
one of them)."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor, threads
from twisted.internet.defer import gatherResults

from brokerd.config import Settings
from brokerd.tap import makeService
from tests.admin.support import http
from tests.browser.cdp import Chromium, chromium_or_skip
from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.support.broker import LineClient, free_port
from tests.support.secrets import write_private

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "dashboard-token"
MESSAGES = 40
SMQP_MESSAGES = 6


INKED = """(() => {
  // where the chart drew: the vertical axis's label (left margin, middle), the horizontal
  // axis's label (under the plot, centre), and a positive control: the left margin's bottom
  // corner, where nothing is drawn
  const c = document.getElementById('rate-chart');
  const g = c.getContext('2d');
  const inked = (x, y, w, h) => g.getImageData(x, y, w, h).data.some((v, i) => i % 4 === 3 && v > 0);
  return {y_label: inked(4, c.height / 2 - 30, 12, 60), x_label: inked(c.width / 2 - 10, c.height - 14, 60, 12),
          empty_corner: inked(0, c.height - 6, 20, 6)};
})()"""


def _traffic(ssmp: int) -> list[LineClient]:
    """The scripted run; the subscriber and publisher stay connected (returned)."""
    subscriber = LineClient.connect(ssmp)
    assert subscriber.request("LOGIN watcher open") == b"200"
    assert subscriber.request("SUBSCRIBE news") == b"200"
    publisher = LineClient.connect(ssmp)
    assert publisher.request("LOGIN pub open") == b"200"
    for n in range(MESSAGES):
        assert publisher.request(f"MCAST news m{n}") == b"200"
    assert [subscriber.line() for _ in range(MESSAGES)][-1] == b"000 pub MCAST news m%d" % (MESSAGES - 1)
    refused = LineClient.connect(ssmp)
    assert refused.request("LOGIN mallory secret guess").startswith(b"401")
    refused.close()
    return [subscriber, publisher]


def _smqp_traffic(smqp: int) -> list[BlockingSMQP]:
    """A subscriber away (its messages wait: pending) and one online that does not acknowledge
    (unacknowledged); the publisher and the online subscriber stay connected (returned)."""
    away = BlockingSMQP(smqp)
    away.login("bob", "away")
    assert away.command("CREATE TOPIC /jobs").code == 200
    assert away.command("SUB MESSAGE /jobs").code == 200
    assert away.command("QUIT").code == 200
    away.close()
    online = BlockingSMQP(smqp)
    online.login("alice", "online")
    assert online.command("SUB MESSAGE /jobs").code == 200
    publisher = BlockingSMQP(smqp)
    publisher.login("alice", "pub")
    for n in range(SMQP_MESSAGES):
        publisher.send(publisher.publish_bytes("/jobs", f"J{n}", b"job %d" % n))
        assert publisher.reply().code == 200
    assert online.notify().body.sections[0].data == b"job 0"
    return [online, publisher]


def _unauthenticated(admin: int) -> tuple[int, str, int]:
    page = http(admin, "GET", "/")
    return page.status, page.headers["content-type"], http(admin, "GET", "/api/events").status


@pytest_twisted.ensureDeferred
async def test_dashboard_shows_a_traffic_run_live(tmp_path: Path) -> None:
    binary = chromium_or_skip()
    ssmp, smqp, admin = free_port(), free_port(), free_port()
    token = tmp_path / "token"
    write_private(token, TOKEN)
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    settings = Settings(listeners={"ssmp": [f"tcp:{ssmp}:interface=127.0.0.1"],
                                   "smqp": [f"tcp:{smqp}:interface=127.0.0.1"]},
                        open_login=True, accounts_file=accounts, data_dir=tmp_path / "data", event_log=False,
                        admin=f"tcp:{admin}:interface=127.0.0.1", admin_token_file=token)
    service = makeService(settings, reactor)
    service.startService()
    browser = None
    clients: list[LineClient] = []
    smqp_clients: list[BlockingSMQP] = []
    try:
        factories = service.runtime.front_ends.values()
        await gatherResults([f.started for f in factories if hasattr(f, "started")])  # SMQP's store is open
        status, content_type, events = await threads.deferToThread(_unauthenticated, admin)
        assert (status, content_type, events) == (200, "text/html; charset=utf-8", 401)
        browser = await Chromium.launch(tmp_path, binary)
        page = await browser.page()
        await page.call("Page.navigate", url=f"http://127.0.0.1:{admin}/#token={TOKEN}")
        assert await page.wait_for("Number(document.body.dataset.updates) >= 1")
        assert await page.evaluate("document.getElementById('accepted').textContent") == "0"

        clients = await threads.deferToThread(_traffic, ssmp)

        assert await page.wait_for(f"document.getElementById('accepted').textContent === '{MESSAGES}'")
        assert await page.wait_for("Number(document.getElementById('rate-chart').dataset.max) > 1")
        points = int(await page.evaluate("document.getElementById('rate-chart').dataset.points"))
        assert await page.wait_for(f"Number(document.getElementById('rate-chart').dataset.points) > {points}")
        chart = await page.evaluate(
            "(() => { const c = document.getElementById('rate-chart'); return [c.dataset.yLabel, c.dataset.xLabel,"
            " Array.from(document.querySelectorAll('#rate-legend li')).map(li => li.dataset.line)]; })()")
        assert chart == ["messages per second", "seconds ago", ["accepted", "delivered"]]
        inked = await page.evaluate(INKED)
        assert inked == {"y_label": True, "x_label": True, "empty_corner": False}, inked
        topics = await page.evaluate("Array.from(document.querySelectorAll('#topics td')).map(td => td.textContent)")
        assert topics == ["news", "1", "ssmp 1"]
        connections = await page.evaluate(
            "Array.from(document.querySelectorAll('#connections tbody tr td')).map(td => td.textContent)")
        assert connections == ["admin", "0", "0", "0", "1", "ssmp", "2", "2", "2", "1"]  # admin: the 401 above
        smqp_clients = await threads.deferToThread(_smqp_traffic, smqp)
        pending = "Array.from(document.querySelectorAll('#smqp tr:first-child td')).map(td => td.textContent).join(' ')"
        assert await page.wait_for(f"{pending} === 'pending {2 * SMQP_MESSAGES}'")  # for bob away and alice online
        refusals = await page.evaluate("document.getElementById('auth-failures').textContent")
        assert "mallory" in refusals and "ssmp" in refusals
        await page.call("Emulation.setDeviceMetricsOverride", width=1000, height=1000, deviceScaleFactor=1,
                        mobile=False)
        png = await page.screenshot()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "admin-dashboard.png").write_bytes(png)
    finally:
        for client in clients:
            client.close()
        for smqp_client in smqp_clients:
            smqp_client.close()
        if browser is not None:
            browser.close()
        await service.stopService()
        await service.runtime.store.close()


def _history_with_traffic(admin: int) -> dict:
    """``GET /api/history`` once a second's sample holds the traffic (bounded wait)."""
    import json
    import time

    deadline = time.monotonic() + 30
    while True:
        kept = json.loads(http(admin, "GET", "/api/history", token=TOKEN).body)
        if any(sample["accepted"] > 0 for sample in kept["samples"]):
            return kept
        assert time.monotonic() < deadline, kept
        time.sleep(0.2)  # polling the broker's once-a-second sample, bounded by the deadline


@pytest_twisted.ensureDeferred
async def test_a_dashboard_opened_after_the_traffic_shows_it(tmp_path: Path) -> None:
    """The broker keeps the last hour of per-second rates (``GET /api/history``, token-checked
    like the rest of the API): a page opened after a run draws the run at once."""
    binary = chromium_or_skip()
    ssmp, admin = free_port(), free_port()
    write_private(tmp_path / "token", TOKEN)
    settings = Settings(listeners={"ssmp": [f"tcp:{ssmp}:interface=127.0.0.1"]}, open_login=True,
                        data_dir=tmp_path / "data", event_log=False, admin=f"tcp:{admin}:interface=127.0.0.1",
                        admin_token_file=tmp_path / "token")
    service = makeService(settings, reactor)
    service.startService()
    browser = None
    clients: list[LineClient] = []
    try:
        assert (await threads.deferToThread(http, admin, "GET", "/api/history")).status == 401
        clients = await threads.deferToThread(_traffic, ssmp)
        kept = await threads.deferToThread(_history_with_traffic, admin)
        assert kept["interval_seconds"] == 1 and kept["kept_seconds"] == 3600
        browser = await Chromium.launch(tmp_path, binary)
        page = await browser.page()
        await page.call("Page.navigate", url=f"http://127.0.0.1:{admin}/#token={TOKEN}")
        assert await page.wait_for("Number(document.body.dataset.updates) >= 1")
        chart = await page.evaluate("(() => { const c = document.getElementById('rate-chart');"
                                    " return [Number(c.dataset.points), Number(c.dataset.max)]; })()")
        assert chart[0] >= len(kept["samples"]) and chart[1] > 1, chart  # the run, drawn from the history
        assert await page.evaluate("document.getElementById('window').textContent") == "60 minutes"
    finally:
        for client in clients:
            client.close()
        if browser is not None:
            browser.close()
        await service.stopService()

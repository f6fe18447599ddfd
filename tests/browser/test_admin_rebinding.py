"""DNS rebinding against the admin listener in a real browser: headless Chromium resolves
``rebind.attacker.example`` to 127.0.0.1 (``--host-resolver-rules``), as a rebinding attacker's
DNS would once the page is loaded.  That page's fetch() of /api/sessions and its POST that
would close a session are refused (421); the same from http://127.0.0.1:PORT, the listener's
own origin, work.  The listener runs on loopback without a token, the case the Host check
protects."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from brokerd.config import Settings
from brokerd.tap import makeService
from tests.admin.support import http
from tests.browser.cdp import Chromium, Page, chromium_or_skip
from tests.support.broker import LineClient, free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REBOUND = "rebind.attacker.example"


def _login(ssmp: int, name: str) -> LineClient:
    client = LineClient.connect(ssmp)
    assert client.request(f"LOGIN {name} open") == b"200"
    assert client.request("SUBSCRIBE news") == b"200"
    return client


def _session_id(admin: int, name: str) -> str:
    sessions = http(admin, "GET", "/api/sessions").json()["sessions"]
    return next(s["id"] for s in sessions if s["name"] == name)


async def _from_page(page: Page, origin: str, victim: str) -> dict[str, object]:
    """Open ``origin``'s / and, from its JavaScript, list the sessions and close ``victim``."""
    await page.call("Page.navigate", url=f"{origin}/")
    assert await page.wait_for(f"location.origin === {json.dumps(origin)} && document.readyState === 'complete'")
    return await page.evaluate(f"""(async () => {{
        const listed = await fetch('/api/sessions');
        const closed = await fetch('/api/sessions/{victim}/close',
            {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: '{{}}'}});
        return {{listed: listed.status, sessions: listed.status === 200 ? (await listed.json()).sessions.length : null,
                 closed: closed.status}};
    }})()""")


@pytest_twisted.ensureDeferred
async def test_a_rebound_page_cannot_use_the_admin_listener(tmp_path: Path) -> None:
    binary = chromium_or_skip()
    ssmp, admin = free_port(), free_port()
    settings = Settings(listeners={"ssmp": [f"tcp:{ssmp}:interface=127.0.0.1"]}, open_login=True,
                        data_dir=tmp_path / "data", event_log=False, admin=f"tcp:{admin}:interface=127.0.0.1")
    service = makeService(settings, reactor)
    service.startService()
    browser = None
    clients: list[LineClient] = []
    try:
        clients = [await threads.deferToThread(_login, ssmp, name) for name in ("innocent", "victim", "second")]
        victim = await threads.deferToThread(_session_id, admin, "victim")
        browser = await Chromium.launch(tmp_path, binary, f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1")
        page = await browser.page()

        rebound = await _from_page(page, f"http://{REBOUND}:{admin}", victim)
        assert rebound == {"listed": 421, "sessions": None, "closed": 421}
        body = await page.evaluate("document.body.innerText")
        assert "Host" in body  # the page itself was the listener's 421 answer
        # the victim's session is still there: it publishes, the innocent client is served
        innocent, victim_client, _second = clients
        assert await threads.deferToThread(victim_client.request, "MCAST news still-open") == b"200"
        assert await threads.deferToThread(innocent.line) == b"000 victim MCAST news still-open"

        own = await _from_page(page, f"http://127.0.0.1:{admin}", victim)
        assert own == {"listed": 200, "sessions": 3, "closed": 200}
        assert await threads.deferToThread(victim_client.closed)
    finally:
        for client in clients:
            client.close()
        if browser is not None:
            browser.close()
        await service.stopService()

"""The socket.mq demo page in a real browser: headless Chromium opens /socket.mq/demo/ on a
real ``twistd brokerd``, the page subscribes over the WebSocket with socketmq.js, a message
published over SSMP appears on the page, and a message typed into the page reaches an SSMP
subscriber.  The screenshot is saved as test-artifacts/socketmq-demo.png.  A page that reaches
the broker under another origin's name is refused the WebSocket (the Origin check)."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import pytest_twisted

from tests.browser.cdp import Chromium, chromium_or_skip
from tests.support.socketmq import TwistdBroker

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest_twisted.ensureDeferred
async def test_ssmp_message_appears_on_the_demo_page(tmp_path: Path) -> None:
    binary = chromium_or_skip()
    broker = TwistdBroker(tmp_path)
    await broker.start()
    browser = None
    sam = None
    try:
        browser = await Chromium.launch(tmp_path, binary)
        page = await browser.page()
        topic = "demo/browser"
        await page.call("Page.navigate", url=f"{broker.url}/socket.mq/demo/?topic={topic}")
        assert await page.wait_for("document.body && document.body.dataset.subscribed") == topic
        assert await page.evaluate("document.getElementById('status').textContent") == f"subscribed to {topic}"

        sam = await broker.ssmp(b"sam")
        sam.send(b"SUBSCRIBE " + topic.encode())
        await sam.lines.count(2)
        text = f"hello from ssmp {uuid.uuid4().hex[:8]}"
        sam.send(f"MCAST {topic} {text}".encode())
        shown = await page.wait_for(
            "Array.from(document.querySelectorAll('#messages li')).map(li => li.textContent)"
            f".filter(t => t.includes({json.dumps(text)}))"
        )
        assert shown == [f"ssmp:sam{text}"]

        # And the other way: typed into the page, published over the WebSocket, read over SSMP.
        await page.evaluate(
            "document.getElementById('text').value = 'typed in the browser';"
            "document.querySelector('#publish-form button').click(); true"
        )
        line = await sam.next_line(lambda line: b"typed in the browser" in line)
        assert line == f"000 socketmq:anonymous MCAST {topic} typed in the browser".encode()

        ARTIFACTS.mkdir(exist_ok=True)
        png = await page.screenshot()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        (ARTIFACTS / "socketmq-demo.png").write_bytes(png)
    finally:
        if sam is not None:
            await sam.close()
        if browser is not None:
            browser.close()
        broker.stop()


@pytest_twisted.ensureDeferred
async def test_a_page_of_another_origin_cannot_open_the_websocket(tmp_path: Path) -> None:
    """Cross-site WebSocket hijacking in a real browser: the demo page (origin
    http://127.0.0.1:PORT) connects to the same broker under another origin's name
    (localhost:PORT) and is refused, while its own origin connects."""
    binary = chromium_or_skip()
    broker = TwistdBroker(tmp_path)
    await broker.start()
    browser = None
    try:
        browser = await Chromium.launch(tmp_path, binary)
        page = await browser.page()
        await page.call("Page.navigate", url=f"{broker.url}/socket.mq/demo/?topic=demo/origin")
        assert await page.wait_for("document.body && document.body.dataset.subscribed") == "demo/origin"
        attempt = (
            "import('/socket.mq/socketmq.js').then(m => m.connect({base}))"
            ".then(c => {{ window.{name} = 'open'; c.close(); }}, e => {{ window.{name} = 'refused ' + e.status; }}); true"
        )
        other = broker.url.replace("127.0.0.1", "localhost")
        await page.evaluate(attempt.format(base=json.dumps(other), name="other"))
        await page.evaluate(attempt.format(base="undefined", name="own"))
        assert await page.wait_for("window.own") == "open"
        assert (await page.wait_for("window.other")).startswith("refused ")
    finally:
        if browser is not None:
            browser.close()
        broker.stop()

"""A small Chrome DevTools Protocol client for browser tests: headless Chromium (Debian's
package) driven over its DevTools WebSocket with Autobahn, so no WebDriver is needed.

    browser = await Chromium.launch(tmp_path)
    page = await browser.page()
    await page.call("Page.navigate", url=...)
    value = await page.evaluate("document.title")
    png = await page.screenshot()
    await browser.close()
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool

from brokerd.protocols.socketmq.api import read_body
from tests.support.live import TIMEOUT, reactor, sleep

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-allow-origins=*",
    "--window-size=1000,700",
)


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_or_skip() -> str:
    """The Chromium binary; the test is skipped where none is installed (failed under CI,
    whose image has one)."""
    binary = chromium_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed (.ci/run installs chromium and chromium-driver)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return binary


class CDPError(Exception):
    pass


class _Connection(WebSocketClientProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.opened: Deferred = Deferred()
        self._calls: dict[int, Deferred] = {}
        self._next = 0

    def onOpen(self) -> None:
        self.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        message = json.loads(payload)
        d = self._calls.pop(message.get("id"), None)
        if d is None:
            return  # an event; the tests poll instead of listening
        if "error" in message:
            d.errback(CDPError(message["error"]))
        else:
            d.callback(message.get("result", {}))

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        calls, self._calls = self._calls, {}
        for d in calls.values():
            d.errback(CDPError(f"DevTools connection closed: {code} {reason}"))

    def call(self, method: str, **params: Any) -> Deferred:
        self._next += 1
        d: Deferred = Deferred()
        self._calls[self._next] = d
        self.sendMessage(json.dumps({"id": self._next, "method": method, "params": params}).encode())
        return d.addTimeout(TIMEOUT, reactor())


class Page:
    def __init__(self, connection: _Connection) -> None:
        self.connection = connection

    def call(self, method: str, **params: Any) -> Deferred:
        return self.connection.call(method, **params)

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CDPError(result["exceptionDetails"])
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = TIMEOUT) -> Any:
        """Poll ``expression`` until it is truthy; CDPError with the last value after ``timeout``.
        An exception while polling (the page still loading) counts as not yet."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = await self.evaluate(expression)
            except CDPError as error:
                value = error
            else:
                if value:
                    return value
            await sleep(0.1)
        raise CDPError(f"timed out waiting for {expression!r} (last value {value!r})")

    async def screenshot(self) -> bytes:
        result = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(result["data"])

    def close(self) -> None:
        self.connection.sendClose()


class Chromium:
    def __init__(self, process: subprocess.Popen, port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log
        self.pages: list[Page] = []

    @classmethod
    async def launch(cls, directory: Path, binary: str, *flags: str) -> Chromium:
        """Start Chromium with FLAGS and ``flags`` (e.g. ``--host-resolver-rules=...``)."""
        profile = directory / "profile"
        profile.mkdir()
        log = directory / "chromium.log"
        with open(log, "wb") as output:
            process = subprocess.Popen(
                [binary, *FLAGS, *flags, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.exists() and active.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise CDPError(f"Chromium did not start: {log.read_text()[-2000:]}")
            await sleep(0.1)
        port = int(active.read_text().split()[0])
        return cls(process, port, log)

    async def page(self) -> Page:
        agent = Agent(reactor(), pool=HTTPConnectionPool(reactor(), persistent=False))
        for _ in range(50):
            response = await agent.request(b"GET", f"http://127.0.0.1:{self.port}/json/list".encode())
            targets = json.loads(await read_body(response))
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                break
            await sleep(0.1)
        else:
            raise CDPError("Chromium has no page target")
        url = pages[0]["webSocketDebuggerUrl"]
        factory = WebSocketClientFactory(url)
        factory.protocol = _Connection
        factory.setProtocolOptions(maxMessagePayloadSize=0, maxFramePayloadSize=0)
        connection: _Connection = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.port).connect(factory)
        await connection.opened.addTimeout(TIMEOUT, reactor())
        page = Page(connection)
        self.pages.append(page)
        await page.call("Page.enable")
        await page.call("Runtime.enable")
        return page

    def close(self) -> None:
        for page in self.pages:
            page.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

"""The live dashboard at ``/``: static HTML/JS shipped in the package, fed by server-sent
events from ``/api/events``.

The page holds no data and no secret, so it and its assets are served to anyone who can
connect; everything it shows comes from ``/api/events``, which takes the token like every
API call (the page sends it with fetch() from the URL fragment ``#token=...``, which never
reaches a server, or from what the operator types in).

One view is computed per tick for every watching page, only while a page watches: the
figures of /api/status, the top topics and the slowest consumers.  A page whose connection
has more than MAX_QUEUED bytes waiting (a stalled browser) is dropped, and at most
MAX_WATCHERS pages watch at once, so a dashboard can never grow the broker's memory.
"""
from __future__ import annotations

import heapq
from importlib import resources
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET
from twisted.web.server import Request

from brokerd.admin import strictjson
from brokerd.admin.figures import Figures
from brokerd.admin.sessions import describe_session, list_topics
from brokerd.core.broker import Broker
from brokerd.interfaces import ISubscriber
from brokerd.twistedio import queued_bytes

_log = Logger(namespace="brokerd.admin")
"""Module-level, as brokerd.admin.oplog's is (why: there)."""

TICK = 1.0
"""Seconds between two updates of the watching pages."""
MAX_WATCHERS = 16
"""Pages that may watch at once (more get 503)."""
MAX_QUEUED = 1 << 20
"""Bytes that may wait on a page's connection before it is dropped."""
TOP = 10
"""Topics and consumers a view lists."""

ASSETS = {
    b"": ("index.html", b"text/html; charset=utf-8"),
    b"dashboard.js": ("dashboard.js", b"text/javascript; charset=utf-8"),
    b"dashboard.css": ("dashboard.css", b"text/css; charset=utf-8"),
}


def asset(name: str) -> bytes:
    return resources.files("brokerd.admin").joinpath("dashboard", name).read_bytes()


class Asset(Resource):
    isLeaf = True

    def __init__(self, name: str, content_type: bytes) -> None:
        super().__init__()
        self.body = asset(name)
        self.content_type = content_type

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", self.content_type)
        request.setHeader(b"content-security-policy", b"default-src 'self'; img-src 'self' data:")
        request.setHeader(b"x-frame-options", b"DENY")
        return self.body


def slowest_consumers(broker: Broker, count: int = TOP) -> list[dict[str, Any]]:
    """The sessions that dropped the most (then: have the most queued), described."""

    def lag(session: ISubscriber) -> tuple[int, int]:
        return getattr(session, "dropped", 0), queued_bytes(getattr(session, "transport", None)) or 0

    chosen = heapq.nlargest(count, broker.sessions(), key=lag)
    return [describe_session(broker, session) for session in chosen if any(lag(session))]


def view(figures: Figures, queues: dict[str, Any] | None) -> dict[str, Any]:
    """What one dashboard update shows."""
    snapshot = figures.snapshot()
    snapshot["smqp_queues"] = queues
    snapshot["recent_auth_failures"] = list(figures.operator_log.recent_auth_failures)[-TOP:]
    snapshot["top_topics"] = list_topics(figures.broker)[:TOP]
    snapshot["slowest_consumers"] = slowest_consumers(figures.broker)
    return snapshot


class Events(Resource):
    """``GET /api/events``: ``text/event-stream``, one ``data:`` line of JSON per tick."""

    isLeaf = True

    def __init__(self, figures: Figures, clock: IReactorTime) -> None:
        super().__init__()
        self.figures = figures
        self.clock = clock
        self.watchers: set[Request] = set()
        self._loop: LoopingCall | None = None

    def render_GET(self, request: Request) -> bytes | int:
        if len(self.watchers) >= MAX_WATCHERS:
            request.setResponseCode(503)
            request.setHeader(b"content-type", b"application/json")
            return strictjson.dumps({"error": f"{MAX_WATCHERS} dashboards watch already"}) + b"\n"
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-store")
        self.watchers.add(request)
        request.notifyFinish().addBoth(lambda _: self._gone(request))
        if self._loop is None:
            self._loop = LoopingCall(self.tick)
            self._loop.clock = self.clock
            self._loop.start(TICK, now=True).addErrback(
                lambda failure: _log.failure("dashboard updates stopped", failure))
        else:
            self.tick()
        return NOT_DONE_YET

    def _gone(self, request: Request) -> None:
        self.watchers.discard(request)
        if not self.watchers and self._loop is not None:
            if self._loop.running:
                self._loop.stop()
            self._loop = None

    def tick(self) -> Deferred[None]:
        return self.figures.queues().addCallback(self._send)

    def _send(self, queues: dict[str, Any] | None) -> None:
        if not self.watchers:
            return
        data = b"data: " + strictjson.dumps(view(self.figures, queues)) + b"\n\n"
        for request in list(self.watchers):
            if (queued_bytes(request.channel.transport) or 0) > MAX_QUEUED:
                self.watchers.discard(request)
                request.finish()
                continue
            request.write(data)

    def stop(self) -> None:
        """Finish every stream (the listener is stopping)."""
        for request in list(self.watchers):
            request.finish()

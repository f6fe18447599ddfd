"""The last hour of message rates, kept in the broker: a dashboard opened now draws the hour
before it at once (``GET /api/history``), instead of only what happens while it is open.

One sample a second (messages accepted and delivered per second since the one before, at the
broker's uptime), in a ring of at most :data:`HISTORY_SECONDS` samples: a fixed 3,600 small
tuples, never more, whatever the traffic (docs/operations.md, the admin API's fixed limits).
"""
from __future__ import annotations

from collections import deque
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from brokerd.admin.figures import Figures

HISTORY_SECONDS = 3600
"""Samples kept: one an interval, so an hour."""
INTERVAL = 1.0
"""Seconds between samples."""

_log = Logger(namespace="brokerd.admin")


class RateHistory(Service):
    """Samples the broker's message counters every :data:`INTERVAL` seconds of ``clock``."""

    def __init__(self, figures: Figures, clock: IReactorTime, seconds: int = HISTORY_SECONDS) -> None:
        self.figures = figures
        self.clock = clock
        self.samples: deque[tuple[float, float, float]] = deque(maxlen=seconds)
        """(uptime seconds, accepted per second, delivered per second), oldest first."""
        self._previous: tuple[float, int, int] | None = None
        self._loop: LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        self._loop = LoopingCall(self.sample)
        self._loop.clock = self.clock
        self._loop.start(INTERVAL, now=True).addErrback(lambda failure: _log.failure("rate history stopped", failure))

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def sample(self) -> None:
        stats = self.figures.broker.stats
        now, accepted, delivered = self.figures.uptime(), stats.published, stats.delivered
        previous, self._previous = self._previous, (now, accepted, delivered)
        if previous is None or now <= previous[0]:
            return
        seconds = now - previous[0]
        self.samples.append((round(now, 3), (accepted - previous[1]) / seconds, (delivered - previous[2]) / seconds))

    def view(self) -> dict[str, Any]:
        """What ``GET /api/history`` answers."""
        return {"interval_seconds": INTERVAL, "kept_seconds": self.samples.maxlen,
                "samples": [{"t": t, "accepted": a, "delivered": d} for t, a, d in self.samples]}

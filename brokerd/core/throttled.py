"""A warning about events that may come in floods, logged once per interval at most.

A refusal a client can cause (a quota reached, a message not stored for a full subscriber)
is worth a line for the operator, but one line per event would let any client flood the log.
:class:`ThrottledWarning` logs the first event at once, then at most one line per interval,
which says how many happened since the last line.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

INTERVAL = 60.0
"""Seconds between two lines of one warning, by default."""


class ThrottledWarning:
    """One ``log.warn(text)`` per ``interval`` seconds at most; ``text`` may use ``{count}``
    (events since the last line), ``{interval}`` and the fields given to :meth:`happened`."""

    def __init__(self, log: Logger, clock: IReactorTime | Callable[[], float], text: str, interval: float = INTERVAL) -> None:
        """``clock``: an IReactorTime (its ``seconds``), or a function that returns the time."""
        self.log = log
        self.now: Callable[[], float] = cast("Callable[[], float]", getattr(clock, "seconds", clock))
        self.text = text
        self.interval = interval
        self.unreported = 0
        self.next_line = 0.0

    def happened(self, count: int = 1, **fields: object) -> None:
        """``count`` more events; ``fields`` describe the latest."""
        self.unreported += count
        now = self.now()
        if now < self.next_line:
            return
        self.log.warn(self.text, count=self.unreported, interval=self.interval, **fields)
        self.unreported = 0
        self.next_line = now + self.interval

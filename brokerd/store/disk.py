"""The free-space floor of the data directory (``--disk-free-limit``), RabbitMQ's
``disk_free_limit`` for brokerd.

A full disk is not a crash (SQLite and the event log fail cleanly) but it stalls delivery: an
acknowledgement is a write too, and with no room for it a subscriber's messages come again and
again.  So the broker stops taking new data *before* the disk is full: below the floor,
publishes that would be stored are refused with the protocol's temporary failure and the event
log drops (and counts) what it would write, while acknowledgements, deletions and everything
that frees space still commit in the room the floor keeps.

The free space is measured every ``interval`` seconds in a thread (``statvfs`` may block on a
network file system), once synchronously at start so that the first publish already knows.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.interfaces import IBrokerReactor

DEFAULT_INTERVAL = 2.0
"""Seconds between two measurements."""


def free_bytes(path: Path) -> int:
    """Bytes available to the broker on ``path``'s file system (blocking)."""
    return shutil.disk_usage(path).free


class DiskSpace(Service):
    """Watches the free space under ``path``; ``low`` is True below ``limit`` bytes."""

    _log = Logger()

    def __init__(self, path: Path, limit: int, reactor: IBrokerReactor, interval: float = DEFAULT_INTERVAL) -> None:
        self.setName("disk-space")  # Twisted's Service declares ``name = None`` untyped
        self.path = Path(path)
        self.limit = limit
        self.interval = interval
        self._reactor = reactor
        self.free: int | None = None
        self.low = False
        self._loop: LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        try:
            self._measured(free_bytes(self.path))
        except OSError as exc:
            self._unmeasurable(exc)
        self._loop = LoopingCall(self._measure)
        self._loop.clock = self._reactor
        self._loop.start(self.interval, now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _measure(self) -> Deferred[None]:
        measured = deferToThreadPool(self._reactor, self._reactor.getThreadPool(), free_bytes, self.path)
        return measured.addCallbacks(self._measured, self._failed)

    def _failed(self, failure: Failure) -> None:
        failure.trap(OSError)
        self._unmeasurable(failure.value)

    def _measured(self, free: int) -> None:
        self.free = free
        low = free < self.limit
        if low and not self.low:
            self._log.warn(
                "{path}: {free} bytes free, below --disk-free-limit {limit}: publishes that would be "
                "stored are refused and the event log pauses until space is freed",
                path=str(self.path), free=free, limit=self.limit,
            )
        elif self.low and not low:
            self._log.info("{path}: {free} bytes free again: publishes are accepted", path=str(self.path), free=free)
        self.low = low

    def _unmeasurable(self, error: BaseException | None) -> None:
        """The file system cannot be asked (gone, permissions): keep the last verdict."""
        self._log.warn("{path}: cannot measure free space: {error}", path=str(self.path), error=error)

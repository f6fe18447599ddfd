"""Blocking work (scrypt password checks, OpenPGP) off the reactor, in a bounded queue.

The reactor's thread pool queues without limit: a login flood would line up scrypt checks
(tens of milliseconds and 16 MiB each) behind one another, every waiting login holding its
connection and its memory, and an honest login would wait behind all of them.  A
:class:`WorkQueue` counts the jobs it has handed to the pool and not seen finish; at
``limit`` it fails new ones at once with :class:`brokerd.errors.Busy`, which each front end
answers with its temporary-failure reply.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from twisted.internet.defer import Deferred, fail, maybeDeferred
from twisted.internet.threads import deferToThreadPool

from brokerd.config import Settings
from brokerd.errors import Busy
from brokerd.interfaces import IBrokerReactor


_R = TypeVar("_R")
"""What a callback passes on unchanged."""


class WorkQueue:
    """Runs ``f(*args)`` in ``reactor``'s thread pool, at most ``limit`` jobs at a time queued
    or running; ``run`` is an accounts-checker Runner.  Without a thread pool (a test clock)
    the work runs inline."""

    def __init__(self, reactor: IBrokerReactor, limit: int = Settings.max_auth_queue) -> None:
        self._reactor = reactor
        self.limit = limit
        self.pending = 0
        self.refused = 0
        """Jobs refused because the queue was full."""

    def run(self, f: Callable[..., object], *args: object) -> Deferred:
        if self.pending >= self.limit:
            self.refused += 1
            return fail(Busy(f"{self.pending} jobs are waiting for the thread pool"))
        get_pool = getattr(self._reactor, "getThreadPool", None)
        if get_pool is None:
            return maybeDeferred(f, *args)
        self.pending += 1
        d = deferToThreadPool(self._reactor, get_pool(), f, *args)
        d.addBoth(self._finished)
        return d

    def _finished(self, result: _R) -> _R:
        self.pending -= 1
        return result


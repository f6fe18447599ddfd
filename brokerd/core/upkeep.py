"""The durable service's upkeep: its start over the store (the topics, the server id, the
subscriptions and the next message number, read once the store is open, and who waits for
that), and the periodic work on the clock: expiry into dead letters, the purge of old dead
letters, and the store's queue figures for the event log.

A mixin of :class:`~brokerd.core.durable.DurableService`, apart so that the service's class
holds the deliveries and this module what keeps them in shape over time.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.config import Settings
from brokerd.core.storedtopics import StoredTopics
from brokerd.core.subscriptions import SubscriptionIndex
from brokerd.events import schema
from brokerd.store.base import SERVER_ID_META, log_unless_outage
from brokerd.store.records import Settled

EXPIRY_INTERVAL = 1.0
"""Seconds between sweeps that make expired messages dead letters."""
EXPIRY_BATCH = 1000
"""Messages one sweep moves (another sweep follows at once when there were more)."""
PURGE_INTERVAL = 60.0
"""Seconds between purges of the dead letters older than their retention."""


class DurableUpkeep:
    """The start and the sweeps of the durable service."""

    _log = Logger()
    store: Any
    clock: Any
    events: Any
    protocol: str
    domain: str
    server_id: str
    index: SubscriptionIndex
    topics: StoredTopics
    _seq: int

    if TYPE_CHECKING:
        def _count_pending(self) -> Deferred: ...
        def expired(self, settled: Settled) -> None: ...
        def settle(self, settled: Settled, reason: str | None = None) -> None: ...

    def init_upkeep(self, settings: Settings) -> None:
        """The upkeep's state, from ``settings`` (called by the service's ``__init__``)."""
        self.dead_letter_retention: float = settings.durable_dead_letter_retention
        """Seconds a dead letter is kept before it is removed for good."""
        self.gauge_interval: float | None = settings.event_log_gauge if settings.event_log else None
        """Seconds between readings of the store's queue figures into ``gauge`` events."""
        self._gauge_last: tuple[int, int, int] | None = None
        self._loops: list[LoopingCall] = []
        self._starting = False
        self._start_waiters: list[Deferred] | None = []
        """Who waits for :meth:`start` to finish; None once it did."""
        self._start_failure: Failure | None = None

    def start(self, opened: Deferred | None = None) -> Deferred:
        """Once the store is open (``opened`` fired; now when None), load the topics, the
        server id (made and stored by the first node to start), the subscriptions and the next
        message number.  ``opened``'s own result goes on unchanged to its other callbacks.
        Returns :meth:`when_started`."""
        if not self._starting:
            self._starting = True

            def load(result: Any) -> Any:
                d = self.store.load_topics()
                d.addCallback(self.topics.replace)
                d.addCallback(lambda _: self.store.get_meta(SERVER_ID_META))
                d.addCallback(self._server_id_read)
                d.addCallback(lambda _: self.store.load_subscriptions())
                d.addCallback(self.index.load)
                d.addCallback(lambda _: self._count_pending())
                d.addCallback(lambda _: self.store.next_seq())
                d.addCallback(self._numbered)
                d.addBoth(self._finished)
                return result

            def failed(failure: Failure) -> Failure:
                self._finished(failure)
                return failure

            (opened if opened is not None else succeed(None)).addCallbacks(load, failed)
        return self.when_started()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` finished (well or not)."""
        return self._start_waiters is None

    def when_started(self) -> Deferred:
        """A Deferred that fires with None once :meth:`start` finished, or with its failure
        (the front ends greet their clients, or say they are not available)."""
        if self._start_waiters is None:
            return fail(self._start_failure) if self._start_failure is not None else succeed(None)
        waiter: Deferred = Deferred()
        self._start_waiters.append(waiter)
        return waiter

    def _finished(self, result: Any) -> None:
        waiters, self._start_waiters = self._start_waiters or [], None
        self._start_failure = result if isinstance(result, Failure) else None
        for waiter in waiters:
            if self._start_failure is not None:
                waiter.errback(self._start_failure)
            else:
                waiter.callback(None)

    def _server_id_read(self, server_id: str | None) -> Deferred | None:
        if server_id is None:
            self.server_id = f"{self.domain}/{secrets.token_hex(4)}"
            return self.store.set_meta(SERVER_ID_META, self.server_id)
        self.server_id = server_id
        return None

    def _numbered(self, seq: int) -> None:
        self._seq = seq

    def start_sweeps(self) -> None:
        if self._loops:
            return
        work_list: list[tuple[float, Callable[[], Deferred | None]]] = [
            (EXPIRY_INTERVAL, self.sweep), (PURGE_INTERVAL, self.purge_dead_letters)]
        if self.gauge_interval is not None:
            work_list.append((self.gauge_interval, self.gauge))
        for interval, work in work_list:
            loop = LoopingCall(work)
            loop.clock = self.clock
            loop.start(interval, now=False).addErrback(self._report("Durable delivery sweep"))
            self._loops.append(loop)

    def stop_sweeps(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []

    def _report(self, what: str, **fields: Any) -> Callable[[Any], None]:
        """An errback that logs a failure of ``what`` with its traceback, unless the store is
        away: that change of state is the store's one line (brokerd.store.base.is_outage)."""
        def report(failure: Any) -> None:
            log_unless_outage(failure, self._log, what, **fields)
        return report

    # ------------------------------------------------------------------ expiry and dead letters

    def sweep(self) -> Deferred:
        """Make expired messages dead letters (with receipts for those that asked)."""
        d = self.store.expire(self.clock.seconds(), EXPIRY_BATCH)

        def expired(found: list[Settled]) -> Deferred | None:
            for settled in found:
                self.expired(settled)
                self.settle(settled, "expired")
            if len(found) >= EXPIRY_BATCH:
                return self.sweep()
            return None

        return d.addCallback(expired).addErrback(self._report("Expiring stored messages"))

    def purge_dead_letters(self) -> Deferred:
        """Remove the dead letters kept longer than ``dead_letter_retention``."""
        d = self.store.empty_trash(self.clock.seconds() - self.dead_letter_retention)
        return d.addErrback(self._report("Purging the dead letters"))

    def gauge(self) -> Deferred | None:
        """Read the store's queue figures (off the reactor thread: one counting query) and
        log a ``gauge`` event when they changed since the last one."""
        ask = getattr(self.store, "queue_figures", None)
        if ask is None:
            return None

        def read(figures: dict[str, Any]) -> None:
            reading = (int(figures.get("pending", 0)), int(figures.get("unacknowledged", 0)),
                       int(figures.get("trash_total", sum(int(n) for n in figures.get("trash", {}).values()))))
            if reading != self._gauge_last:
                self._gauge_last = reading
                self.events.record(schema.GAUGE, self.protocol, pending=reading[0], unacknowledged=reading[1],
                                   trash=reading[2])

        return ask().addCallback(read).addErrback(self._report("Reading the queue figures"))

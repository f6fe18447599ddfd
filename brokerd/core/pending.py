"""How many messages wait in the store for one durable subscriber, at most.

A durable subscriber whose client is away collects a pending delivery for every message its
subscriptions match, until it comes back or ends.  For a front end whose sessions anyone may
make (MQTT's persistent sessions: an anonymous or cheap login), nothing else bounds that: one
session left subscribed to ``#`` would take the disk down to ``--disk-free-limit``, after which
the core stores nothing for anyone.  :class:`PendingQuota` counts the live pending deliveries of
the subscribers whose names start with a front end's prefix and lets :meth:`DurableService.keep
<brokerd.core.durable.DurableService.keep>` store a message for one of them only while it has
fewer than ``limit``: beyond, the message is not stored for that subscriber (the others, and
its publisher's answer, are unchanged), counted, and logged once per interval at most.

The counts are read from the store when the service starts (IStore.pending_counts), then kept
here: a delivery counts from the moment :meth:`keep` reserves it until the store reports it
settled (acknowledged, given up, released when its message became a dead letter) or the
subscriber ends.  On a node of a cluster each node counts what it stored.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from brokerd.core.throttled import ThrottledWarning


class PendingQuota:
    """At most ``limit`` live pending deliveries for each subscriber named ``prefix``...."""

    _log = Logger()

    def __init__(self, prefix: str, limit: int, clock: IReactorTime) -> None:
        self.prefix = prefix
        self.limit = limit
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.dropped = 0
        """Deliveries not stored because their subscriber had ``limit`` pending."""
        self._warning = ThrottledWarning(
            self._log, clock, "{count} message(s) not stored for durable subscribers that had {limit} waiting "
            "(one such line per {interval:.0f} s at most)")

    def bounds(self, subscriber: str) -> bool:
        return subscriber.startswith(self.prefix)

    def loaded(self, counts: dict[str, int]) -> None:
        """The store's counts, read at the start: added to what was reserved meanwhile."""
        for subscriber, count in counts.items():
            self.counts[subscriber] += count

    def reserve(self, deliveries: list[tuple[str, str]], messages: int) -> list[list[tuple[str, str]]]:
        """The deliveries of each of a run of ``messages`` messages (the same ``deliveries``
        wanted for each): a bounded subscriber takes the first ones its room allows, and
        those are counted now (:meth:`release` them if the store fails)."""
        bounded = [name for name, _change in deliveries if self.bounds(name)]
        if not bounded:
            return [deliveries] * messages
        room = {name: max(self.limit - self.counts[name], 0) for name in bounded}
        runs = []
        for index in range(messages):
            runs.append([(name, change) for name, change in deliveries if room.get(name, messages) > index])
        full = 0
        for name, free in room.items():
            taken = min(free, messages)
            self.counts[name] += taken
            full += messages - taken
        if full:
            self._drop(full)
        return runs

    def release(self, deliveries: Iterable[tuple[str, str]]) -> None:
        """One message's ``deliveries`` (reserved, or in the store) are no longer pending."""
        for name, _change in deliveries:
            self.settled(name)

    def settled(self, subscriber: str) -> None:
        """One pending delivery of ``subscriber`` was settled."""
        count = self.counts.get(subscriber)
        if count is not None:
            if count > 1:
                self.counts[subscriber] = count - 1
            else:
                del self.counts[subscriber]

    def forget(self, subscriber: str) -> None:
        """``subscriber`` ended: its pending deliveries go with it."""
        self.counts.pop(subscriber, None)

    def _drop(self, count: int) -> None:
        self.dropped += count
        self._warning.happened(count, limit=self.limit)

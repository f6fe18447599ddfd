"""Sampled delivery latency: how long a message takes from the core to its recipients' sockets.

Timing every delivery would cost a clock read per message; logging it, a record per message.
Instead the Broker tests one attribute per publish (``Broker.sampling``), which this sampler
sets at most once every ``interval`` seconds.  The next multicast publish after that is routed
with time stamps: the time the core took the message (its acceptance: the front end's publish
call, in the reactor turn of the read that carried it) and, per receiving protocol, the time
its last recipient of that protocol was handed the write.  One ``latency`` record per
receiving protocol goes to the event log (docs/events.md).

Two kinds of wire format write later than the core's hand-over, and are treated apart:

- ``writes_after_read`` (SSMP, MCCHAT): a session holds what the current read sends it until
  the read is handled, then writes it all at once (``brokerd.protocols.flow``); its time is
  taken at that write, through ``after_read``.
- ``queued_delivery`` (durable front ends): the core hands the message to a queue (the durable
  store, a session's outbox); the front end logs the write itself (``delivered``), so no
  sample is taken here.

The sampler re-arms itself with one ``callLater`` after each sample, so an idle broker never
wakes up for it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from brokerd.config import Settings
from brokerd.core.message import Message
from brokerd.events import schema
from brokerd.events.log import IEventRecorder
from brokerd.interfaces import ISubscriber, IWireFormat

Stamps = list[tuple[IWireFormat, int, int]]
"""(wire format, recipients, time in ns) of each format a timed run was handed to."""


class TimedRouter(Protocol):
    """The Broker's router as the sampler uses it (brokerd.core.router, which imports this module)."""

    def timed(self, messages: list[Message], exclude: ISubscriber | None, stamps: Stamps) -> int: ...


class SampledBroker(Protocol):
    """The Broker as its sampler sees it (brokerd.core.broker, which imports this module):
    whether the next multicast is timed, and the router that times it."""

    sampling: bool

    @property
    def router(self) -> TimedRouter: ...


def _never(_callback: Callable[[], None]) -> bool:
    return False


class DeliverySampler:
    """Takes one timed publish per ``interval`` and logs its latency per receiving protocol.

    ``recorder`` is the event log's IEventRecorder; ``after_read(callback)`` runs ``callback``
    once the read being handled has written what it held, and returns False when no read is
    being handled (the front ends' flow module provides it)."""

    def __init__(
        self,
        broker: SampledBroker,
        recorder: IEventRecorder,
        reactor: IReactorTime | None,
        *,
        interval: float = Settings.event_log_sample,
        after_read: Callable[[Callable[[], None]], bool] = _never,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if interval <= 0:
            raise ValueError("the sample interval must be positive")
        self.broker = broker
        self.recorder = recorder
        self.reactor = reactor
        self.interval = interval
        self.after_read = after_read
        self.clock_ns = clock_ns
        self.samples = 0
        """Latency records written (for tests and operators)."""
        self._rearm: IDelayedCall | None = None

    def start(self) -> None:
        """Take the next publish's sample (the Broker calls this when it starts)."""
        self.broker.sampling = True

    def stop(self) -> None:
        self.broker.sampling = False
        if self._rearm is not None and self._rearm.active():
            self._rearm.cancel()
        self._rearm = None

    def _arm(self) -> None:
        self._rearm = None
        self.broker.sampling = True

    def route(self, messages: list[Message], exclude: ISubscriber | None) -> int:
        """Route ``messages`` (one accepted run, as ``Router.timed`` takes it) with time
        stamps; return the deliveries."""
        broker = self.broker
        broker.sampling = False
        clock = self.clock_ns
        stamps: Stamps = []
        accepted = clock()
        delivered = broker.router.timed(messages, exclude, stamps)
        taken = [(fmt, count, at) for fmt, count, at in stamps if count and not fmt.queued_delivery]
        if not taken:  # nobody to time: the next publish is sampled instead
            broker.sampling = True
            return delivered
        first = messages[0]
        details = (first.protocol, first.sender_name, first.target, len(messages))
        later = [entry for entry in taken if entry[0].writes_after_read]
        now = [entry for entry in taken if not entry[0].writes_after_read]
        if later and not self.after_read(lambda: self._log(accepted, [(f, c, clock()) for f, c, _ in later], details)):
            now += later  # not inside a read: they were written when handed over
        if now:
            self._log(accepted, now, details)
        if self.reactor is not None:
            self._rearm = self.reactor.callLater(self.interval, self._arm)
        return delivered

    def _log(self, accepted: int, stamps: Stamps, details: tuple) -> None:
        protocol, sender, topic, count = details
        for fmt, recipients, at in stamps:
            self.samples += 1
            self.recorder.record(
                schema.LATENCY,
                fmt.protocol,
                sender=f"{protocol}:{schema.text(sender)}",
                topic=topic,
                message="multicast",
                count=count if count > 1 else None,
                fanout=recipients,
                latency_us=max(0, (at - accepted) // 1000),
            )

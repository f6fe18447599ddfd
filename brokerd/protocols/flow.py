"""Flow control shared by the front ends: bounded output per recipient, then drop and count.

Each connection registers itself as a streaming producer of its own transport.  Twisted calls
``pauseProducing`` when more than the transport's ``bufferSize`` bytes wait to be written; from
then on the broker's messages for that connection are dropped and counted, and its own requests
are not read (so its replies cannot pile up) until ``resumeProducing``.

The drops of one congestion episode (from the pause to the resume, or to the end of the
connection) go to the event log as one ``dropped`` record whose ``dropped`` field is the count
of writes dropped, as in ``broker.stats.slow_consumer_drops`` (a write is one message, or a run
of messages one publisher sent to one topic in one read, which the core hands over as one): a
slow reader costs the hot path an integer increment per write, never a log entry.
"""
from __future__ import annotations

from typing import Any

from brokerd.events.schema import DROPPED, SLOW_CONSUMER


def limit_output_buffer(transport: Any, limit: int) -> None:
    """Make Twisted pause the producer when more than ``limit`` bytes are queued.  For TLS the
    queue that matters is the TCP transport's under the TLS layer."""
    transport.bufferSize = limit
    inner = getattr(transport, "transport", None)
    if inner is not None and hasattr(inner, "bufferSize"):
        inner.bufferSize = limit


def record_drops(events: Any, protocol: str, session: bytes, count: int, reason: str = SLOW_CONSUMER) -> None:
    """One ``dropped`` event standing for ``count`` writes ``session`` did not get."""
    events.record(DROPPED, protocol, session=session, reason=reason, dropped=count, outcome=DROPPED)


class DropWhenCongested:
    """IPushProducer half of a session whose ``send`` is its transport's ``write``.

    The class using it has ``transport``, ``closed``, ``dropped``, ``protocol``, ``name``,
    ``factory.broker`` and ``factory.events`` (the event log's IEventRecorder), and calls
    :meth:`report_drops` when its connection ends (before it detaches from the broker, so the
    record comes before the session's logout).
    """

    episode_drops = 0
    """Messages dropped since the last pause that are not logged yet."""

    def _drop(self, data: bytes) -> None:
        """``send`` while congested: count instead of writing."""
        self.dropped += 1
        self.episode_drops += 1
        self.factory.broker.stats.slow_consumer_drops += 1

    def pauseProducing(self) -> None:
        if self.closed:
            return
        self.send = self._drop
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        if self.closed:
            return
        self.send = self.transport.write
        self.transport.resumeProducing()
        if self.episode_drops:
            self.report_drops()

    def stopProducing(self) -> None:
        self.send = self._drop

    def report_drops(self) -> None:
        """Log the drops of the current episode (if any) as one event; idempotent."""
        count = self.episode_drops
        if count:
            self.episode_drops = 0
            record_drops(self.factory.events, self.protocol, self.name, count)

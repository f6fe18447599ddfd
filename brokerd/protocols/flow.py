"""Flow control shared by the front ends: bounded output per recipient, then drop and count.

Each connection registers itself as a streaming producer of its own transport.  Twisted calls
``pauseProducing`` when more than the transport's ``bufferSize`` bytes wait to be written; from
then on the broker's messages for that connection are dropped and counted, and its own requests
are not read (so its replies cannot pile up) until ``resumeProducing``.
"""
from __future__ import annotations

from typing import Any


def limit_output_buffer(transport: Any, limit: int) -> None:
    """Make Twisted pause the producer when more than ``limit`` bytes are queued.  For TLS the
    queue that matters is the TCP transport's under the TLS layer."""
    transport.bufferSize = limit
    inner = getattr(transport, "transport", None)
    if inner is not None and hasattr(inner, "bufferSize"):
        inner.bufferSize = limit


class DropWhenCongested:
    """IPushProducer half of a session whose ``send`` is its transport's ``write``.

    The class using it has ``transport``, ``closed``, ``dropped`` and ``factory.broker``.
    """

    def _drop(self, data: bytes) -> None:
        """``send`` while congested: count instead of writing."""
        self.dropped += 1
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

    def stopProducing(self) -> None:
        self.send = self._drop

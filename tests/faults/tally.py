"""What a fault-injection run's clients sent and saw, and the checks over it.

A payload is ``<stream>:<seq>``: a *stream* is one publishing connection (a publisher that
reconnects starts a new stream, since a connection the client gave up on may still be read
by a frozen node after newer ones), ``seq`` counts from 1 in it.  A subscriber connection
must see each stream's numbers strictly increasing (a gap is allowed: live pub/sub is at most
once, and a durable publish not acknowledged may be lost); a number not above the last one is
an order violation (a duplicate too: a replay shows up here)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred


class Signal:
    """Bounded waits for a condition over changing state: whoever changes the state calls
    :meth:`changed`; :meth:`until` fires once the condition holds, or fails at ``timeout``."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self._waits: list[tuple[Callable[[], bool], Deferred]] = []

    def changed(self) -> None:
        for condition, d in list(self._waits):
            if not d.called and condition():
                self._waits.remove((condition, d))
                d.callback(None)

    def until(self, condition: Callable[[], bool], timeout: float) -> Deferred:
        d: Deferred = Deferred()
        if condition():
            d.callback(None)
            return d
        self._waits.append((condition, d))

        def forget(result: Any) -> Any:
            if (condition, d) in self._waits:
                self._waits.remove((condition, d))
            return result

        return d.addTimeout(timeout, self.reactor).addBoth(forget)


def parse(payload: bytes | str) -> tuple[str, int] | None:
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    stream, _, number = text.rpartition(":")
    if not stream or not number.isdigit():
        return None
    return stream, int(number)


@dataclass
class Receiver:
    """One subscriber connection's view: the last number of each stream it saw."""

    name: str
    last: dict[str, int] = field(default_factory=dict)
    delivered: int = 0


@dataclass
class Tally:
    signal: Signal
    sent: dict[str, int] = field(default_factory=dict)
    """Each stream's highest number sent."""
    order_violations: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    """Payloads no publisher of the run sent (forged deliveries)."""
    delivered: dict[str, int] = field(default_factory=dict)
    """Deliveries per subscriber (its name, across its reconnections)."""
    published: dict[str, int] = field(default_factory=dict)
    acknowledged: dict[str, int] = field(default_factory=dict)
    reconnects: dict[str, int] = field(default_factory=dict)
    smqp_acknowledged: set[str] = field(default_factory=set)
    """SMQP publishes the server answered 200 (stored)."""
    smqp_received: set[str] = field(default_factory=set)
    smqp_completed: set[str] = field(default_factory=set)
    """Notifications whose 310 exchange completed (the server's 310 ACK arrived)."""
    smqp_duplicates: list[str] = field(default_factory=list)
    smqp_notifications: int = 0

    def publishing(self, protocol: str, stream: str, number: int) -> str:
        self.sent[stream] = number
        self.published[protocol] = self.published.get(protocol, 0) + 1
        return f"{stream}:{number}"

    def acknowledge(self, protocol: str) -> None:
        self.acknowledged[protocol] = self.acknowledged.get(protocol, 0) + 1

    def reconnected(self, client: str) -> None:
        self.reconnects[client] = self.reconnects.get(client, 0) + 1

    def receive(self, receiver: Receiver, payload: bytes | str, subscriber: str) -> None:
        parsed = parse(payload)
        if parsed is None or parsed[0] not in self.sent or parsed[1] > self.sent[parsed[0]]:
            self.foreign.append(f"{receiver.name}: {payload!r}")
            self.signal.changed()
            return
        stream, number = parsed
        last = receiver.last.get(stream, 0)
        if number <= last:
            self.order_violations.append(f"{receiver.name}: {stream} {number} after {last}")
        else:
            receiver.last[stream] = number
        receiver.delivered += 1
        self.delivered[subscriber] = self.delivered.get(subscriber, 0) + 1
        self.signal.changed()

    def smqp_notified(self, receiver: Receiver, payload: bytes) -> None:
        text = payload.decode("utf-8", "replace")
        self.smqp_notifications += 1
        if text in self.smqp_completed:
            self.smqp_duplicates.append(text)
        first = text not in self.smqp_received
        self.smqp_received.add(text)
        if first:
            self.receive(receiver, payload, "smqp-durable")
        else:
            self.signal.changed()

    def smqp_lost(self) -> list[str]:
        return sorted(self.smqp_acknowledged - self.smqp_received)

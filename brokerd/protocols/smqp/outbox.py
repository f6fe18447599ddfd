"""One SMQP session's notification queue: the two-phase commit of NOTIFY MESSAGE.

The durable truth is the store (a pending delivery row per message the subscriber has not
acknowledged), kept by the core's durable service (:mod:`brokerd.core.durable`, whatever
protocol published the message); the outbox is this session's cursor over it.  It holds a window of at most
:data:`WINDOW` pending deliveries (highest priority first, then in order), sends one, and
sends the next only after the client's ``310 ACK`` has been stored and the server's ``310``
written (:meth:`Outbox.acknowledge`, then :meth:`Outbox.pump` once the reply is out).

- No acknowledgement within the service's ``retry_timeout`` (default :data:`RETRY_TIMEOUT`)
  seconds: the notification is sent again (once the session's output is under its limit,
  like any notification; the next timeout starts when it is written), up to
  ``max_attempts`` (default :data:`MAX_ATTEMPTS`) attempts in all; then the delivery is
  given up (the message goes to its topic's Trash once nobody has it pending).
- ``416`` (not available): the delivery is offered again after ``retry_timeout`` (counting
  an attempt), and a ``ONE`` message is offered to the other subscribers at once.
- ``312`` (wait): acknowledged, and the message's topic is suspended for this session.
- A topic suspended by SET NOTIFY SUSPEND, or whose delivery mode is NONE, is skipped; its
  deliveries stay in the store and come back when it is resumed.
- Messages that never went through the store (Guarantee: NO, other protocols' unicasts,
  topic/subscriber notices) wait in a bounded FIFO (:data:`MAX_VOLATILE` notifications and
  the service's ``max_queued_bytes`` bytes, then dropped and counted, one event-log record
  per run of drops) and need no acknowledgement; they too wait for an outstanding
  acknowledgement.
- Bytes, not only counts: the window holds at most ``max_queued_bytes`` of message bodies
  (always at least one message), the store read that refills it reads no more (the bodies
  past the budget stay unread in the store, and so do those the window already holds), and
  :meth:`Outbox.pump` writes only while the session's output is under
  ``--max-output-buffer`` (``can_notify``), the FIFO in batches of about :data:`BATCH`
  bytes; the rest waits for the session's resumeProducing.

New deliveries arrive with :meth:`Outbox.offer` after their publish committed; a full
window only marks the outbox ``stale``, and the store is read again when the window drains.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.core.durable import MAX_ATTEMPTS, RETRY_TIMEOUT  # noqa: F401 (the defaults of --smqp-retry-timeout, --smqp-max-attempts)
from brokerd.core.subscriptions import wildcard_covers
from brokerd.store.records import Delivery

WINDOW = 256
"""Pending deliveries one session holds in memory (the rest stay in the store)."""
MAX_VOLATILE = 4096
"""Unacknowledged-kind notifications (Guarantee: NO, other protocols' unicasts, notices) queued per
session before new ones are dropped."""
MAX_QUEUED_BYTES = 4 << 20
"""Bytes of message bodies in one session's window, and bytes of its FIFO of notifications
that need no acknowledgement (each): the default of ``--smqp-max-queued-bytes``."""
BATCH = 64 * 1024
"""Bytes of the FIFO written at once before the session's output limit is checked again."""


class Session(Protocol):
    subscriber: str

    def write_notify(self, parts: list[bytes]) -> None: ...

    def can_notify(self) -> bool: ...


class NoNotification(Exception):
    """A 310/312/416 with no notification outstanding."""


class Outbox:
    _log = Logger()

    def __init__(self, session: Session, service: Any) -> None:
        self.session = session
        self.service = service
        self.durable = service.durable
        self.name = session.subscriber
        self.heap: list[tuple[int, int, Delivery]] = []
        self.known: set[int] = set()
        """Seqs in the heap, in flight, waiting for a ONE claim, or refused for now."""
        self.volatile: deque[bytes] = deque()
        self.volatile_bytes = 0
        self.window_bytes = 0
        """Bytes of the message bodies in the heap."""
        self.max_bytes: int = getattr(service, "max_queued_bytes", MAX_QUEUED_BYTES)
        self.inflight: Delivery | None = None
        self.inflight_parts: list[bytes] | None = None
        self.settling = False
        self._retry_call: Any = None
        self._later: dict[int, Any] = {}
        self.waiting_one: dict[int, Delivery] = {}
        self.stale = True
        self.loading = False
        self.suspended_all = False
        self.suspended: set[str] = set()
        self.closed = False
        self.dropped = 0
        self.unreported = 0
        """Volatile notifications dropped since the queue last drained (not logged yet)."""
        self._resending: set[int] = set()
        """Refused (416) deliveries offered again: their next send is a redelivery."""
        self._resend_attempt = 0
        """The attempt number of the retry of the notification in flight waiting for the
        session's output to drain (0: none)."""

    # ------------------------------------------------------------------ suspension

    def blocked(self, topic: str) -> bool:
        """Not to be sent now: suspended, a NONE topic, or one the subscriber may no longer
        read (the UAL changed after the message was stored for it; it stays pending)."""
        if topic in self.suspended or self.durable.delivery_mode(topic) == "NONE":
            return True
        readable = self.durable.readable
        if readable is not None and not readable(self.name, topic):
            return True
        return any("*" in s and _covers(s, topic) for s in self.suspended)

    def suspend(self, topic: str | None) -> None:
        """SET NOTIFY SUSPEND (None: everything) or a 312 wait on ``topic``."""
        if topic is None:
            self.suspended_all = True
        else:
            self.suspended.add(topic)

    def resume(self, topic: str | None) -> None:
        """SET NOTIFY RESUME (None: everything); ignored when nothing was suspended."""
        if topic is None:
            if not self.suspended_all and not self.suspended:
                return
            self.suspended_all = False
            self.suspended.clear()
        elif topic in self.suspended:
            self.suspended.discard(topic)
        else:
            return
        self.refresh()

    def refresh(self) -> None:
        """Read the store again (a topic became deliverable, subscriptions changed)."""
        self.stale = True
        self.pump()

    # ------------------------------------------------------------------ input

    def offer(self, delivery: Delivery) -> None:
        """A new pending delivery, committed in the store."""
        if self.closed or delivery.seq in self.known:
            return
        if self.blocked(delivery.topic):
            return
        if self._window_full():
            self.stale = True
            return
        self._push(delivery)
        self.pump()

    def _window_full(self) -> bool:
        return len(self.heap) >= WINDOW or (bool(self.heap) and self.window_bytes >= self.max_bytes)

    def offer_volatile(self, data: bytes) -> None:
        if self.closed:
            return
        if len(self.volatile) >= MAX_VOLATILE or self.volatile_bytes + len(data) > self.max_bytes:
            self.dropped += 1
            self.unreported += 1
            self.service.volatile_dropped(self)
            return
        self.volatile.append(data)
        self.volatile_bytes += len(data)
        self.pump()

    def discard(self, seq: int) -> None:
        """The delivery is no longer pending (settled elsewhere, trashed, moved)."""
        self.known.discard(seq)
        self._resending.discard(seq)
        self.waiting_one.pop(seq, None)
        call = self._later.pop(seq, None)
        if call is not None and call.active():
            call.cancel()

    def reoffer(self, seq: int) -> None:
        """A ONE message another session held is free again."""
        delivery = self.waiting_one.pop(seq, None)
        if delivery is not None and not self.closed:
            self.known.discard(seq)
            self.offer(delivery)

    def _push(self, delivery: Delivery) -> None:
        self.known.add(delivery.seq)
        self.window_bytes += len(delivery.data)
        heapq.heappush(self.heap, (-delivery.priority, delivery.seq, delivery))

    def _pop(self) -> tuple[int, int, Delivery]:
        entry = heapq.heappop(self.heap)
        self.window_bytes -= len(entry[2].data)
        return entry

    # ------------------------------------------------------------------ output

    def pump(self) -> None:
        """Send what may be sent now."""
        if self.closed or self.settling or not self.session.can_notify():
            return
        if self.inflight is not None:
            if self._resend_attempt:
                self._resend()
            return
        if self.suspended_all:
            return
        volatile = self.volatile
        while volatile:
            if not self.session.can_notify():
                return  # the session's resumeProducing pumps again
            parts: list[bytes] = []
            size = 0
            while volatile and size < BATCH:
                data = volatile.popleft()
                parts.append(data)
                size += len(data)
            self.volatile_bytes -= size
            self.session.write_notify(parts)
        if self.unreported:
            self._report_drops()
        if not self.session.can_notify():
            return
        heap = self.heap
        while heap:
            _p, seq, delivery = self._pop()
            if seq not in self.known or seq in self.waiting_one:
                continue
            if self.blocked(delivery.topic):
                self.known.discard(seq)
                continue
            if delivery.mode == "ONE" and not self.durable.claim(seq, self):
                self.waiting_one[seq] = delivery
                continue
            self._send(delivery)
            return
        if self.stale and not self.loading:
            self._reload()

    def _send(self, delivery: Delivery) -> None:
        self.inflight = delivery
        self._resend_attempt = 0
        self.inflight_parts = self.service.render(delivery)
        self.session.write_notify(self.inflight_parts)
        self._retry_call = self.durable.clock.callLater(self.durable.retry_timeout, self._retry)
        if delivery.seq in self._resending or delivery.attempts:
            self._resending.discard(delivery.seq)
            self.durable.redelivered(self, delivery, delivery.attempts + 1)
        else:
            self.durable.delivered(self, delivery)

    def _report_drops(self) -> None:
        count, self.unreported = self.unreported, 0
        self.service.volatile_drops(self, count)

    def _reload(self) -> None:
        self.loading = True
        self.stale = False
        exclude = [t for t in self.suspended if "*" not in t] + self.durable.held_topics()
        # What the window has room for, in messages and in bytes: the store reads no body
        # past the budget, so a refill never holds more than the limit and one message.
        limit = max(1, WINDOW - len(self.heap))
        budget = max(1, self.max_bytes - self.window_bytes)
        d = self.durable.store.pending(self.name, limit, exclude, budget, frozenset(self.known))
        d.addCallbacks(self._loaded, self._load_failed)

    def _loaded(self, deliveries: list[Delivery]) -> None:
        self.loading = False
        if self.closed:
            return
        added = 0
        for delivery in deliveries:
            if delivery.seq in self.known or self.blocked(delivery.topic):
                continue
            if self._window_full():
                self.stale = True
                break
            self._push(delivery)
            added += 1
        if added:
            self.stale = True  # the read may have stopped at the budget: read again once drained
        self.pump()

    def _load_failed(self, failure: Failure) -> None:
        self.loading = False
        self._log.failure("Reading the pending notifications of {name}", failure, name=self.name)
        self.stale = True

    # ------------------------------------------------------------------ the client's answer

    def acknowledge(self, wait: bool = False) -> Deferred:
        """The client's ``310 ACK`` (``wait``: its ``312``): fires once stored."""
        delivery = self._take()
        self.settling = True
        if wait:
            self.suspend(delivery.topic)
        d = self.durable.acknowledged(self, delivery)

        def done(result: Any) -> Any:
            self.settling = False
            self.known.discard(delivery.seq)
            return result

        return d.addBoth(done)

    def refuse(self) -> Deferred:
        """The client's ``416``: try again later (a ONE message: someone else first)."""
        delivery = self._take()
        if delivery.mode == "ONE":
            self.durable.release(delivery.seq, self)
        self.settling = True
        d = self.durable.store.attempt(self.name, delivery.seq)

        def counted(attempts: int) -> Deferred | None:
            self.settling = False
            if attempts == 0:
                self.known.discard(delivery.seq)
                return None
            if attempts >= self.durable.max_attempts:
                return self._give_up(delivery)
            durable = self.durable
            self._later[delivery.seq] = durable.clock.callLater(durable.retry_timeout, self._again, delivery)
            return None

        def failed(failure: Failure) -> None:
            self.settling = False
            self.known.discard(delivery.seq)
            self._log.failure("Counting a refused delivery", failure)

        return d.addCallbacks(counted, failed)

    def _take(self) -> Delivery:
        delivery = self.inflight
        if delivery is None or self.settling:
            raise NoNotification()
        self.inflight = self.inflight_parts = None
        self._resend_attempt = 0
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None
        return delivery

    def _again(self, delivery: Delivery) -> None:
        self._later.pop(delivery.seq, None)
        if self.closed or delivery.seq not in self.known:
            return
        self.known.discard(delivery.seq)
        self._resending.add(delivery.seq)
        self.offer(delivery)
        if delivery.seq not in self.known:  # not taken (suspended, full window): forget it
            self._resending.discard(delivery.seq)

    def _retry(self) -> None:
        """No acknowledgement in time: count the attempt, send again or give up."""
        self._retry_call = None
        delivery = self.inflight
        if delivery is None or self.closed:
            return
        self.settling = True
        d = self.durable.store.attempt(self.name, delivery.seq)

        def counted(attempts: int) -> Deferred | None:
            self.settling = False
            if self.closed or self.inflight is not delivery:
                return None
            if attempts == 0:
                self._abandon(delivery)
                return None
            if attempts >= self.durable.max_attempts:
                self.inflight = self.inflight_parts = None
                return self._give_up(delivery)
            self._resend_attempt = attempts + 1
            self.pump()  # now if the output is under its limit, else once it drains
            return None

        def failed(failure: Failure) -> None:
            self.settling = False
            self._log.failure("Counting a delivery attempt", failure)
            if self.inflight is delivery and not self.closed:
                self._retry_call = self.durable.clock.callLater(self.durable.retry_timeout, self._retry)

        d.addCallbacks(counted, failed)

    def _resend(self) -> None:
        """The retry of the notification in flight, written under the same output limit as
        any notification; its retry timeout starts once it is written."""
        attempt, self._resend_attempt = self._resend_attempt, 0
        delivery, parts = self.inflight, self.inflight_parts
        assert delivery is not None and parts is not None
        self.durable.redelivered(self, delivery, attempt)
        self.session.write_notify(parts)
        self._retry_call = self.durable.clock.callLater(self.durable.retry_timeout, self._retry)

    def _abandon(self, delivery: Delivery) -> None:
        """The delivery vanished from the store (expired, removed): move on."""
        self.inflight = self.inflight_parts = None
        if delivery.mode == "ONE":
            self.durable.release(delivery.seq, self)
        self.known.discard(delivery.seq)
        self.pump()

    def _give_up(self, delivery: Delivery) -> Deferred:
        if delivery.mode == "ONE":
            self.durable.release(delivery.seq, self)
        self.settling = True

        def done(result: Any) -> Any:
            self.settling = False
            self.known.discard(delivery.seq)
            self.pump()
            return result

        return self.durable.give_up(self, delivery).addBoth(done)

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        """The connection is gone: what was not acknowledged stays pending in the store."""
        self.closed = True
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        for call in self._later.values():
            if call.active():
                call.cancel()
        self._later.clear()
        inflight = self.inflight
        self.inflight = self.inflight_parts = None
        if inflight is not None and inflight.mode == "ONE":
            self.durable.release(inflight.seq, self)
        for seq in list(self.waiting_one):
            self.durable.unwait(seq, self)
        self.heap.clear()
        self.window_bytes = 0
        self.known.clear()
        self.volatile.clear()
        self.volatile_bytes = 0
        self.waiting_one.clear()
        self._resending.clear()
        if self.unreported:
            self._report_drops()


def _covers(pattern_topic: str, key: str) -> bool:
    """A suspended wildcard (``base/pattern``) covers ``key``."""
    base, _slash, pattern = pattern_topic.rpartition("/")
    if base.startswith("/"):
        base = ""
    return wildcard_covers(base, pattern, key)


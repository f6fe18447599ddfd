"""One SMQP session's notification queue: the two-phase commit of NOTIFY MESSAGE.

The durable truth is the store (a pending delivery row per message the subscriber has not
acknowledged), kept by the core's durable service (:mod:`brokerd.core.durable`, whatever
protocol published the message); the outbox is this session's cursor over it.  It holds a window of at most
:data:`WINDOW` pending deliveries (highest priority first, then in order), sends one, and
sends the next only after the client's ``310 ACK`` has been stored and the server's ``310``
written (:meth:`Outbox.acknowledge`, then :meth:`Outbox.pump` once the reply is out).

- ONE messages: at most the service's ``max_one_held`` (``--smqp-max-one-held``) sent
  and unanswered; the others are parked (left to the other subscribers) until an answer
  makes room.  One left unanswered for the retry timeout ends the session like a window's
  (below), so it goes to a subscriber that answers instead of being sent here again.
- No acknowledgement within the durable service's ``retry_timeout`` (``--durable-retry-timeout``)
  seconds: the notification is sent again (once the session's output is under its limit,
  like any notification; the next timeout starts when it is written), up to
  ``max_attempts`` (``--durable-max-attempts``) attempts in all; then the delivery is
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

Notification window (a brokerd extension, ``SET NOTIFY WINDOW n``, docs/smqp.md): by default
one notification is outstanding, as the draft has it.  With a window of ``n`` up to ``n``
NOTIFYs (and at most ``max_queued_bytes`` of their bodies, always at least one) are
outstanding: written, and the server's answer to the client's answer not yet written (the
session reports that with :meth:`Outbox.replied`).  The client answers them in the order
they were sent, so each ``310``/``312``/``416`` settles the oldest one; their store writes
overlap and share the store's group commits.  A notification of a window left unanswered for
the retry timeout is not sent again on the same connection (it would break the order of the
answers): its attempt is counted (given up at ``max_attempts``) and the session is closed, so
everything unanswered is sent again on the next login.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.core.publication import StoredPage
from brokerd.core.storedtopics import HELD
from brokerd.core.subscriber import owner_of
from brokerd.core.subscriptions import wildcard_covers
from brokerd.interfaces import IWireFormat
from brokerd.protocols.smqp.answers import Answers, NoNotification, _Sent  # noqa: F401 (NoNotification: the outbox's error)
from brokerd.store.base import is_outage
from brokerd.store.memory import StoreClosed
from brokerd.store.records import Delivery

WINDOW = 256
"""Pending deliveries one session holds in memory (the rest stay in the store)."""
MAX_VOLATILE = 4096
"""Unacknowledged-kind notifications (Guarantee: NO, other protocols' unicasts, notices) queued per
session before new ones are dropped."""
BATCH = 64 * 1024
"""Bytes of the FIFO written at once before the session's output limit is checked again."""


class Session(Protocol):
    """Who an outbox notifies: an SMQP session (or a link to another domain's server), named
    as a durable subscriber, which writes one notification at a time when it can."""

    @property
    def subscriber(self) -> str: ...

    def write_notify(self, parts: list[bytes]) -> None: ...

    def can_notify(self) -> bool: ...


class Outbox(Answers):
    _log = Logger()

    def __init__(self, session: Session, service: Any) -> None:
        self.session = session
        self.service = service
        self.durable = service.durable
        self.name = session.subscriber
        self.owner = owner_of(self.name)
        """Whose subscriber this is: the router asks the access list for this principal."""
        self.heap: list[tuple[int, int, Delivery]] = []
        self.known: set[int] = set()
        """Seqs in the heap, in flight, waiting for a ONE claim, or refused for now."""
        self.volatile: deque[bytes] = deque()
        self.volatile_bytes = 0
        self.window_bytes = 0
        """Bytes of the message bodies in the heap."""
        self.max_bytes: int = service.max_queued_bytes
        self.max_one_held: int = service.max_one_held
        self.one_held = 0
        """ONE messages among ``sent`` (claimed by this session, not answered)."""
        self.parked: dict[int, Delivery] = {}
        """ONE deliveries taken from the heap while ``one_held`` was at ``max_one_held``: left
        to the other subscribers meanwhile, back in the heap once an answer makes room.
        Still in ``known`` and counted in the window, so a store read does not load them
        again and the memory they take stays bounded by :data:`WINDOW`."""
        self.sent: deque[_Sent] = deque()
        """Notifications written and not answered by the client, oldest first."""
        self.sent_bytes = 0
        """Bytes of the message bodies in ``sent``."""
        self.window = 1
        """Notifications outstanding at most (``SET NOTIFY WINDOW``; 1: the draft's)."""
        self.settles = 0
        """Client answers whose store write has not completed."""
        self.unreplied = 0
        """Client answers the session has not written its own answer to yet."""
        self._counting = False
        """A retry's attempt is being counted, or a delivery given up."""
        self._later: dict[int, IDelayedCall] = {}
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

    @property
    def inflight(self) -> Delivery | None:
        """The oldest notification not answered yet."""
        return self.sent[0].delivery if self.sent else None

    @property
    def settling(self) -> bool:
        return self._counting or self.settles > 0

    def outstanding(self) -> int:
        """Notifications sent whose exchange is not over (see the module docstring)."""
        return len(self.sent) + self.settles + self.unreplied

    def set_window(self, size: int) -> None:
        """SET NOTIFY WINDOW: up to ``size`` notifications outstanding from now on."""
        self.window = size
        self.pump()

    def replied(self) -> None:
        """The session wrote its answer to one client answer: the window has room again."""
        if self.unreplied:
            self.unreplied -= 1
        self.pump()

    # ------------------------------------------------------------------ suspension

    def blocked(self, topic: str) -> bool:
        """Not to be sent now: suspended, or a NONE topic (whether the subscriber may read it
        the router decided before it came in: :meth:`take`, :meth:`forbid`)."""
        if topic in self.suspended or self.durable.delivery_mode(topic) == HELD:
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
        self.durable.route(StoredPage(self.owner, (delivery,), self))
        self.pump()

    def take(self, delivery: Delivery) -> None:
        """The router let the subscriber read ``delivery``: into the window, unless it is
        here already, blocked, or the window is full (then read again once it drains)."""
        if delivery.seq in self.known or self.blocked(delivery.topic):
            return
        if self._window_full():
            self.stale = True
            return
        self._push(delivery)

    def forbid(self, delivery: Delivery) -> None:
        """The subscriber's owner may no longer read ``delivery``'s topic (the UAL changed
        after it was stored for it): not sent, and it stays pending, should the UAL let the
        subscriber read it again."""

    def recheck(self) -> None:
        """The access list changed: what waits here unsent (the heap, the parked ONE
        deliveries) is routed again."""
        waiting = [entry[2] for entry in self.heap] + list(self.parked.values())
        if not waiting or self.closed:
            return
        self.heap.clear()
        self.parked.clear()
        self.window_bytes = 0
        self.known.difference_update(delivery.seq for delivery in waiting)
        self.durable.route(StoredPage(self.owner, waiting, self))
        self.pump()

    @property
    def wire_format(self) -> IWireFormat:
        """How the core renders a message never stored for this session (NOTIFY MESSAGE
        with Guarantee: NO)."""
        return self.service.wire

    def _window_full(self) -> bool:
        held = len(self.heap) + len(self.parked)
        return held >= WINDOW or (held > 0 and self.window_bytes >= self.max_bytes)

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
        parked = self.parked.pop(seq, None)
        if parked is not None:
            self.window_bytes -= len(parked.data)
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
        if self.closed or self._counting or not self.session.can_notify():
            return
        if self._resend_attempt and self.sent:
            self._resend()
            return
        if self.suspended_all or self.outstanding() >= self.window:
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
        if self.parked and self.one_held < self.max_one_held:
            self._unpark()
        heap = self.heap
        while heap and self.outstanding() < self.window:
            if not self.session.can_notify():
                return
            _p, seq, delivery = self._pop()
            if seq not in self.known or seq in self.waiting_one:
                continue
            if self.blocked(delivery.topic):
                self.known.discard(seq)
                continue
            if self.sent and self.sent_bytes + len(delivery.data) > self.max_bytes:
                self.known.discard(seq)
                self._push(delivery)  # over the bytes in flight: once answers come
                return
            if delivery.mode == "ONE":
                if self.one_held >= self.max_one_held:
                    self._park(delivery)
                    continue
                if not self.durable.claim(seq, self):
                    self.waiting_one[seq] = delivery
                    continue
            self._send(delivery)
        if self.outstanding() >= self.window:
            return
        if self.stale and not self.loading:
            self._reload()

    def _park(self, delivery: Delivery) -> None:
        """Hold back a ONE delivery while this session holds its share (see ``parked``)."""
        self.parked[delivery.seq] = delivery
        self.window_bytes += len(delivery.data)

    def _unpark(self) -> None:
        """An answer made room for a ONE message: the parked ones go back in the heap (those
        over the share are parked again as the heap is sent)."""
        parked, self.parked = self.parked, {}
        for delivery in parked.values():
            self.window_bytes -= len(delivery.data)
            self._push(delivery)

    def _send(self, delivery: Delivery) -> None:
        self._resend_attempt = 0
        entry = _Sent(delivery, self.service.render(delivery))
        if delivery.mode == "ONE":
            self.one_held += 1
        self.sent.append(entry)
        self.sent_bytes += len(delivery.data)
        self.session.write_notify(entry.parts)
        entry.call = self.durable.clock.callLater(self.durable.retry_timeout, self._retry, entry)
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
        limit = max(1, WINDOW - len(self.heap) - len(self.parked))
        budget = max(1, self.max_bytes - self.window_bytes)
        d = self.durable.pending(self.name, limit, exclude, budget, frozenset(self.known))
        d.addCallbacks(self._loaded, self._load_failed)

    def _loaded(self, deliveries: list[Delivery]) -> None:
        self.loading = False
        if self.closed:
            return
        held = len(self.heap)
        self.durable.route(StoredPage(self.owner, deliveries, self))
        if len(self.heap) > held:
            self.stale = True  # the read may have stopped at the budget: read again once drained
        self.pump()

    def _load_failed(self, failure: Failure) -> None:
        self.loading = False
        if failure.check(StoreClosed):
            return  # the broker is stopping: what is pending stays stored for the next start
        if not is_outage(failure):  # the store logs its outage once; the next pump reads again
            self._log.failure("Reading the pending notifications of {name}", failure, name=self.name)
        self.stale = True

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        """The connection is gone: what was not acknowledged stays pending in the store."""
        self.closed = True
        for call in self._later.values():
            if call.active():
                call.cancel()
        self._later.clear()
        sent, self.sent = self.sent, deque()
        self.sent_bytes = 0
        self.one_held = 0
        self.parked.clear()
        for entry in sent:
            entry.cancel()
            if entry.delivery.mode == "ONE":
                self.durable.release(entry.delivery.seq, self)
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


"""Durable delivery: durable subscriptions and pending messages, for every protocol.

A durable subscription outlives its subscriber's connection.  A message published to a topic
one covers, by any protocol, is stored with one pending delivery per subscriber before its
publisher is told it was accepted (:meth:`DurableService.keep` for the core's publishes,
:meth:`DurableService.publish` for a front end that builds the record itself); a connected
subscriber is offered it once committed, an offline one reads its pending deliveries from the
store when it comes back.  Topics no durable subscription covers never reach this module: the
Broker asks :meth:`DurableService.covers` (a dict lookup) and routes in memory.

The service keeps, beside the store: the subscription index, the connected durable sessions
(each an :class:`IDurableSession`, e.g. an SMQP outbox), message numbers, the ``ONE``
delivery claims, expiry into a topic's Trash and Trash emptying, and one outcome event per
delivery, acknowledgement, redelivery, give-up, expiry and Trash move (docs/events.md),
with the message's id, topic, publisher, size and age.  Those come from
:attr:`DurableService.published`, a bounded memory of recent messages; a message it no
longer holds is read back from the store once, off the reactor thread.

What the front end that owns the subscriptions decides is set as attributes: default
timeouts and delivery modes per topic, message ids, which topics are private to it, and who
sends receipts.  All of it runs on the reactor thread; the store works off it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core import stored
from brokerd.core.message import MULTICAST, Message
from brokerd.core.subscriptions import MESSAGE, SubscriptionIndex
from brokerd.events import schema
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.store.base import is_outage
from brokerd.store.records import Delivery, MessageRecord, ReceiptDue, Settled

EXPIRY_INTERVAL = 1.0
"""Seconds between sweeps that move expired messages to their Trash."""
EXPIRY_BATCH = 1000
"""Messages one sweep moves (another sweep follows at once when there were more)."""
TRASH_INTERVAL = 60.0
"""Seconds between Trash emptyings."""
PUBLISHED_MEMORY = 16_384
"""Recent messages whose id, publisher, time and size outcome events take from memory
(the oldest is forgotten first; a forgotten one is read back from the store)."""
UNACKNOWLEDGED = schema.UNACKNOWLEDGED
"""The drop reason of a delivery given up after ``max_attempts`` sends without an ack."""
ADD = "ADD"
"""The change a new message makes to its topic (the one durable subscribers are told of)."""


class Published(NamedTuple):
    """What outcome events say about a stored message."""

    message_id: str
    publisher: str
    received: float
    size: int


class IDurableSession(Protocol):
    """A connected durable subscriber, as the service sees it (an SMQP outbox)."""

    name: str
    closed: bool

    def offer(self, delivery: Delivery) -> None:
        """A new pending delivery, committed."""

    def discard(self, seq: int) -> None:
        """The delivery is no longer pending (settled elsewhere, trashed, moved)."""

    def reoffer(self, seq: int) -> None:
        """A ONE message another session held is free again."""

    def refresh(self) -> None:
        """Read the pending deliveries from the store again (a held topic was released)."""


def publisher_of(message: Message) -> str:
    """How the store names the publisher of another protocol's message:
    ``<protocol>:<sender name>`` (Latin-1, so any name survives)."""
    return f"{message.protocol}:{message.sender_name.decode('latin-1')}"


class DurableService:
    """The durable subscriptions and pending messages of the broker, over an IStore.

    Settings the owning front end may change: ``default_timeout`` and ``timeout_for(key)``
    (seconds a stored message lives when it names no expiry; None: for ever),
    ``mode_for(key)`` (``ALL``, or ``ONE``: the first acknowledgement settles it),
    ``identify(seq, now)`` (a stored message's id), ``reachable(key)`` (whether the core's
    publishes to a topic are kept: SMQP's login topics and virtual topics are not),
    ``receipts`` (called with each
    ReceiptDue), ``protocol`` (the event log's protocol of outcome events),
    ``retry_timeout``, ``max_attempts`` and ``trash_retention``.
    """

    _log = Logger()

    def __init__(self, store: Any, clock: Any, events: Any = NULL_EVENT_LOG) -> None:
        self.store = store
        self.clock = clock
        self.events = events
        """The event log's IEventRecorder."""
        self.index = SubscriptionIndex()
        self.sessions: dict[str, IDurableSession] = {}
        """Connected durable subscribers by name."""
        self.claims: dict[int, IDurableSession] = {}
        self.waiters: dict[int, set[IDurableSession]] = {}
        self.held: set[str] = set()
        """Topic keys whose messages stay in the store for now (SMQP delivery NONE)."""
        self.published: dict[int, Published] = {}
        """seq -> recent stored message, at most PUBLISHED_MEMORY (see the module docstring)."""
        self.suid = ""
        self.protocol = "durable"
        self.reachable: Callable[[str], bool] | None = None
        self.readable: Callable[[str, str], bool] | None = None
        """(subscriber, topic key) -> may it read the topic now; None: every subscription is
        still allowed (no reloadable access list).  Checked at delivery, so a revoked
        permission stops live and durable subscriptions alike."""
        self.is_link: Callable[[str], bool] | None = None
        """subscriber -> is it a link to another server (SMQP federation), which takes only
        messages published for forwarding (an SMQP Depth): :meth:`keep` leaves it out."""
        self.default_timeout: float | None = 86400.0
        self.timeout_for: Callable[[str], float | None] = lambda _key: self.default_timeout
        self.mode_for: Callable[[str], str] = lambda _key: "ALL"
        self.identify: Callable[[int, float], str] = lambda seq, _now: f"{self.suid}/{seq}"
        self.receipts: Callable[[ReceiptDue], Any] | None = None
        self.size_of: Callable[[bytes], int] | None = None
        """The size the event log reports of a stored row that is no stored Message (a front
        end's own rows, e.g. SMQP bodies stored before the durable service existed)."""
        self.announce: Callable[..., None] | None = None
        """Tell the other nodes of a cluster what this node committed (keywords ``tree``,
        ``subscribers``, ``pending``): the Broker sets it to its engine's ``durable_changed``
        when the engine is shared; None on one node (nothing to tell, nothing computed)."""
        self.on_tree_changed: Callable[[], Any] | None = None
        """Called when another node changed the topic tree of the owning front end (SMQP
        reads it from the store again)."""
        self.retry_timeout: float = Settings.smqp_retry_timeout
        """Seconds to wait for a delivery's acknowledgement before sending it again."""
        self.max_attempts: int = Settings.smqp_max_attempts
        """Delivery attempts of one message to one subscriber before it is given up."""
        self.trash_retention: float = Settings.smqp_trash_retention
        """Seconds a message stays in a Trash before it is removed for good."""
        self.gauge_interval: float | None = None
        """Seconds between readings of the store's queue figures into ``gauge`` events (None:
        none; the owning front end sets it when the event log is on)."""
        self._gauge_last: tuple[int, int, int] | None = None
        self.online: dict[str, float] = {}
        """Connected durable subscribers by name: when they connected (clock seconds), which
        splits an outcome's latency into the time the message waited for its subscriber
        and the time it took once the subscriber was there (``queued_us``)."""
        self._seq = 0
        self._loops: list[LoopingCall] = []
        self.stats = {"published": 0, "kept": 0, "acked": 0, "redelivered": 0, "expired": 0,
                      "trashed": 0, "delivered": 0, "given_up": 0}

    # ------------------------------------------------------------------ life

    def start(self) -> Deferred:
        """Load the subscriptions and the next message number from the store."""
        d = self.store.load_subscriptions()
        d.addCallback(self.index.load)
        d.addCallback(lambda _: self.store.next_seq())
        d.addCallback(self._numbered)
        return d

    def _numbered(self, seq: int) -> None:
        self._seq = seq

    def start_sweeps(self) -> None:
        if self._loops:
            return
        work_list = [(EXPIRY_INTERVAL, self.sweep), (TRASH_INTERVAL, self.empty_trash)]
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
            if not is_outage(failure):
                self._log.failure(what, failure, **fields)
        return report

    def next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    # ------------------------------------------------------------------ sessions

    def attach(self, session: IDurableSession) -> None:
        """A durable subscriber connected; an older session of the same name is closed by
        its front end before."""
        self.sessions[session.name] = session
        self.online[session.name] = self.clock.seconds()

    def detach(self, session: IDurableSession) -> None:
        if self.sessions.get(session.name) is session:
            del self.sessions[session.name]
            self.online.pop(session.name, None)

    def delivery_mode(self, key: str) -> str:
        return "NONE" if key in self.held else "ALL"

    def held_topics(self) -> list[str]:
        return sorted(self.held)

    def hold(self, key: str, held: bool) -> None:
        """Hold back (or release) the messages of topic ``key``."""
        if held:
            self.held.add(key)
        elif key in self.held:
            self.held.discard(key)
            for session in list(self.sessions.values()):
                session.refresh()

    # ------------------------------------------------------------------ recipients

    def covers(self, topic: bytes) -> bool:
        """Whether a durable subscription covers core topic ``topic`` and the owning front
        end keeps the core's messages to it (``reachable``).  The Broker asks on every
        publish: for a topic no durable subscription covers it is a cached dict lookup."""
        if not self.index.has_subscribers(topic):
            return False
        return self.reachable is None or self.reachable(topic.decode("utf-8"))

    def recipients(self, key: str, change: str, received: float) -> list[str]:
        """The durable subscribers of topic ``key`` that get a ``change`` received at
        ``received``: this is the one place recipients of a stored message are chosen.  A
        subscription whose UNTIL has passed ends here (it unsubscribes)."""
        found: dict[str, None] = {}
        readable = self.readable
        for sub in self.index.matching(MESSAGE, key):
            record = sub.record
            if readable is not None and not readable(record.subscriber, key):
                continue
            if record.until is not None and record.until <= received:
                self.end_subscription(record.subscriber, MESSAGE, record.topic)
                continue
            if record.since is not None and received < record.since:
                continue
            if sub.wants(change):
                found[record.subscriber] = None
        return list(found)

    def end_subscription(self, subscriber: str, kind: str, topic: str) -> Deferred:
        self.index.remove(subscriber, kind, topic)
        d = self.store.remove_subscription(subscriber, kind, topic)
        return d.addErrback(self._report("Ending the subscription of {s} to {t}", s=subscriber, t=topic))

    # ------------------------------------------------------------------ storing

    def keep(self, messages: list[Message]) -> Deferred:
        """Store multicast ``messages`` (one topic, in order) for the durable subscribers
        of their topic; fires (with None) once all are committed.  Each gets an id
        (``message_id``) and, unless it names them, the topic's expiry and mode."""
        now = self.clock.seconds()
        key = messages[0].target.decode("utf-8")  # type: ignore[union-attr]
        is_link = self.is_link
        deliveries = [(name, ADD) for name in self.recipients(key, ADD, now)
                      if is_link is None or not is_link(name)]
        timeout = self.timeout_for(key)
        mode = self.mode_for(key)
        d: Deferred | None = None
        for message in messages:
            seq = self.next_seq()
            message_id = self.identify(seq, now)
            expires = message.expires
            if expires is None and timeout is not None:
                expires = now + timeout
            created = now if message.created is None else message.created
            details = message.details.replace(message_id=message_id, created=created, expires=expires)
            kept = Message(MULTICAST, message.target, message.payload, message.protocol, message.sender_name,
                           message.binary, display_name=message.display_name, details=details)
            record = MessageRecord(message_id, key, publisher_of(message), "", now, expires, message.priority,
                                   stored.encode(kept), seq, mode)
            self.stats["kept"] += 1
            d = self.publish(record, deliveries, len(message.payload))
        assert d is not None
        return d.addCallback(lambda _: None)

    def publish(self, record: MessageRecord, deliveries: list[tuple[str, str]], size: int = 0) -> Deferred:
        """Store ``record`` with its pending ``deliveries`` ``(subscriber, change)``; once
        committed, offer it to the connected subscribers among them.  ``size`` is what the
        event log reports.  Fires with the record's seq."""
        d = self.store.publish(record, deliveries)

        def committed(seq: int) -> int:
            self.stats["published"] += 1
            self.remember(record.seq, Published(record.smuid, record.publisher, record.received, size))
            self.offer(record, deliveries)
            if self.announce is not None:
                elsewhere = {name for name, _change in deliveries if name not in self.sessions}
                if elsewhere:
                    self.announce(pending=elsewhere)
            return seq

        return d.addCallback(committed)

    def remember(self, seq: int, published: Published) -> None:
        memory = self.published
        if len(memory) >= PUBLISHED_MEMORY:
            del memory[next(iter(memory))]
        memory[seq] = published

    def offer(self, record: MessageRecord, deliveries: Iterable[tuple[str, str]]) -> None:
        """Offer stored ``record`` to the connected sessions among ``deliveries``
        (``(subscriber, change)``), one Delivery per change."""
        made: dict[str, Delivery] = {}
        for subscriber, change in deliveries:
            session = self.sessions.get(subscriber)
            if session is None:
                continue
            delivery = made.get(change)
            if delivery is None:
                delivery = made[change] = Delivery(record.seq, record.topic, record.priority, change, 0,
                                                   record.mode, record.data)
            session.offer(delivery)

    # ------------------------------------------------------------------ other nodes

    def changed(self, tree: bool = False, subscribers: Iterable[str] = ()) -> None:
        """The owning front end committed a change to its topic tree or to ``subscribers``'
        subscriptions: tell the other nodes (nothing on one node)."""
        if self.announce is not None:
            self.announce(tree=tree, subscribers=subscribers)

    def announced(self, tree: bool, subscribers: Iterable[str], pending: Iterable[str]) -> Deferred:
        """Another node committed durable state to the shared store: read the changed part
        again.  ``tree``: the front end's topic tree (``on_tree_changed``); ``subscribers``:
        their subscriptions, so they are recipients of the next message stored here;
        ``pending``: new pending deliveries, pulled by those connected here (their refill
        path), so they are served live.  Fires once the subscriptions are read."""
        if tree and self.on_tree_changed is not None:
            self.on_tree_changed()
        reads = [self._reload(name) for name in subscribers]
        for name in pending:
            session = self.sessions.get(name)
            if session is not None and not session.closed:
                session.refresh()
        return DeferredList(reads, consumeErrors=True).addCallback(lambda _: None)

    def resync(self) -> Deferred:
        """Read the tree and every subscription again and have every connected subscriber
        pull its pending deliveries: a node (this one or another) was cut off from the
        others, so announcements may have been missed.  Fires once done."""
        if self.on_tree_changed is not None:
            self.on_tree_changed()
        d = self.store.load_subscriptions()

        def read(records: list[Any]) -> None:
            self.index.replace(records)
            for session in list(self.sessions.values()):
                if not session.closed:
                    session.refresh()

        d.addCallback(read)
        return d.addErrback(self._report("Reading the durable subscriptions again"))

    def _reload(self, subscriber: str) -> Deferred:
        d = self.store.subscriptions_of(subscriber)

        def read(records: list[Any]) -> None:
            index = self.index
            for sub in index.of(subscriber):
                index.remove(subscriber, sub.record.kind, sub.record.topic)
            index.load(records)
            session = self.sessions.get(subscriber)
            if session is not None and not session.closed:
                session.refresh()

        d.addCallback(read)
        return d.addErrback(self._report("Reading the subscriptions of {s} again", s=subscriber))

    # ------------------------------------------------------------------ acknowledgements

    def acknowledged(self, session: Any, delivery: Delivery) -> Deferred:
        d = self.store.acknowledge(session.name, delivery.seq)

        def done(settled: Settled | None) -> None:
            if delivery.mode == "ONE":
                self.claims.pop(delivery.seq, None)
            if settled is not None:
                self.acked(session, delivery)
                self.settle(settled)
            if delivery.mode == "ONE":
                for waiter in self.waiters.pop(delivery.seq, ()):
                    waiter.discard(delivery.seq)

        return d.addCallback(done)

    def give_up(self, session: Any, delivery: Delivery) -> Deferred:
        d = self.store.give_up(session.name, delivery.seq, self.clock.seconds())

        def done(settled: Settled | None) -> None:
            if settled is not None:
                self.given_up(session, delivery)
                self.settle(settled, "undeliverable")

        return d.addCallback(done)

    def claim(self, seq: int, session: IDurableSession) -> bool:
        """A ONE message goes to one session at a time."""
        holder = self.claims.get(seq)
        if holder is None or holder is session or holder.closed:
            self.claims[seq] = session
            return True
        self.waiters.setdefault(seq, set()).add(session)
        return False

    def release(self, seq: int, session: IDurableSession) -> None:
        """The session holding a ONE message let it go (refused, gave up, disconnected)."""
        if self.claims.get(seq) is session:
            del self.claims[seq]
        for waiter in list(self.waiters.pop(seq, ())):
            if waiter is not session:
                waiter.reoffer(seq)

    def unwait(self, seq: int, session: IDurableSession) -> None:
        waiting = self.waiters.get(seq)
        if waiting is not None:
            waiting.discard(session)
            if not waiting:
                del self.waiters[seq]

    def settle(self, settled: Settled, reason: str | None = None) -> None:
        """Apply what the store reports: drop released deliveries, hand a due receipt to
        ``receipts``.  ``reason`` says why a message went to the Trash (expired,
        undeliverable, removed, recalled, replaced)."""
        for subscriber in settled.released:
            session = self.sessions.get(subscriber)
            if session is not None:
                session.discard(settled.seq)
        if settled.trashed:
            self.claims.pop(settled.seq, None)
            self.waiters.pop(settled.seq, None)
            self.trashed(settled, reason)
        if settled.receipt is not None and self.receipts is not None:
            self.receipts(settled.receipt)

    # ------------------------------------------------------------------ expiry and Trash

    def sweep(self) -> Deferred:
        """Move expired messages to their Trash (with receipts for those that asked)."""
        d = self.store.expire(self.clock.seconds(), EXPIRY_BATCH)

        def expired(found: list[Settled]) -> Deferred | None:
            for settled in found:
                self.expired(settled)
                self.settle(settled, "expired")
            if len(found) >= EXPIRY_BATCH:
                return self.sweep()
            return None

        return d.addCallback(expired).addErrback(self._report("Expiring stored messages"))

    def empty_trash(self) -> Deferred:
        d = self.store.empty_trash(self.clock.seconds() - self.trash_retention)
        return d.addErrback(self._report("Emptying the Trash"))

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

    # ------------------------------------------------------------------ outcomes

    def delivered(self, session: Any, delivery: Delivery) -> None:
        """A stored message was written to the subscriber's connection (not a resend after
        an acknowledgement timed out: that is :meth:`redelivered`)."""
        self.stats["delivered"] += 1
        self._outcome(schema.DELIVERED, session.session, delivery.seq, delivery.topic,
                      online=self.online.get(session.name))

    def acked(self, session: Any, delivery: Delivery) -> None:
        """The subscriber's acknowledgement of ``delivery`` is stored (never sent again)."""
        self.stats["acked"] += 1
        self._outcome(schema.ACKED, session.session, delivery.seq, delivery.topic, online=self.online.get(session.name))

    def redelivered(self, session: Any, delivery: Delivery, attempt: int) -> None:
        """``delivery`` was sent again (attempt number ``attempt``): no ack in time."""
        self.stats["redelivered"] += 1
        self._outcome(schema.REDELIVERED, session.session, delivery.seq, delivery.topic)

    def given_up(self, session: Any, delivery: Delivery) -> None:
        """No ack after ``max_attempts`` sends: never sent to this subscriber again."""
        self.stats["given_up"] += 1
        self._outcome(schema.DROPPED, session.session, delivery.seq, delivery.topic, UNACKNOWLEDGED)

    def expired(self, settled: Settled) -> None:
        """Message ``settled.seq`` reached its timeout (it goes to the Trash): one event for
        each subscriber that had not acknowledged it yet."""
        self.stats["expired"] += 1
        for subscriber in settled.released:
            self._outcome(schema.EXPIRED, subscriber, settled.seq, settled.topic, "expired")

    def trashed(self, settled: Settled, reason: str | None = None) -> None:
        """Message ``settled.seq`` went to the Trash of ``settled.topic``."""
        self.stats["trashed"] += 1
        self._outcome(schema.TRASHED, None, settled.seq, settled.topic, reason)
        self.published.pop(settled.seq, None)

    def _outcome(self, kind: str, session: Any, seq: int, topic: str, reason: str | None = None,
                 online: float | None = None) -> None:
        """Write one outcome event about message ``seq`` for ``session`` (the subscriber's
        ISubscriber, its name, or None for an event about the message itself); ``online``:
        since when the subscriber is connected, for ``queued_us``."""
        published = self.published.get(seq)
        now = self.clock.seconds()
        if published is not None:
            self._write(kind, session, topic, reason, now, published, online)
            return
        d = self.store.find_message(seq)

        def found(record: MessageRecord | None) -> None:
            self._write(kind, session, topic, reason, now, None if record is None else self._published_of(record),
                        online)

        d.addCallback(found).addErrback(self._report("Reading message {seq} for the event log", seq=seq))

    def _published_of(self, record: MessageRecord) -> Published:
        size = len(record.data)
        if stored.is_stored_message(record.data):
            try:
                size = len(stored.decode(record.data).payload)
            except ValueError:
                pass
        elif self.size_of is not None:
            size = self.size_of(record.data)
        return Published(record.smuid, record.publisher, record.received, size)

    def _write(self, kind: str, session: Any, topic: str, reason: str | None, now: float,
               published: Published | None, online: float | None = None) -> None:
        name = getattr(session, "name", session)
        fields: dict[str, Any] = {"session": name, "topic": topic, "reason": reason, "outcome": kind}
        if published is not None:
            fields["sender"] = published.publisher
            fields["message_id"] = published.message_id
            fields["bytes"] = published.size
            fields["latency_us"] = max(0, int((now - published.received) * 1_000_000))
            if online is not None:
                fields["queued_us"] = max(0, int((min(online, now) - published.received) * 1_000_000))
        self.events.record(kind, self.protocol, **fields)

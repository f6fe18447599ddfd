"""The SMQP message service: one per front end, shared by every SMQP session.

It owns what is about messages rather than one connection: the durable subscription index,
each logged-in session's :class:`~brokerd.protocols.smqp.outbox.Outbox`, message numbers,
fan-out after a publish committed, the ``ONE`` delivery claims, receipts, expiry into the
Trash, periodic Trash emptying, and the bridge to the other protocols through the core.

Outcomes have one method each (:meth:`MessageService.delivered`, :meth:`~MessageService.acked`,
:meth:`~MessageService.redelivered`, :meth:`~MessageService.given_up`,
:meth:`~MessageService.expired`, :meth:`~MessageService.trashed`, and slow readers'
:meth:`~MessageService.volatile_dropped`): they count in :attr:`MessageService.stats` and write
the event log (docs/events.md), with the message's SMUID, topic, publisher, size and the time
since it was published.  Those come from :attr:`MessageService.published`, a bounded memory of
recent messages; a message it no longer holds (older, or from before a restart) is read back
from the store once, off the reactor thread, and its event is written when that read is done.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import BROKER
from brokerd.events import schema
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.interfaces import ISubscriber
from brokerd.protocols.flow import record_drops
from brokerd.protocols.smqp.codec import decode_body, encode_notify, format_datetime
from brokerd.protocols.smqp.events import Body
from brokerd.protocols.smqp.messages import first_text, receipt_body
from brokerd.protocols.smqp.outbox import MAX_ATTEMPTS, RETRY_TIMEOUT, Outbox
from brokerd.protocols.smqp.subscriptions import MESSAGE, SUBSCRIBERS, TOPIC, SubscriptionIndex
from brokerd.store.records import Delivery, MessageRecord, ReceiptDue, Settled

EXPIRY_INTERVAL = 1.0
"""Seconds between sweeps that move expired messages to their Trash."""
EXPIRY_BATCH = 1000
"""Messages one sweep moves (another sweep follows at once when there were more)."""
TRASH_INTERVAL = 60.0
"""Seconds between Trash emptyings."""
TRASH_RETENTION = 3600.0
"""Seconds a message stays in a Trash before it is removed for good (the default of
``--smqp-trash-retention``)."""
SERVER_SENDER = "server"
"""The publisher named in receipts' records."""
PUBLISHED_MEMORY = 16_384
"""Recent messages whose SMUID, publisher, time and size outcome events take from memory
(the oldest is forgotten first; a forgotten one is read back from the store)."""
PROTOCOL = "smqp"
BRIDGE_PROTOCOL = "smqp-bridge"
"""The protocol of the core sessions that carry other protocols' messages to SMQP topics, so
that their logins, logouts and subscriptions in the event log are not taken for clients'."""
UNACKNOWLEDGED = schema.UNACKNOWLEDGED
"""The drop reason of a delivery given up after ``max_attempts`` sends without a 310 ACK."""
STORED = "stored"
"""The ``outcome`` of an SMQP ``accepted`` record: kept for the topic's SMQP subscribers."""


class Published(NamedTuple):
    """What outcome events say about a stored message."""

    smuid: str
    publisher: str
    received: float
    size: int


def message_id(body: Body) -> str | None:
    """The server's Smuid of a stored body (the last one: a REPLY carries earlier ones first)."""
    smuids = body.get_all("Smuid")
    return smuids[-1] if smuids else None


def _published_of(record: MessageRecord) -> Published:
    try:
        size = decode_body(record.data).size
    except ValueError:
        size = len(record.data)
    return Published(record.smuid, record.publisher, record.received, size)


def login_key(subscriber: str) -> str:
    """``alice:c1`` -> the login topic key ``accounts/alice/c1``."""
    account, _colon, channel = subscriber.partition(":")
    return f"accounts/{account}/{channel}"


@implementer(ISubscriber)
class TopicBridge:
    """The SMQP side of one core topic: messages other protocols publish to it arrive here
    (rendered once by the SMQP wire format) and go to the SMQP subscribers of the topic."""

    protocol = BRIDGE_PROTOCOL
    address = None
    principal = BROKER
    """The front end itself: SMQP checks each subscriber (MessageService.readable)."""

    def __init__(self, service: MessageService, key: str) -> None:
        self.service = service
        self.key = key
        self.name = b"smqp-topic:" + key.encode("utf-8")
        self.wire_format = service.wire

    def send(self, data: bytes) -> None:
        self.service.foreign(self.key, data)

    def replaced(self) -> None:
        """Bridges have no address, so nothing replaces them."""


class MessageService:
    """The delivery constants are per service: ``retry_timeout`` (seconds before an
    unacknowledged NOTIFY is sent again), ``max_attempts`` (sends before a delivery is given
    up) and ``trash_retention`` (seconds a message stays in a Trash); the factory sets them
    from the settings, the module constants are their defaults.  ``timeout_for`` gives the
    default timeout of a message kept in a queue (topic key), None for INFINITE; the factory
    makes it apply topic timeouts."""

    _log = Logger()

    def __init__(self, store: Any, clock: Any, broker: Any, wire: Any,
                 display: Callable[[str], str], events: Any = NULL_EVENT_LOG) -> None:
        self.store = store
        self.events = events
        """The event log's IEventRecorder."""
        self.published: dict[int, Published] = {}
        """seq -> recent stored message, at most PUBLISHED_MEMORY (see the module docstring)."""
        self.clock = clock
        self.broker = broker
        self.wire = wire
        self.display = display
        """Topic key -> the path to show in notifications."""
        self.index = SubscriptionIndex()
        self.outboxes: dict[str, Outbox] = {}
        self.claims: dict[int, Outbox] = {}
        self.waiters: dict[int, set[Outbox]] = {}
        self.bridges: dict[str, TopicBridge] = {}
        self.none_topics: set[str] = set()
        self.readable: Callable[[str, str], bool] | None = None
        """(subscriber, topic key) -> may it read the topic now; None: every subscription is
        still allowed (no reloadable access list).  Checked at delivery, so a revoked
        permission stops live and durable subscriptions alike."""
        self.suid = ""
        self.default_timeout: float | None = 86400.0
        self.timeout_for: Callable[[str], float | None] = lambda _key: self.default_timeout
        self.retry_timeout: float = RETRY_TIMEOUT
        self.max_attempts: int = MAX_ATTEMPTS
        self.trash_retention: float = TRASH_RETENTION
        self._seq = 0
        self._loops: list[LoopingCall] = []
        self.stats = {"published": 0, "volatile": 0, "acked": 0, "redelivered": 0, "expired": 0,
                      "trashed": 0, "receipts": 0, "volatile_dropped": 0, "foreign_in": 0,
                      "foreign_out": 0, "not_forwarded": 0, "delivered": 0, "given_up": 0}

    # ------------------------------------------------------------------ life

    def start(self) -> Deferred:
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
        for interval, work in ((EXPIRY_INTERVAL, self.sweep), (TRASH_INTERVAL, self.empty_trash)):
            loop = LoopingCall(work)
            loop.clock = self.clock
            loop.start(interval, now=False).addErrback(self._log.failure, "SMQP sweep")
            self._loops.append(loop)

    def stop_sweeps(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []

    def next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def smuid(self, seq: int, stamp: str) -> str:
        return f"{self.suid}/{seq}({stamp})"

    # ------------------------------------------------------------------ sessions

    def attach(self, session: Any) -> Outbox:
        old = self.outboxes.get(session.subscriber)
        if old is not None:
            old.close()
        outbox = Outbox(session, self)
        self.outboxes[session.subscriber] = outbox
        return outbox

    def detach(self, outbox: Outbox) -> None:
        outbox.close()
        if self.outboxes.get(outbox.name) is outbox:
            del self.outboxes[outbox.name]

    def delivery_mode(self, topic: str) -> str:
        return "NONE" if topic in self.none_topics else "ALL"

    def undeliverable_topics(self) -> list[str]:
        return sorted(self.none_topics)

    def set_delivery(self, key: str, mode: str) -> None:
        """A topic's delivery mode changed: NONE holds its messages back."""
        if mode == "NONE":
            self.none_topics.add(key)
            return
        if key in self.none_topics:
            self.none_topics.discard(key)
            for outbox in list(self.outboxes.values()):
                outbox.refresh()

    # ------------------------------------------------------------------ recipients

    def recipients(self, key: str, change: str, received: float) -> list[str]:
        """Subscribers of ``key`` that take ``change`` notifications now.  A subscription
        whose UNTIL has passed ends here (the draft: the client is unsubscribed)."""
        found: dict[str, None] = {}
        readable = self.readable
        for sub in self.index.matching(MESSAGE, key):
            record = sub.record
            if readable is not None and not readable(record.subscriber, key):
                continue
            if record.until is not None and record.until <= received:
                self.end_subscription(sub.record.subscriber, MESSAGE, sub.record.topic)
                continue
            if record.since is not None and received < record.since:
                continue
            if sub.wants(change):
                found[record.subscriber] = None
        return list(found)

    def end_subscription(self, subscriber: str, kind: str, topic: str) -> Deferred:
        self.index.remove(subscriber, kind, topic)
        d = self.store.remove_subscription(subscriber, kind, topic)
        return d.addErrback(self._log.failure, "Ending the subscription of {s} to {t}", s=subscriber, t=topic)

    # ------------------------------------------------------------------ publishing

    def publish(self, record: MessageRecord, deliveries: list[tuple[str, str]],
                body: Body | None = None, size: int = 0) -> Deferred:
        """Store ``record`` with its pending ``deliveries``; once committed, hand them to
        the connected subscribers and (``body`` given) to the other protocols.  ``size`` is
        what the event log reports (``Body.size``).

        A message the core routes (forwarded) gets its ``accepted`` event from the core;
        any other (a login topic, nothing the other protocols can carry, a receipt) gets
        one here."""
        d = self.store.publish(record, deliveries)

        def committed(seq: int) -> int:
            self.stats["published"] += 1
            self.remember(record.seq, Published(record.smuid, record.publisher, record.received, size))
            # The other protocols first, so the message's ``accepted`` precedes its SMQP
            # ``delivered`` events in the log.
            routed = body is not None and self.forward(record.topic, record.publisher, body, record.smuid)
            if not routed:
                self.accepted(record.topic, record.publisher, record.smuid, size, bool(deliveries))
            self.offer(record, deliveries)
            return seq

        return d.addCallback(committed)

    def remember(self, seq: int, published: Published) -> None:
        memory = self.published
        if len(memory) >= PUBLISHED_MEMORY:
            del memory[next(iter(memory))]
        memory[seq] = published

    def accepted(self, key: str, publisher: str, smuid: str | None, size: int, stored: bool) -> None:
        """The ``accepted`` event of a message the core did not route."""
        self.events.record(schema.ACCEPTED, PROTOCOL, session=publisher, topic=key, message=MULTICAST,
                           message_id=smuid, bytes=size, fanout=0,
                           outcome=STORED if stored else "unrouted")

    def offer(self, record: MessageRecord, deliveries: Iterable[tuple[str, str]]) -> None:
        """Offer stored ``record`` to the connected sessions among ``deliveries``
        (``(subscriber, change)``), one Delivery per change."""
        made: dict[str, Delivery] = {}
        for subscriber, change in deliveries:
            outbox = self.outboxes.get(subscriber)
            if outbox is None:
                continue
            delivery = made.get(change)
            if delivery is None:
                delivery = made[change] = Delivery(record.seq, record.topic, record.priority, change, 0,
                                                   record.mode, record.data)
            outbox.offer(delivery)

    def publish_volatile(self, key: str, publisher: str, body: Body, subscribers: Iterable[str]) -> None:
        """A Guarantee: NO message: straight to the connected subscribers, never stored."""
        data = encode_notify("MESSAGE", self.display(key), "ADD", body=body)
        self.stats["volatile"] += 1
        reached = False
        for subscriber in subscribers:
            outbox = self.outboxes.get(subscriber)
            if outbox is not None:
                reached = True
                outbox.offer_volatile(data)
        smuid = message_id(body)
        if not self.forward(key, publisher, body, smuid):
            self.accepted(key, publisher, smuid, body.size, reached)

    def forward(self, key: str, publisher: str, body: Body, smuid: str | None = None) -> bool:
        """The message to SSMP, MCCHAT and socket.mq subscribers of the same topic: the first
        text/* section as the payload (see :func:`~brokerd.protocols.smqp.messages.first_text`).
        False when it is not for them (a login topic, no section they can carry)."""
        if key.startswith("accounts/") or key == "accounts":
            return False
        carried = first_text(body)
        if carried is None:
            self.stats["not_forwarded"] += 1
            return False
        payload, binary = carried
        message = Message(MULTICAST, key.encode("utf-8"), payload, "smqp", publisher.encode("utf-8"),
                          binary=binary, headers={"smqp": body, "message_id": smuid})
        if self.broker.publish(message, exclude=self.bridges.get(key)):
            self.stats["foreign_out"] += 1
        return True

    def render(self, delivery: Delivery) -> list[bytes]:
        if delivery.change == "RAW":
            return [delivery.data]
        line = f"NOTIFY MESSAGE {self.display(delivery.topic)} {delivery.change}\r\n".encode("utf-8")
        return [line, delivery.data]

    # ------------------------------------------------------------------ acknowledgements

    def acknowledged(self, outbox: Outbox, delivery: Delivery) -> Deferred:
        d = self.store.acknowledge(outbox.name, delivery.seq)

        def stored(settled: Settled | None) -> None:
            if delivery.mode == "ONE":
                self.claims.pop(delivery.seq, None)
            if settled is not None:
                self.acked(outbox, delivery)
                self.settle(settled)
            if delivery.mode == "ONE":
                for waiter in self.waiters.pop(delivery.seq, ()):
                    waiter.discard(delivery.seq)

        return d.addCallback(stored)

    def give_up(self, outbox: Outbox, delivery: Delivery) -> Deferred:
        d = self.store.give_up(outbox.name, delivery.seq, self.clock.seconds())

        def stored(settled: Settled | None) -> None:
            if settled is not None:
                self.given_up(outbox, delivery)
                self.settle(settled, "undeliverable")

        return d.addCallback(stored)

    def claim(self, seq: int, outbox: Outbox) -> bool:
        """A ONE message goes to one session at a time."""
        holder = self.claims.get(seq)
        if holder is None or holder is outbox or holder.closed:
            self.claims[seq] = outbox
            return True
        self.waiters.setdefault(seq, set()).add(outbox)
        return False

    def release(self, seq: int, outbox: Outbox) -> None:
        """The session holding a ONE message let it go (416, gave up, disconnected)."""
        if self.claims.get(seq) is outbox:
            del self.claims[seq]
        for waiter in list(self.waiters.pop(seq, ())):
            if waiter is not outbox:
                waiter.reoffer(seq)

    def unwait(self, seq: int, outbox: Outbox) -> None:
        waiting = self.waiters.get(seq)
        if waiting is not None:
            waiting.discard(outbox)
            if not waiting:
                del self.waiters[seq]

    def settle(self, settled: Settled, reason: str | None = None) -> None:
        """Apply what the store reports: drop released deliveries, send a due receipt.
        ``reason`` says why a message went to the Trash (expired, undeliverable, removed,
        recalled, replaced)."""
        for subscriber in settled.released:
            outbox = self.outboxes.get(subscriber)
            if outbox is not None:
                outbox.discard(settled.seq)
        if settled.trashed:
            self.claims.pop(settled.seq, None)
            self.waiters.pop(settled.seq, None)
            self.trashed(settled, reason)
        if settled.receipt is not None:
            self.send_receipt(settled.receipt)

    def send_receipt(self, due: ReceiptDue) -> Deferred:
        """NOTIFY RECEIPT to the publisher's login topic, durable like any message."""
        now = self.clock.seconds()
        try:
            original = decode_body(due.data)
        except ValueError:
            original = Body()
        body = receipt_body(original, due.acked, due.total, self.display(due.topic), format_datetime(now))
        data = encode_notify("RECEIPT", self.display(due.topic), body=body)
        seq = self.next_seq()
        stamp = format_datetime(now)
        key = login_key(due.publisher)
        timeout = self.timeout_for(key)
        expires = None if timeout is None else now + timeout
        record = MessageRecord(self.smuid(seq, stamp), key, SERVER_SENDER,
                               f"receipt/{due.seq}", now, expires, 1, data, seq)
        self.stats["receipts"] += 1
        d = self.publish(record, [(due.publisher, "RAW")], size=len(data))
        return d.addErrback(self._log.failure, "Storing a receipt for {p}", p=due.publisher)

    # ------------------------------------------------------------------ expiry and Trash

    def sweep(self) -> Deferred:
        """Move expired messages to their Trash (receipts X/Y for those that asked)."""
        d = self.store.expire(self.clock.seconds(), EXPIRY_BATCH)

        def expired(found: list[Settled]) -> Deferred | None:
            for settled in found:
                self.expired(settled)
                self.settle(settled, "expired")
            if len(found) >= EXPIRY_BATCH:
                return self.sweep()
            return None

        return d.addCallback(expired).addErrback(self._log.failure, "Expiring SMQP messages")

    def empty_trash(self) -> Deferred:
        d = self.store.empty_trash(self.clock.seconds() - self.trash_retention)
        return d.addErrback(self._log.failure, "Emptying the SMQP Trash")

    # ------------------------------------------------------------------ outcomes

    def delivered(self, outbox: Outbox, delivery: Delivery) -> None:
        """A stored message was written to the subscriber's connection (not a resend after
        an acknowledgement timed out: that is :meth:`redelivered`)."""
        self.stats["delivered"] += 1
        self._outcome(schema.DELIVERED, outbox.session, delivery.seq, delivery.topic)

    def acked(self, outbox: Outbox, delivery: Delivery) -> None:
        """The subscriber's 310 ACK of ``delivery`` is stored (never sent to it again)."""
        self.stats["acked"] += 1
        self._outcome(schema.ACKED, outbox.session, delivery.seq, delivery.topic)

    def redelivered(self, outbox: Outbox, delivery: Delivery, attempt: int) -> None:
        """``delivery`` was sent again (attempt number ``attempt``): no 310 ACK in time."""
        self.stats["redelivered"] += 1
        self._outcome(schema.REDELIVERED, outbox.session, delivery.seq, delivery.topic)

    def given_up(self, outbox: Outbox, delivery: Delivery) -> None:
        """No 310 ACK after ``max_attempts`` sends: never sent to this subscriber again."""
        self.stats["given_up"] += 1
        self._outcome(schema.DROPPED, outbox.session, delivery.seq, delivery.topic, UNACKNOWLEDGED)

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

    def volatile_dropped(self, outbox: Outbox) -> None:
        """A session's queue of unacknowledged-kind notifications was full (counted here;
        the outbox logs each episode through :meth:`volatile_drops`)."""
        self.stats["volatile_dropped"] += 1

    def volatile_drops(self, outbox: Outbox, count: int) -> None:
        """One event for ``count`` notifications a slow session lost (MAX_VOLATILE)."""
        record_drops(self.events, PROTOCOL, outbox.name, count, schema.QUEUE_FULL)

    def _outcome(self, kind: str, session: Any, seq: int, topic: str, reason: str | None = None) -> None:
        """Write one outcome event about message ``seq`` for ``session`` (the subscriber's
        ISubscriber, its name, or None for an event about the message itself)."""
        published = self.published.get(seq)
        now = self.clock.seconds()
        if published is not None:
            self._write(kind, session, topic, reason, now, published)
            return
        d = self.store.find_message(seq)

        def found(record: MessageRecord | None) -> None:
            self._write(kind, session, topic, reason, now, None if record is None else _published_of(record))

        d.addCallback(found).addErrback(self._log.failure, "Reading message {seq} for the event log", seq=seq)

    def _write(self, kind: str, session: Any, topic: str, reason: str | None, now: float,
               published: Published | None) -> None:
        name = getattr(session, "name", session)
        fields: dict[str, Any] = {"session": name, "topic": topic, "reason": reason, "outcome": kind}
        if published is not None:
            fields["sender"] = published.publisher
            fields["message_id"] = published.smuid
            fields["bytes"] = published.size
            fields["latency_us"] = max(0, int((now - published.received) * 1_000_000))
        self.events.record(kind, PROTOCOL, **fields)

    # ------------------------------------------------------------------ notices

    def notice(self, kind: str, key: str, change: str, data: bytes) -> None:
        """A header-only or one-line notification to the connected sessions whose ``kind``
        subscriptions cover ``key`` and take ``change`` (DELETE, MOVE; NOTIFY TOPIC; another
        protocol's message, rendered once, as an ADD)."""
        sent: set[str] = set()
        readable = self.readable if kind == MESSAGE else None
        for sub in self.index.matching(kind, key):
            name = sub.record.subscriber
            if name in sent or not sub.wants(change):
                continue
            if readable is not None and not readable(name, key):
                continue
            outbox = self.outboxes.get(name)
            if outbox is not None:
                sent.add(name)
                outbox.offer_volatile(data)

    def message_notice(self, key: str, change: str, record: MessageRecord) -> None:
        """NOTIFY MESSAGE <topic> DELETE|MOVE: the header only, no acknowledgement."""
        try:
            original = decode_body(record.data)
        except ValueError:
            return
        attributes = tuple((n, v) for n, v in original.attributes if n.lower() != "guarantee")
        body = Body(attributes + (("Guarantee", "NO"),), ())
        self.notice(MESSAGE, key, change, encode_notify("MESSAGE", self.display(key), change, body=body))

    def topic_notice(self, key: str, change: str, *value: str, path: str | None = None) -> None:
        """NOTIFY TOPIC <topic> <change> [value] to the TOPIC subscribers of ``key``
        (``path``: how to show the topic when it is no longer in the tree)."""
        data = encode_notify("TOPIC", path or self.display(key), change, *value)
        self.notice(TOPIC, key, change, data)

    def topics_removed(self, removed: Iterable[tuple[str, str]], dropped: Iterable[Any]) -> None:
        """REMOVE TOPIC committed: ``removed`` are ``(key, path)`` of the topics gone,
        ``dropped`` the subscriptions (:class:`~brokerd.protocols.smqp.subscriptions.Subscription`)
        the store no longer has.  The TOPIC subscribers that take DELETE get NOTIFY TOPIC
        <topic> DELETE (before their own subscriptions to the topic go); then the dropped
        subscriptions leave the index, and other protocols' messages to the removed topics
        stop reaching SMQP.  Pending deliveries stay: messages already published are still
        delivered (the draft: a topic goes once its last message has been delivered)."""
        removed = list(removed)
        for key, path in removed:
            self.topic_notice(key, "DELETE", path=path)
        for sub in dropped:
            self.index.remove(sub.record.subscriber, sub.record.kind, sub.record.topic)
        for key, _path in removed:
            bridge = self.bridges.pop(key, None)
            if bridge is not None:
                self.broker.detach(bridge)

    def subscribers_changed(self, key: str) -> None:
        """NOTIFY SUBSCRIBERS <topic> <count> to the watchers of the topic."""
        data = encode_notify("SUBSCRIBERS", self.display(key), str(self.index.exact_count(key)))
        sent: set[str] = set()
        for sub in self.index.matching(SUBSCRIBERS, key):
            name = sub.record.subscriber
            outbox = self.outboxes.get(name)
            if outbox is not None and name not in sent:
                sent.add(name)
                outbox.offer_volatile(data)

    # ------------------------------------------------------------------ other protocols

    def bridge(self, keys: Iterable[str]) -> None:
        """Make sure messages other protocols publish to these topics reach SMQP."""
        for key in keys:
            if key in self.bridges or not key or key.startswith("accounts"):
                continue
            bridge = TopicBridge(self, key)
            try:
                self.broker.attach(bridge)
                self.broker.subscribe(bridge, key.encode("utf-8"))
            except Exception:
                self._log.failure("Bridging SMQP topic {key}", key=key)
                self.broker.detach(bridge)
                continue
            self.bridges[key] = bridge

    def unbridge(self, keys: Iterable[str]) -> None:
        for key in keys:
            bridge = self.bridges.get(key)
            if bridge is not None and not self.index.matching(MESSAGE, key):
                del self.bridges[key]
                self.broker.detach(bridge)

    def foreign(self, key: str, data: bytes) -> None:
        """A message from another protocol (rendered once): to every connected subscriber."""
        self.stats["foreign_in"] += 1
        self.notice(MESSAGE, key, "ADD", data)

    def stop(self) -> None:
        self.stop_sweeps()
        for bridge in list(self.bridges.values()):
            self.broker.detach(bridge)
        self.bridges.clear()


"""The SMQP message service: SMQP's side of durable delivery, shared by every SMQP session.

The durable subscriptions, pending messages, claims, expiry and Trash are the core's
(:class:`~brokerd.core.durable.DurableService`, whatever protocol published a message); this
module is what only SMQP has on top: each logged-in session's
:class:`~brokerd.protocols.smqp.outbox.Outbox` (the two-phase NOTIFY/310 cursor over its
pending deliveries), rendering a stored message as ``NOTIFY MESSAGE``, receipts to the
publisher's login topic, ``Guarantee: NO`` messages (never stored), the notices of topic and
subscriber changes, and handing SMQP messages to the other protocols' live subscribers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService
from brokerd.core.message import MULTICAST, Message
from brokerd.core.publication import KEEP_FOR_FILTERS, NEVER_KEEP, Multicast, Unstored
from brokerd.core.subscriptions import MESSAGE, SUBSCRIBERS, TOPIC
from brokerd.errors import Forbidden
from brokerd.events import schema
from brokerd.events.log import NULL_EVENT_LOG, IEventRecorder
from brokerd.protocols.flow import record_drops
from brokerd.protocols.smqp.codec import encode_body, encode_notify, format_datetime
from brokerd.protocols.smqp.events import Body
from brokerd.protocols.smqp.mapping import stored_body
from brokerd.protocols.smqp.messages import MAX_FOREIGN_BINARY, receipt_body
from brokerd.protocols.smqp.outbox import Outbox, Session
from brokerd.protocols.smqp.wire import SMQPWireFormat
from brokerd.store.records import Delivery, MessageRecord, ReceiptDue

__all__ = ["MessageService", "login_key", "message_id"]

SERVER_SENDER = "server"
"""The publisher named in receipts' records."""
PROTOCOL = "smqp"
STORED = "stored"
"""The ``outcome`` of an SMQP ``accepted`` record: kept for the topic's SMQP subscribers."""


def message_id(body: Body) -> str | None:
    """The server's Smuid of a stored body (the last one: a REPLY carries earlier ones first)."""
    smuids = body.get_all("Smuid")
    return smuids[-1] if smuids else None


def login_key(subscriber: str) -> str:
    """``alice:c1`` -> the login topic key ``accounts/alice/c1``."""
    account, _colon, channel = subscriber.partition(":")
    return f"accounts/{account}/{channel}"


class MessageService:
    """SMQP's messaging over the core's durable service ``durable``, which owns the store.
    ``display`` gives the path a topic key is shown as; ``domain`` names this server in the
    Cmuids of other protocols' messages."""

    _log = Logger()

    def __init__(self, durable: DurableService, broker: Broker, wire: SMQPWireFormat, display: Callable[[str], str],
                 events: IEventRecorder = NULL_EVENT_LOG, domain: str = "localhost") -> None:
        self.durable = durable
        durable.protocol = PROTOCOL
        durable.receipts = self.send_receipt
        durable.size_of = _size_of
        self.events = events
        """The event log's IEventRecorder."""
        self.clock = durable.clock
        self.broker = broker
        self.wire = wire
        self.display = display
        """Topic key -> the path to show in notifications."""
        self.domain = domain
        self.index = self.durable.index
        self.outboxes: dict[str, Outbox] = self.durable.sessions  # type: ignore[assignment]  # SMQP attaches Outboxes only
        """The connected SMQP sessions' outboxes by ``account:channel`` (the durable
        service's sessions)."""
        self.max_queued_bytes: int = Settings.smqp_max_queued_bytes
        """Bytes of one session's window and of its FIFO (``--smqp-max-queued-bytes``)."""
        self.max_one_held: int = Settings.smqp_max_one_held
        """ONE messages one session holds unanswered at most (``--smqp-max-one-held``)."""
        self.counts = {"volatile": 0, "receipts": 0, "volatile_dropped": 0, "foreign_out": 0,
                       "not_forwarded": 0, "forbidden": 0}

    @property
    def stats(self) -> dict[str, int]:
        """The durable service's counters and SMQP's own, together."""
        return {**self.durable.stats, **self.counts}

    @property
    def published(self) -> dict:
        return self.durable.published

    @property
    def suid(self) -> str:
        return self.durable.server_id

    def smuid(self, seq: int, stamp: str) -> str:
        return f"{self.suid}/{seq}({stamp})"

    def next_seq(self) -> int:
        return self.durable.next_seq()

    # ------------------------------------------------------------------ sessions

    def attach(self, session: Session) -> Outbox:
        old = self.outboxes.get(session.subscriber)
        if old is not None:
            old.close()
        outbox = Outbox(session, self)
        self.durable.attach(outbox)
        return outbox

    def detach(self, outbox: Outbox) -> None:
        outbox.close()
        self.durable.detach(outbox)

    def recipients(self, key: str, change: str, received: float) -> list[str]:
        return self.durable.recipients(key, change, received)

    # ------------------------------------------------------------------ publishing

    def publish(self, record: MessageRecord, deliveries: list[tuple[str, str]],
                message: Message | None = None, size: int = 0) -> Deferred:
        """Store ``record`` with its pending ``deliveries`` through the durable service;
        once committed, hand ``message`` (when given) to the other protocols' live
        subscribers.  ``size`` is what the event log reports (``Body.size``).

        A message the core routes gets its ``accepted`` event from the core; any other (a
        login topic, nothing the other protocols can carry, a receipt) gets one here."""
        d = self.durable.publish(record, deliveries, size)

        def committed(seq: int) -> int | Deferred[int]:
            # The core keeps it for the other protocols' durable sessions (MQTT's persistent
            # ones) too, before the publisher is answered: nothing acknowledged is lost.
            publication = None if message is None else self.forward(message, stored=True)
            if publication is None:
                self.accepted(record.topic, record.publisher, record.message_id, size, bool(deliveries))
                return seq
            kept = publication.kept
            return seq if kept is None else kept.addCallback(lambda _: seq)

        return d.addCallback(committed)

    def accepted(self, key: str, publisher: str, smuid: str | None, size: int, stored: bool) -> None:
        """The ``accepted`` event of a message the core did not route."""
        self.events.record(schema.ACCEPTED, PROTOCOL, session=publisher, topic=key, message=MULTICAST,
                           message_id=smuid, bytes=size, fanout=0,
                           outcome=STORED if stored else "unrouted")

    def publish_volatile(self, key: str, publisher: str, size: int, message: Message,
                         explicit: Iterable[str]) -> None:
        """A Guarantee: NO message, never stored: through the core to the durable
        subscribers connected here (and ``explicit`` ones) and to the other protocols' live
        subscribers.  ``size`` is what the event log reports."""
        self.counts["volatile"] += 1
        reached = self.broker.route(Unstored(message, explicit))
        if self.forward(message) is None:
            self.accepted(key, publisher, message.message_id, size, bool(reached))

    def forward(self, message: Message, stored: bool = False) -> Multicast | None:
        """An SMQP message to the other protocols' live subscribers of the same topic (its
        main part as the payload, see :mod:`~brokerd.protocols.smqp.mapping`), and when
        ``stored`` (SMQP kept it for its own subscribers) to their durable FILTER subscribers
        (the router's durable stage: the publication's ``kept``).  The routed publication, or
        None when it is not for them: a login topic, or no section they can carry
        (:func:`carried`)."""
        key = (message.target or b"").decode("utf-8")  # an SMQP publication's topic is set
        if key.startswith("accounts/") or key == "accounts":
            return None
        if not carried(message):
            self.counts["not_forwarded"] += 1
            return None
        publication = Multicast([message], keeping=KEEP_FOR_FILTERS if stored else NEVER_KEEP)
        try:
            reached = self.broker.route(publication)
        except Forbidden:
            # The core decides for SMQP as for every protocol: the same cached decision the
            # session was answered with, so this only refuses when a reload came in between.
            self.counts["forbidden"] += 1
            return None
        if reached:
            self.counts["foreign_out"] += 1
        return publication

    def body_bytes(self, data: bytes) -> bytes:
        """A stored row's SMQP body, encoded (GET MESSAGE, NOTIFY MESSAGE)."""
        if not data or data[0] != 0:
            return data
        return encode_body(stored_body(data, self.domain))

    def render(self, delivery: Delivery) -> list[bytes]:
        if delivery.change == "RAW":
            return [delivery.data]
        line = f"NOTIFY MESSAGE {self.display(delivery.topic)} {delivery.change}\r\n".encode("utf-8")
        return [line, self.body_bytes(delivery.data)]

    # ------------------------------------------------------------------ receipts

    def send_receipt(self, due: ReceiptDue) -> Deferred:
        """NOTIFY RECEIPT to the publisher's login topic, durable like any message."""
        now = self.clock.seconds()
        try:
            original = stored_body(due.data, self.domain)
        except ValueError:
            original = Body()
        body = receipt_body(original, due.acked, due.total, self.display(due.topic), format_datetime(now))
        data = encode_notify("RECEIPT", self.display(due.topic), body=body)
        seq = self.next_seq()
        stamp = format_datetime(now)
        key = login_key(due.publisher)
        timeout = self.durable.topics.timeout_for(key)
        expires = None if timeout is None else now + timeout
        record = MessageRecord(self.smuid(seq, stamp), key, SERVER_SENDER,
                               f"receipt/{due.seq}", now, expires, 1, data, seq)
        self.counts["receipts"] += 1
        d = self.publish(record, [(due.publisher, "RAW")], size=len(data))
        return d.addErrback(lambda failure: self._log.failure("Storing a receipt for {p}", failure, p=due.publisher))

    # ------------------------------------------------------------------ slow readers

    def volatile_dropped(self, outbox: Outbox) -> None:
        """A session's queue of unacknowledged-kind notifications was full (counted here;
        the outbox logs each episode through :meth:`volatile_drops`)."""
        self.counts["volatile_dropped"] += 1

    def volatile_drops(self, outbox: Outbox, count: int) -> None:
        """One event for ``count`` notifications a slow session lost (MAX_VOLATILE)."""
        record_drops(self.events, PROTOCOL, outbox.name, count, schema.QUEUE_FULL)

    # ------------------------------------------------------------------ notices

    def notice(self, kind: str, key: str, change: str, data: bytes) -> None:
        """A header-only or one-line notification to the connected sessions whose ``kind``
        subscriptions cover ``key`` and take ``change`` (DELETE, MOVE; NOTIFY TOPIC)."""
        sent: set[str] = set()
        readable = self.durable.readable if kind == MESSAGE else None
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
            original = stored_body(record.data, self.domain)
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
        ``dropped`` the subscriptions (:class:`~brokerd.core.subscriptions.Subscription`)
        the store no longer has.  The TOPIC subscribers that take DELETE get NOTIFY TOPIC
        <topic> DELETE (before their own subscriptions to the topic go); then the dropped
        subscriptions leave the index, so other protocols' messages to the removed topics
        are no longer kept for SMQP.  Pending deliveries stay: messages already published
        are still delivered (the draft: a topic goes once its last message has been
        delivered)."""
        for key, path in list(removed):
            self.topic_notice(key, "DELETE", path=path)
        for sub in dropped:
            self.index.remove(sub.record.subscriber, sub.record.kind, sub.record.topic)

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

    def stop(self) -> None:
        self.durable.stop_sweeps()


def carried(message: Message) -> bool:
    """Whether the other protocols carry an SMQP message: it has a section, and its main part
    is text or at most :data:`~brokerd.protocols.smqp.messages.MAX_FOREIGN_BINARY` bytes
    (the rule of :func:`~brokerd.protocols.smqp.messages.first_text`)."""
    return bool(message.parts) and (not message.binary or len(message.payload) <= MAX_FOREIGN_BINARY)


def _size_of(data: bytes) -> int:
    """The data size of a stored SMQP body (what the event log reports)."""
    try:
        return stored_body(data, "").size
    except ValueError:
        return len(data)

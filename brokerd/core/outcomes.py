"""The outcome events of durable delivery: one per delivery, acknowledgement, redelivery,
give-up, expiry and dead letter (docs/events.md: ``trashed``), with the message's id, topic, publisher,
size and age.

Those come from :attr:`DurableOutcomes.published`, a bounded memory of recent messages; a
message it no longer holds is read back from the store once, off the reactor thread.  A
mixin of :class:`~brokerd.core.durable.DurableService`, kept apart because it is the
service's report, not its decisions.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from brokerd.core import stored
from brokerd.events import schema
from brokerd.events.log import IEventRecorder
from brokerd.store.base import IStore
from brokerd.store.records import Delivery, MessageRecord, Settled

PUBLISHED_MEMORY = 16_384
"""Recent messages whose id, publisher, time and size outcome events take from memory
(the oldest is forgotten first; a forgotten one is read back from the store)."""
UNACKNOWLEDGED = schema.UNACKNOWLEDGED
"""The drop reason of a delivery given up after ``max_attempts`` sends without an ack."""
FORBIDDEN = schema.REJECTED
"""The drop reason of a delivery given up because its subscriber's owner may no longer read
its topic (the access list changed after it was stored)."""


class Published(NamedTuple):
    """What outcome events say about a stored message."""

    message_id: str
    publisher: str
    received: float
    size: int


class Outbox(Protocol):
    """A durable subscriber's outbox as its outcome events name it: ``name`` is the
    subscriber's name in the store, ``session`` the session it writes to (the event log names
    the subscriber by the session's ``name``)."""

    @property
    def name(self) -> str: ...

    @property
    def session(self) -> object: ...


class DurableOutcomes:
    """Writes the outcome events; the service sets ``events``, ``protocol``, ``clock``,
    ``store``, ``stats``, ``online`` and ``size_of``."""

    events: IEventRecorder
    protocol: str
    clock: IReactorTime
    store: IStore
    stats: dict[str, int]
    online: dict[str, float]
    size_of: Callable[[bytes], int] | None
    published: OrderedDict[int, Published]
    """seq -> recent stored message, at most PUBLISHED_MEMORY, oldest first."""

    if TYPE_CHECKING:
        def _report(self, what: str, **fields: object) -> Callable[[Failure], None]: ...

    def remember(self, seq: int, published: Published) -> None:
        """Keep ``published`` for the events of message ``seq``, forgetting the oldest.

        An OrderedDict, not a dict: deleting a dict's first entry leaves a hole that the
        next ``next(iter(dict))`` walks over, so forgetting the oldest of a full dict cost
        a walk over every entry forgotten since its last resize (8 µs a publish here at
        16,384 entries); ``popitem(last=False)`` is constant time."""
        memory = self.published
        if len(memory) >= PUBLISHED_MEMORY:
            memory.popitem(last=False)
        memory[seq] = published

    def delivered(self, session: Outbox, delivery: Delivery) -> None:
        """A stored message was written to the subscriber's connection (not a resend after
        an acknowledgement timed out: that is :meth:`redelivered`)."""
        self.stats["delivered"] += 1
        self._outcome(schema.DELIVERED, session.session, delivery.seq, delivery.topic,
                      online=self.online.get(session.name))

    def acked(self, session: Outbox, delivery: Delivery) -> None:
        """The subscriber's acknowledgement of ``delivery`` is stored (never sent again)."""
        self.stats["acked"] += 1
        self._outcome(schema.ACKED, session.session, delivery.seq, delivery.topic, online=self.online.get(session.name))

    def redelivered(self, session: Outbox, delivery: Delivery, attempt: int) -> None:
        """``delivery`` was sent again (attempt number ``attempt``): no ack in time."""
        self.stats["redelivered"] += 1
        self._outcome(schema.REDELIVERED, session.session, delivery.seq, delivery.topic)

    def given_up(self, session: Outbox, delivery: Delivery, reason: str = UNACKNOWLEDGED) -> None:
        """Never sent to this subscriber again (``reason``: no ack after ``max_attempts``
        sends, or its owner may no longer read the topic)."""
        self.stats["given_up"] += 1
        self._outcome(schema.DROPPED, session.session, delivery.seq, delivery.topic, reason)

    def expired(self, settled: Settled) -> None:
        """Message ``settled.seq`` reached its timeout (it becomes a dead letter): one event for
        each subscriber that had not acknowledged it yet."""
        self.stats["expired"] += 1
        for subscriber in settled.released:
            self._outcome(schema.EXPIRED, subscriber, settled.seq, settled.topic, "expired")

    def dead_lettered(self, settled: Settled, reason: str | None = None) -> None:
        """Message ``settled.seq`` became a dead letter of ``settled.topic``."""
        self.stats["trashed"] += 1
        self._outcome(schema.TRASHED, None, settled.seq, settled.topic, reason)
        self.published.pop(settled.seq, None)

    def _outcome(self, kind: str, session: object, seq: int, topic: str, reason: str | None = None,
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
            published = None
            if record is not None:
                # kept: the next event of the same message (its ack after its delivery)
                # takes it from memory instead of reading and decoding it again
                published = self._published_of(record)
                if kind != schema.TRASHED:
                    self.remember(seq, published)
            self._write(kind, session, topic, reason, now, published, online)

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
        return Published(record.message_id, record.publisher, record.received, size)

    def _write(self, kind: str, session: object, topic: str, reason: str | None, now: float,
               published: Published | None, online: float | None = None) -> None:
        name = getattr(session, "name", session)
        fields: dict[str, object] = {"session": name, "topic": topic, "reason": reason, "outcome": kind}
        if published is not None:
            fields["sender"] = published.publisher
            fields["message_id"] = published.message_id
            fields["bytes"] = published.size
            fields["latency_us"] = max(0, int((now - published.received) * 1_000_000))
            if online is not None:
                fields["queued_us"] = max(0, int((min(online, now) - published.received) * 1_000_000))
        self.events.record(kind, self.protocol, **fields)

"""Durable delivery: durable subscriptions and pending messages, for every protocol.

A durable subscription outlives its subscriber's connection.  A message published to a topic
one covers, by any protocol, is stored with one pending delivery per subscriber before its
publisher is told it was accepted (:meth:`DurableService.keep` for the core's publishes,
:meth:`DurableService.publish` for a front end that builds the record itself); a connected
subscriber is offered it once committed, an offline one reads its pending deliveries from the
store when it comes back.  Topics no durable subscription covers never reach this module: the
Broker asks :meth:`DurableService.covers` (a dict lookup) and routes in memory.

brokerd.tap builds the service over the node's store whenever the node has one, whichever
front ends it runs (docs/architecture.md, "Durable delivery"): a node keeps the core's
publishes for every durable subscriber whichever front end it listens with.  What a stored
message gets from its topic (delivery mode, default timeout, whether the core keeps it at
all) comes from the stored topics (:class:`~brokerd.core.storedtopics.StoredTopics`), its id
from the server id, and who may read it from the core's access policy, asked for the
subscriber's owner (brokerd.core.subscriber): all of it here, read from the store.  A front
end that owns a topic tree changes the topics and subscriptions through this service, and
sets only what it renders: ``receipts`` and ``size_of``.

The service keeps, beside the store: the subscription index, the connected durable sessions
(each an :class:`IDurableSession`), message numbers, the claims of :data:`SINGLE` deliveries,
expiry into dead letters (a topic's dead-letter queue) and their purge, and the outcome events
(:class:`~brokerd.core.outcomes.DurableOutcomes`).  All of it runs on the reactor thread;
the store works off it.
"""
from __future__ import annotations

import socket
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.config import Settings
from brokerd.core import stored
from brokerd.core.access import Perm
from brokerd.core.message import Message
from brokerd.core.outcomes import FORBIDDEN, UNACKNOWLEDGED, DurableOutcomes, Published
from brokerd.core.pending import PendingQuota
from brokerd.core.queues import DurableQueues
from brokerd.core.subscriber import owner_of, takes_core_publishes
from brokerd.core.storedtopics import EVERY, HELD, SINGLE, StoredTopics
from brokerd.core.subscriptions import ADD, FILTER, MESSAGE, SubscriptionIndex
from brokerd.core.sync import DurableSync
from brokerd.core.upkeep import DurableUpkeep
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.stamps import format_datetime
from brokerd.store.base import StoreFull, is_outage
from brokerd.store.records import Delivery, MessageRecord, PacketFlow, ReceiptDue, Settled, TopicRecord

if TYPE_CHECKING:
    from brokerd.core.publication import Publication

__all__ = ["ADD", "DurableService", "FILTER", "IDurableSession", "Published", "UNACKNOWLEDGED", "attach_durable",
           "publisher_of", "server_domain"]



class IDurableSession(Protocol):
    """A connected durable subscriber, as the service sees it (a front end's outbox)."""

    name: str
    closed: bool

    def offer(self, delivery: Delivery) -> None:
        """A new pending delivery, committed."""

    def discard(self, seq: int) -> None:
        """The delivery is no longer pending (settled elsewhere, a dead letter, moved)."""

    def reoffer(self, seq: int) -> None:
        """A :data:`SINGLE` message another session held is free again."""

    def refresh(self) -> None:
        """Read the pending deliveries from the store again (a held topic was released)."""

    @property
    def wire_format(self) -> Any:
        """The IWireFormat that renders a message never stored (:meth:`offer_volatile`)."""

    def offer_volatile(self, data: bytes) -> None:
        """Bytes to write that take no acknowledgement (a message never stored, a notice)."""

    def recheck(self) -> None:
        """The access list changed: what waits here unsent goes through the router's stored
        path again (:class:`brokerd.core.publication.StoredPage`)."""


def _unrouted(publication: Publication) -> int:
    """The route of a durable service no Broker uses yet: nothing is delivered before it is."""
    raise RuntimeError("the durable service routes through its Broker (Broker.use_durable)")


def publisher_of(message: Message) -> str:
    """How the store names the publisher of another protocol's message:
    ``<protocol>:<sender name>`` (Latin-1, so any name survives)."""
    return f"{message.protocol}:{message.sender_name.decode('latin-1')}"


def server_domain(settings: Settings) -> str:
    """The domain this server is known by (its configured ``domain``, else the host name)."""
    return settings.domain or socket.gethostname() or "localhost"


class DurableService(DurableUpkeep, DurableSync, DurableQueues, DurableOutcomes):
    """The durable subscriptions and pending messages of the broker, over an IStore.

    Every tunable comes from ``settings``: the default message timeout, the retry timeout,
    the attempts before a delivery is given up, the dead letters' retention, the gauge interval
    (the ``durable_*`` settings).
    The owning front end sets ``receipts`` (called with each ReceiptDue), ``size_of`` (the
    size of its own stored rows), ``protocol`` (the event log's protocol of outcome events)
    and ``on_tree_changed`` (called with the topic records another node committed).
    """

    def __init__(self, store: Any, clock: Any, events: Any = NULL_EVENT_LOG,
                 settings: Settings | None = None) -> None:
        settings = settings if settings is not None else Settings()
        self.store = store
        self.clock = clock
        self.events = events
        """The event log's IEventRecorder."""
        self.domain = server_domain(settings)
        """The domain of a new server id (the first node to start names the server)."""
        self.index = SubscriptionIndex()
        self.topics = StoredTopics(settings.durable_message_timeout)
        """The stored topic tree: each topic's delivery mode and default timeout."""
        self.sessions: dict[str, IDurableSession] = {}
        """Connected durable subscribers by name."""
        self.claims: dict[int, IDurableSession] = {}
        self.waiters: dict[int, set[IDurableSession]] = {}
        self.published: OrderedDict[int, Published] = OrderedDict()
        """seq -> recent stored message, at most PUBLISHED_MEMORY (brokerd.core.outcomes)."""
        self.server_id = ""
        """The server's unique id (one for a cluster's nodes): the head of every stored message's id."""
        self.protocol = "durable"
        self.access_control: Callable[[], Any] | None = None
        """The core's current AccessControl (the Broker sets it): asked who may read a topic when
        a message is kept (the router asks again as the outboxes read it: StoredPage)."""
        self.route: Callable[[Publication], int] = _unrouted
        """The router's (the Broker sets it): the outboxes route what they read as StoredPages."""
        self.receipts: Callable[[ReceiptDue], Any] | None = None
        self.size_of: Callable[[bytes], int] | None = None
        """The size the event log reports of a stored row that is no stored Message (a front
        end's own rows)."""
        self.announce: Callable[..., None] | None = None
        """Tell the other nodes of a cluster what this node committed (keywords ``tree``,
        ``subscribers``, ``pending``): the Broker sets it to its engine's ``durable_changed``
        when the engine is shared; None on one node (nothing to tell, nothing computed)."""
        self.full: Callable[[], bool] | None = None
        """Whether the data directory is below ``--disk-free-limit`` (brokerd.tap sets it to the
        disk guard's reading): :meth:`keep` then stores nothing and fails with StoreFull, so a
        publisher of any protocol gets its temporary failure."""
        self.on_tree_changed: Callable[[list[TopicRecord]], Any] | None = None
        """Called with the topic records when another node changed the tree (a front end that
        keeps its own tree rebuilds it from them)."""
        self.pending_quota: PendingQuota | None = None
        """The bound on what waits for each subscriber of a front end that set one
        (:meth:`bound_pending`); None: unbounded (a front end whose sessions are its accounts')."""
        self.retry_timeout: float = settings.durable_retry_timeout
        """Seconds to wait for a delivery's acknowledgement before sending it again."""
        self.max_attempts: int = settings.durable_max_attempts
        """Delivery attempts of one message to one subscriber before it is given up."""
        self.online: dict[str, float] = {}
        """Connected durable subscribers by name: when they connected (clock seconds), which
        splits an outcome's latency into the time the message waited for its subscriber
        and the time it took once the subscriber was there (``queued_us``)."""
        self._seq = 0
        self.init_upkeep(settings)
        self._tree_reading: Deferred | None = None
        self._tree_again = False
        self._tree_changing = 0
        self._tree_changes = 0
        self.stats = {"published": 0, "kept": 0, "acked": 0, "redelivered": 0, "expired": 0,
                      "trashed": 0, "delivered": 0, "given_up": 0}

    def bound_pending(self, prefix: str, limit: int) -> None:
        """At most ``limit`` messages wait in the store for each subscriber whose name starts
        with ``prefix`` (a front end's owned subscribers, :func:`~brokerd.core.subscriber.protocol_prefix`): see
        brokerd.core.pending.  A front end calls it when it is built, before the start."""
        self.pending_quota = PendingQuota(prefix, limit, self.clock)
        if self.started and self._start_failure is None:
            self._count_pending().addErrback(self._report("Counting the pending deliveries"))

    def _count_pending(self) -> Deferred:
        quota = self.pending_quota
        if quota is None:
            return succeed(None)
        return self.store.pending_counts(quota.prefix).addCallback(quota.loaded)

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

    def recheck(self) -> None:
        """The access list changed (the Broker's ``set_policy``): every connected subscriber's
        outbox routes what waits in it unsent again, so nothing its owner may no longer read
        goes out (what it reads from the store later is routed as it is read)."""
        for session in list(self.sessions.values()):
            session.recheck()

    def delivery_mode(self, key: str) -> str:
        return HELD if key in self.topics.held else EVERY

    def held_topics(self) -> list[str]:
        return sorted(self.topics.held)

    # ------------------------------------------------------------------ recipients

    def message_id(self, seq: int, now: float) -> str:
        """The id of stored message ``seq`` received at ``now``."""
        return f"{self.server_id}/{seq}({format_datetime(now)})"

    def covers(self, topic: bytes) -> bool:
        """Whether a durable subscription covers core topic ``topic``: a topic one where the
        stored topic keeps the core's messages (:meth:`StoredTopics.reachable`), or a FILTER
        one.  The Broker asks on every publish: for a topic no durable subscription covers it
        is a cached lookup."""
        if self.index.has_subscribers(topic) and self.topics.reachable(topic.decode("utf-8")):
            return True
        return self.index.has_filter_subscribers(topic)

    @property
    def readable(self) -> Callable[[str, str], bool] | None:
        """(subscriber, topic key) -> may it read the topic now; None when the core has no
        access policy (every subscription stays allowed)."""
        if self.access_control is None or self.access_control().policy is None:
            return None
        return self._readable

    def _readable(self, subscriber: str, key: str) -> bool:
        principal = owner_of(subscriber)
        if principal is None or self.access_control is None:
            return True
        return self.access_control().allows(principal, key.encode("utf-8"), Perm.SUBSCRIBE)

    def recipients(self, key: str, change: str, received: float, kind: str = MESSAGE) -> list[str]:
        """The durable subscribers of topic ``key`` (by their ``kind`` subscriptions: MESSAGE
        ones to stored topics, or FILTER ones) that get a ``change`` received at ``received``: this is
        the one place recipients of a stored message are chosen.  A subscription whose UNTIL
        has passed ends here (it unsubscribes)."""
        found: dict[str, None] = {}
        readable = self.readable
        for sub in self.index.matching(kind, key):
            record = sub.record
            if readable is not None and not readable(record.subscriber, key):
                continue
            if record.until is not None and record.until <= received:
                self.end_subscription(record.subscriber, kind, record.topic)
                continue
            if record.since is not None and received < record.since:
                continue
            if sub.wants(change):
                found[record.subscriber] = None
        return list(found)

    def core_recipients(self, key: str, received: float) -> list[str]:
        """The durable subscribers of topic ``key`` that get a core publish (any protocol's,
        stored or not) received at ``received``: :meth:`recipients` of an ADD, without the
        relays, which take only messages published for forwarding (brokerd.core.subscriber)."""
        return [name for name in self.recipients(key, ADD, received) if takes_core_publishes(name)]

    def kept_recipients(self, key: str, received: float, filters_only: bool = False) -> list[str]:
        """Whom :meth:`keep` stores a core publish to ``key`` for: the MESSAGE subscribers
        where the stored topic keeps the core's messages, and the FILTER subscribers, whoever
        published (only those with ``filters_only``: a front end that stores its own messages
        for its own topic subscribers)."""
        names: dict[str, None] = {}
        if not filters_only and self.topics.reachable(key):
            names.update(dict.fromkeys(self.core_recipients(key, received)))
        names.update(dict.fromkeys(self.recipients(key, ADD, received, FILTER)))
        return list(names)

    def end_subscription(self, subscriber: str, kind: str, topic: str) -> Deferred:
        self.index.remove(subscriber, kind, topic)
        d = self.store.remove_subscription(subscriber, kind, topic)
        return d.addErrback(self._report("Ending the subscription of {s} to {t}", s=subscriber, t=topic))

    # ------------------------------------------------------------------ storing

    def keep(self, messages: list[Message], filters_only: bool = False, flows: list[PacketFlow] | None = None) -> Deferred:
        """Store multicast ``messages`` (one topic, in order) for the durable subscribers
        of their topic (:meth:`kept_recipients`); fires (with None) once all are committed.
        Each gets an id (``message_id``) and, unless it names them, the topic's expiry and
        mode.  They go to the store in one operation (IStore.publish_many): a read of
        pipelined publishes costs one store call, not one per message.  ``flows`` (an MQTT
        publisher's QoS 2 PUBLISHes received) are stored in the same transaction, or alone
        when nothing is kept."""
        now = self.clock.seconds()
        topic = messages[0].target
        assert topic is not None  # a multicast run names its topic (Message.target)
        key = topic.decode("utf-8")
        deliveries = [(name, ADD) for name in self.kept_recipients(key, now, filters_only)]
        kept_bare = not filters_only and self.topics.reachable(key)  # a stored topic keeps it unread too
        if not deliveries and not kept_bare:
            return self.put_flows(flows)  # a filter's subscriber may not read it: nothing to keep
        quota = self.pending_quota
        wanted = [deliveries] * len(messages) if quota is None else quota.reserve(deliveries, len(messages))
        # A message every recipient of which is full is not stored at all (nor refused).
        runs = [(message, each) for message, each in zip(messages, wanted) if each or kept_bare]
        if not runs:
            return self.put_flows(flows)
        if self.full is not None and self.full():
            self._unreserve(wanted)
            return fail(StoreFull("the disk is nearly full; the message was not stored"))
        each = [run_deliveries for _message, run_deliveries in runs]
        timeout = self.topics.timeout_for(key)
        mode = self.topics.mode_for(key)
        head = f"{self.server_id}/"
        tail = f"({format_datetime(now)})"  # message_id's, once for the read
        kept: list[tuple[MessageRecord, int]] = []
        for message, _run_deliveries in runs:
            seq = self.next_seq()
            message_id = f"{head}{seq}{tail}"
            expires = message.expires
            if expires is None and timeout is not None:
                expires = now + timeout
            created = now if message.created is None else message.created
            data = stored.encode_stamped(message, message_id, created, expires)
            record = MessageRecord(message_id, key, publisher_of(message), "", now, expires, message.priority,
                                   data, seq, mode)
            kept.append((record, len(message.payload)))
        self.stats["kept"] += len(kept)
        items = [(record, run_deliveries) for (record, _size), run_deliveries in zip(kept, each)]
        d = self.store.publish_many(items, flows) if flows else self.store.publish_many(items)

        def committed(_seqs: list[int]) -> None:
            self.committed(kept, deliveries, each)

        def not_stored(failure: Failure) -> Failure:
            self._unreserve(each)
            return failure

        return d.addCallbacks(committed, not_stored)

    def put_flows(self, flows: list[PacketFlow] | None) -> Deferred:
        """Store ``flows`` (MQTT's QoS 2 exchanges under way, kept with a durable
        subscriber: brokerd.protocols.mqtt.stored); fires once committed, at once when there
        are none.  They end with the subscriber (:meth:`forget_subscriber`)."""
        return self.store.put_flows(flows) if flows else succeed(None)

    def remove_flow(self, subscriber: str, inbound: bool, packet_id: int) -> Deferred:
        """One exchange of :meth:`put_flows` is over; fires once committed."""
        return self.store.remove_flow(subscriber, inbound, packet_id)

    def flows_of(self, subscriber: str) -> Deferred:
        """The exchanges under way of ``subscriber`` (IStore.flows_of)."""
        return self.store.flows_of(subscriber)

    def _unreserve(self, runs: list[list[tuple[str, str]]]) -> None:
        """Deliveries :class:`PendingQuota` reserved that were not stored after all."""
        if self.pending_quota is not None:
            for run_deliveries in runs:
                self.pending_quota.release(run_deliveries)

    def offer_unstored(self, message: Message, explicit: Iterable[str] = ()) -> int:
        """Hand a multicast its publisher asked not to store (a guarantee of none) to
        the durable subscribers of its topic that are connected to this node, and to the
        ``explicit`` ones (a login topic's owner), rendered once per wire format; nothing is
        kept for one that is offline, and relays take only stored messages.  Returns how
        many sessions it was handed to."""
        topic = message.target
        assert topic is not None  # a multicast names its topic (Message.target)
        key = topic.decode("utf-8")
        names = dict.fromkeys(explicit)
        now = self.clock.seconds()
        names.update(dict.fromkeys(self.core_recipients(key, now)))
        names.update(dict.fromkeys(self.recipients(key, ADD, now, FILTER)))
        rendered: dict[Any, bytes | None] = {}
        reached = 0
        for name in names:
            session = self.sessions.get(name)
            if session is None or session.closed:
                continue
            fmt = session.wire_format
            if fmt not in rendered:
                rendered[fmt] = fmt.render_message(message)
            data = rendered[fmt]
            if data is not None:
                session.offer_volatile(data)
                reached += 1
        return reached

    def publish(self, record: MessageRecord, deliveries: list[tuple[str, str]], size: int = 0) -> Deferred:
        """Store ``record`` with its pending ``deliveries`` ``(subscriber, change)``; once
        committed, offer it to the connected subscribers among them.  ``size`` is what the
        event log reports.  Fires with the record's seq."""
        d = self.store.publish(record, deliveries)

        def committed(seq: int) -> int:
            self.committed([(record, size)], deliveries)
            return seq

        return d.addCallback(committed)

    def committed(self, kept: list[tuple[MessageRecord, int]], deliveries: list[tuple[str, str]],
                  each: list[list[tuple[str, str]]] | None = None) -> None:
        """The records of ``kept`` (each with the size the event log reports) and their
        pending ``deliveries`` (the same subscribers for all, or ``each`` record's own) are
        committed: count and remember them, offer them to the connected subscribers among
        their deliveries, and tell the other nodes about the rest, once for the run."""
        self.stats["published"] += len(kept)
        remember = self.remember
        for record, size in kept:
            remember(record.seq, Published(record.message_id, record.publisher, record.received, size))
        sessions = self.sessions
        if any(name in sessions for name, _change in deliveries):
            for index, (record, _size) in enumerate(kept):
                self.offer(record, deliveries if each is None else each[index])
        self._announce_pending(deliveries)

    def _announce_pending(self, deliveries: list[tuple[str, str]]) -> None:
        """Tell the other nodes that the subscribers of ``deliveries`` not connected here
        have new pending deliveries (nothing on one node)."""
        if self.announce is not None:
            elsewhere = {name for name, _change in deliveries if name not in self.sessions}
            if elsewhere:
                self.announce(pending=elsewhere)

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

    # ------------------------------------------------------------------ acknowledgements

    def acknowledged(self, session: Any, delivery: Delivery) -> Deferred:
        d = self.store.acknowledge(session.name, delivery.seq)

        def done(settled: Settled | None) -> None:
            if delivery.mode == SINGLE:
                self.claims.pop(delivery.seq, None)
            if settled is not None:
                self._settled_pending(session.name)
                reported = delivery
                if not delivery.topic:  # one known by its seq only (an MQTT exchange resumed)
                    reported = Delivery(delivery.seq, settled.topic, delivery.priority, delivery.change,
                                        delivery.attempts, delivery.mode, delivery.data)
                self.acked(session, reported)
                self.settle(settled)
            if delivery.mode == SINGLE:
                for waiter in self.waiters.pop(delivery.seq, ()):
                    waiter.discard(delivery.seq)

        return d.addCallback(done)

    def give_up(self, session: Any, delivery: Delivery, reason: str = UNACKNOWLEDGED) -> Deferred:
        """``session``'s subscriber will never be sent ``delivery``: settled for it (a dead
        letter when nobody else waits for it).  ``reason``: why, for the event log
        (:data:`UNACKNOWLEDGED`, or :data:`FORBIDDEN` when its owner may no longer read it)."""
        d = self.store.give_up(session.name, delivery.seq, self.clock.seconds())

        def done(settled: Settled | None) -> None:
            if settled is not None:
                self._settled_pending(session.name)
                self.given_up(session, delivery, reason)
                self.settle(settled, "forbidden" if reason == FORBIDDEN else "undeliverable")

        return d.addCallback(done)

    def _settled_pending(self, subscriber: str) -> None:
        if self.pending_quota is not None:
            self.pending_quota.settled(subscriber)

    def claim(self, seq: int, session: IDurableSession) -> bool:
        """A :data:`SINGLE` message goes to one session at a time."""
        holder = self.claims.get(seq)
        if holder is None or holder is session or holder.closed:
            self.claims[seq] = session
            return True
        self.waiters.setdefault(seq, set()).add(session)
        return False

    def release(self, seq: int, session: IDurableSession) -> None:
        """The session holding a :data:`SINGLE` message let it go (refused, gave up, disconnected)."""
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
        ``receipts``.  ``reason`` says why a message became a dead letter (expired,
        undeliverable, removed, recalled, replaced)."""
        for subscriber in settled.released:
            self._settled_pending(subscriber)
            session = self.sessions.get(subscriber)
            if session is not None:
                session.discard(settled.seq)
        if settled.trashed:
            self.claims.pop(settled.seq, None)
            self.waiters.pop(settled.seq, None)
            self.dead_lettered(settled, reason)
        if settled.receipt is not None and self.receipts is not None:
            self.receipts(settled.receipt)



def attach_durable(broker: Any, store: Any, opened: Deferred | None, clock: Any, events: Any,
                   settings: Settings) -> DurableService:
    """The node's durable service over ``store``, made the Broker's and started once the
    store is open: what brokerd.tap does for every node that has a store."""
    durable = broker.use_durable(DurableService(store, clock, events, settings))
    # A failure to start is the front ends' to report (when_started) and the store's opener's:
    # this copy of it is not left to be logged as an unhandled error when collected.
    durable.start(opened).addErrback(lambda _failure: None)
    # Retained messages load once the store is open; a failure is the store's to report.
    durable.when_started().addCallbacks(
        lambda _: broker.retained.use_store(store).addErrback(_retained_not_loaded), lambda _failure: None)
    return durable


def _retained_not_loaded(failure: Failure) -> None:
    """The store did not open (its opener reports that) or its retained messages could not be
    read: the node runs with those retained from now on."""
    if not is_outage(failure):
        Logger().failure("Loading the retained messages", failure)

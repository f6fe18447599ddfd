"""A persistent MQTT session's subscriptions and messages in the core's store.

With a store on the node (the default), a session that outlives its connection (3.1.1 Clean
Session 0, v5 a Session Expiry Interval above 0) keeps its subscriptions as the core's durable
FILTER subscriptions, named by :class:`brokerd.core.subscriber.SubscriberId` (protocol, owner,
client identifier).  A QoS 1 or 2 subscription collects messages: every protocol's publish to
a topic it matches is committed with a pending delivery for the session before its publisher is
answered, and the delivery is settled when the client acknowledged it (PUBACK, or PUBCOMP at
QoS 2).  So what was acknowledged to a publisher survives the broker's kill -9, and a client
that comes back, to this node or another one on the shared store, reads what waits for it.  A
QoS 0 subscription is remembered with the others and delivered live, as MQTT allows.

:class:`StoredDeliveries` is the session, as durable delivery sees it (IDurableSession), while
a connection is bound: it reads the pending deliveries a page at a time and hands them to the
session within its window.

Exactly once, across a crash too (MQTT 4.3.3, 4.4): the QoS 2 exchanges of a persistent
session under way are stored with it (store PacketFlows).  A stored message sent at QoS 2 is
written to the client only once the store has its Packet Identifier; at the client's PUBREC
the store notes it released before PUBREL goes; the delivery is settled at PUBCOMP.  A
session taken up from the store (a restart, another node) reads them back first: a released
one is answered with its PUBREL again, never its PUBLISH; one not released is sent again with
its Packet Identifier and DUP, so that a client that had it knows it.  A QoS 2 PUBLISH the
client sends is committed together with its Packet Identifier (``Broker.keep``), before
PUBREC; PUBCOMP goes once its PUBREL took the identifier out: after a restart a PUBLISH sent
again is answered PUBREC without being published twice, and a PUBREL is answered PUBCOMP.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.core import stored
from brokerd.core.durable import DurableService
from brokerd.core.message import Message
from brokerd.core.outcomes import FORBIDDEN
from brokerd.core.publication import StoredPage
from brokerd.core.storedtopics import EVERY
from brokerd.core.subscriber import owner_of
from brokerd.core.subscriptions import ADD, FILTER
from brokerd.interfaces import IWireFormat
from brokerd.protocols.mqtt.session import Outgoing, SubscriptionOptions, pubrel
from brokerd.store.base import log_unless_outage
from brokerd.store.records import Delivery, PacketFlow, SubscriptionRecord

PAGE = 256
"""Pending deliveries read from the store at a time, at most (and the session's window)."""


def subscription_record(subscriber: str, topic_filter: str, options: SubscriptionOptions) -> SubscriptionRecord:
    """The core's FILTER subscription for one MQTT subscription of session ``subscriber``:
    its options kept in ``changes`` (``ADD`` when it collects messages, i.e. QoS 1 or 2)."""
    changes = [ADD] if options.qos else []
    changes.append(f"q{options.qos}")
    if options.no_local:
        changes.append("nl")
    if options.retain_as_published:
        changes.append("rap")
    if options.identifier is not None:
        changes.append(f"i{options.identifier}")
    return SubscriptionRecord(subscriber, FILTER, topic_filter, tuple(changes))


def subscription_options(record: SubscriptionRecord) -> tuple[int, bool, bool, int | None]:
    """(QoS, no local, retain as published, subscription identifier) of a stored subscription
    (:func:`subscription_record`)."""
    qos, no_local, as_published, identifier = 0, False, False, None
    for change in record.changes:
        if change[:1] == "q" and change[1:].isdigit():
            qos = min(int(change[1:]), 2)
        elif change == "nl":
            no_local = True
        elif change == "rap":
            as_published = True
        elif change[:1] == "i" and change[1:].isdigit():
            identifier = int(change[1:])
    return qos, no_local, as_published, identifier


class StoredDeliveries:
    """A persistent MQTT session bound to a connection, as durable delivery sees it.

    Deliveries come from the store (:meth:`refresh`, a page at a time, oldest first) or as
    they are committed (:meth:`offer`); they wait here, at most a page, until the session's
    window lets it send them.  An offer that finds the page full, or a read under way, is
    left in the store and read with the next page: the order is the store's.
    """

    _log = Logger()

    def __init__(self, session: Any, durable: DurableService, max_bytes: int) -> None:
        self.session = session  # an MQTTSession, or a bridge (BridgeQueue): they share no type
        self.durable = durable
        self.name: str = session.durable_name
        self.owner = owner_of(self.name)
        """Whose subscriber this is: the router asks the access list for this principal."""
        self.max_bytes = max_bytes
        self.closed = False
        self.waiting: deque[Delivery] = deque()
        self.known: set[int] = set()
        """Seqs waiting here or handed to the session and not settled."""
        self._reading = False
        self._behind = False
        self._held = False
        """A QoS 2 message waits for the store to have its Packet Identifier: nothing more
        is sent meanwhile, so the order stays the store's."""
        self.resumed: dict[int, int] = {}
        """seq -> Packet Identifier of the messages sent before a restart and not released."""

    @property
    def wire_format(self) -> IWireFormat:
        return self.session.wire_format

    def open(self, resumed: Callable[[], object] | None = None) -> None:
        """Start delivering; a session taken up from the store first reads its QoS 2
        exchanges back, then calls ``resumed`` (the connection reads on)."""
        self.durable.attach(self)
        if resumed is None:
            self.refresh()
            return
        d = self.durable.flows_of(self.name)
        d.addCallbacks(self._resume, self._not_resumed)
        d.addBoth(lambda _: resumed())

    def _resume(self, flows: list[PacketFlow]) -> None:
        """Take up the QoS 2 exchanges the store kept (see the module docstring)."""
        session = self.session
        packets = []
        for flow in flows:
            if flow.inbound:
                session.received_qos2.add(flow.packet_id)
            elif flow.packet_id in session.inflight:
                continue
            elif flow.released:
                outgoing = Outgoing(None, 2, False, Delivery(flow.seq, "", 0, ADD, 0, EVERY, b""))
                outgoing.released = True
                session.inflight[flow.packet_id] = outgoing
                packets.append(pubrel(flow.packet_id))
            else:
                self.resumed[flow.seq] = flow.packet_id
                session.reserved.add(flow.packet_id)
        if packets and session.connection is not None and not self.closed:
            session.connection.write_now(b"".join(packets))
        self.refresh()

    def _not_resumed(self, failure: Failure) -> None:
        log_unless_outage(failure, self._log, "Reading the QoS 2 exchanges of MQTT session {name}", name=self.name)
        self.refresh()

    def close(self) -> None:
        self.closed = True
        self.durable.detach(self)
        self.waiting.clear()

    # ------------------------------------------------------------------ IDurableSession

    def offer(self, delivery: Delivery) -> None:
        if self.closed or delivery.seq in self.known:
            return
        if self._reading or self._behind or len(self.waiting) >= PAGE:
            self._behind = True  # the next read finds it, in the store's order
            return
        self.durable.route(StoredPage(self.owner, (delivery,), self))
        self.pump()

    def take(self, delivery: Delivery) -> None:
        """The router let the session read ``delivery``: it waits here for the window."""
        if delivery.seq not in self.known:
            self.known.add(delivery.seq)
            self.waiting.append(delivery)

    def forbid(self, delivery: Delivery) -> None:
        """The session's owner may no longer read ``delivery``'s topic (the access list
        changed after it was stored): given up, a dead letter when nobody else waits for it.
        MQTT has no way to wait for a topic to open again, and the session would read it
        again with every page.  Known until the store settled it, so no read brings it back."""
        seq = delivery.seq
        self.known.add(seq)
        d = self.durable.give_up(self, delivery, FORBIDDEN)
        d.addErrback(log_unless_outage, self._log, "Giving up a stored message of MQTT session {name}", name=self.name)
        d.addBoth(lambda _: self.known.discard(seq))

    def recheck(self) -> None:
        """The access list changed: what waits here unsent is routed again."""
        waiting = list(self.waiting)
        self.waiting.clear()
        self.known.difference_update(delivery.seq for delivery in waiting)
        if waiting and not self.closed:
            self.durable.route(StoredPage(self.owner, waiting, self))
            self.pump()

    def discard(self, seq: int) -> None:
        """Settled elsewhere (expired, removed): not sent if it still waits here."""
        if seq in self.known and any(delivery.seq == seq for delivery in self.waiting):
            self.waiting = deque(delivery for delivery in self.waiting if delivery.seq != seq)
            self.known.discard(seq)

    def reoffer(self, seq: int) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Read the next page of pending deliveries (at connect, when there may be more)."""
        if self.closed:
            return
        if self._reading:
            self._behind = True
            return
        self._reading = True
        self._behind = False
        skip = frozenset(self.known | self.session.stored_in_flight())
        d = self.durable.pending(self.name, PAGE, (), self.max_bytes, skip)
        d.addCallbacks(self._read, self._not_read)

    def offer_volatile(self, data: bytes) -> None:
        """A message never stored (SMQP's Guarantee: NO) for this session: sent as it is."""
        for item in getattr(data, "items", ()):
            self.session.deliver(item, kept=True)

    # ------------------------------------------------------------------ sending

    def _read(self, deliveries: list[Delivery]) -> None:
        self._reading = False
        if self.closed:
            return
        self.durable.route(StoredPage(self.owner, deliveries, self))
        if deliveries:
            self._behind = True  # a page (or the byte budget) full: more may wait
        elif self.resumed:
            self._forget_resumed()
        self.pump()

    def _forget_resumed(self) -> None:
        """Every pending delivery was read: the messages sent before a restart and not met
        are no longer pending (expired or removed meanwhile); their exchanges end."""
        for seq, packet_id in list(self.resumed.items()):
            if seq in self.known:
                continue
            del self.resumed[seq]
            self.session.reserved.discard(packet_id)
            self.durable.remove_flow(self.name, False, packet_id).addErrback(
                log_unless_outage, self._log, "Ending a QoS 2 exchange of MQTT session {name}", name=self.name)

    def _not_read(self, failure: Failure) -> None:
        self._reading = False
        log_unless_outage(failure, self._log, "Reading the stored messages of MQTT session {name}", name=self.name)

    def pump(self) -> None:
        """Hand the waiting deliveries to the session while its window allows; read the
        next page when none waits and more may be in the store.  What goes at QoS 2 is
        written once the store has its Packet Identifier (with what followed it)."""
        if self._held:
            return
        session = self.session
        waiting = self.waiting
        out: list[bytes] = []
        flows: list[PacketFlow] = []
        while waiting and session.can_send_stored():
            delivery = waiting.popleft()
            message = self.message_of(delivery)
            packet_id = None
            if message is not None:
                packet_id = session.send_stored(message, delivery, out, self.resumed.pop(delivery.seq, None))
            if packet_id is None:
                self.settle(delivery)
                continue
            self.durable.delivered(self, delivery)  # the event log's outcome, as SMQP's
            if session.inflight[packet_id].qos == 2:
                flows.append(PacketFlow(self.name, False, packet_id, delivery.seq))
        if flows:
            self._held = True
            d = self.durable.put_flows(flows)
            d.addErrback(log_unless_outage, self._log, "Storing the QoS 2 exchanges of MQTT session {name}", name=self.name)
            d.addCallback(lambda _: self._write_held(out))
            return
        if out:
            session.connection.write_now(b"".join(out))
        if not waiting and self._behind and not self._reading:
            self.refresh()

    def message_of(self, delivery: Delivery) -> Message | None:
        """The core Message ``delivery`` stores, or None: another front end's own row, or
        one that cannot be read (logged; the caller settles it)."""
        if not stored.is_stored_message(delivery.data):
            return None
        try:
            return stored.decode(delivery.data)
        except ValueError:
            self._log.warn("Stored message {seq} of {name} cannot be read; settled", seq=delivery.seq, name=self.name)
            return None

    def _write_held(self, out: list[bytes]) -> None:
        """The store has the Packet Identifiers of ``out``'s QoS 2 messages: write them (on
        a store outage too, as at least once), and go on."""
        self._held = False
        connection = self.session.connection
        if self.closed or connection is None:
            return  # the session sends them again (DUP) on its next connection
        connection.write_now(b"".join(out))
        self.pump()

    def released(self, packet_id: int, delivery: Delivery) -> Deferred[object]:
        """PUBREC came for stored ``delivery`` sent with ``packet_id``: a Deferred that fires
        once the store has it released (the caller's PUBREL waits for it)."""
        d = self.durable.put_flows([PacketFlow(self.name, False, packet_id, delivery.seq, True)])
        return d.addErrback(log_unless_outage, self._log, "Storing the QoS 2 exchanges of MQTT session {name}", name=self.name)

    def settle(self, delivery: Delivery, packet_id: int | None = None) -> None:
        """The client has ``delivery`` (or it is not for it): the store lets it go, and the
        QoS 2 exchange it was sent with (``packet_id``) after it.  The next page is read by
        :meth:`pump`, which the session calls as its window frees."""
        self.known.discard(delivery.seq)
        d = self.durable.acknowledged(self, delivery)
        d.addErrback(log_unless_outage, self._log, "Settling a stored message of MQTT session {name}", name=self.name)
        if packet_id is not None:
            self.durable.remove_flow(self.name, False, packet_id).addErrback(
                log_unless_outage, self._log, "Ending a QoS 2 exchange of MQTT session {name}", name=self.name)

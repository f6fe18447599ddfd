"""An MQTT session: what outlives one network connection (MQTT 5.0 section 4.1).

The session, not the connection, is the core's subscriber (ISubscriber): it holds the
subscriptions, the QoS 1 and 2 messages sent and not yet acknowledged, the messages waiting
for the client's Receive Maximum to allow them, and the Packet Identifiers of QoS 2 messages
received and not yet released.  A connection binds to it at CONNECT and unbinds when it ends;
a persistent session (3.1.1 Clean Session 0, v5 a Session Expiry Interval above 0) stays
attached to the core meanwhile.  On a node with a store its QoS 1 and 2 subscriptions are the
core's durable subscriptions (:mod:`.stored`): what any protocol publishes for them is stored
and read back, across a restart too, and settled when the client acknowledged it.  Without a
store what is published while its client is away waits here, up to ``max_queued`` messages
(QoS 0 ones are not kept offline).

Delivery (:meth:`MQTTSession.send`): the core hands every session of a wire format the same
:class:`~brokerd.protocols.mqtt.wire.MQTTPublishes`.  A session whose subscriptions ask for
nothing but plain QoS 0 copies writes those bytes as they are; the others look up their
subscriptions matching the topic (the highest QoS, no-local, Subscription Identifiers) and
build their copy from the message's shared frame.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, ITransport
from zope.interface import implementer

from brokerd.core.filters import matches
from brokerd.core.message import Message
from brokerd.core.principal import Principal
from brokerd.interfaces import ISubscriber
from brokerd.protocols.mqtt.packets import MQTT_5, Will
from brokerd.protocols.mqtt.publish import PublishFrame
from brokerd.protocols.mqtt.wire import MQTTPublishes, MQTTWireFormat, Rendered
from brokerd.store.records import Delivery

MAX_PACKET_ID = 0xFFFF


def pubrel(packet_id: int) -> bytes:
    """PUBREL for ``packet_id`` (3.1.1 and v5 alike: v5's reason code 0 may be left out)."""
    return bytes((0x62, 2)) + packet_id.to_bytes(2, "big")
_MATCH_CACHE = 1024
"""Topics whose matching subscriptions a session remembers (forgotten when they change)."""


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """One subscription of a session: its granted QoS and v5 options."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    identifier: int | None = None
    matched: bytes = b""
    """The filter topics are matched with: the subscription's, without ``$share/{group}/``."""


class Outgoing:
    """A QoS 1 or 2 message sent to the client and not yet acknowledged (PUBACK, or PUBREC
    then PUBCOMP): resent with DUP when the session resumes on a new connection.  A stored
    one sent at QoS 2 (``delivery`` set, ``qos`` 2) has its exchange in the store too
    (:mod:`.stored`): it is settled at PUBCOMP."""

    __slots__ = ("delivery", "frame", "qos", "released", "retain")

    def __init__(self, frame: PublishFrame | None, qos: int, retain: bool, delivery: Delivery | None = None) -> None:
        self.frame = frame
        self.qos = qos
        self.retain = retain
        self.released = False
        """QoS 2: PUBREC came and PUBREL was sent; PUBCOMP ends it (``frame`` is None for
        one a stored session resumed released: only its PUBREL is left)."""
        self.delivery = delivery
        """The stored Delivery it is (a persistent session's), until the client has it."""


class BoundConnection(Protocol):
    """The connection a session is bound to (an MQTTServerProtocol, which imports this
    module), as the session and the session registry use it."""

    @property
    def transport(self) -> ITransport | None: ...

    @property
    def congested(self) -> bool: ...

    @property
    def _normal_end(self) -> bool: ...

    _will: Will | None

    def write_now(self, data: bytes) -> None: ...

    def closed_by_operator(self) -> None: ...

    def taken_over(self) -> None: ...

    def hold_reading(self) -> Callable[[], None]: ...


class SessionStoredDeliveries(Protocol):
    """The stored deliveries of a durable session while a connection is bound
    (:class:`.stored.StoredDeliveries`, which imports this module)."""

    def open(self, resumed: Callable[[], object] | None = None) -> None: ...

    def close(self) -> None: ...

    def pump(self) -> None: ...

    def released(self, packet_id: int, delivery: Delivery) -> Deferred[object]: ...

    def settle(self, delivery: Delivery, packet_id: int | None = None) -> None: ...


class RetainedPages(Protocol):
    """The bound connection's replay of retained messages, which waits for the session's
    window to free (:class:`.retaining.RetainedDelivery`, which imports this module)."""

    @property
    def connection(self) -> object: ...

    def add(self, topic_filter: str) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None: ...


@implementer(ISubscriber)
class MQTTSession:
    """One client identifier's session (see the module docstring)."""

    protocol = "mqtt"

    def __init__(self, client_id: str, principal: Principal, wire_format: MQTTWireFormat,
                 max_inflight: int, max_queued: int) -> None:
        self.client_id = client_id
        self.name = client_id.encode("utf-8")
        self.address: bytes | None = self.name
        self.principal = principal
        self.wire_format = wire_format
        self.version = wire_format.version
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        self.connection: BoundConnection | None = None
        """The bound MQTTServerProtocol, None while the client is away."""
        self.window = max_inflight
        """QoS 1 and 2 messages sent and unacknowledged at most: the smaller of the client's
        Receive Maximum and ``--mqtt-max-inflight``."""
        self.max_queued = max_queued
        self.max_packet_size: int | None = None
        """The client's Maximum Packet Size (v5): larger messages are not sent to it."""
        self.topic_aliases: dict[str, int] | None = None
        """The Topic Aliases the server set on the bound connection, by topic (v5, 3.3.2.3.4:
        they last as long as the connection); None while the client takes none."""
        self.topic_alias_maximum = 0
        """How many the bound connection takes: its Topic Alias Maximum, at most
        ``--mqtt-topic-alias-maximum``."""
        self.inflight: dict[int, Outgoing] = {}
        self.queued: deque[tuple[Rendered, int, bool]] = deque()
        self.received_qos2: set[int] = set()
        """Packet Identifiers of QoS 2 PUBLISHes received and not yet released (PUBREL)."""
        self.reserved: set[int] = set()
        """Packet Identifiers of stored messages sent before a restart and not yet sent again
        (:mod:`.stored`): no other message takes them meanwhile."""
        self.from_store = False
        """Taken up from the store at this CONNECT: its QoS 2 exchanges are read back."""
        self.expiry: float = 0.0
        """Seconds the session outlives its connection (0: it ends with it)."""
        self.expiry_timer: IDelayedCall | None = None
        self.dropped = 0
        """Messages not delivered: QoS 0 while away or congested, the queue full, too large."""
        self._next_id = 1
        self._matching: dict[str, tuple[int, bool, tuple[int, ...], bool, bool] | None] = {}
        self.will_timer: IDelayedCall | None = None
        """A v5 will waiting for its Will Delay Interval (cancelled if the client comes back)."""
        self.delayed_will: Will | None = None
        """The Will that :attr:`will_timer` publishes."""
        self.durable_name: str | None = None
        """The core's durable subscriber this session is (:mod:`.stored`); None when its
        subscriptions are this node's memory only (a clean session, a node without a store)."""
        self.kept: set[str] = set()
        """Filters of subscriptions that collect messages in the store (QoS 1 and 2 of a
        durable session): their messages come through :attr:`stored`, never live."""
        self.stored: SessionStoredDeliveries | None = None
        """The StoredDeliveries while a connection is bound to a durable session."""
        self.retained_out: RetainedPages | None = None
        """The RetainedDelivery (:mod:`.retaining`) of the bound connection's subscriptions,
        told when the window frees."""
        self._plain = True

    # ------------------------------------------------------------------ subscriptions

    def subscribed(self, topic_filter: str, options: SubscriptionOptions, kept: bool = False) -> bool:
        """Record a subscription (``kept``: its messages are stored for it); whether it is
        new (Retain Handling 1)."""
        new = topic_filter not in self.subscriptions
        self.subscriptions[topic_filter] = options
        if kept:
            self.kept.add(topic_filter)
        else:
            self.kept.discard(topic_filter)
        self._changed()
        return new

    def unsubscribed(self, topic_filter: str) -> bool:
        found = self.subscriptions.pop(topic_filter, None) is not None
        self.kept.discard(topic_filter)
        self._changed()
        return found

    def subscription_revoked(self, topic_filter: bytes) -> None:
        """The core took a filter this session's principal may no longer read away."""
        name = topic_filter.decode("utf-8", "replace")
        self.subscriptions.pop(name, None)
        self.kept.discard(name)
        self._changed()

    def _changed(self) -> None:
        self._matching.clear()
        self._plain = self.max_packet_size is None and self.topic_aliases is None and all(
            options.qos == 0 and not options.no_local and options.identifier is None
            and not options.retain_as_published for options in self.subscriptions.values())

    def _match(self, topic: str) -> tuple[int, bool, tuple[int, ...], bool, bool] | None:
        """(highest granted QoS, whether every match is no-local, Subscription Identifiers,
        whether one is Retain As Published, whether one is :attr:`kept`) of this session's
        subscriptions matching ``topic``; None when none does."""
        cached: tuple[int, bool, tuple[int, ...], bool, bool] | None | Literal[False] = self._matching.get(topic, False)
        if cached is not False:
            return cached
        target = topic.encode("utf-8")
        qos = -1
        no_local = True
        identifiers: list[int] = []
        as_published = False
        kept = False
        for topic_filter, options in self.subscriptions.items():
            if matches(options.matched, target):
                qos = max(qos, options.qos)
                no_local = no_local and options.no_local
                as_published = as_published or options.retain_as_published
                if options.identifier is not None:
                    identifiers.append(options.identifier)
                kept = kept or topic_filter in self.kept
        found = None if qos < 0 else (qos, no_local, tuple(identifiers), as_published, kept)
        if len(self._matching) >= _MATCH_CACHE:
            self._matching.clear()
        self._matching[topic] = found
        return found

    # ------------------------------------------------------------------ ISubscriber

    def send(self, data: bytes) -> None:
        connection = self.connection
        if self._plain and connection is not None and not connection.congested:
            connection.write_now(data)
            return
        items = getattr(data, "items", None)
        if items is None:  # a run the core rendered message by message: QoS 0 packets
            if connection is not None and not connection.congested:
                connection.write_now(data)
            else:
                self.dropped += 1
            return
        out: list[bytes] = []  # the run's packets for this client: one write
        for item in items:
            self.deliver(item, out=out)
        if out and self.connection is not None:
            self.connection.write_now(b"".join(out))

    @property
    def transport(self) -> ITransport | None:
        """The bound connection's transport (the admin listener shows its source and queue);
        None while the client is away."""
        connection = self.connection
        return None if connection is None else connection.transport

    def close_transport(self) -> None:
        """An operator closes the session's connection (``brokerd-ctl close``): a v5 client
        is told 0x98, Administrative action.  A persistent session stays until it expires."""
        connection = self.connection
        if connection is not None:
            connection.closed_by_operator()

    on_replaced: Callable[[MQTTSession], None] | None = None
    """Called with the session when :meth:`replaced` (set by the front end's registry)."""

    def replaced(self) -> None:
        """A session with this client identifier started on another node of the cluster: the
        core detached this one; it ends (its connection is told, as at a takeover here)."""
        self.expiry = 0
        if self.on_replaced is not None:
            self.on_replaced(self)
        connection = self.connection
        if connection is not None:
            connection.taken_over()

    # ------------------------------------------------------------------ delivery

    def deliver(self, item: Rendered, retained: bool = False, kept: bool = False, out: list[bytes] | None = None) -> None:
        """Send one message as this session's subscriptions ask (``retained``: sent because
        a subscription was made, with RETAIN set; ``kept``: not stored, though a :attr:`kept`
        subscription matches, e.g. SMQP's Guarantee: NO); its packet is written, or added to
        ``out`` for the caller to write with the rest of a run."""
        shaped = self._shape(item, item.qos, retained, live=not (retained or kept))
        if shaped is None:
            return
        frame, qos, retained = shaped
        connection = self.connection
        if qos == 0:
            if connection is not None and not connection.congested:
                if self.topic_aliases is not None:
                    frame = self._aliased(frame, 0)
                if out is None:
                    connection.write_now(frame.packet(0, retained))
                else:
                    out.append(frame.packet(0, retained))
            else:
                self.dropped += 1
            return
        if connection is not None and len(self.inflight) < self.window and not self.queued:
            self._send_numbered(frame, qos, retained, None, out)
        elif len(self.queued) < self.max_queued:
            self.queued.append((Rendered(frame, item.message), qos, retained))
        else:
            self.dropped += 1

    def _shape(self, item: Rendered, offered: int, retained: bool, live: bool) -> tuple[PublishFrame, int, bool] | None:
        """The frame, QoS and RETAIN flag ``item`` (offered at QoS ``offered``) goes to this
        client with, as its subscriptions ask; None when it is not for it: no subscription
        matches, no local, larger than the client takes (counted), or (``live``) a
        :attr:`kept` subscription matches, which takes it from the store."""
        message = item.message
        match = self._match(item.frame.topic)
        if match is None:
            return None
        granted, no_local, identifiers, as_published, stored = match
        if stored and live:
            return None  # stored for this session: it comes from the store, once
        if no_local and not retained and message.protocol == "mqtt" and message.sender_name == self.name:
            return None
        # RETAIN: set on what a new subscription is sent; otherwise only for a Retain As
        # Published subscription, as its publisher set it (3.3.1.3).
        retained = retained or (as_published and message.details.retained)
        frame = item.frame
        if identifiers and self.version == MQTT_5:
            frame = frame.with_subscription_identifiers(identifiers)
        qos = min(offered, granted)
        if self.max_packet_size is not None and frame.size(qos) > self.max_packet_size:
            self.dropped += 1
            return None
        return frame, qos, retained

    def _send_numbered(self, frame: PublishFrame, qos: int, retain: bool, delivery: Delivery | None = None,
                       out: list[bytes] | None = None, resumed: int | None = None) -> int:
        """Send a QoS 1 or 2 PUBLISH with a new Packet Identifier, or (``resumed``) again
        with the one it had before a restart, DUP set; the identifier."""
        if resumed is None or resumed in self.inflight:
            packet_id, dup = self._packet_id(), False
        else:
            packet_id, dup = resumed, True
        self.reserved.discard(packet_id)
        self.inflight[packet_id] = Outgoing(frame, qos, retain, delivery)  # resent whole on a new connection
        if self.topic_aliases is not None:
            frame = self._aliased(frame, qos)
        if out is None:
            connection = self.connection
            assert connection is not None  # send_queued, the one caller without ``out``, sends to a bound one
            connection.write_now(frame.head(qos, retain, packet_id, dup) + frame.tail)
        else:
            out += (frame.head(qos, retain, packet_id, dup), frame.tail)
        return packet_id

    def _aliased(self, frame: PublishFrame, qos: int) -> PublishFrame:
        """``frame`` as the bound connection gets it: with the Topic Alias it has for the
        topic (and an empty topic name), or, while it takes more, with the topic name and the
        next alias, which stands for the topic from then on; as it is otherwise (the aliases
        set are kept for the connection's life: the first topics sent get them)."""
        aliases = self.topic_aliases
        if aliases is None:
            return frame
        alias = aliases.get(frame.topic)
        if alias is not None:
            return frame.with_topic_alias(alias, send_topic=False)
        if len(aliases) >= self.topic_alias_maximum:
            return frame
        alias = len(aliases) + 1
        aliased = frame.with_topic_alias(alias, send_topic=True)
        if self.max_packet_size is not None and aliased.size(qos) > self.max_packet_size:
            return frame
        aliases[frame.topic] = alias
        return aliased

    # ------------------------------------------------------------------ stored delivery

    def can_send_stored(self) -> bool:
        """Whether the window lets a stored message go now (what waits in memory first)."""
        connection = self.connection
        return (connection is not None and not connection.congested and not self.queued
                and len(self.inflight) < self.window)

    def stored_in_flight(self) -> set[int]:
        """Seqs of the stored messages sent and not acknowledged yet (on any connection)."""
        return {outgoing.delivery.seq for outgoing in self.inflight.values() if outgoing.delivery is not None}

    def send_stored(self, message: Message, delivery: Delivery, out: list[bytes],
                    resumed: int | None = None) -> int | None:
        """Add stored ``message`` (call when :meth:`can_send_stored`) to ``out`` as the
        subscriptions ask (``resumed``: the Packet Identifier it was sent with before a
        restart, which it is sent again with); the Packet Identifier when it went at QoS 1
        or 2 and waits for the client's acknowledgement, None when it is done already (sent
        at QoS 0, or not for this session: expired, no subscription matches any more, no
        local, larger than the client takes)."""
        expires = message.details.expires
        if expires is not None and expires <= self.wire_format.clock():
            return None  # v5 3.3.2.3.3: an expired message is not sent, its copy goes
        item = self.wire_format.rendered(message)
        if item is None:
            return None
        # Another protocol's message was stored for this session before its publisher was
        # answered: it goes at least once (QoS 1), as far as the subscription allows.
        shaped = self._shape(item, item.qos if message.protocol == "mqtt" else 1, False, live=False)
        if shaped is None:
            return None
        frame, qos, retained = shaped
        if qos == 0:
            out.append(self._aliased(frame, 0).packet(0, retained))
            return None
        return self._send_numbered(frame, qos, retained, delivery, out, resumed)

    def _settle(self, outgoing: Outgoing, packet_id: int) -> None:
        delivery, outgoing.delivery = outgoing.delivery, None
        if delivery is not None and self.stored is not None:
            self.stored.settle(delivery, packet_id if outgoing.qos == 2 else None)

    def _packet_id(self) -> int:
        packet_id = self._next_id
        while packet_id in self.inflight or packet_id in self.reserved:
            packet_id = packet_id % MAX_PACKET_ID + 1
        self._next_id = packet_id % MAX_PACKET_ID + 1
        return packet_id

    def acknowledged(self, packet_id: int) -> bool:
        """PUBACK (QoS 1) or PUBCOMP (QoS 2) for ``packet_id``: the message is done; send
        what waits for the window.  False when no such message was in flight."""
        outgoing = self.inflight.pop(packet_id, None)
        if outgoing is None:
            return False
        self._settle(outgoing, packet_id)
        self.send_queued()
        return True

    def received(self, packet_id: int) -> bool | Deferred[object]:
        """PUBREC for ``packet_id``: the client has it; the caller sends PUBREL.  False when
        no such QoS 2 message is in flight; for a stored one, a Deferred that fires once the
        store has it released, before which no PUBREL may go (after a restart the message
        would be sent again, and the client, released, would take it as new); else True."""
        outgoing = self.inflight.get(packet_id)
        if outgoing is None or outgoing.qos != 2:
            return False
        outgoing.released = True
        if outgoing.delivery is not None and self.stored is not None:
            return self.stored.released(packet_id, outgoing.delivery)
        return True

    def send_queued(self) -> None:
        """Send queued QoS 1 and 2 messages while the window allows."""
        connection = self.connection
        queued = self.queued
        while queued and connection is not None and len(self.inflight) < self.window and not connection.congested:
            item, qos, retain = queued.popleft()
            frame = self._still_current(item)
            if frame is None:
                self.dropped += 1
                continue
            self._send_numbered(frame, qos, retain)
        if self.stored is not None:
            self.stored.pump()
        if self.retained_out is not None:
            self.retained_out.resume()

    def _still_current(self, item: Rendered) -> PublishFrame | None:
        """The frame of a message that waited in the queue: None once its Message Expiry
        Interval has passed (v5 3.3.2.3.3: its copy is deleted, not sent), else, for a v5
        client, made again so that the interval it carries is what is left of it."""
        expires = item.message.details.expires
        if expires is None:
            return item.frame
        if expires <= self.wire_format.clock():
            return None
        if self.version != MQTT_5:
            return item.frame
        fresh = self.wire_format.rendered(item.message)
        if fresh is None:
            return item.frame
        match = self._match(fresh.frame.topic)
        identifiers = () if match is None else match[2]
        return fresh.frame.with_subscription_identifiers(identifiers) if identifiers else fresh.frame

    def resend_inflight(self) -> list[bytes]:
        """On a resumed session: the unacknowledged PUBLISHes again (DUP set) and the
        PUBRELs, in order (4.4: the only retransmission MQTT has)."""
        packets = []
        for packet_id, outgoing in self.inflight.items():
            if outgoing.released:
                packets.append(pubrel(packet_id))
            else:
                frame = outgoing.frame
                assert frame is not None  # only a released one (the store resumed) has none
                packets.append(frame.packet(outgoing.qos, outgoing.retain, packet_id, dup=True))
        return packets

    def bind(self, connection: BoundConnection, window: int, max_packet_size: int | None, topic_alias_maximum: int = 0) -> None:
        self.connection = connection
        self.window = window
        self.max_packet_size = max_packet_size
        self.topic_alias_maximum = topic_alias_maximum
        self.topic_aliases = {} if topic_alias_maximum and self.version == MQTT_5 else None
        self._changed()
        if self.expiry_timer is not None and self.expiry_timer.active():
            self.expiry_timer.cancel()
        self.expiry_timer = None
        if self.will_timer is not None and self.will_timer.active():
            self.will_timer.cancel()  # back within the Will Delay Interval: no will (3.1.3.2.2)
        self.will_timer = None
        self.delayed_will = None

    def unbind(self, connection: object) -> bool:
        """``connection`` ended; whether it was this session's."""
        if self.connection is not connection:
            return False
        self.connection = None
        # QoS 0 messages are not kept for an absent client.
        return True


__all__ = ["MQTTPublishes", "MQTTSession", "Outgoing", "SubscriptionOptions"]

"""The MCCHAT v1 server: one MCChatServerProtocol per connection, one factory per listener.

MCCHAT has no login: a connection is a session from its first byte, named by the transport
(``ip:port``, as the spec's section 4 says), and it is sent INFO (version 1) at once.  The
protocol object is also the session's "mind" (ISubscriber): the Broker writes rendered MSG
packets straight to it.  Packets are dispatched on their type through one table.

The hot path follows the SSMP server: the MSG packets of one read that go to one topic in a row
are published as one batch (each subscriber gets them as one write), and the sender is not
excluded, because the spec says a subscribed sender gets a copy of its own message.

Flow control: from its first read on, each connection is a streaming producer of its own
transport.  When more than ``max_output_buffer`` bytes wait for a slow reader, Twisted pauses
us: messages for it are dropped and counted, and its own packets are no longer read, until the
buffer drains.  Topic lists (TL answers, the discovery snapshot) are never dropped: they are
written in pieces while the reader takes them (brokerd.protocols.mcchat.listing); messages
that arrive while a list is half written wait behind it, at most ``max_output_buffer`` bytes
of them (the rest are dropped and counted).

What the spec leaves open, and what brokerd does (docs/mcchat.md):

* SUB to a topic already subscribed, UNSUB of one not subscribed: nothing (no reply exists).
  A SUB beyond ``max_subscriptions``: ignored and counted.
* A packet the codec reports as Malformed (a topic holding 0x04, a string that is not UTF-8),
  INFO or TL sent by a client, MSG to the reserved topic ``""``: dropped and counted; the
  connection stays.  A stream that cannot be framed (unknown opcode, a string over its limit):
  the connection is closed, after the packets before it were handled.
* A connection with no subscription that sends nothing for ``idle_timeout`` seconds is closed.
* The topic ``""`` is for discovery: see :class:`Discovery`.
* Access policy: a connection's principal is its verified client certificate's (else it is
  anonymous).  A SUB or MSG the core's policy does not allow is dropped and counted
  (``forbidden``), as MCCHAT has no packet to refuse with; a subscription a reloaded policy
  revokes simply ends.

Event log (docs/events.md): the core logs each connection's login/logout, subscriptions and
accepted MSGs (a message MCCHAT cannot carry is in ``accepted.dropped``).  This module adds,
per connection and never per message: one ``dropped``/``slow_consumer`` record per congestion
episode (brokerd.protocols.flow), and when the connection ends one ``dropped``/``rejected``
record counting the MSG packets it sent that were not published (malformed, to ``""``), plus
the packet that could not be framed when that closed it (``outcome`` ``closed``).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Any

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IAddress, IPushProducer, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.auth.tls import peer_names
from brokerd.config import Settings
from brokerd.core.access import SYSTEM_MARK, Perm
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import BROKER, NOBODY, Principal, certificate_principal, reserved_name
from brokerd.core.publication import Multicast
from brokerd.errors import AlreadySubscribed, Forbidden, NotSubscribed, SubscriptionLimit
from brokerd.events.log import NULL_EVENT_LOG, IEventRecorder, transport_source
from brokerd.events.schema import DROPPED, REJECTED
from brokerd.interfaces import ISubscriber
from brokerd.protocols.dispatch import command_table
from brokerd.protocols.flow import DropWhenCongested, begin_read, end_read
from brokerd.protocols.lifecycle import LivenessSweep
from brokerd.protocols.mcchat.codec import MAX_TL_TOPICS, VERSION, MCChatParser, encode_info
from brokerd.protocols.mcchat.events import (
    EOT_IN_TOPIC,
    MSG,
    Info,
    Malformed,
    Msg,
    Sub,
    TopicList,
    TopicListRequest,
    Unsub,
)
from brokerd.protocols.mcchat.listing import DISCOVERY, TL, PendingLists
from brokerd.protocols.mcchat.wire import (
    MCCHAT_WIRE,
    RESERVED_TOPIC,
    SERVER_USERNAME,
    display_name,
    is_mcchat_topic,
)
from brokerd.store.base import log_unless_outage


INFO_PACKET = encode_info(VERSION)
_SYSTEM_HEADS = (b"s", b"S")
"""First bytes of a username that may be reserved (brokerd.core.principal.reserved_name)."""
_serials = itertools.count(1)


class MCChatStats:
    """What the MCCHAT front end dropped or refused, by reason; plain ints, cheap to bump."""

    __slots__ = (
        "eot_in_topic",
        "not_utf8",
        "client_only_packets",
        "reserved_topic",
        "subscription_limit",
        "forbidden",
        "protocol_errors",
        "idle_closed",
        "announcements",
    )
    eot_in_topic: int
    not_utf8: int
    client_only_packets: int
    reserved_topic: int
    subscription_limit: int
    forbidden: int
    protocol_errors: int
    idle_closed: int
    announcements: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def transport_id(address: IAddress) -> bytes:
    """The spec's client identifier: ``ip:port`` for TCP (``[ip]:port`` for IPv6); for a
    transport without ports (UNIX sockets...) ``<kind>#<serial>``, unique in this process."""
    if isinstance(address, IPv6Address):
        return f"[{address.host}]:{address.port}".encode("ascii", "replace")
    if isinstance(address, IPv4Address):
        return f"{address.host}:{address.port}".encode("ascii", "replace")
    kind = type(address).__name__.lower().replace("address", "") or "peer"
    return f"{kind}#{next(_serials)}".encode("ascii", "replace")


class Discovery:
    """The reserved topic ``""``.

    A client that subscribes to ``""`` is sent, at once, one MSG per active topic (topic
    ``""``, username ``""``, message = the topic's name), and from then on one such MSG
    whenever a topic becomes active, i.e. gets its first subscriber.  Clients cannot send to
    ``""``: everything said there comes from the server.  Announcements go through the Broker
    (topic ``""``), so a subscriber of ``""`` in any protocol gets them.

    Activations by every protocol are seen: the Broker calls its ``topic_listeners``
    (callables ``(topic, active)``) after a topic gained its first or lost its last member.
    The same reports keep :meth:`topics`, the list TL answers and snapshots are made of, up to
    date.  The Discovery is one of its Broker's topic listeners and lives as long as it.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.stats: MCChatStats | None = None
        self._topics: tuple[bytes, ...] | None = None
        broker.topic_listeners.append(self.topic_changed)
        broker.remote_topics_listeners.append(self.forget_topics)

    def forget_topics(self) -> None:
        """Another node of a cluster gained or lost a topic: list the topics afresh."""
        self._topics = None

    def topic_changed(self, topic: bytes, active: bool) -> None:
        """The Broker's report; only activations are announced."""
        self._topics = None
        if active:
            self.activated(topic)

    def topics(self) -> tuple[bytes, ...]:
        """The active topics an MCCHAT client can name (see active_mcchat_topics), kept until
        a topic becomes active or inactive: every connection listing them shares this tuple."""
        topics = self._topics
        if topics is None:
            topics = self._topics = tuple(active_mcchat_topics(self.broker))
        return topics

    def activated(self, topic: bytes) -> None:
        """Tell the subscribers of ``""`` that ``topic`` became active."""
        if not is_mcchat_topic(topic) or self.broker.topics.get(RESERVED_TOPIC) is None:
            return
        if self.stats is not None:
            self.stats.announcements += 1
        self.broker.route(Multicast([
            Message(
                MULTICAST, RESERVED_TOPIC, topic, "mcchat", SERVER_USERNAME,
                display_name=SERVER_USERNAME, principal=BROKER,
            )
        ]))



def discovery_for(broker: Broker) -> Discovery:
    """The one Discovery of ``broker`` (shared by all its MCCHAT listeners): found among the
    broker's topic listeners, so that nothing outside the broker keeps it (or the broker)
    alive."""
    for listener in broker.topic_listeners:
        owner = getattr(listener, "__self__", None)
        if isinstance(owner, Discovery):
            return owner
    return Discovery(broker)


def active_mcchat_topics(broker: Broker) -> list[bytes]:
    """Active topics an MCCHAT client can name, in creation order, at most MAX_TL_TOPICS;
    never the reserved ``""``."""
    topics = [topic for topic in broker.active_topics() if is_mcchat_topic(topic)]
    return topics[:MAX_TL_TOPICS]


def _discard(data: bytes) -> None:
    """``send`` of a closed connection."""


@implementer(ISubscriber, IPushProducer)
class MCChatServerProtocol(DropWhenCongested, Protocol):
    """One MCCHAT connection; also its session as the Broker sees it."""

    _log = Logger()
    protocol = "mcchat"
    wire_format = MCCHAT_WIRE
    address = None
    """MCCHAT sessions have no unicast address: nothing can be sent to one session alone."""
    name = b""
    principal: Principal = NOBODY
    factory: MCChatServerFactory

    def __init__(self) -> None:
        self._parser = MCChatParser()
        self._bound: bytes | None = None
        """The certificate name that replaces this connection's usernames, when bound."""
        self._started = False
        """Set by the first read (see _first_read)."""
        self._lists = PendingLists()
        """TL answers and discovery snapshots not written yet (see _write_lists)."""
        self._held: list[bytes] = []
        """Messages that arrived while a list was half written, sent after it."""
        self._held_bytes = 0
        self._paused = False
        """Twisted paused us: more than max_output_buffer bytes wait for the reader."""
        self.closed = False
        self.subscribed = 0
        """Topics this session is subscribed to (the idle rule spares subscribers)."""
        self.dropped = 0
        """Packets dropped because this connection's reader was too slow."""
        self.rejected = 0
        """MSG packets from this connection that were not published (not yet logged)."""
        self.bad_stream = False
        """The connection is closed because its input could not be framed."""
        self.heard = True
        """Set on every read; the idle sweep turns it into ``last_heard``."""
        self.last_heard = 0.0

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        factory = self.factory
        if not self.open_connection(factory.settings.max_output_buffer):
            self.closed = True  # MCCHAT has no packet to refuse with: the connection closes
            self.transport.loseConnection()
            return
        self.logged_in()  # MCCHAT has no login: a connection is a session at once
        self.name = transport_id(self.transport.getPeer())
        self.start_flow_control(factory.settings.max_output_buffer)
        keepalive = getattr(self.transport, "setTcpKeepAlive", None)
        if keepalive is not None:
            keepalive(1)
        self.transport.write(INFO_PACKET)
        self.heard = False  # silence counts from now, not from the sweep's next tick
        factory.liveness.watch(self)
        factory.broker.attach(self)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self.release_connection():
            self._leave()
        self.closed = True
        self.send = _discard

    def _close(self) -> None:
        """Leave every topic now and close; nothing more is read or sent."""
        if self.closed:
            return
        self._leave()
        self.close_transport()

    def _leave(self) -> None:
        """Stop sending, log what was lost, and leave the broker (safe to repeat: a closed
        connection leaves again when its connection is lost)."""
        self.closed = True
        self.send = _discard
        self._lists.clear()
        self._held = []
        self._held_bytes = 0
        self._report()
        self.factory.liveness.forget(self)
        self.factory.broker.detach(self)

    def _report(self) -> None:
        """Log what this connection lost (before its logout): the current slow-consumer
        episode, and its rejected MSGs as one record.  Idempotent."""
        self.report_drops()
        rejected = self.rejected + (1 if self.bad_stream else 0)
        if rejected:
            self.rejected = 0
            self.factory.events.record(
                DROPPED, "mcchat", session=self.name, reason=REJECTED, dropped=rejected,
                outcome="closed" if self.bad_stream else DROPPED,
            )
            self.bad_stream = False

    def stopProducing(self) -> None:
        self.send = _discard

    def pauseProducing(self) -> None:
        """Over the output limit: stop reading; drop messages, except that those arriving
        while a list is half written are held (bounded) to follow it."""
        if self.closed:
            return
        self._paused = True
        if not self._lists.writing:
            self.send = self._drop
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        if self.closed:
            return
        self._paused = False
        self.transport.resumeProducing()
        if self._lists.busy:
            self._write_lists()
        else:
            self.send = self.steady_send()
        if self.episode_drops:
            self.report_drops()

    # ------------------------------------------------------------------ topic lists

    def _write_lists(self) -> None:
        """Write the pending topic lists, a piece at a time, until they are done or the
        transport is over its limit (resumeProducing goes on).  While a list is half
        written, ``send`` holds messages, to be written after it."""
        lists = self._lists
        snapshot = self.factory.discovery.topics
        while lists.busy and not self._paused and not self.closed:
            self.send = self._hold
            piece = lists.next_piece(snapshot)
            if piece:
                self.write_piece(piece)
            if not lists.writing:
                self._release_held()
        if self.closed:
            return
        if lists.writing:
            self.send = self._hold
        else:
            self.send = self._drop if self._paused else self.steady_send()

    def _hold(self, data: bytes) -> None:
        """``send`` while a list is half written: keep up to max_output_buffer bytes."""
        if self._held_bytes + len(data) > self.factory.settings.max_output_buffer:
            self._drop(data)
            return
        self._held.append(data)
        self._held_bytes += len(data)

    def _release_held(self) -> None:
        held = self._held
        if held:
            data = held[0] if len(held) == 1 else b"".join(held)
            self._held = []
            self._held_bytes = 0
            self.write_now(data)

    # ------------------------------------------------------------------ ISubscriber

    def replaced(self) -> None:
        """Never called: MCCHAT sessions have no address another session could take."""
        self._close()

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard = True
        if not self._started:
            self._first_read()
            if self.closed:
                return
        held: list[bytes] = []
        self.hold_writes(held)
        first = begin_read()
        try:
            self._handle(data)
        finally:
            self.release_writes()
            if held and not self.closed:
                self.write_now(held[0] if len(held) == 1 else b"".join(held))
            if first:
                end_read()

    def _handle(self, data: bytes) -> None:
        """Publish the MSG runs and handle the other packets of one read."""
        events, error = self._parser.feed(data)
        name = self.name
        bound = self._bound
        principal = self.principal
        access = self.factory.broker.access
        guarded = access.policy is not None
        run: list[Message] = []
        run_topic: bytes | None = None
        for event in events:
            if event.__class__ is Msg:
                topic = event[0]
                if topic != run_topic:
                    if run:
                        self._publish(run)
                        run = []
                    if not topic:
                        self.factory.stats.reserved_topic += 1
                        self.rejected += 1
                        run_topic = None
                        continue
                    if (guarded or topic[0] == SYSTEM_MARK) and not access.allows(principal, topic, Perm.PUBLISH):
                        self.factory.stats.forbidden += 1
                        self.rejected += 1
                        run_topic = None
                        continue
                    run_topic = topic
                username = event[1] if bound is None else bound
                if username[:1] in _SYSTEM_HEADS and reserved_name(username):
                    # would read as the broker's own sender (sys:brokerd): dropped, like a
                    # message the access list forbids (MCCHAT answers nothing)
                    self.factory.stats.forbidden += 1
                    self.rejected += 1
                    continue
                run.append(Message(MULTICAST, topic, event[2], "mcchat", name, display_name=username,
                                   principal=principal))
                continue
            if run:
                self._publish(run)
                run = []
                run_topic = None
            _HANDLERS[event.__class__](self, event)
            if self.closed:
                return
        if run:
            self._publish(run)
        if error is not None:
            self.factory.stats.protocol_errors += 1
            self.bad_stream = True
            self._close()

    def _publish(self, run: list[Message]) -> None:
        """Route ``run`` and keep it for the topic's durable subscribers (MCCHAT answers
        nothing, so nothing waits for the commit)."""
        broker = self.factory.broker
        publication = Multicast(run)
        broker.route(publication)
        if publication.kept is not None:
            # MCCHAT has no way to say a message was not stored
            publication.kept.addErrback(log_unless_outage, self._log, "Storing MCCHAT messages for durable subscribers")

    def _first_read(self) -> None:
        """What waits for the TLS handshake, which is over once application data flows.

        Flow control starts here: before the handshake, TLS buffers our INFO and pauses its
        producer, and a paused producer stops reading, so the handshake could never finish.
        Nothing but INFO can be sent to a connection that has not sent a packet yet.  The
        verified certificate is read here, once: its first name is the session's principal
        (and the username, when usernames are bound).
        """
        self._started = True
        self.register_producer()
        names = peer_names(self.transport)
        self.principal = certificate_principal(names)
        if names and self.factory.broker.kept_out.refuses(self.principal) is not None:
            # MCCHAT has no login to refuse: a certificate the operator keeps out
            # (brokerd-ctl close ID --for S) is closed before its first packet counts.
            refused = getattr(self.factory.broker.observer, "auth_failure", None)
            if refused is not None:
                refused("mcchat", names[0], source=transport_source(self.transport), scheme="cert",
                        reason="kept out by the operator")
            self._close()
            return
        if self.factory.bind_username and names:
            self._bound = display_name(names[0])

    # ------------------------------------------------------------------ packets

    def do_SUB(self, packet: Sub) -> None:
        topic = packet.topic
        factory = self.factory
        broker = factory.broker
        try:
            broker.subscribe(self, topic)
        except AlreadySubscribed:
            return
        except SubscriptionLimit:
            factory.stats.subscription_limit += 1
            return
        except Forbidden:
            factory.stats.forbidden += 1
            return
        self.subscribed += 1
        if topic == RESERVED_TOPIC:
            self._lists.request(DISCOVERY)
            self._write_lists()

    def subscription_revoked(self, topic: bytes) -> None:
        """A reloaded access policy ended one of our subscriptions (the idle rule counts them)."""
        self.subscribed -= 1

    def do_UNSUB(self, packet: Unsub) -> None:
        try:
            self.factory.broker.unsubscribe(self, packet.topic)
        except NotSubscribed:
            return
        self.subscribed -= 1

    def do_TLRQ(self, packet: TopicListRequest) -> None:
        """Answer with the active topics, written as the client reads (see _write_lists):
        every TLRQ is answered, and a client that asks without reading costs a counter."""
        self._lists.request(TL)
        self._write_lists()

    def do_INFO(self, packet: Info | TopicList) -> None:
        """INFO and TL are what a server sends; from a client they mean nothing."""
        self.factory.stats.client_only_packets += 1

    do_TL = do_INFO

    def malformed(self, packet: Malformed) -> None:
        if packet.opcode == MSG:
            self.rejected += 1
        stats = self.factory.stats
        if packet.reason == EOT_IN_TOPIC:
            stats.eot_in_topic += 1
        else:
            stats.not_utf8 += 1


P = MCChatServerProtocol
# The codec's packet classes and their verbs (brokerd.protocols.dispatch); a packet that is
# not a verb (one the codec could frame but not read) has its own handler.
_VERBS: dict[Hashable, str] = {Sub: "SUB", Unsub: "UNSUB", TopicListRequest: "TLRQ", Info: "INFO", TopicList: "TL"}
_HANDLERS: dict[type, Callable[..., None]] = {
    **command_table(P, _VERBS),
    Malformed: P.malformed,
}
del P


class MCChatServerFactory(Factory[MCChatServerProtocol]):
    """One per MCCHAT listener set; all share the Broker and its Discovery.

    From ``settings``: ``mcchat_idle_timeout``, the seconds a connection without any
    subscription may stay silent before it is closed (a subscriber may stay silent forever:
    MCCHAT has no keepalive packet, so TCP keepalive is switched on to find dead peers); and
    ``mcchat_bind_username``: when true, the username of every MSG from a connection with a
    verified TLS client certificate is replaced by the certificate's first name (its CN), so
    that it cannot be spoofed.
    """

    protocol = MCChatServerProtocol
    _log = Logger()

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        clock: IReactorTime,
        *,
        events: IEventRecorder = NULL_EVENT_LOG,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.events = events
        """The event log's IEventRecorder (drops by reason; routing goes through the Broker)."""
        self.idle_timeout = settings.mcchat_idle_timeout
        self.bind_username = settings.mcchat_bind_username
        self.stats = MCChatStats()
        self.discovery = discovery_for(broker)
        self.discovery.stats = self.stats
        self.liveness = LivenessSweep(clock, self.idle_timeout / 4, self._silent)
        """Open connections, closed when idle (brokerd.protocols.lifecycle)."""
        self.live: dict[MCChatServerProtocol, None] = self.liveness.live

    def startFactory(self) -> None:
        self.liveness.start()

    def stopFactory(self) -> None:
        self.liveness.stop()

    def _silent(self, connection: MCChatServerProtocol, now: float) -> None:
        """Close a connection that has no subscription and was silent for idle_timeout."""
        if connection.subscribed == 0 and now - connection.last_heard >= self.idle_timeout:
            self.stats.idle_closed += 1
            connection._close()


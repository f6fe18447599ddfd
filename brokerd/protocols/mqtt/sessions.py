"""The MQTT front end's sessions by client identifier, and what outlives a connection.

Persistent sessions wait here (attached to the core, so they keep receiving) until they expire;
a CONNECT with a known client identifier takes the session over if it is the same principal's
and is refused otherwise; wills are published from here; retained messages are the core's
(``Broker.retained``, kept by the router's retain stage).  One instance serves every MQTT listener of the node.

On a node with a store a persistent session is also the core's durable subscriber
(:mod:`.stored`): a CONNECT that finds no session here looks for the principal's stored one
of that client identifier (left by this node before a restart, or by another node of the
cluster) and takes its subscriptions and pending messages up.
"""
from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService
from brokerd.core.principal import Principal
from brokerd.core.publication import Multicast
from brokerd.core.subscriber import SubscriberId, protocol_prefix
from brokerd.core.subscriptions import FILTER
from brokerd.errors import BrokerError, Forbidden
from brokerd.protocols.mqtt.packets import (
    Will,
)
from brokerd.protocols.mqtt.quotas import SessionQuotas, stored_owner
from brokerd.protocols.mqtt.session import BoundConnection, MQTTSession, SubscriptionOptions
from brokerd.protocols.mqtt.stored import (
    StoredDeliveries,
    subscription_options,
    subscription_record,
)
from brokerd.protocols.mqtt.topics import server_topic
from brokerd.protocols.mqtt.wire import core_message, wire_formats
from brokerd.store.base import log_unless_outage

STORED_SESSIONS = protocol_prefix(MQTTSession.protocol)
"""What the durable subscriber names of every stored MQTT session start with."""


class MQTTSessions:
    """The MQTT front end's sessions by client identifier, and what outlives a connection:
    persistent sessions until they expire, wills, retained messages (the core's)."""

    _log = Logger()

    def __init__(self, broker: Broker, settings: Settings, clock: IReactorTime) -> None:
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.formats = wire_formats(clock.seconds)
        self.by_id: dict[str, MQTTSession] = {}
        broker.owned_namespaces.add(MQTTSession.protocol)  # a client identifier is its principal's
        self._assigned = 0
        self._incarnations = 0
        self._listeners = 0
        self._sweeping = False
        self._timed = False
        self.quotas = SessionQuotas(settings, clock)
        """The persistent sessions by owner, within the operator's quotas (:mod:`.quotas`)."""
        if broker.durable is not None:  # what the store keeps for each stored session, at most
            broker.durable.bound_pending(STORED_SESSIONS, settings.mqtt_max_stored_queued)

    @property
    def durable(self) -> DurableService | None:
        """The core's durable service once it started; None without a store, or on a node
        of a cluster without the shared one (``--store``)."""
        durable = self.broker.durable
        if durable is None or not durable.started:
            return None
        if self.settings.cluster is not None and self.settings.store is None:
            return None  # each node's own SQLite file: a session there would not follow its client
        return durable

    def assign_client_id(self) -> str:
        self._assigned += 1
        return f"brokerd-{id(self) & 0xFFFFFF:06x}-{self._assigned}"

    def open(self, client_id: str, principal: Principal, version: int,
             clean_start: bool, expiry: float = 0,
             connection: BoundConnection | None = None) -> tuple[MQTTSession | None, bool]:
        """The session a CONNECT binds to and whether it existed (Session Present); None
        when the identifier is another principal's.  ``expiry``: seconds the session is to
        outlive its connection (above 0: it is stored, on a node with a store);
        ``connection``: the connection that will bind to it (the core's login event names
        its source)."""
        if not self.broker.may_take_address(MQTTSession.protocol, client_id.encode("utf-8"), principal):
            return None, False  # a session of another principal has it, here or on another node
        existing = self.by_id.get(client_id)
        if existing is not None:
            old = existing.connection
            if old is not None:
                old.taken_over()
                if existing.connection is old:  # not unbound by the close yet
                    existing.unbind(old)
                    if old._will is not None and not old._normal_end:
                        # 3.1.4: published as for a lost connection; a v5 Will Delay Interval
                        # means none when the session goes on (bind cancels it), and the will
                        # at once when this CONNECT ends the session (_end).
                        self.will_of_lost_connection(existing, old._will)
                    old._will = None
            if clean_start or existing.version != version:
                self._end(existing)
            else:
                if expiry > 0:
                    self.quotas.add((principal, client_id))
                if existing.durable_name is None and expiry > 0:
                    self._store(existing)
                return existing, True
        session = MQTTSession(client_id, principal, self.formats[version], self.settings.mqtt_max_inflight,
                              self.settings.mqtt_max_queued)
        session.on_replaced = self._replaced_elsewhere
        self.by_id[client_id] = session
        session.connection = connection
        self.broker.attach(session)
        present = self._take_up_stored(session, clean_start)
        if expiry > 0:
            self.quotas.add((principal, client_id))
        if session.durable_name is None and expiry > 0:
            self._store(session)
        return session, present

    # ------------------------------------------------------------------ stored sessions

    def _store(self, session: MQTTSession) -> None:
        """Make ``session`` a durable subscriber from now on (a new incarnation), with the
        subscriptions it has (a session that became persistent by a new CONNECT)."""
        durable = self.durable
        if durable is None:
            return
        self._incarnations += 1
        incarnation = f"{int(self.clock.seconds() * 1000):012x}.{id(self) & 0xFFFF:04x}.{self._incarnations}"
        identity = SubscriberId(session.principal, MQTTSession.protocol, session.client_id, incarnation)
        session.durable_name = identity.encode()
        for topic_filter, options in list(session.subscriptions.items()):
            if topic_filter.startswith("$share/"):
                continue  # shared subscriptions are the node's (docs/mqtt.md)
            self.store_subscription(session, topic_filter, options).addErrback(
                log_unless_outage, self._log, "Storing an MQTT subscription")
            session.subscribed(topic_filter, options, kept=options.qos > 0)

    def _take_up_stored(self, session: MQTTSession, clean_start: bool) -> bool:
        """Find the principal's stored session of ``session``'s client identifier: with a
        clean start it ends (in the background); otherwise ``session`` becomes it, its
        subscriptions made again (QoS 0 ones live).  Whether one was taken up."""
        durable = self.durable
        if durable is None:
            return False
        prefix = SubscriberId.session_prefix(session.principal, MQTTSession.protocol, session.client_id)
        names = durable.index.subscribers_named(prefix)
        if not names:
            return False
        names.sort()
        if clean_start:
            for name in names:
                self._forget(name)
            self.quotas.remove((session.principal, session.client_id))
            return False
        for name in names[:-1]:  # older incarnations a crash left behind
            self._forget(name)
        name = names[-1]
        session.durable_name = name
        session.from_store = True
        for sub in durable.index.of(name):
            topic_filter = sub.record.topic
            qos, no_local, as_published, identifier = subscription_options(sub.record)
            options = SubscriptionOptions(qos, no_local, as_published, identifier, topic_filter.encode("utf-8"))
            if not qos:
                try:
                    self.broker.subscribe_filter(session, topic_filter.encode("utf-8"))
                except (Forbidden, ValueError, BrokerError):
                    continue  # no longer allowed: it goes when the session next subscribes
            session.subscribed(topic_filter, options, kept=qos > 0)
        return True

    def store_subscription(self, session: MQTTSession, topic_filter: str, options: SubscriptionOptions) -> Deferred:
        """Keep one subscription of durable ``session`` in the store (its QoS 1 and 2 ones
        collect messages from the commit on).  A Deferred that fires once committed."""
        durable, name = self.broker.durable, session.durable_name
        assert durable is not None and name is not None  # a durable session is a store's
        record = subscription_record(name, topic_filter, options)
        return durable.subscribe(record, [])

    def drop_subscription(self, session: MQTTSession, topic_filter: str) -> Deferred:
        """Take one subscription of durable ``session`` out of the store; a Deferred."""
        durable, name = self.broker.durable, session.durable_name
        assert durable is not None and name is not None  # a durable session is a store's
        sub = durable.index.get(name, FILTER, topic_filter)
        if sub is None:
            return succeed(None)
        return durable.unsubscribe(name, [sub], lambda _sub: ())

    def _forget(self, name: str) -> None:
        durable = self.broker.durable
        if durable is not None:
            durable.forget_subscriber(name).addErrback(log_unless_outage, self._log,
                                                       "Ending the stored MQTT session {name}", name=name)

    def listening(self, started: bool) -> None:
        """A listener of the front end started (``started``) or stopped.  While one listens
        and the store is read, the stored messages expire into dead letters and those are
        purged (DurableService's sweeps, which SMQP runs too: on a node without SMQP nobody
        else would); at the first start the unclaimed stored sessions are timed."""
        self._listeners += 1 if started else -1
        durable = self.broker.durable
        if durable is None:
            return
        if self._listeners == 0:
            if self._sweeping:
                self._sweeping = False
                durable.stop_sweeps()
            return
        if started and self._listeners == 1:
            durable.when_started().addCallbacks(self._store_read, lambda _failure: None)

    def _store_read(self, _result: object) -> None:
        durable = self.broker.durable
        assert durable is not None  # called once the store it has was read
        if self._listeners > 0 and not self._sweeping:
            self._sweeping = True
            durable.start_sweeps()
            if not self._timed:
                self._timed = True
                self._admit_stored_sessions()
                self.time_stored_sessions()

    def time_stored_sessions(self) -> None:
        """At the node's start: the stored sessions no client has come back to yet end after
        ``--mqtt-max-session-expiry`` (their own expiry, never longer, was timed by the node that
        stopped) unless their client is back by then.  Not on a node of a cluster, where
        another node may be serving them."""
        durable = self.durable
        if durable is None or self.settings.cluster is not None:
            return
        names = durable.index.subscribers_named(STORED_SESSIONS)
        if names:
            self.clock.callLater(self.settings.mqtt_max_session_expiry, self._end_unclaimed, names)

    def _admit_stored_sessions(self) -> None:
        """At the node's start: the stored sessions count against the quotas, the oldest
        first, and those beyond them end now, so that a restart re-arms no more than the
        quotas allow.  Not on a node of a cluster, which does not own the shared store's
        sessions (each node counts those it serves)."""
        durable = self.durable
        if durable is None or self.settings.cluster is not None:
            return
        for name in self.quotas.admit_stored(durable.index.subscribers_named(STORED_SESSIONS)):
            self._forget(name)

    def _end_unclaimed(self, names: list[str]) -> None:
        claimed = {session.durable_name for session in self.by_id.values()}
        for name in names:
            if name not in claimed:
                self._forget(name)
                owner = stored_owner(name)
                if owner is not None and owner[1] not in self.by_id:
                    self.quotas.remove(owner)

    def connected(self, session: MQTTSession) -> None:
        """A connection was bound to ``session`` and answered: a durable one reads what the
        store holds for it."""
        self._disconnected(session)  # a takeover here unbound the old connection directly
        durable = self.durable
        if session.durable_name is not None and durable is not None:
            session.stored = StoredDeliveries(session, durable, self.settings.max_output_buffer)
            if session.from_store:  # its QoS 2 exchanges are read before the client's packets
                session.from_store = False
                connection = session.connection
                assert connection is not None  # connected() follows the bind
                session.stored.open(connection.hold_reading())
            else:
                session.stored.open()

    def _disconnected(self, session: MQTTSession) -> None:
        stored = session.stored
        if stored is not None:
            session.stored = None
            stored.close()

    def _replaced_elsewhere(self, session: MQTTSession) -> None:
        """Another node's connection took this client identifier: forget the session here.
        A stored session lives on there (it took it up from the shared store); one in this
        node's memory only ends (docs/mqtt.md)."""
        session.durable_name = None
        self._disconnected(session)
        if self.by_id.get(session.client_id) is session:
            del self.by_id[session.client_id]
        if session.connection is None:
            self._end(session)

    def connection_ended(self, session: MQTTSession) -> None:
        self._disconnected(session)
        if session.expiry <= 0:
            self._end(session)
            return
        session.expiry_timer = self.clock.callLater(session.expiry, self._expired, session)

    def _expired(self, session: MQTTSession) -> None:
        session.expiry_timer = None
        if session.connection is None:
            self._end(session)

    def _end(self, session: MQTTSession) -> None:
        if self.by_id.get(session.client_id) is session:
            del self.by_id[session.client_id]
        self.quotas.remove((session.principal, session.client_id))
        timer, will = session.will_timer, session.delayed_will
        if timer is not None and timer.active():  # the session ends before the will's delay
            timer.cancel()
            assert will is not None  # set with the timer
            self._will_due(session, will)
        if session.expiry_timer is not None and session.expiry_timer.active():
            session.expiry_timer.cancel()
        session.expiry_timer = None
        self.broker.detach(session)
        self._disconnected(session)
        if session.durable_name is not None:
            self._forget(session.durable_name)
            session.durable_name = None
        session.subscriptions.clear()
        session.kept.clear()
        session.queued.clear()
        session.inflight.clear()

    def will_of_lost_connection(self, session: MQTTSession, will: Will) -> None:
        """A connection of ``session`` ended without DISCONNECT: publish its will now, or
        (v5 Will Delay Interval) once the delay or the session is over, whichever comes first,
        unless the client is back by then."""
        delay = will.properties.will_delay_interval or 0
        if delay and session.expiry > 0:
            session.will_timer = self.clock.callLater(min(delay, session.expiry), self._will_due, session, will)
            session.delayed_will = will
        else:
            self.publish_will(session, will)

    def _will_due(self, session: MQTTSession, will: Will) -> None:
        session.will_timer = None
        session.delayed_will = None
        self.publish_will(session, will)

    def publish_will(self, session: MQTTSession, will: Will) -> None:
        """Publish a connection's will for it (3.1.2.5), if its principal may (and not to a
        server topic, which no client publishes to)."""
        target = will.topic.encode("utf-8")
        if server_topic(will.topic) or not self.broker.may_publish(session.principal, target):
            return
        message = core_message(target, will.payload, will.qos, will.retain, will.properties, session.name,
                               session.principal, self.clock.seconds())
        publication = Multicast([message])
        try:  # a will to retain is kept by the router's retain stage, for durable subscribers by its durable stage
            self.broker.route(publication)
        except Forbidden:
            return
        if publication.kept is not None:
            publication.kept.addErrback(log_unless_outage, self._log, "Storing an MQTT will for durable subscribers")

"""The Broker: the one service every front end talks to.

It knows sessions (ISubscriber "minds"), topics and how to route a Message to them, and
nothing about any wire protocol: a front end parses its protocol, calls the Broker, and the
Broker hands back bytes rendered by each recipient's IWireFormat.  A message to a topic with
durable subscribers is also kept by the durable service (the router's durable stage, which
leaves the commit's Deferred in the publication's ``kept``) before the publisher is answered.  Everything here runs on the reactor thread and never
blocks.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from twisted.application.service import Service
from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.admission import Admission, Admissions
from brokerd.core.durable import DurableService
from brokerd.core.engine import IN_MEMORY
from brokerd.core.filtered import FilterSubscriptions
from brokerd.core.access import SYSTEM_TOPICS, AccessControl, Perm
from brokerd.core.keepout import KeptOut
from brokerd.core.live import LiveSubscriptions
from brokerd.core.message import Message
from brokerd.core.principal import Principal
from brokerd.core.publication import Broadcast, Multicast, Publication, unicast_to
from brokerd.core.retained import RetainedMessages
from brokerd.core.router import Router
from brokerd.core.stats import BrokerStats
from brokerd.core.sampling import DeliverySampler
from brokerd.core.sessions import SessionRegistry
from brokerd.core.topics import Topic, TopicRegistry
from brokerd.interfaces import IAccessPolicy, IBrokerObserver, IEngine, ISubscriber

_SYSTEM = SYSTEM_TOPICS[:1]
"""A topic starting with this may be a system topic: checked even without a policy."""


class Broker(Service):
    """Sessions, topics, routing and fan-out for every protocol.

    ``max_subscriptions`` bounds the topics one session may join; ``max_connections`` bounds
    the connections of all front ends together, the other ``max_*`` those of one listener, of
    one source address and of those not yet logged in (see :meth:`admit`).  ``policy`` is the
    access policy (None: everything is allowed); :meth:`set_policy` replaces it.

    Addresses live in one namespace per protocol (``ISubscriber.protocol``): a session can
    only replace, and a unicast only reach, a session of the namespace it names.
    """

    name = "broker"
    _log = Logger()

    def __init__(
        self,
        *,
        max_subscriptions: int = Settings.max_subscriptions,
        max_connections: int = Settings.max_connections,
        max_listener_connections: int = Settings.max_listener_connections,
        max_connections_per_address: int = Settings.max_connections_per_address,
        max_unauthenticated: int = Settings.max_unauthenticated,
        observer: IBrokerObserver | None = None,
        policy: IAccessPolicy | None = None,
    ) -> None:
        self.stats = BrokerStats()
        self.admissions = Admissions(
            self.stats,
            max_connections=max_connections,
            max_listener_connections=max_listener_connections,
            max_connections_per_address=max_connections_per_address,
            max_unauthenticated=max_unauthenticated,
        )
        self.topics = TopicRegistry()
        self.filtered = FilterSubscriptions()
        """Subscriptions to topic filters (:meth:`subscribe_filter`)."""
        self._retained = RetainedMessages()
        self.registry = SessionRegistry()
        """Attached sessions and who holds each address (brokerd.core.sessions)."""
        self.owned_namespaces = self.registry.owned_namespaces
        """Namespaces whose addresses belong to their session's principal (MQTT's client
        identifiers): :attr:`SessionRegistry.owned_namespaces`."""
        self.access = AccessControl(policy)
        self.durable: DurableService | None = None
        """Durable subscriptions and pending messages (:meth:`use_durable`); None on a node
        without a store."""
        self.engine: IEngine = IN_MEMORY
        """Where routing reaches beyond this process (:meth:`use_engine`)."""
        self.kept_out = KeptOut()
        """Principals an operator keeps out for a while (:meth:`keep_out`; the realm asks it)."""
        self._forward: Callable[[list[Message], dict[str, bytes] | None], None] | None = None
        """The engine's ``forward`` when it is shared, else None: what :meth:`attach` tests
        before it tells the engine, so a single node pays nothing for it."""
        joined: dict[ISubscriber, dict[bytes, Topic]] = {}
        self.router = Router(self.stats, self.topics, self.filtered, self.registry.addresses, joined)
        """Where every publication is delivered (brokerd.core.router)."""
        self.router.install(access=self.access, retained=self._retained)
        self.route: Callable[[Publication], int] = self.router.route
        """The one routing entry point (:meth:`brokerd.core.router.Router.route`), bound here
        so that a front end's call costs no extra frame."""
        self.live = LiveSubscriptions(self.registry, self.router, max_subscriptions)
        """Topics, filters, shared groups and presence (brokerd.core.live)."""
        self.topic_listeners = self.live.topic_listeners
        """Called with (topic, True) when a topic gets its first member and (topic, False)
        when it loses its last (MCCHAT's "" discovery topic uses it)."""
        self.remote_topics_listeners = self.live.remote_topics_listeners
        """Called when a topic appears on or disappears from another node of a cluster."""
        self._observer: IBrokerObserver | None = None
        self.observer = observer
        self._sampler: DeliverySampler | None = None

    @property
    def max_subscriptions(self) -> int:
        """The topics and filters one session may subscribe to."""
        return self.live.max_subscriptions

    @max_subscriptions.setter
    def max_subscriptions(self, value: int) -> None:
        self.live.max_subscriptions = value

    @property
    def observer(self) -> IBrokerObserver | None:
        """Told of sessions, subscriptions and (through the router) routed messages."""
        return self._observer

    @observer.setter
    def observer(self, observer: IBrokerObserver | None) -> None:
        self._observer = self.live.observer = observer
        self.router.install(observer=observer)

    @property
    def sampler(self) -> DeliverySampler | None:
        """The delivery-latency sampler (None: no samples), set before the broker starts: the
        router's multicast path has its stage only while there is one."""
        return self._sampler

    @sampler.setter
    def sampler(self, sampler: DeliverySampler | None) -> None:
        self._sampler = sampler
        self.router.install(sampler=sampler)

    @property
    def sampling(self) -> bool:
        """Whether the next multicast is timed (the sampler sets it, at most once per its
        interval; brokerd.core.sampling)."""
        return self.router.sampling

    @sampling.setter
    def sampling(self, value: bool) -> None:
        self.router.sampling = value

    def use_engine(self, engine: IEngine) -> IEngine:
        """Route through ``engine`` (a cluster's) from now on; it starts with the broker."""
        self.engine = self.registry.engine = engine
        self._forward = engine.forward if engine.shared else None
        self.router.install(engine=engine)
        if self.durable is not None:
            self.durable.announce = engine.durable_changed if engine.shared else None
        return engine

    def startService(self) -> None:
        super().startService()
        self.engine.start(self)
        if self.sampler is not None:
            self.sampler.start()

    def use_durable(self, durable: DurableService) -> DurableService:
        """Keep messages for durable subscribers with ``durable`` (over the node's store):
        brokerd.tap makes it for every node that has a store, whatever front ends it runs."""
        self.durable = self.live.durable = durable
        self.router.install(durable=durable)
        durable.access_control = lambda: self.access  # set_policy replaces it
        durable.route = self.router.route
        durable.announce = self.engine.durable_changed if self.engine.shared else None
        return durable

    def durable_announced(self, tree: bool, subscribers: list[str], pending: list[str]) -> None:
        """Another node committed durable state to the shared store (the engine's report)."""
        if self.durable is not None:
            self.durable.announced(tree, subscribers, pending)

    def keep_out(self, principal: Principal, seconds: float) -> None:
        """Refuse ``principal``'s logins for ``seconds``, on this node and (through the
        engine) on every other node of the cluster."""
        self.kept_out.add(principal, seconds)
        self.engine.keep_out(principal, seconds)

    def keep_out_announced(self, principal: Principal, seconds: float) -> None:
        """Another node keeps ``principal`` out for ``seconds`` (the engine's report)."""
        self.kept_out.add(principal, seconds)

    def durable_resync(self) -> None:
        """A node of the cluster came back after an outage of the shared medium: durable
        announcements may have been missed, read the durable state again."""
        if self.durable is not None:
            self.durable.resync()

    def stopService(self):
        """Detach every session still connected, so their topics are left and the event log
        (stopped after the broker) records their logout."""
        super().stopService()
        if self.sampler is not None:
            self.sampler.stop()
        for session in list(self.registry.sessions):
            self.detach(session)
        return self.engine.stop()

    # ------------------------------------------------------------------ connections

    @property
    def max_connections(self) -> int:
        return self.admissions.max_connections

    @max_connections.setter
    def max_connections(self, value: int) -> None:
        self.admissions.max_connections = value

    def admit(self, listener: Hashable | None = None, address: Hashable | None = None) -> Admission | None:
        """Count a new connection on ``listener`` from ``address`` in; None (counted as
        refused) when a limit is full.  The Admission counts it out again (``release``)."""
        return self.admissions.admit(listener, address)

    # ------------------------------------------------------------------ sessions

    def attach(self, session: ISubscriber) -> None:
        """Register a logged-in session; an older session with the same address is detached
        and told to close (SSMP: "the server MUST close any previous connection")."""
        previous = self.registry.add(session)
        if previous is not None:
            self.detach(previous)
            previous.replaced()
        if self._forward is not None:
            self.engine.session_attached(session)
        if self.observer is not None:
            self.observer.session_attached(session)

    def may_take_address(self, namespace: str, address: bytes, principal: Principal | None) -> bool:
        """Whether a login of ``principal`` may take ``address`` over (SessionRegistry): a
        front end refuses the login otherwise, and :meth:`replace_address` decides with it
        which of two logins stays."""
        return self.registry.may_take_address(namespace, address, principal)

    def replace_address(self, namespace: str, address: bytes, principal: Principal | None = None,
                        later: bool = True) -> bool:
        """A session on another node logged in with ``address`` as ``principal``, ``later`` (or
        not) than the local session that has it: whether that one was closed (the decision:
        :meth:`SessionRegistry.loses_to`)."""
        previous = self.registry.loses_to(namespace, address, principal, later)
        if previous is None:
            return False
        self.detach(previous)
        previous.replaced()
        return True

    def detach(self, session: ISubscriber) -> None:
        """Forget a session: leave every topic (presence watchers are told) and free its
        address.  Safe to call more than once, and for a session that never attached."""
        if session not in self.registry:
            return
        freed = self.registry.remove(session)
        self.live.leave_all(session)
        if freed and self._forward is not None:
            self.engine.session_detached(session)
        if self.observer is not None:
            self.observer.session_detached(session)

    def sessions(self) -> list[ISubscriber]:
        """Every attached session."""
        return list(self.registry.sessions)

    def session_for(self, namespace: str, address: bytes) -> ISubscriber | None:
        """The session of protocol ``namespace`` at ``address``, if any."""
        return self.registry.holder(namespace, address)

    # ------------------------------------------------------------------ subscriptions

    def subscribe(self, session: ISubscriber, name: bytes, presence: bool = False) -> None:
        """Join ``session`` to topic ``name`` (:meth:`LiveSubscriptions.subscribe`)."""
        self.live.subscribe(session, name, presence)

    def unsubscribe(self, session: ISubscriber, name: bytes) -> None:
        """Leave topic ``name``; raises NotSubscribed."""
        self.live.unsubscribe(session, name)

    def subscribe_filter(self, session: ISubscriber, topic_filter: bytes, share: bytes | None = None) -> None:
        """Subscribe ``session`` to ``topic_filter``, or to its ``share`` group's shared
        subscription (:meth:`LiveSubscriptions.subscribe_filter`)."""
        self.live.subscribe_filter(session, topic_filter, share)

    def unsubscribe_filter(self, session: ISubscriber, topic_filter: bytes, share: bytes | None = None) -> None:
        """Take ``session`` off ``topic_filter`` (or its ``share`` group's); raises NotSubscribed."""
        self.live.unsubscribe_filter(session, topic_filter, share)

    def is_subscribed(self, session: ISubscriber, topic: bytes) -> bool:
        return self.live.is_subscribed(session, topic)

    def subscriptions(self, session: ISubscriber) -> list[bytes]:
        """The topics and filters of ``session``, live or stored (:meth:`LiveSubscriptions.subscriptions`)."""
        return self.live.subscriptions(session)

    def active_topics(self) -> list[bytes]:
        """Topics with at least one subscriber (on any node of a cluster)."""
        return self.live.active_topics()

    def watched(self, name: bytes) -> bool:
        """Whether a publish to topic ``name`` would reach a subscriber of this node."""
        return self.live.watched(name)

    def tell_presence(self, name: bytes, member: ISubscriber, joined: bool, presence: bool) -> None:
        """A member on another node joined or left topic ``name``: tell the local watchers."""
        self.live.tell_presence(name, member, joined, presence)

    def remote_topics_changed(self) -> None:
        """The engine's report that another node's topics changed."""
        self.live.remote_topics_changed()

    # ------------------------------------------------------------------ retained messages

    @property
    def retained(self) -> RetainedMessages:
        """The last retained message of each topic (MQTT's retain flag), kept in the store
        when the node has one (brokerd.core.durable.attach_durable); the router's retain stage
        keeps them.  Setting it (the server's bounds) installs the stage with it."""
        return self._retained

    @retained.setter
    def retained(self, retained: RetainedMessages) -> None:
        self._retained = retained
        self.router.install(retained=retained)

    # ------------------------------------------------------------------ access policy

    def may_publish(self, principal: Principal, topic: bytes) -> bool:
        """Whether ``principal`` may publish to ``topic`` (front ends ask first, so that they
        can refuse with their own reply; :meth:`publish` refuses anyway)."""
        access = self.access
        if access.policy is None and topic[:1] != _SYSTEM:
            return True
        return access.allows(principal, topic, Perm.PUBLISH)

    def may_subscribe(self, principal: Principal, topic_filter: bytes) -> bool:
        """Whether ``principal`` may subscribe to ``topic_filter``'s text (what
        :meth:`subscribe_filter` asks; a durable filter subscription asks it first)."""
        access = self.access
        return access.policy is None or access.allows(principal, topic_filter, Perm.SUBSCRIBE)

    def set_policy(self, policy: IAccessPolicy | None) -> int:
        """Install a new access policy (a reload) and take every live subscription it no
        longer allows off its topic at once; returns how many were revoked."""
        self.access = access = AccessControl(policy)
        self.router.install(access=access)
        self.filtered.forget_answers()
        if policy is None:
            return 0
        revoked = self.live.revoke(access)
        if self.durable is not None:
            self.durable.recheck()
        if revoked:
            self._log.info("The new access policy revoked {count} subscriptions", count=revoked)
        return revoked

    # ------------------------------------------------------------------ routing

    def publish(self, message: Message, exclude: ISubscriber | None = None) -> int:
        """Route a multicast ``message`` to its topic (a :class:`Multicast` run of one): the
        sessions it was handed to.  Raises Forbidden when its principal may not publish there."""
        return self.router.route(Multicast([message], exclude))

    def publish_batch(self, messages: list[Message], exclude: ISubscriber | None = None) -> int:
        """Route a run of multicast ``messages`` to their topic (:class:`Multicast`): each
        recipient gets the run as one write.  Returns the (message, recipient) deliveries."""
        return self.router.route(Multicast(messages, exclude))

    def unicast(self, message: Message, namespace: str) -> bool:
        """Route ``message`` to the session of protocol ``namespace`` at ``message.target``
        (:class:`Unicast`); False when there is none here or on another node.  Raises
        Forbidden when the sender may not publish to the recipient's login topic."""
        return self.router.route(unicast_to([message], namespace)) > 0

    def broadcast(self, message: Message, sender: ISubscriber) -> int:
        """Route ``message`` once to each peer sharing a topic with ``sender`` that the sender
        may publish to (:class:`Broadcast`); the deliveries."""
        return self.router.route(Broadcast(message, sender))

    def peers_of(self, session: ISubscriber, publishing: bool = False) -> list[ISubscriber]:
        """Every other session sharing at least one topic with ``session``, each once; with
        ``publishing``, only topics the access policy lets ``session`` publish to."""
        names: Iterable[bytes] = self.router.publishable(session) if publishing else self.router.joined.get(session, {})
        peers = self.router.members_of(names)
        peers.pop(session, None)
        return list(peers)

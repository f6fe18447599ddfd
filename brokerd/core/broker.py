"""The Broker: the one service every front end talks to.

It knows sessions (ISubscriber "minds"), topics and how to route a Message to them, and
nothing about any wire protocol: a front end parses its protocol, calls the Broker, and the
Broker hands back bytes rendered by each recipient's IWireFormat.  A message to a topic with
durable subscribers is also handed to the durable service (:meth:`Broker.keep`), which stores
it before the publisher is answered.  Everything here runs on the reactor thread and never
blocks.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.admission import Admission, Admissions
from brokerd.core.durable import DurableService
from brokerd.core.subscriptions import ADD, FILTER
from brokerd.core.engine import IN_MEMORY
from brokerd.core.filtered import FilterSubscriptions
from brokerd.core.filters import filter_problem, has_wildcard
from brokerd.core.access import SYSTEM_TOPICS, AccessControl, Perm, inbox
from brokerd.core.keepout import KeptOut
from brokerd.core.message import Message
from brokerd.core.principal import NOBODY, Principal
from brokerd.core.retained import RetainedMessages
from brokerd.core.sampling import DeliverySampler
from brokerd.core.topics import FanOut, Topic, TopicRegistry, by_format
from brokerd.errors import AlreadySubscribed, BrokerError, Forbidden, NotSubscribed, SubscriptionLimit
from brokerd.interfaces import IAccessPolicy, IBrokerObserver, IEngine, ISubscriber, IWireFormat

_SYSTEM = SYSTEM_TOPICS[:1]
"""A topic starting with this may be a system topic: checked even without a policy."""
_NO_GROUPS: frozenset[tuple[bytes, bytes]] = frozenset()
"""What a node of a cluster serves of the shared groups for a run another node accepted: none
(the publishing node sends each group's share to the node it chose, :meth:`Broker.deliver_shared`)."""


def _counts() -> defaultdict[IWireFormat, int]:
    return defaultdict(int)


class BrokerStats:
    """Counters an operator (and the tests) can read; plain ints, cheap to bump."""

    __slots__ = (
        "published",
        "delivered",
        "unrenderable",
        "slow_consumer_drops",
        "connections",
        "refused_connections",
        "accepted_by",
        "routed_by",
    )

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.unrenderable = 0
        self.slow_consumer_drops = 0
        self.connections = 0
        self.refused_connections = 0
        self.accepted_by: defaultdict[str, int] = defaultdict(int)
        """Messages accepted, by the sending session's protocol."""
        self.routed_by: defaultdict[str, defaultdict[IWireFormat, int]] = defaultdict(_counts)
        """Deliveries by sending protocol, then by the recipients' wire format: one bump per
        wire format of a fan-out, not per recipient (keyed by the format object, whose
        ``protocol`` names the receiving protocol, because hashing it costs nothing)."""

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__ if not name.endswith("_by")}


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

    sampling = False
    """Whether the next multicast publish is timed (set by ``sampler``, at most once per its
    interval; see brokerd.core.sampling): the one attribute the publish path tests for it."""
    sampler: DeliverySampler | None = None
    """The delivery-latency sampler (None: no samples), set before the broker starts."""

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
        self.max_subscriptions = max_subscriptions
        self.observer = observer
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
        self._filtering = False
        """Whether some filter has a member: the one attribute routing tests for filters."""
        self.retained = RetainedMessages()
        """The last retained message of each topic (MQTT's retain flag), kept in the store
        when the node has one (brokerd.core.durable.attach_durable)."""
        self._sessions: set[ISubscriber] = set()
        self.access = AccessControl(policy)
        self._addresses: dict[tuple[str, bytes], ISubscriber] = {}
        self.owned_namespaces: set[str] = set()
        """Namespaces whose addresses belong to the principal whose session has one (MQTT's
        client identifiers, which a client chooses): a login of another principal takes none
        over, on this node or another (:meth:`may_take_address`)."""
        self._joined: dict[ISubscriber, dict[bytes, Topic]] = {}
        self.durable: DurableService | None = None
        """Durable subscriptions and pending messages (:meth:`use_durable`); None on a node
        without a store."""
        self.topic_listeners: list[Callable[[bytes, bool], None]] = []
        """Called with (topic, True) when a topic gets its first member and (topic, False)
        when it loses its last (MCCHAT's "" discovery topic uses it)."""
        self.remote_topics_listeners: list[Callable[[], None]] = []
        """Called when a topic appears on or disappears from another node of a cluster (what
        :meth:`active_topics` answers changed; MCCHAT's topic list cache listens)."""
        self.engine: IEngine = IN_MEMORY
        """Where routing reaches beyond this process (:meth:`use_engine`)."""
        self.kept_out = KeptOut()
        """Principals an operator keeps out for a while (:meth:`keep_out`; the realm asks it)."""
        self._forward: Callable[[list[Message], dict[str, bytes] | None], None] | None = None
        """The engine's ``forward`` when it is shared, else None: the publish path tests
        this one attribute, so a single node pays nothing more for the engine."""

    def use_engine(self, engine: IEngine) -> IEngine:
        """Route through ``engine`` (a cluster's) from now on; it starts with the broker."""
        self.engine = engine
        self._forward = engine.forward if engine.shared else None
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
        self.durable = durable
        durable.access_control = lambda: self.access  # set_policy replaces it
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
        for session in list(self._sessions):
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
        self._sessions.add(session)
        address = session.address
        if address is not None:
            key = (session.protocol, address)
            previous = self._addresses.get(key)
            self._addresses[key] = session
            if previous is not None and previous is not session:
                self.detach(previous)
                previous.replaced()
        if self._forward is not None:
            self.engine.session_attached(session)
        if self.observer is not None:
            self.observer.session_attached(session)

    def may_take_address(self, namespace: str, address: bytes, principal: Principal | None) -> bool:
        """Whether a login of ``principal`` may take ``address`` over from the session that has
        it, on this node or (the principal its login was announced with) on another: always,
        but in an owned namespace only the same principal's.  A front end refuses the login
        otherwise, and :meth:`replace_address` decides with it which of two logins stays."""
        if namespace not in self.owned_namespaces:
            return True
        holder = self._addresses.get((namespace, address))
        owner = holder.principal if holder is not None else self.engine.principal_of(namespace, address)
        return owner is None or owner == principal

    def replace_address(self, namespace: str, address: bytes, principal: Principal | None = None,
                        later: bool = True) -> bool:
        """A session on another node logged in with ``address`` as ``principal``, ``later`` (or
        not) than the local session that has it: whether that one was closed.  The decision is
        one node's (:meth:`may_take_address`): a login that may take the address over wins if
        it is the later one, as one node closes the older of two logins; one that may not
        (another principal's, in an owned namespace) wins only if it is the earlier one, the
        local login having been accepted before this node heard of it."""
        previous = self._addresses.get((namespace, address))
        if previous is None or self.may_take_address(namespace, address, principal) != later:
            return False
        self.detach(previous)
        previous.replaced()
        return True

    def detach(self, session: ISubscriber) -> None:
        """Forget a session: leave every topic (presence watchers are told) and free its
        address.  Safe to call more than once, and for a session that never attached."""
        if session not in self._sessions:
            return
        self._sessions.discard(session)
        joined = self._joined.pop(session, None)
        if joined:
            for topic in joined.values():
                self._leave(topic, session)
        if self._filtering:
            for topic_filter in self.filtered.drop(session):
                self._filter_left(session, topic_filter)
            self._filtering = len(self.filtered) > 0
            self._tell_filter_changes()
        address = session.address
        if address is not None:
            key = (session.protocol, address)
            if self._addresses.get(key) is session:
                del self._addresses[key]
                if self._forward is not None:
                    self.engine.session_detached(session)
        if self.observer is not None:
            self.observer.session_detached(session)

    def sessions(self) -> list[ISubscriber]:
        """Every attached session."""
        return list(self._sessions)

    def session_for(self, namespace: str, address: bytes) -> ISubscriber | None:
        """The session of protocol ``namespace`` at ``address``, if any."""
        return self._addresses.get((namespace, address))

    # ------------------------------------------------------------------ subscriptions

    def is_subscribed(self, session: ISubscriber, topic: bytes) -> bool:
        joined = self._joined.get(session)
        return joined is not None and topic in joined

    def subscriptions(self, session: ISubscriber) -> list[bytes]:
        """The topics ``session`` joined, then the filters it subscribed to, live or (a
        session that is a durable subscriber, named by its ``durable_name``) in the store."""
        found = list(self._joined.get(session, ())) + self.filtered.of(session)
        name = getattr(session, "durable_name", None)
        if name is not None and self.durable is not None:
            found.extend(sub.record.topic.encode("utf-8") for sub in self.durable.index.of(name)
                          if sub.record.kind == FILTER and ADD in sub.record.changes)
        return found

    def subscribe_filter(self, session: ISubscriber, topic_filter: bytes, share: bytes | None = None) -> None:
        """Subscribe ``session`` to every topic ``topic_filter`` matches (brokerd.core.filters:
        ``+`` one level, ``#`` the rest), whoever publishes there; a filter without wildcard is
        one topic's name, which the session joins as :meth:`subscribe` does.  With ``share``
        (a group name), ``session`` joins the group's shared
        subscription to the filter: each message goes to one member of the group
        (brokerd.core.filtered.SharedGroup).  Counted with the topics against
        ``max_subscriptions``.

        Raises ValueError (not a filter), AlreadySubscribed, SubscriptionLimit, Forbidden (the
        access list does not let the principal subscribe to the filter's text), or BrokerError
        when the session is not attached.  On a node of a cluster the other nodes learn of a
        filter's first and last subscription (IEngine.filter_changed) and send this node the
        messages of the topics it matches."""
        problem = filter_problem(topic_filter)
        if problem is not None:
            raise ValueError(problem)
        if share is None and not has_wildcard(topic_filter):
            # One topic's name: the session joins the topic as a member, as every protocol's
            # subscriber does (presence watchers see it, the cluster routes the topic's channel).
            self.subscribe(session, topic_filter)
            return
        if session not in self._sessions:
            raise BrokerError("a session must attach before it subscribes")
        filtered = self.filtered
        if filtered.has(session, topic_filter) if share is None else filtered.has_shared(session, (share, topic_filter)):
            raise AlreadySubscribed(topic_filter)
        access = self.access
        if access.policy is not None and not access.allows(session.principal, topic_filter, Perm.SUBSCRIBE):
            raise Forbidden(topic_filter)
        if len(self._joined.get(session, ())) + filtered.count(session) >= self.max_subscriptions:
            raise SubscriptionLimit(topic_filter)
        if share is None:
            filtered.add(session, topic_filter)
        else:
            filtered.add_shared(session, (share, topic_filter))
        self._filtering = True
        self._tell_filter_changes()
        if self.observer is not None:
            self.observer.subscribed(session, topic_filter)

    def _tell_filter_changes(self) -> None:
        changes = self.filtered.changes()
        shares = self.filtered.share_changes()
        if self._forward is not None:
            for topic_filter, active in changes:
                self.engine.filter_changed(topic_filter, active)
            for key, members in shares:
                self.engine.shared_changed(key, members)

    def unsubscribe_filter(self, session: ISubscriber, topic_filter: bytes, share: bytes | None = None) -> None:
        """Take ``session`` off ``topic_filter`` (or its ``share`` group's); raises NotSubscribed."""
        if share is None and not has_wildcard(topic_filter):
            self.unsubscribe(session, topic_filter)
            return
        filtered = self.filtered
        if share is None:
            if not filtered.has(session, topic_filter):
                raise NotSubscribed(topic_filter)
            filtered.remove(session, topic_filter)
        else:
            if not filtered.has_shared(session, (share, topic_filter)):
                raise NotSubscribed(topic_filter)
            filtered.remove_shared(session, (share, topic_filter))
        self._filter_left(session, topic_filter)

    def _filter_left(self, session: ISubscriber, topic_filter: bytes) -> None:
        self._filtering = len(self.filtered) > 0
        self._tell_filter_changes()
        if self.observer is not None:
            self.observer.unsubscribed(session, topic_filter)

    def subscribe(self, session: ISubscriber, name: bytes, presence: bool = False) -> None:
        """Join ``session`` to topic ``name``.  Presence watchers of the topic learn of it;
        with ``presence`` the session gets one event per current member, then live changes.

        Raises AlreadySubscribed, SubscriptionLimit, or Forbidden (the access policy).
        """
        joined = self._joined.get(session)
        if joined is None:
            if session not in self._sessions:
                raise BrokerError("a session must attach before it subscribes")
            joined = self._joined[session] = {}
        elif name in joined:
            raise AlreadySubscribed(name)
        access = self.access
        if access.policy is not None and not access.allows(session.principal, name, Perm.SUBSCRIBE):
            raise Forbidden(name)
        if len(joined) + (self._filtering and self.filtered.count(session)) >= self.max_subscriptions:
            raise SubscriptionLimit(name)
        topic = self.topics.get(name)
        created = topic is None
        if topic is None:
            topic = self.topics.create(name)
        if topic.watchers:
            self._tell_watchers(topic, session, True, presence)
        if presence:
            render = session.wire_format.render_presence
            members = list(topic.members.items())
            if self._forward is not None:
                members += self.engine.members(name)
            for member, member_presence in members:
                data = render(name, member, True, member_presence)
                if data is not None:
                    session.send(data)
        topic.add(session, presence)
        joined[name] = topic
        if self._forward is not None:
            self.engine.member_changed(name, session, True, presence)
        if created:
            self._tell_topic_listeners(name, True)
        if self.observer is not None:
            self.observer.subscribed(session, name)

    def unsubscribe(self, session: ISubscriber, name: bytes) -> None:
        """Leave topic ``name``; raises NotSubscribed."""
        joined = self._joined.get(session)
        if joined is None or name not in joined:
            raise NotSubscribed(name)
        self._leave(joined.pop(name), session)

    def _leave(self, topic: Topic, session: ISubscriber) -> None:
        topic.remove(session)
        if self._forward is not None:
            self.engine.member_changed(topic.name, session, False, False)
        if self.observer is not None:
            self.observer.unsubscribed(session, topic.name)
        if topic.watchers:
            self._tell_watchers(topic, session, False, False)
        if not topic.members:
            self.topics.discard(topic)
            self._tell_topic_listeners(topic.name, False)

    def _tell_topic_listeners(self, name: bytes, active: bool) -> None:
        for listener in tuple(self.topic_listeners):
            listener(name, active)

    def _tell_watchers(self, topic: Topic, member: ISubscriber, joined: bool, presence: bool) -> None:
        rendered: dict[IWireFormat, bytes | None] = {}
        for watcher in tuple(topic.watchers):
            if watcher is member:
                continue
            fmt = watcher.wire_format
            if fmt in rendered:
                data = rendered[fmt]
            else:
                data = rendered[fmt] = fmt.render_presence(topic.name, member, joined, presence)
            if data is not None:
                watcher.send(data)

    def remote_topics_changed(self) -> None:
        """The engine's report that another node's topics changed."""
        for listener in tuple(self.remote_topics_listeners):
            listener()

    def tell_presence(self, name: bytes, member: ISubscriber, joined: bool, presence: bool) -> None:
        """A member on another node joined or left topic ``name``: tell the local watchers."""
        topic = self.topics.get(name)
        if topic is not None and topic.watchers:
            self._tell_watchers(topic, member, joined, presence)

    def active_topics(self) -> list[bytes]:
        """Topics with at least one subscriber (on any node of a cluster)."""
        local = list(self.topics.active())
        if self._forward is None:
            return local
        return local + sorted(self.engine.topics().difference(local))

    # ------------------------------------------------------------------ access policy

    def may_publish(self, principal: Principal, topic: bytes) -> bool:
        """Whether ``principal`` may publish to ``topic`` (front ends ask first, so that they
        can refuse with their own reply; :meth:`publish` refuses anyway)."""
        access = self.access
        if access.policy is None and topic[:1] != _SYSTEM:
            return True
        return access.allows(principal, topic, Perm.PUBLISH)

    def watched(self, name: bytes) -> bool:
        """Whether a publish to topic ``name`` would reach a subscriber of this node: a
        member of the topic, a topic filter or shared group matching it, or a stored session's
        filter (what the statistics topics ask before they publish a figure)."""
        if self.topics.get(name) is not None:
            return True
        filtered = self.filtered
        if self._filtering and (filtered.index.match(name) or filtered.shared.match(name)):
            return True
        durable = self.durable
        return durable is not None and durable.index.has_filter_subscribers(name)

    def may_subscribe(self, principal: Principal, topic_filter: bytes) -> bool:
        """Whether ``principal`` may subscribe to ``topic_filter``'s text (what
        :meth:`subscribe_filter` asks; a durable filter subscription asks it first)."""
        access = self.access
        return access.policy is None or access.allows(principal, topic_filter, Perm.SUBSCRIBE)  # type: ignore[no-any-return]

    def set_policy(self, policy: IAccessPolicy | None) -> int:
        """Install a new access policy (a reload) and take every live subscription it no
        longer allows off its topic at once; returns how many were revoked."""
        self.access = access = AccessControl(policy)
        self.filtered.forget_answers()
        if policy is None:
            return 0
        revoked = 0
        for session, joined in list(self._joined.items()):
            principal = session.principal
            for name in [name for name in joined if not access.allows(principal, name, Perm.SUBSCRIBE)]:
                self._leave(joined.pop(name), session)
                revoked += 1
                tell = getattr(session, "subscription_revoked", None)
                if tell is not None:
                    tell(name)
        for session, filters in self.filtered.subscriptions():
            for topic_filter in [f for f in filters if not access.allows(session.principal, f, Perm.SUBSCRIBE)]:
                self.filtered.remove(session, topic_filter)
                self._filter_left(session, topic_filter)
                revoked += 1
                tell = getattr(session, "subscription_revoked", None)
                if tell is not None:
                    tell(topic_filter)
        if revoked:
            self._log.info("The new access policy revoked {count} subscriptions", count=revoked)
        return revoked

    def _check_publish(self, message: Message, topic: bytes) -> None:
        """Only called when there is a policy, or for a topic that may be a system topic
        (brokerd.core.access.system_topic: only the broker publishes there).  A message that names no principal (a program
        embedding the broker that did not say who publishes) is checked as NOBODY, the
        anonymous login: code that should bypass the list says so with a SERVICE principal
        (brokerd.core.principal.BROKER), which AccessControl allows without asking."""
        principal = message.principal
        if principal is None:
            principal = NOBODY
        if not self.access.allows(principal, topic, Perm.PUBLISH):
            raise Forbidden(topic)

    # ------------------------------------------------------------------ routing

    def publish(self, message: Message, exclude: ISubscriber | None = None) -> int:
        """Deliver a multicast ``message`` to every member of its topic except ``exclude``;
        return how many sessions it was handed to.  Rendered once per wire format: a run of
        one (:meth:`publish_batch`), which the event log records as one message.
        Raises Forbidden when the sender's principal may not publish there."""
        if self.access.policy is not None or message.target[:1] == _SYSTEM:  # type: ignore[index]
            self._check_publish(message, message.target)  # type: ignore[arg-type]
        stats = self.stats
        stats.published += 1
        stats.accepted_by[message.protocol] += 1
        if self._forward is None:
            if self.sampling:
                return self.sampler.route([message], exclude)  # type: ignore[union-attr]
            return self._route([message], exclude, None, None, None)
        return self._route_here_and_forward([message], exclude)

    def publish_batch(self, messages: list[Message], exclude: ISubscriber | None = None) -> int:
        """Deliver consecutive multicast ``messages`` that all go to one topic, in order.

        The front end hands over a run it read in one go; each recipient gets the run as one
        write (the rendered messages joined), which is what makes fan-out cheap in CPython.
        Returns the number of (message, recipient) deliveries.  Raises Forbidden as
        :meth:`publish` does (one run has one sender).
        """
        first = messages[0]
        if self.access.policy is not None or first.target[:1] == _SYSTEM:  # type: ignore[index]
            self._check_publish(first, first.target)  # type: ignore[arg-type]
        stats = self.stats
        stats.published += len(messages)
        stats.accepted_by[first.protocol] += len(messages)
        if self._forward is None:
            if self.sampling:
                return self.sampler.route(messages, exclude)  # type: ignore[union-attr]
            return self._route(messages, exclude)
        return self._route_here_and_forward(messages, exclude)

    def _route_here_and_forward(self, messages: list[Message], exclude: ISubscriber | None) -> int:
        """A node of a cluster: the engine first chooses which node serves each shared group
        the run matches (it sends the run to the chosen other nodes itself); this node routes
        to its members, one member of each group it serves, and forwards the run to the
        other nodes' plain members, with the bytes rendered here for the portable wire
        formats, so a node whose members all take those never decodes it (docs/cluster.md)."""
        groups = self.engine.place_shared(messages)
        if self.sampling and groups is None:
            self._forward(messages, None)  # type: ignore[misc]
            return self.sampler.route(messages, exclude)  # type: ignore[union-attr]
        rendered: dict[str, bytes] = {}
        delivered = self._route(messages, exclude, None, rendered, None, groups)
        self._forward(messages, rendered)  # type: ignore[misc]
        return delivered

    def route_timed(self, messages: list[Message], exclude: ISubscriber | None,
                    stamps: list[tuple[IWireFormat, int, int]]) -> int:
        """Route accepted ``messages`` (a run, as :meth:`publish_batch` takes it) as it does,
        appending to ``stamps`` (wire format, recipients, time in ns) once each format's
        recipients were handed the run: the delivery-latency sampler's publish."""
        return self._route(messages, exclude, stamps)

    def deliver_remote(self, messages: list[Message]) -> int:
        """Deliver a run of multicast ``messages`` (one topic, in order) that another node
        accepted, to this node's members of the topic.  The publishing node checked the access
        policy and counted the messages as published; here they only count as delivered.
        Shared groups are not served from it: the publishing node chose the one node that
        serves each (:meth:`deliver_shared`)."""
        return self._route(messages, None, None, None, None, _NO_GROUPS)

    def deliver_rendered(self, run: Any) -> int:
        """Deliver a run another node accepted, as :meth:`deliver_remote`, from an opened
        envelope (brokerd.cluster.envelope.Run): when every local wire format of the topic is
        portable and the run carries its bytes, each member gets them with one ``send`` and
        the messages are never decoded (the event log gets the run's summary: protocol,
        sender, topic, kind, count, payload bytes); otherwise the run is decoded and routed as
        :meth:`deliver_remote` does.  EnvelopeError when a run that must be decoded does not
        parse (nothing was sent then)."""
        first = run.first
        topic = self.topics.get(first.target)
        sections = run.sections
        observer = self.observer
        if topic is None or not sections or self._filtering or (
                observer is not None and not getattr(observer, "summarizes_runs", False)):
            return self.deliver_remote(run.messages())
        fanout = topic.fanout()
        for fmt, _members in fanout:
            if not (fmt.portable and fmt.protocol in sections):
                return self.deliver_remote(run.messages())
        count = run.count
        routed = self.stats.routed_by[first.protocol]
        reached = 0
        for fmt, members in fanout:
            data = sections[fmt.protocol]
            for member in members:
                member.send(data)
            reached += len(members)
            routed[fmt] += len(members) * count
        self.stats.delivered += reached * count
        if observer is not None:
            observer.run_summary_routed(first.protocol, first.sender_name, first.target, first.kind, count,
                                        run.total, reached, 0)
        return reached * count

    def deliver_shared(self, key: tuple[bytes, bytes], messages: list[Message]) -> bool:
        """Hand a run another node accepted to one member here of the shared group ``key``
        (group name, filter): that node chose this one to serve the group for it.  False when
        no member here may take it (none left, or the access list lets none read the topic):
        the engine tells the publishing node, which chooses again.  A member that is also a
        plain subscriber of the topic got the run from the topic's channel and is not sent it
        twice (as on one node)."""
        group = self.filtered.group(key)
        name: bytes = messages[0].target  # type: ignore[assignment]
        member = None if group is None else group.pick(name, self.access)
        if member is None:
            return False
        _plain, reached = self.filtered.fanout(name, self.topics.get(name), self.access, _NO_GROUPS)
        if member not in reached:
            self._route(messages, None, None, None, ((member.wire_format, (member,)),))
        return True

    def _route(self, messages: list[Message], exclude: ISubscriber | None,
               stamps: list[tuple[IWireFormat, int, int]] | None = None,
               rendered: dict[str, bytes] | None = None, fanout: FanOut | None = None,
               groups: frozenset[tuple[bytes, bytes]] | None = None) -> int:
        """The fan-out, for one message or a run: render ``messages`` (one, or a run of one
        sender's to one topic) once per wire format and hand each session of the format but
        ``exclude`` the bytes with one ``send``; count it and tell the observer (one message as
        one, a run as a run); return the (message, session) deliveries.  The sessions are the
        members of the messages' topic, or ``fanout`` (a broadcast's peers) when given.

        A run takes its format's ``render_run``, else it is rendered message by message, and a
        format that cannot carry some messages of it gets the others.  With ``stamps`` (a timed
        route, brokerd.core.sampling), append (wire format, recipients, time in ns) once each
        format's sessions were handed their bytes; with ``rendered``, keep there the bytes of
        each portable wire format that carried every message (by name, for the other nodes of
        a cluster).  ``groups``: the shared groups this node serves for the run (None: all)."""
        if fanout is None:
            topic = self.topics.get(messages[0].target)  # type: ignore[arg-type]
            if self._filtering:
                fanout, reached_by = self.filtered.fanout(messages[0].target, topic, self.access, groups)  # type: ignore[arg-type]
                if exclude is not None and exclude not in reached_by:
                    exclude = None
            elif topic is None:
                fanout = ()
            else:
                fanout = topic.grouped or topic.fanout()
                if exclude is not None and exclude not in topic.members:
                    exclude = None
        stats = self.stats
        routed = stats.routed_by[messages[0].protocol]
        single = messages[0] if len(messages) == 1 else None
        # reached: the sessions a run was for (a single message's are delivered + unrenderable)
        delivered = unrenderable = reached = 0
        dropped: list[int] | None = None  # per message of a run, once some format cannot carry one
        for fmt, members in fanout:
            recipients = len(members) - (exclude is not None and exclude.wire_format is fmt)
            if single is not None:
                data = fmt.render_message(single)
                if data is None:
                    unrenderable += recipients
                    continue
                carried = 1
            else:
                reached += recipients
                data = fmt.render_run(messages)
                carried = len(messages)
                if data is None:
                    data, parts = _render_each(fmt, messages)
                    if None in parts:
                        if dropped is None:
                            dropped = [0] * len(messages)
                        for index, part in enumerate(parts):
                            if part is None:
                                dropped[index] += recipients
                        carried -= parts.count(None)
                        unrenderable += (len(messages) - carried) * recipients
                        if data is None:
                            continue
            if rendered is not None and carried == len(messages) and fmt.portable:
                rendered[fmt.protocol] = data
            if exclude is None:
                for member in members:
                    member.send(data)
            else:
                for member in members:
                    if member is not exclude:
                        member.send(data)
            delivered += recipients * carried
            routed[fmt] += recipients * carried
            if stamps is not None:
                stamps.append((fmt, recipients, self.sampler.clock_ns()))  # type: ignore[union-attr]
        stats.delivered += delivered
        stats.unrenderable += unrenderable
        observer = self.observer
        if observer is not None:
            if single is not None:
                observer.message_routed(single, delivered, unrenderable)
            elif dropped is None:
                observer.messages_routed(messages, reached, 0)
            else:
                self._report_uneven_run(messages, reached, dropped)
        return delivered

    def publish_unstored(self, message: Message, explicit: Iterable[str] = ()) -> int:
        """Deliver a multicast ``message`` its publisher asked the broker not to store
        (a guarantee of none) to the durable subscribers of its topic connected to this
        node and to the ``explicit`` ones, once each; nothing is kept for one that is offline.
        The live subscribers of the other protocols get it from :meth:`publish`, which the
        front end calls when they can carry it.  Returns the sessions reached."""
        if self.durable is None:
            return 0
        return self.durable.offer_unstored(message, explicit)

    def keep(self, messages: list[Message], flows: list[Any] | None = None) -> Deferred | None:
        """Store multicast ``messages`` (consecutive, one topic, as :meth:`publish_batch`
        takes them; already routed to the live subscribers) for the durable subscribers of
        their topic.  None when the topic has none: nothing is stored, and the publisher may
        be answered at once.  Otherwise a Deferred that fires once every one is committed:
        the publisher's acknowledgement waits for it.  A topic without durable subscribers
        costs one dict lookup here.  ``flows`` (store PacketFlows: an MQTT persistent
        session's QoS 2 PUBLISHes received) are committed with the messages, or alone."""
        durable = self.durable
        if durable is None:
            return None
        if not durable.covers(messages[0].target):  # type: ignore[arg-type]
            return durable.put_flows(flows) if flows else None
        return durable.keep(messages, flows=flows)

    def keep_for_filters(self, messages: list[Message]) -> Deferred | None:
        """:meth:`keep` for the FILTER subscribers only (MQTT's persistent sessions): what a
        front end that stores its own messages for its own durable subscribers asks,
        so that those sessions get its messages too.  None when no filter matches."""
        durable = self.durable
        if durable is None or not durable.index.has_filter_subscribers(messages[0].target):  # type: ignore[arg-type]
            return None
        return durable.keep(messages, filters_only=True)

    def _report_uneven_run(self, messages: list[Message], reached: int, dropped: list[int]) -> None:
        """Some recipients could not be sent some messages of a run: report each stretch of
        messages that reached the same number of sessions as a run of its own, so the event
        log counts every message's fan-out right."""
        start = 0
        for end in range(1, len(messages) + 1):
            if end == len(messages) or dropped[end] != dropped[start]:
                self.observer.messages_routed(messages[start:end], reached - dropped[start], dropped[start])  # type: ignore[union-attr]
                start = end

    def unicast(self, message: Message, namespace: str) -> bool:
        """Deliver ``message`` to the session of protocol ``namespace`` at address
        ``message.target``; False when there is none.  Raises Forbidden when the sender may not
        publish to the recipient's login topic (:func:`brokerd.core.access.inbox`), also for a
        recipient on another node of a cluster (whose principal its node announced; that node
        checks again on delivery)."""
        recipient = self._addresses.get((namespace, message.target))  # type: ignore[arg-type]
        if recipient is None:
            return self._forward is not None and self._unicast_remote([message], namespace)
        if self.access.policy is not None:
            self._check_publish(message, inbox(recipient.principal))
        stats = self.stats
        stats.published += 1
        stats.accepted_by[message.protocol] += 1
        # _deliver_unicast, inlined: this runs once per UCAST.
        fmt = recipient.wire_format
        data = fmt.render_message(message)
        if data is None:
            stats.unrenderable += 1
            delivered, dropped = 0, 1
        else:
            recipient.send(data)
            stats.delivered += 1
            stats.routed_by[message.protocol][fmt] += 1
            delivered, dropped = 1, 0
        if self.observer is not None:
            self.observer.message_routed(message, delivered, dropped)
        return True

    def unicast_run(self, messages: list[Message], namespace: str) -> bool:
        """Deliver consecutive unicast ``messages`` from one sender to one address (what a
        front end read in one go), in order, as :meth:`unicast` would one by one; False when
        there is no session at that address.  The recipient is looked up, the access policy
        asked and the run rendered and sent once (its wire format's ``render_run``, else
        message by message), and the event log gets the run as one entry: one UCAST costs
        about what one MCAST of a run costs (docs/performance-history.md).  Raises Forbidden as
        :meth:`unicast` does (one run has one sender)."""
        first = messages[0]
        recipient = self._addresses.get((namespace, first.target))  # type: ignore[arg-type]
        stats = self.stats
        if recipient is None:
            return self._forward is not None and self._unicast_remote(messages, namespace)
        if self.access.policy is not None:
            self._check_publish(first, inbox(recipient.principal))
        count = len(messages)
        stats.published += count
        stats.accepted_by[first.protocol] += count
        fmt = recipient.wire_format
        data = fmt.render_run(messages)
        if data is not None:
            recipient.send(data)
            stats.delivered += count
            stats.routed_by[first.protocol][fmt] += count
            if self.observer is not None:
                self.observer.messages_routed(messages, 1, 0)
            return True
        data, parts = _render_each(fmt, messages)
        if data is not None:
            recipient.send(data)  # still one send for the run
        sent = count - parts.count(None)
        stats.delivered += sent
        stats.unrenderable += count - sent
        stats.routed_by[first.protocol][fmt] += sent
        if self.observer is not None:
            for message, part in zip(messages, parts):
                self.observer.message_routed(message, int(part is not None), int(part is None))
        return True

    def _unicast_remote(self, messages: list[Message], namespace: str) -> bool:
        """Hand unicast ``messages`` of one sender to one address that is not local to the
        engine, for the node that holds it; False when no node does.  Raises Forbidden, as for a
        local recipient, when the principal that node announced for the address may not be
        written to by the sender (that node checks again on delivery)."""
        first = messages[0]
        if self.access.policy is not None:
            remote = self.engine.principal_of(namespace, first.target)
            if remote is not None:
                self._check_publish(first, inbox(remote))
        accepted = sum(1 for message in messages if self.engine.unicast(message, namespace))
        self.stats.published += accepted
        self.stats.accepted_by[first.protocol] += accepted
        return accepted > 0

    def deliver_unicast(self, message: Message, namespace: str) -> bool:
        """Deliver a unicast ``message`` another node accepted for the local session of
        ``namespace`` at ``message.target``.  The access policy is checked here, where the
        recipient's principal is known; False (dropped) when it forbids it or the session left."""
        recipient = self._addresses.get((namespace, message.target))  # type: ignore[arg-type]
        if recipient is None:
            return False
        if self.access.policy is not None:
            principal = message.principal
            if principal is not None and not self.access.allows(principal, inbox(recipient.principal), Perm.PUBLISH):
                return False
        return self._deliver_unicast(message, recipient)

    def _deliver_unicast(self, message: Message, recipient: ISubscriber) -> bool:
        data = recipient.wire_format.render_message(message)
        if data is None:
            self.stats.unrenderable += 1
            delivered, dropped = 0, 1
        else:
            recipient.send(data)
            self.stats.delivered += 1
            self.stats.routed_by[message.protocol][recipient.wire_format] += 1
            delivered, dropped = 1, 0
        if self.observer is not None:
            self.observer.message_routed(message, delivered, dropped)
        return True

    def peers_of(self, session: ISubscriber, publishing: bool = False) -> list[ISubscriber]:
        """Every other session sharing at least one topic with ``session``, each once; with
        ``publishing``, only topics the access policy lets ``session`` publish to."""
        names = self._joined.get(session, {})
        if publishing:
            names = self._publishable(session)
        peers = self._members_of(names)
        peers.pop(session, None)
        return list(peers)

    def _publishable(self, session: ISubscriber) -> list[bytes]:
        """The topics ``session`` joined and the access policy lets it publish to."""
        access = self.access
        joined = self._joined.get(session, {})
        if access.policy is None:
            return list(joined)
        return [name for name in joined if access.allows(session.principal, name, Perm.PUBLISH)]

    def _members_of(self, names: Iterable[bytes]) -> dict[ISubscriber, None]:
        """The local members of the topics ``names``, each once, in join order."""
        peers: dict[ISubscriber, None] = {}
        for name in names:
            topic = self.topics.get(name)
            if topic is not None:
                peers.update(dict.fromkeys(topic.members))
        return peers

    def broadcast(self, message: Message, sender: ISubscriber) -> int:
        """Deliver ``message`` once to each peer sharing a topic with ``sender`` that the
        sender may publish to; in a cluster the other nodes get the message once each with
        the names of those topics (:meth:`deliver_broadcast`)."""
        self.stats.published += 1
        self.stats.accepted_by[message.protocol] += 1
        names = self._publishable(sender)
        peers = self._members_of(names)
        peers.pop(sender, None)
        delivered = self._route([message], None, None, None, by_format(peers))
        if self._forward is not None and names:
            self.engine.broadcast(message, names)
        return delivered

    def deliver_broadcast(self, message: Message, names: Iterable[bytes]) -> int:
        """Deliver a broadcast ``message`` another node accepted to this node's members of the
        topics ``names`` (its sender's), once each.  The access policy is applied again here
        to each topic, by the message's principal, so a node with the same policy reaches
        exactly the topics the sender's node did; returns the deliveries."""
        access = self.access
        if access.policy is not None:
            principal = message.principal if message.principal is not None else NOBODY
            names = [name for name in names if access.allows(principal, name, Perm.PUBLISH)]
        return self._route([message], None, None, None, by_format(self._members_of(names)))


def _render_each(fmt: IWireFormat, messages: list[Message]) -> tuple[bytes | None, list[bytes | None]]:
    """``messages`` rendered one by one for ``fmt`` (its ``render_run`` declined the run): the
    bytes of those it carries, joined (None when it carries none), and each message's bytes
    (None where it cannot carry it)."""
    render = fmt.render_message
    parts = [render(message) for message in messages]
    carried = [part for part in parts if part is not None] if None in parts else parts
    return (b"".join(carried) if carried else None), parts  # type: ignore[arg-type]


"""The live subscriptions: who is subscribed to what, on this node, now.

Topics joined (with presence), topic filters and shared groups, and the presence events they
cause: the tables routing reads (brokerd.core.router) kept and changed in one place, with the
checks every protocol's subscription goes through (the session attached, not already
subscribed, the access list, ``max_subscriptions``) and what the rest of the node is told (the
observer, topic listeners, and the cluster's engine).  Matching is brokerd.core.filters'
(FilterIndex), which the durable subscriptions (brokerd.core.subscriptions) use too.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from brokerd.core.access import AccessControl, Perm
from brokerd.core.filters import filter_problem, has_wildcard
from brokerd.core.subscriptions import ADD, FILTER
from brokerd.errors import AlreadySubscribed, BrokerError, Forbidden, NotSubscribed, SubscriptionLimit
from brokerd.interfaces import IBrokerObserver, ISubscriber, IWireFormat

if TYPE_CHECKING:
    from brokerd.core.durable import DurableService
    from brokerd.core.router import Router
    from brokerd.core.sessions import SessionRegistry
    from brokerd.core.topics import Topic


class LiveSubscriptions:
    """The topics, filters and shared groups of the attached sessions.  It shares its tables
    with ``router`` (``topics``, ``filtered``, ``joined``, and ``filtering``: whether some
    filter has a member) and asks it for the access list and the engine."""

    def __init__(self, registry: SessionRegistry, router: Router, max_subscriptions: int) -> None:
        self.registry = registry
        self.router = router
        self.topics = router.topics
        self.filtered = router.filtered
        self.joined = router.joined
        self.max_subscriptions = max_subscriptions
        self.observer: IBrokerObserver | None = None
        self.durable: DurableService | None = None
        """The durable service (its filter subscriptions count as watched topics)."""
        self.topic_listeners: list[Callable[[bytes, bool], None]] = []
        """Called with (topic, True) when a topic gets its first member and (topic, False)
        when it loses its last (MCCHAT's "" discovery topic uses it)."""
        self.remote_topics_listeners: list[Callable[[], None]] = []
        """Called when a topic appears on or disappears from another node of a cluster (what
        :meth:`active_topics` answers changed; MCCHAT's topic list cache listens)."""

    def is_subscribed(self, session: ISubscriber, topic: bytes) -> bool:
        joined = self.joined.get(session)
        return joined is not None and topic in joined

    def subscriptions(self, session: ISubscriber) -> list[bytes]:
        """The topics ``session`` joined, then the filters it subscribed to, live or (a
        session that is a durable subscriber, named by its ``durable_name``) in the store."""
        found = list(self.joined.get(session, ())) + self.filtered.of(session)
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
        if session not in self.registry:
            raise BrokerError("a session must attach before it subscribes")
        filtered = self.filtered
        if filtered.has(session, topic_filter) if share is None else filtered.has_shared(session, (share, topic_filter)):
            raise AlreadySubscribed(topic_filter)
        access = self.router.access
        if access.policy is not None and not access.allows(session.principal, topic_filter, Perm.SUBSCRIBE):
            raise Forbidden(topic_filter)
        if len(self.joined.get(session, ())) + filtered.count(session) >= self.max_subscriptions:
            raise SubscriptionLimit(topic_filter)
        if share is None:
            filtered.add(session, topic_filter)
        else:
            filtered.add_shared(session, (share, topic_filter))
        self.router.filtering = True
        self._tell_filter_changes()
        if self.observer is not None:
            self.observer.subscribed(session, topic_filter)

    def _tell_filter_changes(self) -> None:
        changes = self.filtered.changes()
        shares = self.filtered.share_changes()
        if self.router.forwards:
            for topic_filter, active in changes:
                self.router.engine.filter_changed(topic_filter, active)
            for key, members in shares:
                self.router.engine.shared_changed(key, members)

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
        self.router.filtering = len(self.filtered) > 0
        self._tell_filter_changes()
        if self.observer is not None:
            self.observer.unsubscribed(session, topic_filter)

    def subscribe(self, session: ISubscriber, name: bytes, presence: bool = False) -> None:
        """Join ``session`` to topic ``name``.  Presence watchers of the topic learn of it;
        with ``presence`` the session gets one event per current member, then live changes.

        Raises AlreadySubscribed, SubscriptionLimit, or Forbidden (the access policy).
        """
        joined = self.joined.get(session)
        if joined is None:
            if session not in self.registry:
                raise BrokerError("a session must attach before it subscribes")
            joined = self.joined[session] = {}
        elif name in joined:
            raise AlreadySubscribed(name)
        access = self.router.access
        if access.policy is not None and not access.allows(session.principal, name, Perm.SUBSCRIBE):
            raise Forbidden(name)
        if len(joined) + (self.router.filtering and self.filtered.count(session)) >= self.max_subscriptions:
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
            if self.router.forwards:
                members += self.router.engine.members(name)
            for member, member_presence in members:
                data = render(name, member, True, member_presence)
                if data is not None:
                    session.send(data)
        topic.add(session, presence)
        joined[name] = topic
        if self.router.forwards:
            self.router.engine.member_changed(name, session, True, presence)
        if created:
            self._tell_topic_listeners(name, True)
        if self.observer is not None:
            self.observer.subscribed(session, name)

    def unsubscribe(self, session: ISubscriber, name: bytes) -> None:
        """Leave topic ``name``; raises NotSubscribed."""
        joined = self.joined.get(session)
        if joined is None or name not in joined:
            raise NotSubscribed(name)
        self._leave(joined.pop(name), session)

    def _leave(self, topic: Topic, session: ISubscriber) -> None:
        topic.remove(session)
        if self.router.forwards:
            self.router.engine.member_changed(topic.name, session, False, False)
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
        if not self.router.forwards:
            return local
        return local + sorted(self.router.engine.topics().difference(local))

    def watched(self, name: bytes) -> bool:
        """Whether a publish to topic ``name`` would reach a subscriber of this node: a
        member of the topic, a topic filter or shared group matching it, or a stored session's
        filter (what the statistics topics ask before they publish a figure)."""
        if self.topics.get(name) is not None:
            return True
        filtered = self.filtered
        if self.router.filtering and (filtered.index.match(name) or filtered.shared.match(name)):
            return True
        durable = self.durable
        return durable is not None and durable.index.has_filter_subscribers(name)

    def leave_all(self, session: ISubscriber) -> None:
        """``session`` detaches: it leaves every topic (presence watchers are told) and filter."""
        joined = self.joined.pop(session, None)
        if joined:
            for topic in joined.values():
                self._leave(topic, session)
        if self.router.filtering:
            for topic_filter in self.filtered.drop(session):
                self._filter_left(session, topic_filter)
            self.router.filtering = len(self.filtered) > 0
            self._tell_filter_changes()

    def revoke(self, access: AccessControl) -> int:
        """A new access list (a reload): take every live subscription it no longer allows off
        its topic or filter at once, telling the session (``subscription_revoked``, when its
        protocol can say so); how many were revoked."""
        revoked = 0
        for session, joined in list(self.joined.items()):
            principal = session.principal
            for name in [name for name in joined if not access.allows(principal, name, Perm.SUBSCRIBE)]:
                self._leave(joined.pop(name), session)
                revoked += 1
                _tell_revoked(session, name)
        for session, filters in self.filtered.subscriptions():
            for topic_filter in [f for f in filters if not access.allows(session.principal, f, Perm.SUBSCRIBE)]:
                self.filtered.remove(session, topic_filter)
                self._filter_left(session, topic_filter)
                revoked += 1
                _tell_revoked(session, topic_filter)
        return revoked


def _tell_revoked(session: ISubscriber, name: bytes) -> None:
    tell = getattr(session, "subscription_revoked", None)
    if tell is not None:
        tell(name)

"""The Broker: the one service every front end talks to.

It knows sessions (ISubscriber "minds"), topics and how to route a Message to them, and
nothing about any wire protocol: a front end parses its protocol, calls the Broker, and the
Broker hands back bytes rendered by each recipient's IWireFormat.  Everything here runs on the
reactor thread and never blocks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from twisted.application.service import Service
from twisted.logger import Logger

from brokerd.core.message import Message
from brokerd.core.topics import Topic, TopicRegistry
from brokerd.errors import AlreadySubscribed, BrokerError, NotSubscribed, SubscriptionLimit
from brokerd.interfaces import IBrokerObserver, ISubscriber, IWireFormat


class BrokerStats:
    """Counters an operator (and the tests) can read; plain ints, cheap to bump."""

    __slots__ = (
        "published",
        "delivered",
        "unrenderable",
        "slow_consumer_drops",
        "connections",
        "refused_connections",
    )

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.unrenderable = 0
        self.slow_consumer_drops = 0
        self.connections = 0
        self.refused_connections = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class Broker(Service):
    """Sessions, topics, routing and fan-out for every protocol.

    ``max_subscriptions`` bounds the topics one session may join; ``max_connections`` bounds
    the connections of all front ends together (see :meth:`admit`).
    """

    name = "broker"
    _log = Logger()

    def __init__(
        self,
        *,
        max_subscriptions: int = 1024,
        max_connections: int = 50_000,
        observer: IBrokerObserver | None = None,
    ) -> None:
        self.max_subscriptions = max_subscriptions
        self.max_connections = max_connections
        self.observer = observer
        self.stats = BrokerStats()
        self.topics = TopicRegistry()
        self._sessions: set[ISubscriber] = set()
        self._addresses: dict[bytes, ISubscriber] = {}
        self._joined: dict[ISubscriber, dict[bytes, Topic]] = {}
        self.topic_listeners: list[Callable[[bytes, bool], None]] = []
        """Called with (topic, True) when a topic gets its first member and (topic, False)
        when it loses its last (MCCHAT's "" discovery topic uses it)."""

    def stopService(self):
        """Detach every session still connected, so their topics are left and the event log
        (stopped after the broker) records their logout."""
        super().stopService()
        for session in list(self._sessions):
            self.detach(session)

    # ------------------------------------------------------------------ connections

    def admit(self) -> bool:
        """Count a new connection in; False (and counted as refused) when at the limit."""
        stats = self.stats
        if stats.connections >= self.max_connections:
            stats.refused_connections += 1
            return False
        stats.connections += 1
        return True

    def release(self) -> None:
        """Count an admitted connection out."""
        self.stats.connections -= 1

    # ------------------------------------------------------------------ sessions

    def attach(self, session: ISubscriber) -> None:
        """Register a logged-in session; an older session with the same address is detached
        and told to close (SSMP: "the server MUST close any previous connection")."""
        self._sessions.add(session)
        address = session.address
        if address is not None:
            previous = self._addresses.get(address)
            self._addresses[address] = session
            if previous is not None and previous is not session:
                self.detach(previous)
                previous.replaced()
        if self.observer is not None:
            self.observer.session_attached(session)

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
        address = session.address
        if address is not None and self._addresses.get(address) is session:
            del self._addresses[address]
        if self.observer is not None:
            self.observer.session_detached(session)

    def sessions(self) -> list[ISubscriber]:
        """Every attached session."""
        return list(self._sessions)

    def session_for(self, address: bytes) -> ISubscriber | None:
        return self._addresses.get(address)

    # ------------------------------------------------------------------ subscriptions

    def is_subscribed(self, session: ISubscriber, topic: bytes) -> bool:
        joined = self._joined.get(session)
        return joined is not None and topic in joined

    def subscriptions(self, session: ISubscriber) -> list[bytes]:
        return list(self._joined.get(session, ()))

    def subscribe(self, session: ISubscriber, name: bytes, presence: bool = False) -> None:
        """Join ``session`` to topic ``name``.  Presence watchers of the topic learn of it;
        with ``presence`` the session gets one event per current member, then live changes.

        Raises AlreadySubscribed or SubscriptionLimit.
        """
        joined = self._joined.get(session)
        if joined is None:
            if session not in self._sessions:
                raise BrokerError("a session must attach before it subscribes")
            joined = self._joined[session] = {}
        elif name in joined:
            raise AlreadySubscribed(name)
        if len(joined) >= self.max_subscriptions:
            raise SubscriptionLimit(name)
        topic = self.topics.get(name)
        created = topic is None
        if topic is None:
            topic = self.topics.create(name)
        if topic.watchers:
            self._tell_watchers(topic, session, True, presence)
        if presence:
            render = session.wire_format.render_presence
            for member, member_presence in topic.members.items():
                data = render(name, member, True, member_presence)
                if data is not None:
                    session.send(data)
        topic.add(session, presence)
        joined[name] = topic
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

    def active_topics(self) -> list[bytes]:
        """Topics with at least one subscriber."""
        return list(self.topics.active())

    # ------------------------------------------------------------------ routing

    def publish(self, message: Message, exclude: ISubscriber | None = None) -> int:
        """Deliver a multicast ``message`` to every member of its topic except ``exclude``;
        return how many sessions it was handed to.  Rendered once per wire format."""
        stats = self.stats
        stats.published += 1
        topic = self.topics.get(message.target)  # type: ignore[arg-type]
        if topic is None:
            if self.observer is not None:
                self.observer.message_routed(message, 0, 0)
            return 0
        delivered = unrenderable = 0
        skip_sender = exclude is not None and exclude in topic.members
        for fmt, members in topic.fanout():
            data = fmt.render_message(message)
            if data is None:
                unrenderable += len(members) - (skip_sender and exclude.wire_format is fmt)  # type: ignore[union-attr]
                continue
            if skip_sender:
                for member in members:
                    if member is not exclude:
                        member.send(data)
                        delivered += 1
            else:
                for member in members:
                    member.send(data)
                delivered += len(members)
        stats.delivered += delivered
        stats.unrenderable += unrenderable
        if self.observer is not None:
            self.observer.message_routed(message, delivered, unrenderable)
        return delivered

    def publish_batch(self, messages: list[Message], exclude: ISubscriber | None = None) -> int:
        """Deliver consecutive multicast ``messages`` that all go to one topic, in order.

        The front end hands over a run it read in one go; each recipient gets the run as one
        write (the rendered messages joined), which is what makes fan-out cheap in CPython.
        Returns the number of (message, recipient) deliveries.
        """
        stats = self.stats
        stats.published += len(messages)
        topic = self.topics.get(messages[0].target)  # type: ignore[arg-type]
        delivered = unrenderable = reached = 0
        dropped: list[int] | None = None  # per message, once some format cannot carry one
        if topic is not None:
            skip_sender = exclude is not None and exclude in topic.members
            for fmt, members in topic.fanout():
                render = fmt.render_message
                parts = [render(message) for message in messages]
                recipients = len(members) - (skip_sender and exclude.wire_format is fmt)  # type: ignore[union-attr]
                reached += recipients
                if None in parts:
                    if dropped is None:
                        dropped = [0] * len(messages)
                    for index, part in enumerate(parts):
                        if part is None:
                            dropped[index] += recipients
                    parts = [part for part in parts if part is not None]
                    unrenderable += (len(messages) - len(parts)) * recipients
                if not parts:
                    continue
                data = b"".join(parts)
                count = 0
                for member in members:
                    if member is not exclude:
                        member.send(data)
                        count += 1
                delivered += count * len(parts)
            stats.delivered += delivered
            stats.unrenderable += unrenderable
        if self.observer is not None:
            if dropped is None:
                self.observer.messages_routed(messages, reached, 0)
            else:
                self._report_uneven_run(messages, reached, dropped)
        return delivered

    def _report_uneven_run(self, messages: list[Message], reached: int, dropped: list[int]) -> None:
        """Some recipients could not be sent some messages of a run: report each stretch of
        messages that reached the same number of sessions as a run of its own, so the event
        log counts every message's fan-out right."""
        start = 0
        for end in range(1, len(messages) + 1):
            if end == len(messages) or dropped[end] != dropped[start]:
                self.observer.messages_routed(messages[start:end], reached - dropped[start], dropped[start])  # type: ignore[union-attr]
                start = end

    def unicast(self, message: Message) -> bool:
        """Deliver ``message`` to the session at address ``message.target``; False when no
        session has that address."""
        recipient = self._addresses.get(message.target)  # type: ignore[arg-type]
        if recipient is None:
            return False
        self.stats.published += 1
        data = recipient.wire_format.render_message(message)
        if data is None:
            self.stats.unrenderable += 1
            delivered, dropped = 0, 1
        else:
            recipient.send(data)
            self.stats.delivered += 1
            delivered, dropped = 1, 0
        if self.observer is not None:
            self.observer.message_routed(message, delivered, dropped)
        return True

    def peers_of(self, session: ISubscriber) -> list[ISubscriber]:
        """Every other session sharing at least one topic with ``session``, each once."""
        peers: dict[ISubscriber, None] = {}
        for topic in self._joined.get(session, {}).values():
            peers.update(dict.fromkeys(topic.members))
        peers.pop(session, None)
        return list(peers)

    def broadcast(self, message: Message, sender: ISubscriber) -> int:
        """Deliver ``message`` once to each peer sharing a topic with ``sender``."""
        self.stats.published += 1
        unrenderable = self.stats.unrenderable
        delivered = self._render_and_send(message, self.peers_of(sender))
        if self.observer is not None:
            self.observer.message_routed(message, delivered, self.stats.unrenderable - unrenderable)
        return delivered

    def _render_and_send(self, message: Message, recipients: Iterable[ISubscriber]) -> int:
        rendered: dict[IWireFormat, bytes | None] = {}
        delivered = 0
        for recipient in recipients:
            fmt = recipient.wire_format
            if fmt in rendered:
                data = rendered[fmt]
            else:
                data = rendered[fmt] = fmt.render_message(message)
            if data is None:
                self.stats.unrenderable += 1
                continue
            recipient.send(data)
            delivered += 1
        self.stats.delivered += delivered
        return delivered

"""The topic registry: who is subscribed to what, arranged for fast fan-out.

Routing asks one question per publish: "which sessions, grouped by wire format?".  A Topic
answers it from a tuple it rebuilds only after its membership changed, so a publish renders
once per wire format and then loops over a tuple of sessions, and a session that drops out
while a fan-out is running cannot disturb the loop.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from brokerd.interfaces import ISubscriber, IWireFormat

FanOut = tuple[tuple[IWireFormat, tuple[ISubscriber, ...]], ...]


def by_format(sessions: Iterable[ISubscriber]) -> FanOut:
    """``sessions`` grouped by wire format, each group in the order given (formats in the
    order of their first session): what a fan-out renders once and sends to each."""
    groups: dict[IWireFormat, list[ISubscriber]] = {}
    for session in sessions:
        groups.setdefault(session.wire_format, []).append(session)
    return tuple((fmt, tuple(members)) for fmt, members in groups.items())


class Topic:
    """The members of one topic and which of them watch its presence."""

    __slots__ = ("name", "members", "watchers", "grouped")

    def __init__(self, name: bytes) -> None:
        self.name = name
        # member -> whether it subscribed with presence; insertion order = subscription order,
        # which is the order of the initial presence batch.
        self.members: dict[ISubscriber, bool] = {}
        self.watchers: dict[ISubscriber, None] = {}
        self.grouped: FanOut | None = None
        """The members grouped by wire format, None after a change of membership until
        :meth:`fanout` groups them again: a publish reads it first, saving the call."""

    def add(self, member: ISubscriber, presence: bool) -> None:
        self.members[member] = presence
        if presence:
            self.watchers[member] = None
        self.grouped = None

    def remove(self, member: ISubscriber) -> None:
        del self.members[member]
        self.watchers.pop(member, None)
        self.grouped = None

    def fanout(self) -> FanOut:
        """The members grouped by wire format (cached until membership changes)."""
        fanout = self.grouped
        if fanout is None:
            fanout = self.grouped = by_format(self.members)
        return fanout

    def __len__(self) -> int:
        return len(self.members)


class TopicRegistry:
    """Topics by name; a topic exists while it has at least one member."""

    def __init__(self) -> None:
        self._topics: dict[bytes, Topic] = {}
        self.get: Callable[[bytes], Topic | None] = self._topics.get
        """The topic called ``name``, or None: the dict's own lookup, with no Python call in
        front of it (every publish asks)."""

    def create(self, name: bytes) -> Topic:
        """A new topic ``name`` (the caller found none: the Broker looks it up first)."""
        topic = self._topics[name] = Topic(name)
        return topic

    def discard(self, topic: Topic) -> None:
        """Forget ``topic`` (the Broker does when its last member left)."""
        self._topics.pop(topic.name, None)

    def active(self) -> Iterator[bytes]:
        """Names of topics with at least one member, in creation order."""
        return iter(list(self._topics))

    def __len__(self) -> int:
        return len(self._topics)

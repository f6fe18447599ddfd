"""The topic registry: who is subscribed to what, arranged for fast fan-out.

Routing asks one question per publish: "which sessions, grouped by wire format?".  A Topic
answers it from a tuple it rebuilds only after its membership changed, so a publish renders
once per wire format and then loops over a tuple of sessions, and a session that drops out
while a fan-out is running cannot disturb the loop.
"""
from __future__ import annotations

from collections.abc import Iterator

from brokerd.interfaces import ISubscriber, IWireFormat

FanOut = tuple[tuple[IWireFormat, tuple[ISubscriber, ...]], ...]


class Topic:
    """The members of one topic and which of them watch its presence."""

    __slots__ = ("name", "members", "watchers", "_fanout")

    def __init__(self, name: bytes) -> None:
        self.name = name
        # member -> whether it subscribed with presence; insertion order = subscription order,
        # which is the order of the initial presence batch.
        self.members: dict[ISubscriber, bool] = {}
        self.watchers: dict[ISubscriber, None] = {}
        self._fanout: FanOut | None = None

    def add(self, member: ISubscriber, presence: bool) -> None:
        self.members[member] = presence
        if presence:
            self.watchers[member] = None
        self._fanout = None

    def remove(self, member: ISubscriber) -> None:
        del self.members[member]
        self.watchers.pop(member, None)
        self._fanout = None

    def fanout(self) -> FanOut:
        """The members grouped by wire format (cached until membership changes)."""
        fanout = self._fanout
        if fanout is None:
            groups: dict[IWireFormat, list[ISubscriber]] = {}
            for member in self.members:
                groups.setdefault(member.wire_format, []).append(member)
            fanout = self._fanout = tuple((fmt, tuple(ms)) for fmt, ms in groups.items())
        return fanout

    def __len__(self) -> int:
        return len(self.members)


class TopicRegistry:
    """Topics by name; a topic exists while it has at least one member."""

    def __init__(self) -> None:
        self._topics: dict[bytes, Topic] = {}

    def get(self, name: bytes) -> Topic | None:
        return self._topics.get(name)

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

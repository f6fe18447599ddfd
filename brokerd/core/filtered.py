"""Subscriptions to topic filters (``sensors/+/temp``, ``sensors/#``) beside topic members.

A message published to topic T reaches T's members and the members of every filter matching
T (brokerd.core.filters), each session once, whoever published it.  The Broker asks
:meth:`FilterSubscriptions.fanout` only while some filter has a member: with none, routing
pays one attribute test.  The combined fan-out of a topic name is kept until the topic's
membership changes (its ``Topic.grouped`` is rebuilt) or any filter or the access policy
changes, so a steady stream to one topic groups its recipients once.

Access is one model for every protocol: the access list is asked whether the principal may
subscribe to the filter's text when it subscribes (a rule for ``sensors/#`` allows exactly
that filter), and again, for each topic the filter would deliver, whether it may subscribe to
that topic: a filter never carries a topic its principal could not subscribe to by name.
"""
from __future__ import annotations

from collections.abc import Iterable

from brokerd.core.access import AccessControl, Perm
from brokerd.core.filters import FilterIndex
from brokerd.core.topics import FanOut, Topic, by_format
from brokerd.interfaces import ISubscriber

MAX_REMEMBERED = 4096
"""Topic names whose combined fan-out is kept at most (then the memory starts again)."""


class FilterSubscriptions:
    """Who subscribed to which filter, and the fan-out of a topic with them."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.index = FilterIndex(max_remembered)
        self._of: dict[ISubscriber, dict[bytes, None]] = {}
        self._fanouts: dict[bytes, tuple[FanOut | None, FanOut, frozenset[ISubscriber]]] = {}
        self.max_remembered = max_remembered

    def __len__(self) -> int:
        """Filters with at least one member."""
        return len(self.index)

    def of(self, session: ISubscriber) -> list[bytes]:
        """The filters ``session`` subscribed to, in subscription order."""
        return list(self._of.get(session, ()))

    def count(self, session: ISubscriber) -> int:
        return len(self._of.get(session, ()))

    def has(self, session: ISubscriber, topic_filter: bytes) -> bool:
        return topic_filter in self._of.get(session, ())

    def add(self, session: ISubscriber, topic_filter: bytes) -> None:
        self._of.setdefault(session, {})[topic_filter] = None
        self.index.add(topic_filter, session)
        self._fanouts.clear()

    def remove(self, session: ISubscriber, topic_filter: bytes) -> None:
        filters = self._of.get(session)
        if filters is not None:
            filters.pop(topic_filter, None)
            if not filters:
                del self._of[session]
        self.index.discard(topic_filter, session)
        self._fanouts.clear()

    def drop(self, session: ISubscriber) -> list[bytes]:
        """Take every filter of ``session`` away (it detached); returns them."""
        filters = list(self._of.pop(session, ()))
        for topic_filter in filters:
            self.index.discard(topic_filter, session)
        if filters:
            self._fanouts.clear()
        return filters

    def subscriptions(self) -> Iterable[tuple[ISubscriber, list[bytes]]]:
        """(session, its filters) for every session with one (a policy reload walks them)."""
        return [(session, list(filters)) for session, filters in self._of.items()]

    def forget_answers(self) -> None:
        """The access policy changed: no combined fan-out is reused."""
        self._fanouts.clear()

    def fanout(self, name: bytes, topic: Topic | None, access: AccessControl) -> tuple[FanOut, frozenset[ISubscriber]]:
        """The sessions a message to topic ``name`` reaches, grouped by wire format (the
        topic's members first, then each filter member not among them that the access policy
        lets subscribe to ``name``), and the same sessions as a set."""
        grouped = None if topic is None else topic.fanout()
        remembered = self._fanouts.get(name)
        if remembered is not None and remembered[0] is grouped:
            return remembered[1], remembered[2]
        members: dict[ISubscriber, None] = dict.fromkeys(topic.members) if topic is not None else {}
        guarded = access.policy is not None
        for session in self.index.match(name):
            if session not in members and (not guarded or access.allows(session.principal, name, Perm.SUBSCRIBE)):
                members[session] = None  # type: ignore[index]
        if len(self._fanouts) >= self.max_remembered:
            self._fanouts.clear()
        answer = self._fanouts[name] = (grouped, by_format(members), frozenset(members))
        return answer[1], answer[2]

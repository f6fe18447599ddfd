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

Shared subscriptions (MQTT's ``$share/{group}/{filter}``): the sessions that subscribed to one
filter under one group name form a :class:`SharedGroup`, and a message to a topic the filter
matches reaches one of them, in turn (a run of messages, one publisher's read, goes to one
member whole), skipping a member the access policy does not let read the topic.  A member that
also has its own subscription matching the topic gets the message once.  In a cluster a group
spans the nodes: :meth:`FilterSubscriptions.fanout` is told which groups this node serves for a
message (``groups``), the cluster's engine having chosen one node per group
(brokerd.cluster.sharing).
"""
from __future__ import annotations

from collections.abc import Iterable

from brokerd.core.access import AccessControl, Perm
from brokerd.core.filters import FilterIndex
from brokerd.core.topics import FanOut, Topic, by_format
from brokerd.interfaces import ISubscriber

MAX_REMEMBERED = 4096
"""Topic names whose combined fan-out is kept at most (then the memory starts again)."""

SharedKey = tuple[bytes, bytes]
"""(group name, filter) of a shared subscription."""


class SharedGroup:
    """The members of one shared subscription; each message goes to one of them."""

    __slots__ = ("_turn", "key", "members")

    def __init__(self, key: SharedKey) -> None:
        self.key = key
        self.members: list[ISubscriber] = []
        self._turn = 0

    def pick(self, name: bytes, access: AccessControl) -> ISubscriber | None:
        """The member whose turn it is and who may read topic ``name``; None when none may."""
        members = self.members
        count = len(members)
        guarded = access.policy is not None
        for step in range(count):
            member = members[(self._turn + step) % count]
            if not guarded or access.allows(member.principal, name, Perm.SUBSCRIBE):
                self._turn = (self._turn + step + 1) % count
                return member
        return None


class FilterSubscriptions:
    """Who subscribed to which filter, and the fan-out of a topic with them."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.index: FilterIndex[ISubscriber] = FilterIndex(max_remembered)
        self._of: dict[ISubscriber, dict[bytes, None]] = {}
        self._fanouts: dict[bytes, tuple[FanOut | None, FanOut, frozenset[ISubscriber]]] = {}
        self.max_remembered = max_remembered
        self.shared: FilterIndex[SharedGroup] = FilterIndex(max_remembered)
        """The shared groups (SharedGroup) by their filter."""
        self._groups: dict[SharedKey, SharedGroup] = {}
        self._shared_of: dict[ISubscriber, dict[SharedKey, None]] = {}
        self.counts: dict[bytes, int] = {}
        """Plain subscriptions per filter: what a cluster's other nodes are told (a filter that
        appears or goes, see :meth:`changes`), so that they send this node the runs of the
        topics it matches.  Shared groups are told apart (:meth:`share_changes`): a run reaches
        a group's node only when that node was chosen for it."""
        self._changed: list[tuple[bytes, bool]] = []
        self._shares_changed: dict[SharedKey, None] = {}

    def _count(self, topic_filter: bytes, step: int) -> None:
        count = self.counts.get(topic_filter, 0) + step
        if count > 0:
            self.counts[topic_filter] = count
            if count == 1 and step > 0:
                self._changed.append((topic_filter, True))
        else:
            self.counts.pop(topic_filter, None)
            self._changed.append((topic_filter, False))

    def changes(self) -> list[tuple[bytes, bool]]:
        """(filter, active) for each filter that got its first subscription or lost its last
        since the previous call."""
        changed, self._changed = self._changed, []
        return changed

    def share_changes(self) -> list[tuple[SharedKey, int]]:
        """(group key, members here) for each shared group whose members changed since the
        previous call (0: the group has none left here)."""
        changed, self._shares_changed = self._shares_changed, {}
        return [(key, self.group_size(key)) for key in changed]

    def group_size(self, key: SharedKey) -> int:
        group = self._groups.get(key)
        return 0 if group is None else len(group.members)

    def group(self, key: SharedKey) -> SharedGroup | None:
        return self._groups.get(key)

    def groups(self) -> list[tuple[SharedKey, int]]:
        """(group key, members here) of every shared group with members on this node."""
        return [(key, len(group.members)) for key, group in self._groups.items()]

    def __len__(self) -> int:
        """Filters and shared groups with at least one member."""
        return len(self.index) + len(self._groups)

    def of(self, session: ISubscriber) -> list[bytes]:
        """The filters ``session`` subscribed to, in subscription order."""
        return list(self._of.get(session, ()))

    def count(self, session: ISubscriber) -> int:
        return len(self._of.get(session, ())) + len(self._shared_of.get(session, ()))

    def has_shared(self, session: ISubscriber, key: SharedKey) -> bool:
        return key in self._shared_of.get(session, ())

    def add_shared(self, session: ISubscriber, key: SharedKey) -> None:
        """``session`` joins the shared group ``key`` (made with its first member)."""
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = SharedGroup(key)
            self.shared.add(key[1], group)
        group.members.append(session)
        self._shared_of.setdefault(session, {})[key] = None
        self._shares_changed[key] = None

    def remove_shared(self, session: ISubscriber, key: SharedKey) -> None:
        keys = self._shared_of.get(session)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._shared_of[session]
        group = self._groups.get(key)
        if group is not None and session in group.members:
            group.members.remove(session)
            self._shares_changed[key] = None
            if not group.members:
                del self._groups[key]
                self.shared.discard(key[1], group)

    def shared_of(self, session: ISubscriber) -> list[SharedKey]:
        return list(self._shared_of.get(session, ()))

    def has(self, session: ISubscriber, topic_filter: bytes) -> bool:
        return topic_filter in self._of.get(session, ())

    def add(self, session: ISubscriber, topic_filter: bytes) -> None:
        self._of.setdefault(session, {})[topic_filter] = None
        if self.index.add(topic_filter, session):
            self._count(topic_filter, 1)
        self._fanouts.clear()

    def remove(self, session: ISubscriber, topic_filter: bytes) -> None:
        filters = self._of.get(session)
        if filters is not None:
            filters.pop(topic_filter, None)
            if not filters:
                del self._of[session]
        if self.index.discard(topic_filter, session):
            self._count(topic_filter, -1)
        self._fanouts.clear()

    def drop(self, session: ISubscriber) -> list[bytes]:
        """Take every filter of ``session`` away (it detached); returns them."""
        filters = list(self._of.pop(session, ()))
        for topic_filter in filters:
            if self.index.discard(topic_filter, session):
                self._count(topic_filter, -1)
        if filters:
            self._fanouts.clear()
        for key in self.shared_of(session):
            self.remove_shared(session, key)
        return filters

    def subscriptions(self) -> Iterable[tuple[ISubscriber, list[bytes]]]:
        """(session, its filters) for every session with one (a policy reload walks them)."""
        return [(session, list(filters)) for session, filters in self._of.items()]

    def forget_answers(self) -> None:
        """The access policy changed: no combined fan-out is reused."""
        self._fanouts.clear()

    def fanout(self, name: bytes, topic: Topic | None, access: AccessControl,
               groups: frozenset[SharedKey] | None = None) -> tuple[FanOut, frozenset[ISubscriber]]:
        """The sessions a message to topic ``name`` reaches, grouped by wire format (the
        topic's members first, then each filter member not among them that the access policy
        lets subscribe to ``name``, then one member of each shared group), and the same
        sessions as a set.  ``groups``: the shared groups this node serves for this message
        (a cluster's choice; None: every one, as on a single node)."""
        grouped = None if topic is None else topic.fanout()
        remembered = self._fanouts.get(name)
        if remembered is None or remembered[0] is not grouped:
            remembered = self._combine(name, topic, grouped, access)
        if not self._groups or (groups is not None and not groups):
            return remembered[1], remembered[2]
        reached = remembered[2]
        picked = [member for member in (group.pick(name, access) for group in self.shared.match(name)
                                        if groups is None or group.key in groups)
                  if member is not None and member not in reached]
        if not picked:
            return remembered[1], reached
        members = dict.fromkeys(reached)
        members.update(dict.fromkeys(picked))
        return by_format(members), frozenset(members)

    def _combine(self, name: bytes, topic: Topic | None, grouped: FanOut | None,
                 access: AccessControl) -> tuple[FanOut | None, FanOut, frozenset[ISubscriber]]:
        members: dict[ISubscriber, None] = dict.fromkeys(topic.members) if topic is not None else {}
        guarded = access.policy is not None
        for session in self.index.match(name):
            if session not in members and (not guarded or access.allows(session.principal, name, Perm.SUBSCRIBE)):
                members[session] = None
        if len(self._fanouts) >= self.max_remembered:
            self._fanouts.clear()
        answer = self._fanouts[name] = (grouped, by_format(members), frozenset(members))
        return answer

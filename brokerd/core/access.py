"""Topic permissions, checked by the core for every protocol.

The policy itself (which principal may do what where) is an :class:`IAccessPolicy` the core
is handed (brokerd.auth.policy reads it from the UAL file); the core only asks it, through
:class:`AccessControl`, which caches each decision per (principal, topic).  A broker without
an access list has no policy at all, and then nothing here runs on the hot path: the Broker
tests ``access.policy is not None`` before anything else.

One rule holds with or without a policy: nothing but the broker itself (a SERVICE principal)
publishes under ``~sys`` (:func:`system_topic`), where the broker's statistics are; the
front ends test a topic's first byte for ``~`` before asking, so other topics pay nothing.

Decisions are taken when a session subscribes (so fan-out loops never ask) and when it
publishes or sends a unicast (a dict hit after the first time).  A new policy replaces the
cache, and the Broker revalidates every live subscription against it.
"""
from __future__ import annotations

import enum

from brokerd.core.principal import SERVICE, Principal
from brokerd.interfaces import IAccessPolicy


class Perm(enum.Flag):
    """What a principal may do on a topic (the letters of the UAL file)."""

    NONE = 0
    PUBLISH = enum.auto()
    SUBSCRIBE = enum.auto()
    ADMINISTER = enum.auto()
    CREATE = enum.auto()
    """Create, rename and remove topics at or below (in a stored topic tree)."""
    REPLY = enum.auto()
    """Reply to messages received from the topic."""


ALL = Perm.PUBLISH | Perm.SUBSCRIBE | Perm.ADMINISTER | Perm.CREATE | Perm.REPLY

INBOX_PREFIX = b"accounts/"
"""A unicast to a session is a publish to its principal's login topic
(``/accounts/<name>``): the sender needs publish permission there."""

SYSTEM_TOPICS = b"~sys"
"""The broker's own topic tree (brokerd.admin.systopics publishes its statistics there)."""
SYSTEM_MARK = SYSTEM_TOPICS[0]
"""The first byte of a system topic, as an int: ``topic[0] == SYSTEM_MARK`` is the hot paths'
cheap test before :func:`system_topic`."""


def system_topic(topic: bytes) -> bool:
    """Whether ``topic`` is ``~sys`` or below it (any case: ``~SYS/x`` reads the same)."""
    head = topic[:5].lower()
    return head == SYSTEM_TOPICS or head == SYSTEM_TOPICS + b"/"


MAX_CACHED_DECISIONS = 65_536
"""Decisions kept before the cache starts over (memory stays bounded however many
principals and topics come and go)."""


def inbox(principal: Principal) -> bytes:
    """The topic a unicast to a session of ``principal`` is checked against."""
    return INBOX_PREFIX + principal.name.lower().encode("utf-8", "replace")


class AccessControl:
    """The current policy (None: everything is allowed) and its cached decisions."""

    __slots__ = ("policy", "_cache")

    def __init__(self, policy: IAccessPolicy | None = None) -> None:
        self.policy = policy
        self._cache: dict[tuple[Principal, bytes], Perm] = {}

    def permissions(self, principal: Principal, topic: bytes) -> Perm:
        policy = self.policy
        if principal.realm == SERVICE:
            return ALL
        if topic[:1] == SYSTEM_TOPICS[:1] and system_topic(topic):
            granted = ALL if policy is None else self._decide(policy, principal, topic)
            return granted & ~Perm.PUBLISH
        if policy is None:
            return ALL
        return self._decide(policy, principal, topic)

    def _decide(self, policy: IAccessPolicy, principal: Principal, topic: bytes) -> Perm:
        key = (principal, topic)
        cache = self._cache
        perms = cache.get(key)
        if perms is None:
            if len(cache) >= MAX_CACHED_DECISIONS:
                cache.clear()
            perms = cache[key] = policy.permissions(principal, topic)
        return perms

    def allows(self, principal: Principal, topic: bytes, wanted: Perm) -> bool:
        return wanted in self.permissions(principal, topic)

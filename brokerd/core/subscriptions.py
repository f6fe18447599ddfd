"""Durable subscriptions in memory: who is subscribed to what, matched per topic.

The store keeps every subscription (it outlives the connection); this index is loaded from
it at start-up and changed together with it, so a publish finds its subscribers without a
read, and :meth:`SubscriptionIndex.has_subscribers` answers the question every publish of
every protocol asks ("is this topic durable?") from a cache.  Subscribers are named as
brokerd.core.subscriber says.  A topic subscription names a topic key (``stocks/ibm``) or a wildcard:
a base key and a pattern for the last component (stored as ``stocks/quotes/*``; the root's as
``/*``).

A ``FILTER`` subscription (MQTT's persistent sessions, named by
:class:`brokerd.core.subscriber.SubscriberId`) names a topic filter of the core's
(brokerd.core.filters: ``+`` one level, ``#`` the rest) and covers every core topic it
matches, whether or not the stored topic tree has it.  It collects messages only when it takes
``ADD`` (its other ``changes`` are its front end's options, kept with it); one without is only
remembered, for its session to find again.

A wildcard covers every topic below its base, at any depth, whose own name matches the
pattern (``*``: all of them); TOPIC subscriptions cover the base itself too (the draft:
"changes to the topic and its children").
"""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from brokerd.core.filters import FilterIndex
from brokerd.store.records import SubscriptionRecord

MESSAGE, TOPIC, SUBSCRIBERS = "MESSAGE", "TOPIC", "SUBSCRIBERS"
FILTER = "FILTER"
"""A subscription to a core topic filter (see the module docstring)."""
ADD = "ADD"
"""The change a new message makes to its topic (the one durable subscribers are told of)."""


def stored_topic(key: str, pattern: str | None) -> str:
    """The store's form of a subscription topic."""
    if pattern is None:
        return key
    return f"{key}/{pattern}" if key else f"/{pattern}"


def split_topic(topic: str) -> tuple[str, str | None]:
    """``(base key, pattern or None)`` of a stored subscription topic."""
    base, _slash, last = topic.rpartition("/")
    if "*" in last:
        return base, last
    return topic, None


def wildcard_covers(base: str, pattern: str, key: str) -> bool:
    """Whether the wildcard ``base/pattern`` covers topic ``key``: a topic anywhere below
    ``base`` whose last segment matches ``pattern`` (``*`` matches every one)."""
    if base and not key.startswith(base + "/"):
        return False
    return bool(key) and (pattern == "*" or fnmatch.fnmatchcase(key.rsplit("/", 1)[-1], pattern))


@dataclass(frozen=True)
class Subscription:
    record: SubscriptionRecord
    base: str
    pattern: str | None

    @property
    def subscriber(self) -> str:
        return self.record.subscriber

    def covers(self, key: str) -> bool:
        if self.record.kind == FILTER:
            return False  # matched by the index's FilterIndex, never by the topic rules
        if self.pattern is None:
            return key == self.base
        if self.record.kind == TOPIC and key == self.base:
            return True
        return wildcard_covers(self.base, self.pattern.lower(), key)

    def wants(self, change: str) -> bool:
        return change in self.record.changes


_COVERED_LIMIT = 65_536
"""Topics whose answer :meth:`SubscriptionIndex.has_subscribers` remembers (emptied when full)."""


class SubscriptionIndex:
    def __init__(self) -> None:
        self._of: dict[str, dict[tuple[str, str], Subscription]] = {}
        self._exact: dict[tuple[str, str], dict[str, Subscription]] = {}
        self._wild: dict[str, dict[tuple[str, str], Subscription]] = {}
        self._covered: dict[bytes, bool] = {}
        """Core topic -> whether a MESSAGE subscription covers it; emptied on every change."""
        self._filters: FilterIndex[Subscription] = FilterIndex()
        """The FILTER subscriptions that collect messages (take ADD), by filter."""

    def has_subscribers(self, topic: bytes) -> bool:
        """Whether any MESSAGE subscription covers core topic ``topic`` (bytes, as the core
        routes it; a name that is not UTF-8 names no durable topic).  A dict lookup for a
        topic seen since the subscriptions last changed."""
        covered = self._covered.get(topic)
        if covered is None:
            if len(self._covered) >= _COVERED_LIMIT:
                self._covered.clear()
            try:
                key = topic.decode("utf-8")
            except UnicodeDecodeError:
                key = None
            covered = self._covered[topic] = key is not None and bool(self.matching(MESSAGE, key))
        return covered

    def has_filter_subscribers(self, topic: bytes) -> bool:
        """Whether a FILTER subscription that collects messages matches core topic ``topic``
        (the FilterIndex caches its answers)."""
        return len(self._filters) > 0 and bool(self._filters.match(topic))

    def load(self, records: Iterable[SubscriptionRecord]) -> None:
        for record in records:
            self.add(record)

    def replace(self, records: Iterable[SubscriptionRecord]) -> None:
        """Forget every subscription and load ``records`` (the whole store, read again)."""
        self._of.clear()
        self._exact.clear()
        self._wild.clear()
        self._covered.clear()
        self._filters = FilterIndex()
        self.load(records)

    def add(self, record: SubscriptionRecord) -> Subscription:
        """Add or replace (same subscriber, kind and topic)."""
        self.remove(record.subscriber, record.kind, record.topic)
        self._covered.clear()
        base, pattern = split_topic(record.topic)
        sub = Subscription(record, base, pattern)
        self._of.setdefault(record.subscriber, {})[(record.kind, record.topic)] = sub
        if record.kind == FILTER:
            if ADD in record.changes:
                self._filters.add(record.topic.encode("utf-8"), sub)
        elif pattern is None:
            self._exact.setdefault((record.kind, base), {})[record.subscriber] = sub
        else:
            self._wild.setdefault(record.kind, {})[(record.subscriber, record.topic)] = sub
        return sub

    def remove(self, subscriber: str, kind: str, topic: str) -> Subscription | None:
        mine = self._of.get(subscriber)
        sub = mine.pop((kind, topic), None) if mine else None
        if sub is None:
            return None
        self._covered.clear()
        if not mine:
            del self._of[subscriber]
        if kind == FILTER:
            self._filters.discard(topic.encode("utf-8"), sub)
        elif sub.pattern is None:
            exact = self._exact.get((kind, sub.base), {})
            exact.pop(subscriber, None)
            if not exact:
                self._exact.pop((kind, sub.base), None)
        else:
            self._wild.get(kind, {}).pop((subscriber, topic), None)
        return sub

    def get(self, subscriber: str, kind: str, topic: str) -> Subscription | None:
        return self._of.get(subscriber, {}).get((kind, topic))

    def of(self, subscriber: str) -> list[Subscription]:
        """A subscriber's subscriptions, by kind and topic."""
        return [sub for _key, sub in sorted(self._of.get(subscriber, {}).items())]

    def subscribers_named(self, prefix: str) -> list[str]:
        """The subscribers whose names start with ``prefix`` (a session's incarnations,
        SubscriberId.session_prefix): one pass over the subscribers."""
        return [name for name in self._of if name.startswith(prefix)]

    def count_of(self, subscriber: str) -> int:
        return len(self._of.get(subscriber, ()))

    def matching(self, kind: str, key: str) -> list[Subscription]:
        """Every subscription of ``kind`` that covers topic ``key`` (for FILTER: that
        collects messages and matches it)."""
        if kind == FILTER:
            return list(self._filters.match(key.encode("utf-8"))) if len(self._filters) else []
        found = list(self._exact.get((kind, key), {}).values())
        for sub in self._wild.get(kind, {}).values():
            if sub.covers(key):
                found.append(sub)
        return found

    def based_on(self, keys: Iterable[str]) -> list[Subscription]:
        """Every subscription (any kind, any subscriber) whose topic, or wildcard base, is
        one of ``keys`` or below one of them (REMOVE TOPIC drops these)."""
        roots = set(keys)
        found = []
        for mine in self._of.values():
            for sub in mine.values():
                if sub.record.kind == FILTER:
                    continue  # a filter names no stored topic
                base = sub.base
                while base:
                    if base in roots:
                        found.append(sub)
                        break
                    base = base.rpartition("/")[0]
        return found

    def covered(self, subscriber: str, key: str, kind: str = MESSAGE) -> bool:
        """Whether any of the subscriber's ``kind`` subscriptions covers ``key``."""
        return any(sub.record.kind == kind and sub.covers(key) for sub in self._of.get(subscriber, {}).values())

    def exact_count(self, key: str) -> int:
        """Subscribers with a MESSAGE subscription naming ``key`` itself (NOTIFY SUBSCRIBERS)."""
        return len(self._exact.get((MESSAGE, key), ()))

    def exact_subscribers(self, keys: Iterable[str]) -> set[str]:
        """Subscribers with a MESSAGE subscription naming one of ``keys`` itself (COUNT
        SUBSCRIBERS: each counts once however many of the topics it subscribes to)."""
        found: set[str] = set()
        for key in keys:
            found.update(self._exact.get((MESSAGE, key), ()))
        return found

    def topics(self, kind: str = MESSAGE) -> set[str]:
        """Every topic (a wildcard as stored, ``base/pattern``) that some subscriber has a
        ``kind`` subscription to (server links subscribe to these on other servers)."""
        found = {base for (k, base) in self._exact if k == kind}
        found.update(topic for (_subscriber, topic) in self._wild.get(kind, {}))
        return found

    def account_channels(self, account: str) -> set[str]:
        """``account:channel`` subscribers known for an account."""
        prefix = account + ":"
        return {name for name in self._of if name.startswith(prefix)}

"""Topic filters: one subscription to every topic a pattern names, whoever publishes.

A topic name is levels separated by ``/``.  In a filter, the level ``+`` matches exactly one
level and ``#`` (the last level only) any number of levels, none included: ``sport/#`` matches
``sport``, ``sport/tennis`` and ``sport/tennis/player1``.  A topic whose name starts with ``$``
is not matched by a filter whose first level is a wildcard, so ``#`` does not reach ``$SYS/...``.
These are MQTT's rules (MQTT 5.0 and 3.1.1, section 4.7), kept in brokerd.events.filters so
that the pipeline counts by the same ones; the core routes by them, so that a filter reaches
what every protocol publishes and a front end never matches topics itself.

:class:`FilterIndex` keeps the members of each filter in a tree of levels: the members a topic
reaches are found by walking its levels (an exact child, ``+`` and ``#`` at each), not by
testing every filter, and the answer is remembered per topic name until a filter changes (at
most ``max_cached`` names; then the memory starts again).
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from brokerd.events.filters import ANY_LEVELS, ONE_LEVEL, SEPARATOR, SYSTEM, has_wildcard, matches

__all__ = ["ANY_LEVELS", "ONE_LEVEL", "SEPARATOR", "SYSTEM", "FilterIndex", "filter_problem", "has_wildcard",
           "matches"]


def filter_problem(topic_filter: bytes) -> str | None:
    """Why ``topic_filter`` is not a filter :class:`FilterIndex` can hold (empty, a wildcard
    that is not a whole level, ``#`` before the last level), or None.  A front end checks its
    own grammar and limits first (MQTT: brokerd.protocols.mqtt.topics)."""
    if not topic_filter:
        return "topic filter is empty"
    levels = topic_filter.split(SEPARATOR)
    for index, level in enumerate(levels):
        if len(level) > 1 and (ONE_LEVEL in level or ANY_LEVELS in level):
            return "a wildcard must be a whole level"
        if level == ANY_LEVELS and index != len(levels) - 1:
            return "'#' must be the last level"
    return None


Member = TypeVar("Member", bound=Hashable)
"""What a :class:`FilterIndex` holds: sessions for the live subscriptions, subscriber ids or
shared groups elsewhere; one type per index, so :meth:`FilterIndex.match` gives it back typed."""


class _Level(Generic[Member]):
    __slots__ = ("children", "members")

    def __init__(self) -> None:
        self.children: dict[bytes, _Level[Member]] = {}
        self.members: dict[Member, None] = {}
        """Members of the filter that ends at this level, in subscription order."""


class FilterIndex(Generic[Member]):
    """Members (sessions, or any hashable) by topic filter, and the members a topic reaches."""

    def __init__(self, max_cached: int = 4096) -> None:
        self._root: _Level[Member] = _Level()
        self._filters = 0
        self._cache: dict[bytes, tuple[Member, ...]] = {}
        self.max_cached = max_cached
        """Topic names whose answer :meth:`match` remembers at most."""

    def __len__(self) -> int:
        """Filters with at least one member."""
        return self._filters

    def add(self, topic_filter: bytes, member: Member) -> bool:
        """Add ``member`` to ``topic_filter``; False when it was there already."""
        level = self._root
        for name in topic_filter.split(SEPARATOR):
            level = level.children.setdefault(name, _Level())
        if member in level.members:
            return False
        if not level.members:
            self._filters += 1
        level.members[member] = None
        self._cache.clear()
        return True

    def discard(self, topic_filter: bytes, member: Member) -> bool:
        """Take ``member`` out of ``topic_filter``; False when it was not there.  Levels left
        without members or children are dropped."""
        path: list[_Level[Member]] = [self._root]
        for name in topic_filter.split(SEPARATOR):
            level = path[-1].children.get(name)
            if level is None:
                return False
            path.append(level)
        if member not in path[-1].members:
            return False
        del path[-1].members[member]
        if not path[-1].members:
            self._filters -= 1
        names = topic_filter.split(SEPARATOR)
        for index in range(len(names), 0, -1):
            level = path[index]
            if level.members or level.children:
                break
            del path[index - 1].children[names[index - 1]]
        self._cache.clear()
        return True

    def match(self, topic: bytes) -> tuple[Member, ...]:
        """The members of every filter matching the topic name ``topic``, each once, in the
        order of the filters' levels (exact before ``+`` before ``#``) and of subscription."""
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        found: dict[Member, None] = {}
        if self._filters:
            self._walk(self._root, topic.split(SEPARATOR), 0, found, topic[:1] == SYSTEM)
        if len(self._cache) >= self.max_cached:
            self._cache.clear()
        result = self._cache[topic] = tuple(found)
        return result

    def _walk(self, level: _Level[Member], names: list[bytes], index: int, found: dict[Member, None],
              system: bool) -> None:
        wildcards = not (system and index == 0)
        if index == len(names):
            found.update(level.members)
        else:
            child = level.children.get(names[index])
            if child is not None:
                self._walk(child, names, index + 1, found, system)
            child = level.children.get(ONE_LEVEL) if wildcards else None
            if child is not None:
                self._walk(child, names, index + 1, found, system)
        child = level.children.get(ANY_LEVELS) if wildcards else None
        if child is not None:
            found.update(child.members)

    def filters(self) -> Iterator[bytes]:
        """Every filter with members (for statistics and tests)."""
        stack: list[tuple[_Level, tuple[bytes, ...]]] = [(self._root, ())]
        while stack:
            level, names = stack.pop()
            if level.members and names:
                yield SEPARATOR.join(names)
            stack.extend((child, (*names, name)) for name, child in level.children.items())

"""The stored topic tree as durable delivery reads it, on every node that has a store.

A message kept for durable subscribers takes its delivery mode (:data:`EVERY`,
:data:`SINGLE`; :data:`HELD` holds it back) and its default timeout from the topic it is
published to, and the core keeps a publish only for a topic that exists, is no virtual topic
and is no login topic.  This read model answers from the store's topic records on any node,
whichever front ends it runs (docs/architecture.md, "Durable delivery").

It holds the records only.  The front end that owns the tree (its commands, listings,
virtual-topic lookups) changes it through :class:`~brokerd.core.durable.DurableService`,
which writes the store and then this model, and reads another node's changes again
(:meth:`StoredTopics.replace`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from twisted.logger import Logger

from brokerd.store.records import TopicRecord

LOGIN_TOPICS = "accounts"
"""The root of the login topics: they take unicasts only, never another protocol's publish."""
EVERY = "ALL"
"""The delivery mode that gives each message to every durable subscriber of its topic."""
SINGLE = "ONE"
"""The delivery mode that gives each message to one subscriber at a time (competing consumers:
one that refuses it or goes away frees it for another)."""
HELD = "NONE"
"""The delivery mode that holds a topic's messages back in the store.  The three values are
what the store keeps (and what a front end's wire may name them)."""


def parent_key(key: str) -> str:
    """``a/b/c`` -> ``a/b``; ``a`` -> the root ``""``."""
    return key.rpartition("/")[0]


class StoredTopics:
    """Topic records by key, with the durable answers derived from them.

    ``default_timeout`` (seconds; None: messages never expire) applies where no topic on
    the way up sets one.
    """

    _log = Logger()

    def __init__(self, default_timeout: float | None) -> None:
        self.default_timeout = default_timeout
        self._records: dict[str, TopicRecord] = {}
        self.held: set[str] = set()
        """Keys of the topics whose messages stay in the store for now (delivery NONE)."""

    def __len__(self) -> int:
        return len(self._records)

    def records(self) -> list[TopicRecord]:
        return list(self._records.values())

    def get(self, key: str) -> TopicRecord | None:
        return self._records.get(key)

    # ------------------------------------------------------------------ changes

    def replace(self, records: Iterable[TopicRecord]) -> set[str]:
        """The whole tree as read from the store; returns the keys no longer held.  A record
        whose parent is not stored is left out (and logged), so the front end's tree, built
        from :meth:`records`, never sees it."""
        kept: dict[str, TopicRecord] = {}
        for record in sorted(records, key=lambda record: record.key.count("/")):
            if "/" not in record.key or parent_key(record.key) in kept:
                kept[record.key] = record
            else:
                self._log.warn("Topic {key!r} has no parent in the store; ignored", key=record.key)
        self._records = kept
        return self._rehold()

    def put(self, records: Iterable[TopicRecord]) -> set[str]:
        """Records committed (new or changed); returns the keys no longer held."""
        for record in records:
            self._records[record.key] = record
        return self._rehold()

    def delete(self, keys: Iterable[str]) -> set[str]:
        for key in keys:
            self._records.pop(key, None)
        return self._rehold()

    def rename(self, renames: Iterable[tuple[str, TopicRecord]]) -> set[str]:
        """``(old key, new record)`` pairs committed by a rename of a subtree."""
        renames = list(renames)
        for old, _record in renames:
            self._records.pop(old, None)
        return self.put(record for _old, record in renames)

    def _rehold(self) -> set[str]:
        held = {key for key, record in self._records.items() if record.delivery == HELD}
        released = self.held - held
        self.held = held
        return released

    # ------------------------------------------------------------------ answers

    def mode_for(self, key: str) -> str:
        """The delivery mode of a message another protocol publishes to topic ``key``."""
        record = self._records.get(key)
        return SINGLE if record is not None and record.delivery == SINGLE else EVERY

    def timeout_source(self, key: str) -> str | None:
        """The key of the topic whose default timeout applies to messages kept in queue
        ``key``: the topic itself if it sets one, else its nearest ancestor that does (a
        topic inherits its parent's timeout as it inherits its permissions); None when none
        does (the default applies).  A key that names no stored topic (an implicit login
        channel) starts at its nearest stored ancestor."""
        while key:
            record = self._records.get(key)
            if record is not None and record.timeout is not None:
                return key
            key = parent_key(key)
        return None

    def timeout_for(self, key: str) -> float | None:
        """Seconds a message kept in queue ``key`` lives when it names no expiry (None:
        for ever)."""
        source = self.timeout_source(key)
        if source is None:
            return self.default_timeout
        timeout = self._records[source].timeout
        return None if timeout == math.inf else timeout

    def reachable(self, key: str) -> bool:
        """Whether the core keeps other protocols' messages to topic ``key``: a topic that
        exists and is no virtual topic, outside the login topics."""
        if key == LOGIN_TOPICS or key.startswith(LOGIN_TOPICS + "/"):
            return False
        record = self._records.get(key)
        return record is not None and record.link is None

"""How durable delivery follows what is committed to the store, here and on the other nodes
of a cluster: the stored topic tree (changed by the owning front end's commands through
:meth:`DurableSync.put_topics` and its kin, or by another node), the subscriptions another
node announced, and a full read after an outage of the shared medium.

A mixin of :class:`~brokerd.core.durable.DurableService`: the service changes only after the
store has committed, and tells the other nodes through ``announce`` (the engine's
``durable_changed``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.python.failure import Failure

from brokerd.core.storedtopics import StoredTopics
from brokerd.core.subscriptions import SubscriptionIndex
from brokerd.store.base import IStore
from brokerd.store.records import SubscriptionRecord, TopicRecord


class DurableSync:
    """The topic tree and the subscriptions, kept in step with the store."""

    store: IStore
    index: SubscriptionIndex
    topics: StoredTopics
    sessions: dict[str, Any]
    announce: Callable[..., None] | None
    on_tree_changed: Callable[[list[TopicRecord]], Any] | None
    _tree_reading: Deferred | None
    _tree_again: bool
    _tree_changing: int
    """Changes of this node's own to the tree sent to the store and not yet answered."""
    _tree_changes: int
    """Changes of this node's own to the tree answered so far (a read that saw this number
    change while it ran may predate one of them)."""

    if TYPE_CHECKING:
        def _report(self, what: str, **fields: object) -> Callable[[Failure], None]: ...

    def _released(self, keys: set[str]) -> None:
        """Topics no longer held back: every connected subscriber reads its pending
        deliveries again."""
        if keys:
            for session in list(self.sessions.values()):
                session.refresh()

    def put_topics(self, records: list[TopicRecord]) -> Deferred:
        """Store new or changed topic records; once committed, durable delivery follows
        them here and on the other nodes.  Fires with None."""
        if not records:
            return succeed(None)  # nothing to write, nothing to tell the other nodes
        return self._tree_change(self.store.put_topics(records), lambda: self.topics.put(records))

    def rename_topics(self, renames: list[tuple[str, TopicRecord]]) -> Deferred:
        """Store a rename: ``(old key, new record)`` for each topic of the subtree."""
        return self._tree_change(self.store.rename_topics(renames), lambda: self.topics.rename(renames))

    def delete_topics(self, keys: list[str], subscriptions: list[tuple[str, str, str]]) -> Deferred:
        """Remove topics ``keys`` and the ``(subscriber, kind, topic)`` subscriptions based
        on them, in one transaction.  The caller takes the subscriptions out of the index
        once it has told their subscribers (a notice of the deletion goes first).  Fires
        with the number of messages the topics kept (they are still delivered and expire
        as usual), counted before the removal."""
        counted: list[int] = []
        d = self.store.count_messages(keys)
        d.addCallback(counted.append)
        d.addCallback(lambda _: self.store.delete_topics(keys, subscriptions))
        d = self._tree_change(d, lambda: self.topics.delete(keys), {entry[0] for entry in subscriptions})
        return d.addCallback(lambda _: counted[0])

    def _tree_change(self, d: Deferred, apply: Callable[[], set[str]], subscribers: Iterable[str] = ()) -> Deferred:
        """Follow a change of this node's own (the front end changed its tree in memory in
        this same turn, then asked the store): until the store answers, no read of the
        stored tree replaces the trees here, since such a read may predate the change and
        would take back what the front end just answered (see :meth:`reload_topics`)."""
        self._tree_changing += 1

        def committed(_result: object) -> None:
            self._released(apply())
            self.changed(tree=True, subscribers=subscribers)

        def answered(result: object) -> object:
            self._tree_changing -= 1
            self._tree_changes += 1
            if self._tree_again and not self._tree_changing and self._tree_reading is None:
                self.reload_topics()
            return result

        return d.addCallback(committed).addBoth(answered)

    def reload_topics(self) -> Deferred:
        """Another node changed the topic tree: read it again and hand the records to
        ``on_tree_changed``.  One read at a time; a change announced meanwhile is read
        once more after it.  A read is applied only when no change of this node's own was
        in flight or committed while it ran (else it may predate that change and would
        undo it here: a topic just created would be gone again); it is then read once
        more after the last such change is answered.  Fires once this read is done."""
        if self._tree_reading is not None or self._tree_changing:
            self._tree_again = True
            return succeed(None)
        self._tree_again = False
        changes_before = self._tree_changes
        d = self._tree_reading = self.store.load_topics()

        def read(records: list[TopicRecord]) -> None:
            if self._tree_changing or self._tree_changes != changes_before:
                self._tree_again = True
                return
            self._released(self.topics.replace(records))
            if self.on_tree_changed is not None:
                self.on_tree_changed(self.topics.records())

        def done(result: object) -> object:
            self._tree_reading = None
            if self._tree_again and not self._tree_changing:
                self.reload_topics()
            return result

        d.addCallback(read).addErrback(self._report("Reading the topic tree again"))
        return d.addBoth(done)

    # ------------------------------------------------------------------ other nodes

    def changed(self, tree: bool = False, subscribers: Iterable[str] = ()) -> None:
        """The owning front end committed a change to its topic tree or to ``subscribers``'
        subscriptions: tell the other nodes (nothing on one node)."""
        if self.announce is not None:
            self.announce(tree=tree, subscribers=subscribers)

    def announced(self, tree: bool, subscribers: Iterable[str], pending: Iterable[str]) -> Deferred:
        """Another node committed durable state to the shared store: read the changed part
        again.  ``tree``: the topic tree (:meth:`reload_topics`); ``subscribers``:
        their subscriptions, so they are recipients of the next message stored here;
        ``pending``: new pending deliveries, pulled by those connected here (their refill
        path), so they are served live.  Fires once the subscriptions are read."""
        reads = [self._reload(name) for name in subscribers]
        if tree:
            reads.append(self.reload_topics())
        for name in pending:
            session = self.sessions.get(name)
            if session is not None and not session.closed:
                session.refresh()
        return DeferredList(reads, consumeErrors=True).addCallback(lambda _: None)

    def resync(self) -> Deferred:
        """Read the tree and every subscription again and have every connected subscriber
        pull its pending deliveries: a node (this one or another) was cut off from the
        others, so announcements may have been missed.  Fires once done."""
        self.reload_topics()
        d = self.store.load_subscriptions()

        def read(records: list[SubscriptionRecord]) -> None:
            self.index.replace(records)
            for session in list(self.sessions.values()):
                if not session.closed:
                    session.refresh()

        d.addCallback(read)
        return d.addErrback(self._report("Reading the durable subscriptions again"))

    def _reload(self, subscriber: str) -> Deferred:
        d = self.store.subscriptions_of(subscriber)

        def read(records: list[SubscriptionRecord]) -> None:
            index = self.index
            for sub in index.of(subscriber):
                index.remove(subscriber, sub.record.kind, sub.record.topic)
            index.load(records)
            session = self.sessions.get(subscriber)
            if session is not None and not session.closed:
                session.refresh()

        d.addCallback(read)
        return d.addErrback(self._report("Reading the subscriptions of {s} again", s=subscriber))


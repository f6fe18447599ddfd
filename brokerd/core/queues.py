"""What a front end asks of durable delivery: subscribing, unsubscribing, and reading,
retiring to the dead letters, moving and removing stored messages.

The store is the core's: a front end with durable subscribers never calls it, it
asks the durable service, which keeps its index, its connected sessions, its outcome events
and the other nodes of a cluster in step with what it commits.  A mixin of
:class:`~brokerd.core.durable.DurableService`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList, succeed

from brokerd.core.subscriptions import ADD, MESSAGE, Subscription, SubscriptionIndex
from brokerd.store.records import Delivery, MessageRecord, Settled, SubscriptionRecord


class DurableQueues:
    """Subscriptions and stored messages, as a front end's commands need them."""

    store: Any
    clock: Any
    index: SubscriptionIndex
    pending_quota: Any

    if TYPE_CHECKING:
        def changed(self, tree: bool = False, subscribers: Iterable[str] = ()) -> None: ...
        def settle(self, settled: Settled, reason: str | None = None) -> None: ...
        def recipients(self, key: str, change: str, received: float) -> list[str]: ...
        def offer(self, record: MessageRecord, deliveries: Iterable[tuple[str, str]]) -> None: ...

    # ------------------------------------------------------------------ subscriptions

    def subscribe(self, record: SubscriptionRecord, keys: list[str]) -> Deferred:
        """Store a durable subscription (a new one, or one replacing the same subscriber's
        of the same kind and topic); once committed it is in the index and, for a MESSAGE
        subscription that takes ADD and has not ended, the live messages of the topics
        ``keys`` received since its SINCE are pending for it.  Fires with None once the
        other nodes were told."""
        d = self.store.put_subscription(record)

        def stored(_result: Any) -> Deferred | None:
            self.index.add(record)
            now = self.clock.seconds()
            if record.kind == MESSAGE and ADD in record.changes and (record.until is None or record.until > now):
                return self.store.backfill(record.subscriber, keys, record.since, now)
            return None

        return d.addCallback(stored).addCallback(lambda _: self.changed(subscribers=(record.subscriber,)))

    def unsubscribe(self, subscriber: str, subscriptions: list[Subscription],
                    keys_of: Callable[[Subscription], Iterable[str]]) -> Deferred:
        """End ``subscriptions`` of ``subscriber`` (out of the index at once) and drop its
        pending deliveries of the topics (``keys_of`` each MESSAGE subscription) no other
        of its subscriptions still covers.  Fires with those keys once committed."""
        index = self.index
        for sub in subscriptions:
            index.remove(subscriber, sub.record.kind, sub.record.topic)
        removals = [self.store.remove_subscription(subscriber, sub.record.kind, sub.record.topic)
                    for sub in subscriptions]
        dropped = sorted({key for sub in subscriptions if sub.record.kind == MESSAGE
                          for key in keys_of(sub) if not index.covered(subscriber, key)})
        d = self.store.drop_pending(subscriber, dropped) if dropped else removals[-1]

        def done(_result: Any) -> list[str]:
            self.changed(subscribers=(subscriber,))
            return dropped

        return d.addCallback(done)

    def forget_subscriber(self, subscriber: str, page: int = 500) -> Deferred:
        """End every subscription of ``subscriber`` and settle its pending deliveries (a
        session that ended for good: an MQTT clean start or expiry).  The deliveries are
        read and acknowledged ``page`` at a time, so a message all of whose other
        deliveries are done is done.  Fires with the number settled."""
        index = self.index
        subscriptions = index.of(subscriber)
        for sub in subscriptions:
            index.remove(subscriber, sub.record.kind, sub.record.topic)
        if self.pending_quota is not None:
            self.pending_quota.forget(subscriber)
        removals = [self.store.remove_subscription(subscriber, sub.record.kind, sub.record.topic)
                    for sub in subscriptions]
        removals.append(self.store.drop_flows(subscriber))  # its QoS 2 exchanges end with it
        settled = [0]

        def settle_page(_result: Any = None) -> Deferred:
            d = self.store.pending(subscriber, page, (), None, frozenset())
            return d.addCallback(settle_each)

        def settle_each(deliveries: list[Delivery]) -> Deferred | int:
            if not deliveries:
                return settled[0]
            acks = [self.store.acknowledge(subscriber, delivery.seq).addCallback(self._settled_quietly)
                    for delivery in deliveries]
            settled[0] += len(deliveries)
            return DeferredList(acks, fireOnOneErrback=True, consumeErrors=True).addCallback(settle_page)

        d: Any = DeferredList(removals, fireOnOneErrback=True, consumeErrors=True) if removals else succeed(None)
        d.addCallback(settle_page)

        def done(count: int) -> int:
            self.changed(subscribers=(subscriber,))
            return count

        return d.addCallback(done)

    def _settled_quietly(self, settled: Settled | None) -> None:
        if settled is not None:
            self.settle(settled)

    # ------------------------------------------------------------------ stored messages

    def find(self, seq: int) -> Deferred:
        """Deferred[MessageRecord | None]: stored message ``seq``, live or a dead letter."""
        return self.store.find_message(seq)

    def messages(self, key: str, seqs: list[int] | None = None) -> Deferred:
        """Deferred[list[MessageRecord]] of topic ``key``, in order (those in ``seqs``)."""
        return self.store.get_messages(key, seqs)

    def numbers(self, key: str) -> Deferred:
        """Deferred[list[int]]: the numbers of topic ``key``'s messages (none is read)."""
        return self.store.list_messages(key)

    def count(self, keys: list[str]) -> Deferred:
        """Deferred[int]: the messages kept in topics ``keys`` together."""
        return self.store.count_messages(keys)

    def pending(self, subscriber: str, limit: int, exclude: Iterable[str], max_bytes: int,
                skip: frozenset[int]) -> Deferred:
        """Deferred[list[Delivery]]: what ``subscriber`` has to read next (IStore.pending)."""
        return self.store.pending(subscriber, limit, exclude, max_bytes, skip)

    def attempt(self, subscriber: str, delivery: Delivery) -> Deferred:
        """Deferred[int]: count one more attempt to deliver ``delivery``; the new count."""
        return self.store.attempt(subscriber, delivery.seq)

    def to_dead_letters(self, seq: int, reason: str) -> Deferred:
        """Make live message ``seq`` a dead letter of its topic for ``reason`` (removed, recalled,
        replaced): its pending deliveries end, a receipt due goes out.  Fires with the
        Settled, or None when it was not live."""
        d = self.store.trash_message(seq, self.clock.seconds())

        def moved(settled: Settled | None) -> Settled | None:
            if settled is not None:
                self.settle(settled, reason)
            return settled

        return d.addCallback(moved)

    def delete(self, seq: int) -> Deferred:
        """Deferred[bool]: remove message ``seq`` (a dead letter) for good."""
        return self.store.delete_message(seq)

    def move(self, record: MessageRecord, destination: str, moved_from: Callable[[], object]) -> Deferred:
        """Move live ``record`` to topic ``destination``: its pending deliveries end, the
        front end tells the source's subscribers (``moved_from``, e.g. a notice of
        the move), then the destination's subscribers get the message.  Fires with True, or False
        when it was no longer live."""
        deliveries = [(name, ADD) for name in self.recipients(destination, ADD, self.clock.seconds())]
        d = self.store.move_message(record.seq, destination, deliveries)

        def moved(settled: Settled | None) -> bool:
            if settled is None:
                return False
            self.settle(settled)
            moved_from()
            self.offer(replace(record, topic=destination), deliveries)
            return True

        return d.addCallback(moved)

"""The in-memory store: the store contract with dicts, for tests and throwaway brokers.

Nothing survives the process.  Every call takes effect at once and returns a Deferred that
has already fired, so code written against the contract behaves the same on both stores.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from twisted.internet.defer import Deferred, FirstError, fail, gatherResults, succeed
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.store.base import IStore
from brokerd.store.records import (
    ACKED,
    DEAD,
    PENDING,
    Contact,
    Delivery,
    MessageRecord,
    PacketFlow,
    ReceiptDue,
    Settled,
    SubscriptionRecord,
    TopicRecord,
    fitting,
    receipt_due,
    trash_key,
)


class StoreClosed(Exception):
    """A call after :meth:`close`."""


def _first_error(failure: Failure) -> Failure:
    """The failure of the first call that failed, not gatherResults' FirstError around it."""
    return failure.value.subFailure if isinstance(failure.value, FirstError) else failure


@implementer(IStore)
class MemoryStore:
    def __init__(self) -> None:
        self._meta: dict[str, str] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._contacts: dict[str, Contact] = {}
        self._messages: dict[int, MessageRecord] = {}
        self._done: set[int] = set()
        self._receipted: set[int] = set()
        self._deliveries: dict[int, dict[str, list]] = {}
        """seq -> subscriber -> [state, attempts, change]"""
        self._seq = 0
        self._subscriptions: dict[tuple[str, str, str], SubscriptionRecord] = {}
        self._retained: dict[str, bytes] = {}
        self._flows: dict[tuple[str, bool, int], PacketFlow] = {}
        self._closed = False

    def _ok(self, value: object = None) -> Deferred:
        if self._closed:
            return fail(StoreClosed("the store is closed"))
        return succeed(value)

    def open(self) -> Deferred:
        self._closed = False
        return succeed(None)

    def close(self) -> Deferred:
        self._closed = True
        return succeed(None)

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> Deferred:
        return self._ok(self._meta.get(key))

    def set_meta(self, key: str, value: str) -> Deferred:
        if not self._closed:
            self._meta[key] = value
        return self._ok()

    # ------------------------------------------------------------------ topics

    def load_topics(self) -> Deferred:
        return self._ok([self._topics[key] for key in sorted(self._topics)])

    def put_topics(self, records: Iterable[TopicRecord]) -> Deferred:
        if not self._closed:
            for record in records:
                self._topics[record.key] = record
        return self._ok()

    def delete_topics(self, keys: Iterable[str],
                      subscriptions: Iterable[tuple[str, str, str]] = ()) -> Deferred:
        count = 0
        if not self._closed:
            for key in keys:
                count += self._topics.pop(key, None) is not None
            for subscriber, kind, topic in subscriptions:
                self._subscriptions.pop((subscriber, kind, topic), None)
        return self._ok(count)

    def rename_topics(self, renames: Iterable[tuple[str, TopicRecord]]) -> Deferred:
        if not self._closed:
            renames = list(renames)
            for old_key, _record in renames:
                self._topics.pop(old_key, None)
            for _old_key, record in renames:
                self._topics[record.key] = record
        return self._ok()

    # ------------------------------------------------------------------ contacts

    def get_contact(self, account: str) -> Deferred:
        return self._ok(self._contacts.get(account))

    def set_contact(self, account: str, contact: Contact) -> Deferred:
        if not self._closed:
            self._contacts[account] = contact
        return self._ok()

    # ------------------------------------------------------------------ messages

    def _insert(self, record: MessageRecord) -> int:
        if record.seq in self._messages or any(m.message_id == record.message_id for m in self._messages.values()):
            raise ValueError(f"duplicate message {record.message_id!r} (seq {record.seq})")
        self._seq = max(self._seq, record.seq)
        self._messages[record.seq] = record
        return record.seq

    def add_message(self, record: MessageRecord) -> Deferred:
        if self._closed:
            return self._ok()
        if not record.seq:
            record = dataclasses.replace(record, seq=self._seq + 1)
        try:
            return self._ok(self._insert(record))
        except ValueError as exc:
            return fail(exc)

    def next_seq(self) -> Deferred:
        return self._ok(self._seq + 1)

    def publish(self, record: MessageRecord, deliveries: Iterable[tuple[str, str]]) -> Deferred:
        if self._closed:
            return self._ok()
        try:
            seq = self._insert(record)
        except ValueError as exc:
            return fail(exc)
        rows = self._deliveries.setdefault(seq, {})
        for subscriber, change in deliveries:
            rows.setdefault(subscriber, [PENDING, 0, change])
        return self._ok(seq)

    def publish_many(self, items: Iterable[tuple[MessageRecord, Iterable[tuple[str, str]]]],
                     flows: Iterable[PacketFlow] = ()) -> Deferred:
        items = list(items)
        if self._closed:
            return self._ok()
        seqs = [record.seq for record, _deliveries in items]
        taken = {record.message_id for record in self._messages.values()}
        if (len(set(seqs)) < len(seqs) or any(seq in self._messages for seq in seqs)
                or len({record.message_id for record, _d in items} | taken) < len(taken) + len(items)):
            return fail(ValueError("duplicate message among " + ", ".join(repr(r.message_id) for r, _d in items)))
        gathered = gatherResults([self.publish(record, deliveries) for record, deliveries in items],
                                 consumeErrors=True)
        self.put_flows(flows)
        return gathered.addErrback(_first_error)

    def _live(self, seq: int) -> MessageRecord | None:
        record = self._messages.get(seq)
        return record if record is not None and record.trashed is None else None

    def find_message(self, seq: int) -> Deferred:
        return self._ok(self._messages.get(seq))

    def get_messages(self, topic: str, seqs: Iterable[int] | None = None, limit: int | None = None) -> Deferred:
        wanted = None if seqs is None else set(seqs)
        found = [m for seq, m in sorted(self._messages.items())
                 if m.topic == topic and (wanted is None or seq in wanted)]
        return self._ok(found[:limit])

    def list_messages(self, topic: str) -> Deferred:
        return self._ok([seq for seq, m in sorted(self._messages.items()) if m.topic == topic])

    def delete_message(self, seq: int) -> Deferred:
        found = False
        if not self._closed:
            found = self._messages.pop(seq, None) is not None
            self._deliveries.pop(seq, None)
        return self._ok(found)

    def remove_message(self, topic: str, smuid: str) -> Deferred:
        for seq, record in list(self._messages.items()):
            if record.topic == topic and record.message_id == smuid:
                return self.delete_message(seq)
        return self._ok(False)

    def _pending_of(self, seq: int) -> tuple[str, ...]:
        return tuple(sorted(s for s, row in self._deliveries.get(seq, {}).items() if row[0] == PENDING))

    def _receipt(self, seq: int, final: bool) -> ReceiptDue | None:
        record = self._messages.get(seq)
        if record is None or record.receipt == "NONE" or seq in self._receipted:
            return None
        rows = self._deliveries.get(seq, {}).values()
        total, acked = len(rows), sum(row[0] == ACKED for row in rows)
        if not receipt_due(record.receipt, acked, total, final):
            return None
        self._receipted.add(seq)
        return ReceiptDue(seq, record.topic, record.publisher, record.client_message_id, record.data, acked, total)

    def _trash(self, seq: int, now: float) -> Settled | None:
        record = self._live(seq)
        if record is None:
            return None
        receipt = self._receipt(seq, final=True)
        released = self._pending_of(seq)
        self._deliveries.pop(seq, None)
        self._messages[seq] = dataclasses.replace(record, topic=trash_key(record.topic), trashed=now)
        return Settled(seq, record.topic, receipt, released, trashed=True)

    def trash_message(self, seq: int, now: float) -> Deferred:
        return self._ok(None if self._closed else self._trash(seq, now))

    def move_message(self, seq: int, topic: str, deliveries: Iterable[tuple[str, str]]) -> Deferred:
        record = self._live(seq)
        if record is None or self._closed:
            return self._ok(None)
        released = self._pending_of(seq)
        rows = {s: row for s, row in self._deliveries.get(seq, {}).items() if row[0] != PENDING}
        for subscriber, change in deliveries:
            rows.setdefault(subscriber, [PENDING, 0, change])
        self._deliveries[seq] = rows
        self._messages[seq] = dataclasses.replace(record, topic=topic)
        return self._ok(Settled(seq, record.topic, None, released))

    def expire(self, now: float, limit: int) -> Deferred:
        if self._closed:
            return self._ok([])
        due = sorted((m.expires, seq) for seq, m in self._messages.items()
                     if m.trashed is None and m.expires is not None and m.expires <= now)[:limit]
        return self._ok([settled for _e, seq in due if (settled := self._trash(seq, now)) is not None])

    def empty_trash(self, before: float) -> Deferred:
        gone = [seq for seq, m in self._messages.items() if m.trashed is not None and m.trashed <= before]
        if not self._closed:
            for seq in gone:
                del self._messages[seq]
                self._deliveries.pop(seq, None)
        return self._ok(len(gone))

    def count_messages(self, topics: Iterable[str]) -> Deferred:
        wanted = set(topics)
        return self._ok(sum(m.topic in wanted for m in self._messages.values()))

    # ------------------------------------------------------------------ deliveries

    def pending(self, subscriber: str, limit: int, exclude_topics: Iterable[str] = (),
                max_bytes: int | None = None, skip: Iterable[int] = ()) -> Deferred:
        excluded = set(exclude_topics)
        skipped = set(skip)
        found = []
        for seq, rows in self._deliveries.items():
            row = rows.get(subscriber)
            record = self._messages.get(seq)
            if (row is None or row[0] != PENDING or record is None or record.trashed is not None
                    or seq in self._done or record.topic in excluded or seq in skipped):
                continue
            found.append(Delivery(seq, record.topic, record.priority, row[2], row[1], record.mode, record.data))
        found.sort(key=lambda d: (-d.priority, d.seq))
        found = found[:limit]
        return self._ok(found[:fitting((len(d.data) for d in found), max_bytes)])

    def pending_counts(self, prefix: str) -> Deferred:
        counts: dict[str, int] = {}
        for seq, rows in self._deliveries.items():
            record = self._messages.get(seq)
            if record is None or record.trashed is not None or seq in self._done:
                continue
            for subscriber, row in rows.items():
                if row[0] == PENDING and subscriber.startswith(prefix):
                    counts[subscriber] = counts.get(subscriber, 0) + 1
        return self._ok(counts)

    def acknowledge(self, subscriber: str, seq: int) -> Deferred:
        row = self._deliveries.get(seq, {}).get(subscriber)
        if row is None or row[0] != PENDING or self._closed:
            return self._ok(None)
        row[0] = ACKED
        record = self._messages.get(seq)
        if record is None:
            return self._ok(Settled(seq, ""))
        receipt = self._receipt(seq, final=False)
        released: tuple[str, ...] = ()
        if record.mode == "ONE":
            released = self._pending_of(seq)
            for other in released:
                del self._deliveries[seq][other]
            self._done.add(seq)
        return self._ok(Settled(seq, record.topic, receipt, released))

    def attempt(self, subscriber: str, seq: int) -> Deferred:
        row = self._deliveries.get(seq, {}).get(subscriber)
        if row is None or row[0] != PENDING or self._closed:
            return self._ok(0)
        row[1] += 1
        return self._ok(row[1])

    def give_up(self, subscriber: str, seq: int, now: float) -> Deferred:
        row = self._deliveries.get(seq, {}).get(subscriber)
        if row is None or row[0] != PENDING or self._closed:
            return self._ok(None)
        row[0] = DEAD
        record = self._messages.get(seq)
        if record is None:
            return self._ok(None)
        if self._pending_of(seq):
            return self._ok(Settled(seq, record.topic))
        return self._ok(self._trash(seq, now))

    def backfill(self, subscriber: str, topics: Iterable[str], since: float | None, now: float) -> Deferred:
        keys = set(topics)
        added = 0
        if self._closed:
            return self._ok(0)
        for seq, record in self._messages.items():
            if record.topic not in keys:
                continue
            rows = self._deliveries.setdefault(seq, {})
            if since is not None and record.received < since:
                if rows.get(subscriber, [None])[0] == PENDING:
                    del rows[subscriber]
                continue
            if (record.trashed is None and seq not in self._done and subscriber not in rows
                    and (record.expires is None or record.expires > now)):
                rows[subscriber] = [PENDING, 0, "ADD"]
                added += 1
        return self._ok(added)

    def drop_pending(self, subscriber: str, topics: Iterable[str]) -> Deferred:
        keys = set(topics)
        dropped = 0
        if self._closed:
            return self._ok(0)
        for seq, rows in self._deliveries.items():
            record = self._messages.get(seq)
            if record is not None and record.topic in keys and rows.get(subscriber, [None])[0] == PENDING:
                del rows[subscriber]
                dropped += 1
        return self._ok(dropped)

    # ------------------------------------------------------------------ subscriptions

    def load_subscriptions(self) -> Deferred:
        return self._ok([record for _key, record in sorted(self._subscriptions.items())])

    def put_subscription(self, record: SubscriptionRecord) -> Deferred:
        if not self._closed:
            self._subscriptions[(record.subscriber, record.kind, record.topic)] = record
        return self._ok()

    def remove_subscription(self, subscriber: str, kind: str, topic: str) -> Deferred:
        found = False
        if not self._closed:
            found = self._subscriptions.pop((subscriber, kind, topic), None) is not None
        return self._ok(found)

    def subscriptions_of(self, subscriber: str) -> Deferred:
        found = [r for key, r in sorted(self._subscriptions.items()) if key[0] == subscriber]
        return self._ok(found)

    # ------------------------------------------------------------------ QoS 2 exchanges

    def put_flows(self, flows: Iterable[PacketFlow]) -> Deferred:
        if not self._closed:
            for flow in flows:
                self._flows[(flow.subscriber, flow.inbound, flow.packet_id)] = flow
        return self._ok()

    def remove_flow(self, subscriber: str, inbound: bool, packet_id: int) -> Deferred:
        found = False
        if not self._closed:
            found = self._flows.pop((subscriber, inbound, packet_id), None) is not None
        return self._ok(found)

    def flows_of(self, subscriber: str) -> Deferred:
        found = [flow for flow in self._flows.values() if flow.subscriber == subscriber]
        found.sort(key=lambda flow: (not flow.inbound, flow.seq, flow.packet_id))
        return self._ok(found)

    def drop_flows(self, subscriber: str) -> Deferred:
        keys = [key for key in self._flows if key[0] == subscriber]
        if not self._closed:
            for key in keys:
                del self._flows[key]
        return self._ok(len(keys))

    # ------------------------------------------------------------------ retained messages

    def put_retained(self, topic: str, data: bytes | None) -> Deferred:
        if not self._closed:
            if data is None:
                self._retained.pop(topic, None)
            else:
                self._retained[topic] = bytes(data)
        return self._ok()

    def load_retained(self) -> Deferred:
        return self._ok(sorted(self._retained.items()))

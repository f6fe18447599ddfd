"""The in-memory store: the store contract with dicts, for tests and throwaway brokers.

Nothing survives the process.  Every call takes effect at once and returns a Deferred that
has already fired, so code written against the contract behaves the same on both stores.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from brokerd.store.base import IStore
from brokerd.store.records import Contact, MessageRecord, SubscriptionRecord, TopicRecord


class StoreClosed(Exception):
    """A call after :meth:`close`."""


@implementer(IStore)
class MemoryStore:
    def __init__(self) -> None:
        self._meta: dict[str, str] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._contacts: dict[str, Contact] = {}
        self._messages: dict[str, dict[str, MessageRecord]] = {}
        self._seq = 0
        self._subscriptions: dict[tuple[str, str, str], SubscriptionRecord] = {}
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

    def delete_topics(self, keys: Iterable[str]) -> Deferred:
        count = 0
        if not self._closed:
            for key in keys:
                count += self._topics.pop(key, None) is not None
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

    def add_message(self, record: MessageRecord) -> Deferred:
        if self._closed:
            return self._ok()
        for topic in self._messages.values():
            if record.smuid in topic:
                return fail(ValueError(f"duplicate smuid {record.smuid!r}"))
        self._seq += 1
        stored = dataclasses.replace(record, seq=self._seq)
        self._messages.setdefault(record.topic, {})[record.smuid] = stored
        return self._ok(self._seq)

    def remove_message(self, topic: str, smuid: str) -> Deferred:
        found = False
        if not self._closed:
            messages = self._messages.get(topic, {})
            found = messages.pop(smuid, None) is not None
            if not messages:
                self._messages.pop(topic, None)
        return self._ok(found)

    def list_messages(self, topic: str) -> Deferred:
        messages = sorted(self._messages.get(topic, {}).values(), key=lambda m: m.seq)
        return self._ok(messages)

    def count_messages(self, topics: Iterable[str]) -> Deferred:
        return self._ok(sum(len(self._messages.get(key, ())) for key in set(topics)))

    # ------------------------------------------------------------------ subscriptions

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

    def count_subscribers(self, topics: Iterable[str]) -> Deferred:
        wanted = set(topics)
        subscribers = {
            r.subscriber for r in self._subscriptions.values()
            if r.kind == "MESSAGE" and r.topic in wanted
        }
        return self._ok(len(subscribers))

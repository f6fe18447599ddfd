"""The store contract every implementation fulfils (tests/store runs one suite against each).

Every method returns a Deferred.  Calls take effect in the order they were made, and a
Deferred fires only once its change is durable (for the SQLite store: committed), which is
what lets a front end answer ``200`` only after the fact.
"""
from __future__ import annotations

from zope.interface import Interface


class IStore(Interface):
    def open():
        """Create or migrate the schema; fires when the store is usable."""

    def close():
        """Finish every queued call, then release the files; safe to call twice."""

    # -- meta
    def get_meta(key):
        """Deferred[str | None]: a server setting (the SUID, ...)."""

    def set_meta(key, value):
        """Deferred[None]."""

    # -- topics
    def load_topics():
        """Deferred[list[TopicRecord]], parents before children (ordered by key)."""

    def put_topics(records):
        """Deferred[None]: insert or replace these topics."""

    def delete_topics(keys):
        """Deferred[int]: remove these topics; how many existed."""

    def rename_topics(renames):
        """Deferred[None]: ``[(old_key, new_record), ...]`` in one transaction: each old row
        goes, each new one is written (a subtree moved by SET TOPIC NAME)."""

    # -- contacts
    def get_contact(account):
        """Deferred[Contact | None]."""

    def set_contact(account, contact):
        """Deferred[None]."""

    # -- messages
    def add_message(record):
        """Deferred[int]: store a MessageRecord; its ``seq``."""

    def remove_message(topic, smuid):
        """Deferred[bool]: whether it was there."""

    def list_messages(topic):
        """Deferred[list[MessageRecord]] of one topic (key), in ``seq`` order."""

    def count_messages(topics):
        """Deferred[int]: messages retained in these topics (keys) together."""

    # -- durable subscriptions
    def put_subscription(record):
        """Deferred[None]: insert or replace (same subscriber, kind and topic)."""

    def remove_subscription(subscriber, kind, topic):
        """Deferred[bool]: whether it was there."""

    def subscriptions_of(subscriber):
        """Deferred[list[SubscriptionRecord]] of one ``account:channel``, ordered by kind and
        topic."""

    def count_subscribers(topics):
        """Deferred[int]: distinct subscribers with a MESSAGE subscription to any of these
        topics (keys)."""

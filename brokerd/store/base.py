"""The store contract every implementation fulfils (tests/store runs one suite against each).

Every method returns a Deferred.  Calls take effect in the order they were made, and a
Deferred fires only once its change is durable (for the SQLite store: committed), which is
what lets a front end answer ``200`` only after the fact.
"""
from __future__ import annotations

from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface


SERVER_ID_META = "suid"
"""The meta entry that holds the server's id (the durable service's, shared by the nodes of a
cluster)."""


class StoreUnavailable(Exception):
    """The database cannot be reached (or a server-side failure ended the transaction):
    nothing of the call was committed; try again later."""


class StoreFull(StoreUnavailable):
    """The data directory is below ``--disk-free-limit`` (brokerd.store.disk): nothing new is
    stored until there is room again (acknowledgements still are).  An outage like the
    store's: the disk guard logs the change of state once."""


def is_outage(failure: Failure) -> bool:
    """Whether a store call failed because the store is away (StoreUnavailable): the store
    logged that change of state once (unavailable, connected again), so whoever gets the
    failure answers its client and logs nothing more, per call, with no traceback."""
    return failure.check(StoreUnavailable) is not None


def log_unless_outage(failure: Failure, log: Logger, what: str, **fields: Any) -> None:
    """Log a failure of ``what`` with its traceback on ``log`` (a twisted.logger Logger),
    unless the store is away (:func:`is_outage`), which is logged once where it happens.  An
    errback: ``d.addErrback(log_unless_outage, self._log, "Storing ...")``."""
    if not is_outage(failure):
        log.failure(what, failure, **fields)


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

    def delete_topics(keys, subscriptions=()):
        """Deferred[int]: remove these topics; how many existed.  In the same transaction,
        remove the durable subscriptions ``(subscriber, kind, topic)`` in ``subscriptions``
        (REMOVE TOPIC drops the subscriptions of the topics it removes)."""

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
        """Deferred[int]: store a MessageRecord (``seq`` 0: the store picks one); its ``seq``."""

    def next_seq():
        """Deferred[int]: a message ``seq`` never used before (higher than every seq this
        store ever held, removed messages included)."""

    def publish(record, deliveries):
        """Deferred[int]: store a MessageRecord with its ``seq`` (from :meth:`next_seq`
        onwards) and, in the same transaction, one pending delivery per ``(subscriber,
        change)`` in ``deliveries``.  ValueError for a duplicate seq or smuid."""

    def publish_many(items, flows=()):
        """Deferred[list[int]]: :meth:`publish` each ``(record, deliveries)`` of ``items``
        (every record with its ``seq``), all in one operation of one transaction: all are
        stored or, on a failure (ValueError for a duplicate seq or smuid), none.  What a
        front end that publishes several messages at once (one read of an SSMP client) asks,
        at the cost of one store operation instead of one per message.  ``flows``
        (PacketFlow) are put (:meth:`put_flows`) in the same transaction: an MQTT QoS 2
        PUBLISH is stored together with the note that it was received."""

    def find_message(seq):
        """Deferred[MessageRecord | None], live or in a Trash."""

    def get_messages(topic, seqs=None, limit=None):
        """Deferred[list[MessageRecord]] of one topic (key), in ``seq`` order; only those
        whose seq is in ``seqs`` unless it is None; at most the first ``limit`` (None: all)."""

    def delete_message(seq):
        """Deferred[bool]: remove the message for good (and its deliveries)."""

    def trash_message(seq, now):
        """Deferred[Settled | None]: move a live message to its topic's Trash: its pending
        deliveries are dropped (``released``), a due receipt is returned.  None if it was
        not live."""

    def move_message(seq, topic, deliveries):
        """Deferred[Settled | None]: move a live message to another topic: its pending
        deliveries are dropped (``released``) and ``deliveries`` ``(subscriber, change)``
        added (a subscriber that already acknowledged it keeps that).  None if not live."""

    def expire(now, limit):
        """Deferred[list[Settled]]: move at most ``limit`` live messages whose ``expires`` is
        at or before ``now`` to their Trash (as :meth:`trash_message`)."""

    def empty_trash(before):
        """Deferred[int]: remove for good the messages that went to a Trash at or before
        ``before``."""

    # -- deliveries (two-phase acknowledged delivery)
    def pending(subscriber, limit, exclude_topics=(), max_bytes=None, skip=()):
        """Deferred[list[Delivery]]: at most ``limit`` live messages ``subscriber`` has not
        acknowledged, highest priority first, then in ``seq`` order, leaving out the topics
        (keys) in ``exclude_topics`` and the messages whose seq is in ``skip`` (those the
        caller already holds).  With ``max_bytes``, the list ends before the message whose
        data would take it past ``max_bytes`` (it always holds one message when any is
        pending): a subscriber's window of large messages is read a few at a time, and the
        bodies past the budget are never read."""

    def pending_counts(prefix):
        """Deferred[dict[str, int]]: the live messages each subscriber whose name starts with
        ``prefix`` has not acknowledged (what :meth:`pending` would list in all), for the
        subscribers that have any.  Read once, at the start (brokerd.core.pending)."""

    def acknowledge(subscriber, seq):
        """Deferred[Settled | None]: the subscriber acknowledged the message; it is never
        delivered to it again.  For a ``ONE`` message every other pending delivery is
        dropped (``released``).  None when no such pending delivery exists."""

    def attempt(subscriber, seq):
        """Deferred[int]: count one more delivery attempt; the new count (0: no such
        pending delivery)."""

    def give_up(subscriber, seq, now):
        """Deferred[Settled | None]: stop delivering the message to the subscriber (too many
        attempts); when nobody has it pending any more it goes to the Trash."""

    def backfill(subscriber, topics, since, now):
        """Deferred[int]: a new subscription: add a pending delivery of every live, unexpired
        message in ``topics`` (keys) received at or after ``since`` (None: all) that the
        subscriber does not have yet, and drop its pending deliveries of older ones (the
        draft's SINCE rule).  How many were added."""

    def drop_pending(subscriber, topics):
        """Deferred[int]: drop the subscriber's pending deliveries of messages in ``topics``
        (keys): it unsubscribed."""

    def remove_message(topic, smuid):
        """Deferred[bool]: whether it was there."""

    def list_messages(topic):
        """Deferred[list[int]]: the seq numbers of one topic's (key's) messages, in order
        (no message is read)."""

    def count_messages(topics):
        """Deferred[int]: messages retained in these topics (keys) together."""

    # -- durable subscriptions
    def load_subscriptions():
        """Deferred[list[SubscriptionRecord]]: every durable subscription."""

    def put_subscription(record):
        """Deferred[None]: insert or replace (same subscriber, kind and topic)."""

    def remove_subscription(subscriber, kind, topic):
        """Deferred[bool]: whether it was there."""

    def subscriptions_of(subscriber):
        """Deferred[list[SubscriptionRecord]] of one ``account:channel``, ordered by kind and
        topic."""

    # -- QoS 2 exchanges under way (MQTT's persistent sessions: brokerd.protocols.mqtt.stored)
    def put_flows(flows):
        """Deferred[None]: insert or replace each PacketFlow of ``flows`` (one per subscriber,
        direction and Packet Identifier), in one transaction."""

    def remove_flow(subscriber, inbound, packet_id):
        """Deferred[bool]: the exchange is over; whether it was there."""

    def flows_of(subscriber):
        """Deferred[list[PacketFlow]] of ``subscriber``: the inbound ones by Packet
        Identifier, then the outbound ones in ``seq`` order (the order they were sent)."""

    def drop_flows(subscriber):
        """Deferred[int]: remove every PacketFlow of ``subscriber`` (its session ended); how
        many there were."""

    # -- retained messages (MQTT's: the last retained message of each topic)
    def put_retained(topic, data):
        """Deferred[None]: ``data`` (bytes: a Message in its stored form,
        brokerd.core.stored) becomes the retained message of ``topic`` (str: the core topic
        decoded as UTF-8), replacing the one it had; None deletes the topic's retained
        message (nothing to delete is no error)."""

    def load_retained():
        """Deferred[list[tuple[str, bytes]]]: every retained message as ``(topic, data)``, in
        topic order (by code point, as Python sorts str)."""

"""The PostgreSQL store's schema and the row-level steps its operations share.

The tables are the SQLite store's (brokerd/store/sqlite.py), in PostgreSQL types; the schema
is created on open (``CREATE ... IF NOT EXISTS``) under an advisory lock, so nodes starting
together create it once, and its version is kept in ``brokerd_schema``.  A new version only
adds (tables, indexes: ``IF NOT EXISTS``), so the same script brings an older database up to
date in place, and raises its version; a database newer than this brokerd is refused.  The
helpers run in the writer thread inside an operation's transaction; every change to a
message's deliveries locks the message's row first (:func:`lock_message`): that lock is what
serialises two nodes settling the same message.
"""
from __future__ import annotations

import json
from typing import Any

from brokerd.store.pg_writer import PgConnection, PgCursor
from brokerd.store.records import (
    ACKED,
    PENDING,
    MessageRecord,
    ReceiptDue,
    Settled,
    SubscriptionRecord,
    TopicRecord,
    receipt_due,
    trash_key,
)

SEQ_BLOCK = 1 << 36
"""Message numbers a store takes at a time (68 billion: one node run never uses them up)."""
SCHEMA_VERSION = 4
"""1: topics, contacts, messages, deliveries, subscriptions; 2: retained messages; 3: the QoS 2
exchanges under way of MQTT's persistent sessions (records.PacketFlow); 4: owned durable
subscribers' names carry their encoding's version tag (brokerd.core.subscriber)."""
OWNED_BEFORE_TAG = ("position(':' in subscriber) = 0 AND left(subscriber, 1) NOT IN ('~', '@')"
                    " AND length(subscriber) - length(replace(subscriber, '/', '')) = 4")
"""An owned subscriber's name as written before version 4: five percent-encoded parts, no
``:`` (a channel's) and no ``~`` (a queue's)."""
UPGRADES: dict[int, tuple[str, ...]] = {
    4: tuple(f"UPDATE {table} SET subscriber = '@1/' || subscriber WHERE {OWNED_BEFORE_TAG}"
             for table in ("subscriptions", "deliveries", "flows")),
}
"""Statements that bring the data of a schema one version older to the version they are
filed under (the tables of a new version are SCHEMA's, made if missing)."""
SCHEMA_LOCK = 0x62726F6B  # pg_advisory_xact_lock key: nodes starting together migrate once

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS brokerd_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS topics (
    key TEXT PRIMARY KEY, name TEXT NOT NULL, keywords TEXT NOT NULL, delivery TEXT NOT NULL,
    link TEXT, owner TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, system BOOLEAN NOT NULL,
    timeout DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS contacts (account TEXT PRIMARY KEY, mime TEXT NOT NULL, data BYTEA NOT NULL);
CREATE SEQUENCE IF NOT EXISTS message_blocks START WITH 1 INCREMENT BY {SEQ_BLOCK};
CREATE TABLE IF NOT EXISTS messages (
    seq BIGINT PRIMARY KEY, smuid TEXT NOT NULL UNIQUE, topic TEXT NOT NULL, publisher TEXT NOT NULL,
    cmuid TEXT NOT NULL, received DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION,
    priority INTEGER NOT NULL, data BYTEA NOT NULL, mode TEXT NOT NULL DEFAULT 'ALL',
    receipt TEXT NOT NULL DEFAULT 'NONE', receipted BOOLEAN NOT NULL DEFAULT FALSE,
    done BOOLEAN NOT NULL DEFAULT FALSE, trashed DOUBLE PRECISION);
CREATE INDEX IF NOT EXISTS messages_by_topic ON messages (topic, seq);
CREATE INDEX IF NOT EXISTS messages_by_expiry ON messages (expires) WHERE trashed IS NULL;
CREATE INDEX IF NOT EXISTS messages_by_trashed ON messages (trashed) WHERE trashed IS NOT NULL;
CREATE TABLE IF NOT EXISTS deliveries (
    subscriber TEXT NOT NULL, seq BIGINT NOT NULL, state INTEGER NOT NULL, attempts INTEGER NOT NULL,
    change TEXT NOT NULL, PRIMARY KEY (subscriber, seq));
CREATE INDEX IF NOT EXISTS deliveries_by_seq ON deliveries (seq, state);
CREATE TABLE IF NOT EXISTS subscriptions (
    subscriber TEXT NOT NULL, kind TEXT NOT NULL, topic TEXT NOT NULL, changes TEXT NOT NULL,
    since DOUBLE PRECISION, until DOUBLE PRECISION, PRIMARY KEY (subscriber, kind, topic));
CREATE INDEX IF NOT EXISTS subscriptions_by_topic ON subscriptions (topic, kind);
CREATE TABLE IF NOT EXISTS retained (topic TEXT PRIMARY KEY, data BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS flows (
    subscriber TEXT NOT NULL, inbound BOOLEAN NOT NULL, packet_id INTEGER NOT NULL, seq BIGINT NOT NULL,
    released BOOLEAN NOT NULL, PRIMARY KEY (subscriber, inbound, packet_id))
"""
PUT_FLOW = ("INSERT INTO flows (subscriber, inbound, packet_id, seq, released) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (subscriber, inbound, packet_id) DO UPDATE SET seq = EXCLUDED.seq,"
            " released = EXCLUDED.released")

TOPIC_COLUMNS = "key, name, keywords, delivery, link, owner, created, system, timeout"
PUT_TOPIC = (f"INSERT INTO topics ({TOPIC_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
              " ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, keywords = EXCLUDED.keywords,"
              " delivery = EXCLUDED.delivery, link = EXCLUDED.link, owner = EXCLUDED.owner,"
              " created = EXCLUDED.created, system = EXCLUDED.system, timeout = EXCLUDED.timeout")
MESSAGE_COLUMNS = "seq, smuid, topic, publisher, cmuid, received, expires, priority, data, mode, receipt, trashed"
INSERT_DELIVERY = ("INSERT INTO deliveries (subscriber, seq, state, attempts, change) VALUES (%s, %s, %s, %s, %s)"
                    " ON CONFLICT DO NOTHING")
SUBSCRIPTION_COLUMNS = "subscriber, kind, topic, changes, since, until"


def topic_row(record: TopicRecord) -> tuple:
    return (record.key, record.name, json.dumps(list(record.keywords)), record.delivery, record.link,
            record.owner, record.created, record.system, record.timeout)


def topic_record(row: tuple) -> TopicRecord:
    key, name, keywords, delivery, link, owner, created, system, timeout = row
    return TopicRecord(key, name, tuple(json.loads(keywords)), delivery, link, owner, created, system, timeout)


def message_record(row: tuple) -> MessageRecord:
    seq, smuid, topic, publisher, cmuid, received, expires, priority, data, mode, receipt, trashed = row
    return MessageRecord(smuid, topic, publisher, cmuid, received, expires, priority, bytes(data), seq,
                         mode, receipt, trashed)


def subscription(row: tuple) -> SubscriptionRecord:
    subscriber, kind, topic, changes, since, until = row
    return SubscriptionRecord(subscriber, kind, topic, tuple(filter(None, changes.split(","))), since, until)


def one_row(cursor: PgCursor) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate, ``nextval``)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("the database returned no row where one is always returned")
    return row


def create_schema(c: PgConnection) -> None:
    c.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
    for statement in SCHEMA.split(";"):
        c.execute(statement)
    row = one_row(c.execute("SELECT MAX(version) FROM brokerd_schema"))
    if row[0] is None:
        c.execute("INSERT INTO brokerd_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
    elif row[0] > SCHEMA_VERSION:
        raise RuntimeError(f"schema version {row[0]} is newer than this brokerd ({SCHEMA_VERSION})")
    elif row[0] < SCHEMA_VERSION:
        for version in range(row[0] + 1, SCHEMA_VERSION + 1):
            for statement in UPGRADES.get(version, ()):
                c.execute(statement)
        c.execute("UPDATE brokerd_schema SET version = %s", (SCHEMA_VERSION,))


def lock_message(c: PgConnection, seq: int, live: bool = False) -> tuple | None:
    """Lock message ``seq``'s row until the transaction ends: ``(topic, mode, receipt, done)``."""
    where = " AND trashed IS NULL" if live else ""
    return c.execute(f"SELECT topic, mode, receipt, done FROM messages WHERE seq = %s{where} FOR UPDATE",
                     (seq,)).fetchone()


def receipt(c: PgConnection, seq: int, final: bool) -> ReceiptDue | None:
    """The receipt of (locked) message ``seq`` if it is due now, marked as given."""
    row = c.execute("SELECT topic, publisher, cmuid, receipt, receipted, data FROM messages WHERE seq = %s",
                    (seq,)).fetchone()
    if row is None or row[3] == "NONE" or row[4]:
        return None
    total, acked = one_row(c.execute(
        f"SELECT COUNT(*), COUNT(*) FILTER (WHERE state = {ACKED}) FROM deliveries WHERE seq = %s",
        (seq,)))
    if not receipt_due(row[3], acked, total, final):
        return None
    c.execute("UPDATE messages SET receipted = TRUE WHERE seq = %s", (seq,))
    return ReceiptDue(seq, row[0], row[1], row[2], bytes(row[5]), int(acked), int(total))


def drop_pending_of(c: PgConnection, seq: int) -> tuple[str, ...]:
    """Delete message ``seq``'s pending deliveries; who had one."""
    rows = c.execute(f"DELETE FROM deliveries WHERE seq = %s AND state = {PENDING} RETURNING subscriber", (seq,))
    return tuple(sorted(row[0] for row in rows))


def trash(c: PgConnection, seq: int, now: float) -> Settled | None:
    row = lock_message(c, seq, live=True)
    if row is None:
        return None
    due = receipt(c, seq, final=True)
    released = drop_pending_of(c, seq)
    c.execute("DELETE FROM deliveries WHERE seq = %s", (seq,))
    c.execute("UPDATE messages SET topic = %s, trashed = %s WHERE seq = %s", (trash_key(row[0]), now, seq))
    return Settled(seq, row[0], due, released, trashed=True)

"""The PostgreSQL store: the store contract on one database that several brokerd nodes share.

The rows and their meaning are the SQLite store's (:mod:`brokerd.store.sqlite`); the
connection, batching and reconnection are :mod:`brokerd.store.pg_writer`'s.  What differs is
what two nodes writing at once need:

- **Message numbers.**  A node numbers its messages itself after one :meth:`next_seq` at
  start, so each store (each node's run) takes a block of :data:`SEQ_BLOCK` numbers of its
  own from a database sequence the first time it needs one: two nodes never pick the same
  ``seq`` (nor, therefore, the same message id).  Messages of one publisher stay in order;
  messages of different nodes are ordered by block.
- **Claims.**  Every change to a message's deliveries first locks the message's row
  (``SELECT ... FOR UPDATE``): of two subscribers on two nodes acknowledging the same ``ONE``
  message, the second waits for the first, then finds it done and gets None (it was not
  theirs), so a ONE message is settled by exactly one acknowledgement and an acknowledged
  delivery is never pending again.  The expiry sweep takes its messages with ``FOR UPDATE
  SKIP LOCKED``: two nodes sweeping at once trash (and report) each message once.

The schema and the row-level steps are :mod:`brokerd.store.pg_schema`'s.  psycopg is imported
lazily: the broker runs without it.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.config import Settings
from brokerd.interfaces import IBrokerReactor
from brokerd.store.base import IStore
from brokerd.store.latency import Latencies
from brokerd.store.memory import StoreClosed
from brokerd.store.pg_schema import (
    INSERT_DELIVERY,
    MESSAGE_COLUMNS,
    PUT_FLOW,
    PUT_TOPIC,
    SCHEMA_VERSION,
    SEQ_BLOCK,
    SUBSCRIPTION_COLUMNS,
    TOPIC_COLUMNS,
    create_schema,
    drop_pending_of,
    lock_message,
    message_record,
    one_row,
    receipt as due_receipt,
    subscription,
    topic_record,
    topic_row,
    trash,
)
from brokerd.store.pg_writer import MAX_QUEUE, Operation, PgConnection, PostgresWriter, StoreUnavailable, pipelined, redacted
from brokerd.store.records import (
    ACKED,
    DEAD,
    PENDING,
    Contact,
    Delivery,
    MessageRecord,
    PacketFlow,
    Settled,
    SubscriptionRecord,
    TopicRecord,
    fitting,
)

__all__ = ["PostgreSQLStore", "StoreUnavailable", "SCHEMA_VERSION", "SEQ_BLOCK"]


@implementer(IStore)
class PostgreSQLStore:
    """The durable store in a PostgreSQL database (``url``: ``postgresql://...``; ``info``:
    its libpq connection string, see :func:`brokerd.store.pg_writer.connection_info`)."""

    _log = Logger()

    def __init__(self, url: str, info: str, reactor: IBrokerReactor) -> None:
        self.url = redacted(url)
        self._reactor = reactor
        self._writer = PostgresWriter(info, reactor, create_schema, name=self.url)
        self._state = "new"  # new -> open -> closing -> closed
        self._closed: Deferred | None = None
        self._trigger: object | None = None  # what addSystemEventTrigger returned
        self._block: tuple[int, int] | None = None
        """The first and last message number of this store's block (writer thread only)."""
        self._high = 0
        """The highest number of the block used so far (writer thread only)."""
        self._waiting: list[tuple[Operation, tuple, Deferred]] | None = []
        """Calls made before the first connection (None once connected)."""
        self._opened: Deferred | None = None
        self._retry: IDelayedCall | None = None

    # ------------------------------------------------------------------ figures

    @property
    def available(self) -> bool:
        """False while the server cannot be reached: stored publishes are refused."""
        return self._writer.available

    @property
    def backlog(self) -> int:
        return self._writer.backlog

    @property
    def batches(self) -> int:
        return self._writer.batches

    @property
    def commit_latency(self) -> Latencies:
        return self._writer.commit_latency

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> Deferred:
        if self._state != "new":
            return fail(StoreClosed(f"the store is {self._state}"))
        self._state = "open"
        # The thread starts with the reactor (a broker that fails before it runs is not kept
        # alive by a waiting thread); operations queue until then.
        self._reactor.callWhenRunning(self._writer.start)
        self._trigger = self._reactor.addSystemEventTrigger("during", "shutdown", self.close)
        opened = self._opened = Deferred()
        self._try_open()
        return opened

    def _try_open(self) -> None:
        """Connect (and create the schema); while the server cannot be reached, try again
        after the writer's backoff.  Calls made meanwhile wait (at most MAX_QUEUE of them)
        and go out once connected: a broker started before its database serves once the
        database is up, as a node restarted during an outage does."""
        self._retry = None
        if self._state != "open":
            return
        d = self._writer.submit(lambda c: None)

        def failed(failure: Failure) -> None:
            if failure.check(StoreUnavailable) and self._state == "open":
                self._retry = self._reactor.callLater(self._writer.backoff, self._try_open)
                return
            self._release_waiting(failure)

        d.addCallbacks(lambda _: self._release_waiting(None), failed)

    def _release_waiting(self, failure: Failure | None) -> None:
        waiting, self._waiting = self._waiting, None
        opened, self._opened = self._opened, None
        for operation, args, d in waiting or ():
            if failure is None:
                self._writer.submit(operation, *args).chainDeferred(d)
            else:
                d.errback(failure)
        if opened is not None:
            if failure is None:
                opened.callback(None)
            else:
                opened.errback(failure)

    def close(self) -> Deferred:
        if self._state in ("closing", "closed"):
            return self._closed if self._closed is not None else succeed(None)
        if self._state == "new":
            self._state = "closed"
            return succeed(None)
        self._state = "closing"
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        if self._waiting is not None:
            self._release_waiting(Failure(StoreClosed("the store was closed before it could connect")))
        if self._trigger is not None:
            try:
                self._reactor.removeSystemEventTrigger(self._trigger)
            except (ValueError, KeyError):
                pass  # called by that very trigger
            self._trigger = None
        d = self._writer.disconnect()
        d.addBoth(self._stopped)
        self._closed = d
        return d

    def _stopped(self, result: None | Failure) -> None:
        self._state = "closed"
        self._writer.stop()
        if isinstance(result, Failure) and not result.check(StoreUnavailable):
            self._log.failure("Closing the store {url}", result, url=self.url)

    def _submit(self, operation: Operation, *args: object) -> Deferred:
        if self._state != "open":
            return fail(StoreClosed(f"the store is {self._state}"))
        if self._waiting is not None:  # not connected yet: wait for it
            if len(self._waiting) >= MAX_QUEUE:
                return fail(StoreUnavailable(f"{MAX_QUEUE} store operations are waiting for the database"))
            d: Deferred = Deferred()
            self._waiting.append((operation, args, d))
            return d
        return self._writer.submit(operation, *args)

    # ------------------------------------------------------------------ message numbers

    def _take(self, c: PgConnection) -> int:
        """The next unused number of this store's block (taking the block first)."""
        if self._block is None:
            first = one_row(c.execute("SELECT nextval('message_blocks')"))[0]
            self._block = (first, first + SEQ_BLOCK - 1)
            self._high = first - 1
        return self._high + 1

    def _used(self, seq: int) -> None:
        if self._block is not None and self._block[0] <= seq <= self._block[1]:
            self._high = max(self._high, seq)

    def _insert_message(self, c: PgConnection, record: MessageRecord, seq: int, subscribers: Sequence[str] = (),
                        changes: Sequence[str] = ()) -> int:
        """Insert the message and, in the same statement, a pending delivery per subscriber."""
        from psycopg import errors

        row = (seq, record.message_id, record.topic, record.publisher, record.client_message_id, record.received, record.expires,
               record.priority, record.data, record.mode, record.receipt, record.trashed)
        insert = (f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES"
                  " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
        try:
            if subscribers:
                c.execute(f"WITH m AS ({insert} RETURNING seq) INSERT INTO deliveries"
                          " (subscriber, seq, state, attempts, change)"
                          f" SELECT d.subscriber, m.seq, {PENDING}, 0, d.change FROM m,"
                          " unnest(%s::text[], %s::text[]) AS d (subscriber, change)"
                          " ON CONFLICT DO NOTHING", (*row, list(subscribers), list(changes)))
            else:
                c.execute(insert, row)
        except errors.UniqueViolation:
            raise ValueError(f"duplicate message {record.message_id!r} (seq {seq})") from None
        self._used(seq)
        return seq

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> Deferred:
        def get(c: PgConnection) -> str | None:
            row = c.execute("SELECT value FROM meta WHERE key = %s", (key,)).fetchone()
            return row[0] if row else None

        return self._submit(get)

    def set_meta(self, key: str, value: str) -> Deferred:
        return self._submit(lambda c: c.execute(
            "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            (key, value)) and None)

    # ------------------------------------------------------------------ topics

    def load_topics(self) -> Deferred:
        return self._submit(lambda c: [topic_record(row) for row in c.execute(
            f"SELECT {TOPIC_COLUMNS} FROM topics ORDER BY key COLLATE \"C\"")])

    def put_topics(self, records: Iterable[TopicRecord]) -> Deferred:
        rows = [topic_row(r) for r in records]

        def put(c: PgConnection) -> None:
            if rows:
                c.cursor().executemany(PUT_TOPIC, rows)

        return self._submit(put)

    def delete_topics(self, keys: Iterable[str], subscriptions: Iterable[tuple[str, str, str]] = ()) -> Deferred:
        keys = sorted(set(keys))
        doomed = list(subscriptions)

        def delete(c: PgConnection) -> int:
            count = c.execute("DELETE FROM topics WHERE key = ANY(%s::text[])", (keys,)).rowcount
            if doomed:
                c.cursor().executemany(
                    "DELETE FROM subscriptions WHERE subscriber = %s AND kind = %s AND topic = %s", doomed)
            return count

        return self._submit(delete)

    def rename_topics(self, renames: Iterable[tuple[str, TopicRecord]]) -> Deferred:
        renames = list(renames)

        def rename(c: PgConnection) -> None:
            c.execute("DELETE FROM topics WHERE key = ANY(%s::text[])", ([old for old, _r in renames],))
            if renames:
                c.cursor().executemany(PUT_TOPIC, [topic_row(record) for _old, record in renames])

        return self._submit(rename)

    # ------------------------------------------------------------------ contacts

    def get_contact(self, account: str) -> Deferred:
        def get(c: PgConnection) -> Contact | None:
            row = c.execute("SELECT mime, data FROM contacts WHERE account = %s", (account,)).fetchone()
            return Contact(row[0], bytes(row[1])) if row else None

        return self._submit(get)

    def set_contact(self, account: str, contact: Contact) -> Deferred:
        return self._submit(lambda c: c.execute(
            "INSERT INTO contacts (account, mime, data) VALUES (%s, %s, %s) ON CONFLICT (account)"
            " DO UPDATE SET mime = EXCLUDED.mime, data = EXCLUDED.data",
            (account, contact.mime, contact.data)) and None)

    # ------------------------------------------------------------------ messages

    def add_message(self, record: MessageRecord) -> Deferred:
        return self._submit(lambda c: self._insert_message(c, record, record.seq or self._take(c)))

    def next_seq(self) -> Deferred:
        return self._submit(self._take)

    def publish(self, record: MessageRecord, deliveries: Iterable[tuple[str, str]]) -> Deferred:
        pairs = list(deliveries)
        subscribers = [subscriber for subscriber, _change in pairs]
        changes = [change for _subscriber, change in pairs]

        @pipelined
        def publish(c: PgConnection) -> int:
            # One statement: the message and its deliveries; it reads no result, so the
            # publishes of a batch go out in one pipeline (pg_writer).
            return self._insert_message(c, record, record.seq, subscribers, changes)

        return self._submit(publish)

    def publish_many(self, items: Iterable[tuple[MessageRecord, Iterable[tuple[str, str]]]],
                     flows: Iterable[PacketFlow] = ()) -> Deferred:
        flow_rows = [_flow_row(flow) for flow in flows]
        rows = []
        for record, deliveries in items:
            pairs = list(deliveries)
            rows.append((record, [subscriber for subscriber, _change in pairs], [change for _s, change in pairs]))

        @pipelined
        def publish(c: PgConnection) -> list[int]:
            seqs = [self._insert_message(c, record, record.seq, subscribers, changes)
                    for record, subscribers, changes in rows]
            for row in flow_rows:
                c.execute(PUT_FLOW, row)
            return seqs

        return self._submit(publish)

    def find_message(self, seq: int) -> Deferred:
        def get(c: PgConnection) -> MessageRecord | None:
            row = c.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE seq = %s", (seq,)).fetchone()
            return message_record(row) if row else None

        return self._submit(get)

    def get_messages(self, topic: str, seqs: Iterable[int] | None = None, limit: int | None = None) -> Deferred:
        wanted = None if seqs is None else sorted(set(seqs))

        def get(c: PgConnection) -> list[MessageRecord]:
            where = "" if wanted is None else " AND seq = ANY(%s::bigint[])"
            params: list[Any] = [topic] + ([] if wanted is None else [wanted]) + [limit]
            rows = c.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE topic = %s{where}"
                             " ORDER BY seq LIMIT %s", params)
            return [message_record(row) for row in rows]

        return self._submit(get)

    def list_messages(self, topic: str) -> Deferred:
        return self._submit(lambda c: [row[0] for row in c.execute(
            "SELECT seq FROM messages WHERE topic = %s ORDER BY seq", (topic,))])

    def delete_message(self, seq: int) -> Deferred:
        def delete(c: PgConnection) -> bool:
            c.execute("DELETE FROM deliveries WHERE seq = %s", (seq,))
            return c.execute("DELETE FROM messages WHERE seq = %s", (seq,)).rowcount > 0

        return self._submit(delete)

    def remove_message(self, topic: str, smuid: str) -> Deferred:
        def remove(c: PgConnection) -> bool:
            row = c.execute("SELECT seq FROM messages WHERE topic = %s AND smuid = %s FOR UPDATE",
                            (topic, smuid)).fetchone()
            if row is None:
                return False
            c.execute("DELETE FROM deliveries WHERE seq = %s", (row[0],))
            c.execute("DELETE FROM messages WHERE seq = %s", (row[0],))
            return True

        return self._submit(remove)

    def trash_message(self, seq: int, now: float) -> Deferred:
        return self._submit(lambda c: trash(c, seq, now))

    def move_message(self, seq: int, topic: str, deliveries: Iterable[tuple[str, str]]) -> Deferred:
        rows = [(subscriber, seq, PENDING, 0, change) for subscriber, change in deliveries]

        def move(c: PgConnection) -> Settled | None:
            row = lock_message(c, seq, live=True)
            if row is None:
                return None
            released = drop_pending_of(c, seq)
            c.execute("UPDATE messages SET topic = %s WHERE seq = %s", (topic, seq))
            if rows:
                c.cursor().executemany(INSERT_DELIVERY, rows)
            return Settled(seq, row[0], None, released)

        return self._submit(move)

    def expire(self, now: float, limit: int) -> Deferred:
        def expire(c: PgConnection) -> list[Settled]:
            seqs = [row[0] for row in c.execute(
                "SELECT seq FROM messages WHERE trashed IS NULL AND expires IS NOT NULL AND expires <= %s"
                " ORDER BY expires LIMIT %s FOR UPDATE SKIP LOCKED", (now, limit))]
            return [settled for seq in seqs if (settled := trash(c, seq, now)) is not None]

        return self._submit(expire)

    def empty_trash(self, before: float) -> Deferred:
        return self._submit(lambda c: c.execute(
            "DELETE FROM messages WHERE trashed IS NOT NULL AND trashed <= %s", (before,)).rowcount)

    def count_messages(self, topics: Iterable[str]) -> Deferred:
        keys = sorted(set(topics))
        return self._submit(lambda c: c.execute(
            "SELECT COUNT(*) FROM messages WHERE topic = ANY(%s::text[])", (keys,)).fetchone()[0])

    def queue_figures(self, top: int = Settings.metrics_top_queues) -> Deferred:
        """Deferred[dict]: as the SQLite store's (``pending``, ``unacknowledged``, ``trash`` of
        the ``top`` fullest Trash queues, ``trash_total``, ``trash_queues``)."""

        def figures(c: PgConnection) -> dict[str, Any]:
            waiting: dict[bool, int] = dict(c.execute(
                "SELECT d.attempts > 0, COUNT(*) FROM deliveries d JOIN messages m ON m.seq = d.seq"
                f" WHERE d.state = {PENDING} AND m.trashed IS NULL GROUP BY d.attempts > 0").fetchall())
            trash: dict[str, int] = dict(c.execute(
                "SELECT topic, COUNT(*) AS n FROM messages WHERE trashed IS NOT NULL GROUP BY topic"
                " ORDER BY n DESC, topic LIMIT %s", (max(top, 0),)).fetchall())
            total, queues = one_row(c.execute(
                "SELECT COUNT(*), COUNT(DISTINCT topic) FROM messages WHERE trashed IS NOT NULL"))
            return {"pending": waiting.get(False, 0), "unacknowledged": waiting.get(True, 0), "trash": trash,
                    "trash_total": total, "trash_queues": queues}

        return self._submit(figures)

    # ------------------------------------------------------------------ deliveries

    def pending(self, subscriber: str, limit: int, exclude_topics: Iterable[str] = (),
                max_bytes: int | None = None, skip: Iterable[int] = ()) -> Deferred:
        excluded = sorted(set(exclude_topics))
        skipped = frozenset(skip)

        def get(c: PgConnection) -> list[Delivery]:
            # The sizes first, the bodies only of the rows within the budget (as SQLite does):
            # a window of large messages must not be read whole to keep a few of them.
            rows = c.execute(
                "SELECT d.seq, m.topic, m.priority, d.change, d.attempts, m.mode, octet_length(m.data)"
                " FROM deliveries d JOIN messages m ON m.seq = d.seq"
                f" WHERE d.subscriber = %s AND d.state = {PENDING} AND m.trashed IS NULL AND NOT m.done"
                " AND m.topic <> ALL(%s::text[]) ORDER BY m.priority DESC, d.seq LIMIT %s",
                (subscriber, excluded, limit + len(skipped))).fetchall()
            rows = [row for row in rows if row[0] not in skipped][:limit]
            rows = rows[:fitting((row[6] for row in rows), max_bytes)]
            if not rows:
                return []
            bodies: dict[int, bytes] = dict(c.execute("SELECT seq, data FROM messages WHERE seq = ANY(%s::bigint[])",
                                    ([row[0] for row in rows],)).fetchall())
            return [Delivery(seq, topic, priority, change, attempts, mode, bytes(bodies[seq]))
                    for seq, topic, priority, change, attempts, mode, _size in rows if seq in bodies]

        return self._submit(get)

    def pending_counts(self, prefix: str) -> Deferred:
        def count(c: PgConnection) -> dict[str, int]:
            return dict(c.execute(
                "SELECT d.subscriber, COUNT(*) FROM deliveries d JOIN messages m ON m.seq = d.seq"
                f" WHERE left(d.subscriber, %s) = %s AND d.state = {PENDING} AND m.trashed IS NULL"
                " AND NOT m.done GROUP BY d.subscriber", (len(prefix), prefix)).fetchall())

        return self._submit(count)

    def acknowledge(self, subscriber: str, seq: int) -> Deferred:
        def ack(c: PgConnection) -> Settled | None:
            # One round trip in the common case: lock the message's row (the claim: a racing
            # acknowledgement on another node waits here, then sees ``done``), then mark the
            # delivery acknowledged unless a ONE message was settled by someone else.
            row = c.execute(
                "WITH m AS (SELECT seq, topic, mode, receipt, done FROM messages WHERE seq = %s FOR UPDATE),"
                f" a AS (UPDATE deliveries d SET state = {ACKED} FROM m WHERE d.subscriber = %s"
                f" AND d.seq = m.seq AND d.state = {PENDING} AND NOT (m.mode = 'ONE' AND m.done)"
                " RETURNING d.seq)"
                " SELECT m.topic, m.mode, m.receipt, (SELECT COUNT(*) FROM a) FROM m",
                (seq, subscriber)).fetchone()
            if row is None:  # the message is gone: the delivery alone
                acked = c.execute(f"UPDATE deliveries SET state = {ACKED} WHERE subscriber = %s AND seq = %s"
                                  f" AND state = {PENDING}", (subscriber, seq)).rowcount
                return Settled(seq, "") if acked else None
            topic, mode, receipt, acked = row
            if not acked:
                return None  # nothing pending, or another subscriber settled the ONE message first
            due = due_receipt(c, seq, final=False) if receipt != "NONE" else None
            released: tuple[str, ...] = ()
            if mode == "ONE":
                released = drop_pending_of(c, seq)
                c.execute("UPDATE messages SET done = TRUE WHERE seq = %s", (seq,))
            return Settled(seq, topic, due, released)

        return self._submit(ack)

    def attempt(self, subscriber: str, seq: int) -> Deferred:
        def count(c: PgConnection) -> int:
            row = c.execute(f"UPDATE deliveries SET attempts = attempts + 1 WHERE subscriber = %s AND seq = %s"
                            f" AND state = {PENDING} RETURNING attempts", (subscriber, seq)).fetchone()
            return int(row[0]) if row else 0

        return self._submit(count)

    def give_up(self, subscriber: str, seq: int, now: float) -> Deferred:
        def give_up(c: PgConnection) -> Settled | None:
            row = lock_message(c, seq)
            if c.execute(f"UPDATE deliveries SET state = {DEAD} WHERE subscriber = %s AND seq = %s"
                         f" AND state = {PENDING}", (subscriber, seq)).rowcount == 0 or row is None:
                return None
            if c.execute(f"SELECT 1 FROM deliveries WHERE seq = %s AND state = {PENDING} LIMIT 1",
                         (seq,)).fetchone():
                return Settled(seq, row[0])
            return trash(c, seq, now)

        return self._submit(give_up)

    def backfill(self, subscriber: str, topics: Iterable[str], since: float | None, now: float) -> Deferred:
        keys = sorted(set(topics))

        def backfill(c: PgConnection) -> int:
            added = c.execute(
                f"INSERT INTO deliveries (subscriber, seq, state, attempts, change) SELECT %s, seq, {PENDING}, 0,"
                " 'ADD' FROM messages WHERE topic = ANY(%s::text[]) AND trashed IS NULL AND NOT done"
                " AND (expires IS NULL OR expires > %s) AND received >= %s ON CONFLICT DO NOTHING",
                (subscriber, keys, now, since if since is not None else float("-inf"))).rowcount
            if since is not None:
                c.execute(f"DELETE FROM deliveries WHERE subscriber = %s AND state = {PENDING} AND seq IN"
                          " (SELECT seq FROM messages WHERE topic = ANY(%s::text[]) AND received < %s)",
                          (subscriber, keys, since))
            return added

        return self._submit(backfill)

    def drop_pending(self, subscriber: str, topics: Iterable[str]) -> Deferred:
        keys = sorted(set(topics))
        return self._submit(lambda c: c.execute(
            f"DELETE FROM deliveries WHERE subscriber = %s AND state = {PENDING} AND seq IN"
            " (SELECT seq FROM messages WHERE topic = ANY(%s::text[]))", (subscriber, keys)).rowcount)

    # ------------------------------------------------------------------ subscriptions

    def load_subscriptions(self) -> Deferred:
        return self._submit(lambda c: [subscription(row) for row in c.execute(
            f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions"
            ' ORDER BY subscriber COLLATE "C", kind COLLATE "C", topic COLLATE "C"')])

    def put_subscription(self, record: SubscriptionRecord) -> Deferred:
        row = (record.subscriber, record.kind, record.topic, ",".join(record.changes), record.since, record.until)
        return self._submit(lambda c: c.execute(
            f"INSERT INTO subscriptions ({SUBSCRIPTION_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (subscriber, kind, topic) DO UPDATE SET changes = EXCLUDED.changes,"
            " since = EXCLUDED.since, until = EXCLUDED.until", row) and None)

    def remove_subscription(self, subscriber: str, kind: str, topic: str) -> Deferred:
        return self._submit(lambda c: c.execute(
            "DELETE FROM subscriptions WHERE subscriber = %s AND kind = %s AND topic = %s",
            (subscriber, kind, topic)).rowcount > 0)

    def subscriptions_of(self, subscriber: str) -> Deferred:
        return self._submit(lambda c: [subscription(row) for row in c.execute(
            f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE subscriber = %s"
            ' ORDER BY kind COLLATE "C", topic COLLATE "C"', (subscriber,))])

    # ------------------------------------------------------------------ QoS 2 exchanges

    def put_flows(self, flows: Iterable[PacketFlow]) -> Deferred:
        rows = [_flow_row(flow) for flow in flows]

        @pipelined
        def put(c: PgConnection) -> None:
            for row in rows:
                c.execute(PUT_FLOW, row)

        return self._submit(put)

    def remove_flow(self, subscriber: str, inbound: bool, packet_id: int) -> Deferred:
        return self._submit(lambda c: c.execute(
            "DELETE FROM flows WHERE subscriber = %s AND inbound = %s AND packet_id = %s",
            (subscriber, inbound, packet_id)).rowcount > 0)

    def flows_of(self, subscriber: str) -> Deferred:
        return self._submit(lambda c: [PacketFlow(*row) for row in c.execute(
            "SELECT subscriber, inbound, packet_id, seq, released FROM flows WHERE subscriber = %s"
            " ORDER BY inbound DESC, seq, packet_id", (subscriber,))])

    def drop_flows(self, subscriber: str) -> Deferred:
        return self._submit(lambda c: c.execute("DELETE FROM flows WHERE subscriber = %s", (subscriber,)).rowcount)

    # ------------------------------------------------------------------ retained messages

    def put_retained(self, topic: str, data: bytes | None) -> Deferred:
        # It reads no result: the retains of a batch go out in one pipeline (pg_writer).
        @pipelined
        def put(c: PgConnection) -> None:
            if data is None:
                c.execute("DELETE FROM retained WHERE topic = %s", (topic,))
            else:
                c.execute("INSERT INTO retained (topic, data) VALUES (%s, %s)"
                          " ON CONFLICT (topic) DO UPDATE SET data = EXCLUDED.data", (topic, data))

        return self._submit(put)

    def load_retained(self) -> Deferred:
        return self._submit(lambda c: [(topic, bytes(data)) for topic, data in c.execute(
            'SELECT topic, data FROM retained ORDER BY topic COLLATE "C"')])


def _flow_row(flow: PacketFlow) -> tuple:
    return (flow.subscriber, flow.inbound, flow.packet_id, flow.seq, flow.released)

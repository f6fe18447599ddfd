"""The SQLite store: ``DATA_DIR/smqp.sqlite3``, WAL mode, one writer thread, group commit.

Every call becomes an operation ``f(connection, *args)`` queued on the reactor thread.  One
thread, the only one that touches the database, runs the queued operations in batches: a
batch is one transaction (should one operation fail, the batch runs again with a savepoint
per operation, so it does not undo the others), committed with ``synchronous=FULL``, and only
then do the operations' Deferreds fire, in order, on the reactor thread.  While a batch commits, new calls queue up
and go out together in the next one: under load many publishes share one fsync.

The schema is versioned with ``PRAGMA user_version``; :data:`MIGRATIONS` lists the scripts
that take a database from one version to the next (append, never edit).
"""
from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.config import Settings
from brokerd.interfaces import IBrokerReactor
from brokerd.store.base import IStore
from brokerd.store.latency import Latencies
from brokerd.store.memory import StoreClosed
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

FILENAME = "smqp.sqlite3"
SYNCHRONOUS = "FULL"
"""Every commit is on disk before its Deferred fires (a power cut loses nothing acknowledged)."""
MAX_BATCH = 512
"""Operations in one transaction at most."""
_IN_CHUNK = 500
"""Keys per ``IN (...)`` (SQLite allows 999 parameters in older builds)."""

SUBSCRIBER_TABLES = ("subscriptions", "deliveries", "flows")
"""The tables that name durable subscribers."""
OWNED_BEFORE_TAG = ("instr(subscriber, ':') = 0 AND substr(subscriber, 1, 1) NOT IN ('~', '@')"
                    " AND length(subscriber) - length(replace(subscriber, '/', '')) = 4")
"""An owned subscriber's name as written before its encoding had a version tag: five
percent-encoded parts, no ``:`` (a channel's) and no ``~`` (a queue's)."""

MIGRATIONS: tuple[str, ...] = (
    # 1: topics, contacts, server settings, retained messages, durable subscriptions
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE topics (
        key TEXT PRIMARY KEY, name TEXT NOT NULL, keywords TEXT NOT NULL,
        delivery TEXT NOT NULL, link TEXT, owner TEXT NOT NULL, created REAL NOT NULL,
        system INTEGER NOT NULL);
    CREATE TABLE contacts (account TEXT PRIMARY KEY, mime TEXT NOT NULL, data BLOB NOT NULL);
    CREATE TABLE messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, smuid TEXT NOT NULL UNIQUE, topic TEXT NOT NULL,
        publisher TEXT NOT NULL, cmuid TEXT NOT NULL, received REAL NOT NULL, expires REAL,
        priority INTEGER NOT NULL, data BLOB NOT NULL);
    CREATE INDEX messages_by_topic ON messages (topic, seq);
    CREATE TABLE subscriptions (
        subscriber TEXT NOT NULL, kind TEXT NOT NULL, topic TEXT NOT NULL,
        changes TEXT NOT NULL, since REAL, until REAL,
        PRIMARY KEY (subscriber, kind, topic));
    CREATE INDEX subscriptions_by_topic ON subscriptions (topic, kind);
    """,
    # 2: two-phase delivery state, receipts, Trash
    """
    ALTER TABLE messages ADD COLUMN mode TEXT NOT NULL DEFAULT 'ALL';
    ALTER TABLE messages ADD COLUMN receipt TEXT NOT NULL DEFAULT 'NONE';
    ALTER TABLE messages ADD COLUMN receipted INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE messages ADD COLUMN done INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE messages ADD COLUMN trashed REAL;
    CREATE INDEX messages_by_expiry ON messages (expires) WHERE trashed IS NULL;
    CREATE INDEX messages_by_trashed ON messages (trashed) WHERE trashed IS NOT NULL;
    CREATE TABLE deliveries (
        subscriber TEXT NOT NULL, seq INTEGER NOT NULL, state INTEGER NOT NULL,
        attempts INTEGER NOT NULL, change TEXT NOT NULL,
        PRIMARY KEY (subscriber, seq)) WITHOUT ROWID;
    CREATE INDEX deliveries_by_seq ON deliveries (seq, state);
    """,
    # 3: per-topic default message timeouts (NULL: none set, the topic inherits)
    """
    ALTER TABLE topics ADD COLUMN timeout REAL;
    """,
    # 4: MQTT's retained messages, the last of each core topic (brokerd.core.retained), in
    # their stored form (brokerd.core.stored); unrelated to the SMQP messages of migration 1
    """
    CREATE TABLE retained (topic TEXT PRIMARY KEY, data BLOB NOT NULL);
    """,
    # 5: the QoS 2 exchanges under way of MQTT's persistent sessions (records.PacketFlow)
    """
    CREATE TABLE flows (
        subscriber TEXT NOT NULL, inbound INTEGER NOT NULL, packet_id INTEGER NOT NULL,
        seq INTEGER NOT NULL, released INTEGER NOT NULL,
        PRIMARY KEY (subscriber, inbound, packet_id)) WITHOUT ROWID;
    """,
    # 6: owned durable subscribers' names get their encoding's version tag
    # (brokerd.core.subscriber: ``<protocol>/<realm>/<name>/<session>/<incarnation>`` becomes
    # ``@1/<protocol>/...``); account channels and outgoing queues keep theirs
    ";".join(f"UPDATE {table} SET subscriber = '@1/' || subscriber WHERE {OWNED_BEFORE_TAG}"
             for table in SUBSCRIBER_TABLES) + ";",
)
PUT_FLOW = "INSERT OR REPLACE INTO flows VALUES (?, ?, ?, ?, ?)"

Operation = Callable[..., Any]


def _chunks(keys: Iterable[Any]) -> Iterable[list[Any]]:
    """``keys`` sorted, without repeats, in lists short enough for one ``IN (...)``."""
    keys = sorted(set(keys))
    for start in range(0, len(keys), _IN_CHUNK):
        yield keys[start : start + _IN_CHUNK]


_TOPIC_COLUMNS = "key, name, keywords, delivery, link, owner, created, system, timeout"
_PUT_TOPIC = f"INSERT OR REPLACE INTO topics ({_TOPIC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"


def _topic_row(record: TopicRecord) -> tuple:
    return (record.key, record.name, json.dumps(list(record.keywords)), record.delivery,
            record.link, record.owner, record.created, int(record.system), record.timeout)


def _topic_record(row: tuple) -> TopicRecord:
    key, name, keywords, delivery, link, owner, created, system, timeout = row
    return TopicRecord(key, name, tuple(json.loads(keywords)), delivery, link, owner, created,
                       bool(system), timeout)


def _message_record(row: tuple) -> MessageRecord:
    seq, smuid, topic, publisher, cmuid, received, expires, priority, data, mode, receipt, trashed = row
    return MessageRecord(smuid, topic, publisher, cmuid, received, expires, priority, bytes(data), seq,
                         mode, receipt, trashed)


_MESSAGE_COLUMNS = ("seq, smuid, topic, publisher, cmuid, received, expires, priority, data, mode,"
                    " receipt, trashed")
_LIVE = "trashed IS NULL"


def _flow_row(flow: PacketFlow) -> tuple:
    return (flow.subscriber, int(flow.inbound), flow.packet_id, flow.seq, int(flow.released))


def _marks(keys: list) -> str:
    return ",".join("?" * len(keys))


def _insert_message(c: sqlite3.Connection, record: MessageRecord, seq: int | None) -> int:
    row = (seq, record.message_id, record.topic, record.publisher, record.client_message_id, record.received,
           record.expires, record.priority, record.data, record.mode, record.receipt, record.trashed)
    try:
        cursor = c.execute(
            "INSERT INTO messages (seq, smuid, topic, publisher, cmuid, received, expires,"
            " priority, data, mode, receipt, trashed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    except sqlite3.IntegrityError:
        raise ValueError(f"duplicate message {record.message_id!r} (seq {seq})") from None
    if cursor.lastrowid is None:  # sqlite3 sets it after every INSERT of one row
        raise sqlite3.DatabaseError("an INSERT without a row id")
    return cursor.lastrowid


def _receipt(c: sqlite3.Connection, seq: int, final: bool) -> ReceiptDue | None:
    """The receipt of message ``seq`` if it is due now (and mark it given)."""
    row = c.execute("SELECT topic, publisher, cmuid, receipt, receipted FROM messages WHERE seq = ?",
                    (seq,)).fetchone()
    if row is None or row[3] == "NONE" or row[4]:
        return None
    total, acked = c.execute(
        f"SELECT COUNT(*), COALESCE(SUM(state = {ACKED}), 0) FROM deliveries WHERE seq = ?", (seq,)).fetchone()
    if not receipt_due(row[3], acked, total, final):
        return None
    c.execute("UPDATE messages SET receipted = 1 WHERE seq = ?", (seq,))
    data = c.execute("SELECT data FROM messages WHERE seq = ?", (seq,)).fetchone()[0]
    return ReceiptDue(seq, row[0], row[1], row[2], bytes(data), int(acked), int(total))


def _pending_of(c: sqlite3.Connection, seq: int) -> tuple[str, ...]:
    rows = c.execute(f"SELECT subscriber FROM deliveries WHERE seq = ? AND state = {PENDING}", (seq,))
    return tuple(row[0] for row in rows)


def _trash(c: sqlite3.Connection, seq: int, now: float) -> Settled | None:
    row = c.execute(f"SELECT topic FROM messages WHERE seq = ? AND {_LIVE}", (seq,)).fetchone()
    if row is None:
        return None
    receipt = _receipt(c, seq, final=True)
    released = _pending_of(c, seq)
    c.execute("DELETE FROM deliveries WHERE seq = ?", (seq,))
    c.execute("UPDATE messages SET topic = ?, trashed = ? WHERE seq = ?", (trash_key(row[0]), now, seq))
    return Settled(seq, row[0], receipt, released, trashed=True)


THREAD_NAME = "brokerd-store"

@implementer(IStore)
class SQLiteStore:
    """The durable store in one SQLite file.  ``reactor`` fires the Deferreds."""

    _log = Logger()

    def __init__(self, path: Path, reactor: IBrokerReactor) -> None:
        self.path = Path(path)
        self._reactor = reactor
        self._inbox: queue.SimpleQueue[list | None] = queue.SimpleQueue()
        """Batches for the writer thread (None: stop).  A C queue, not Twisted's thread pool:
        handing a batch over is one put, which matters when a subscriber's acknowledgement
        is a batch of its own every round trip."""
        self._thread: threading.Thread | None = None
        self._connection: sqlite3.Connection | None = None
        self._queue: list[tuple[Operation, tuple, Deferred]] = []
        self._busy = False
        self._state = "new"  # new -> open -> closing -> closed
        self._closed: Deferred | None = None
        self._trigger: object | None = None  # what addSystemEventTrigger returned
        self.batches = 0
        """Transactions committed (a batch of operations each)."""
        self.commit_latency = Latencies()
        """Seconds from BEGIN to COMMIT of each transaction (the admin listener's histogram)."""

    @property
    def backlog(self) -> int:
        """Operations waiting for the writer thread (the running batch not included)."""
        return len(self._queue)

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> Deferred:
        if self._state != "new":
            return fail(StoreClosed(f"the store is {self._state}"))
        self._state = "open"
        # The thread starts with the reactor, as the reactor's own pool does: a broker that
        # fails before its reactor runs (a port that cannot be bound) must not be kept alive
        # by a thread waiting for work.  Operations queue until then.
        self._reactor.callWhenRunning(self._start_writer)
        self._trigger = self._reactor.addSystemEventTrigger("during", "shutdown", self.close)
        return self._submit(self._connect)

    def _connect(self, _connection: None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
        connection.execute("PRAGMA foreign_keys=ON")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            connection.close()
            raise RuntimeError(
                f"{self.path}: schema version {version} is newer than this brokerd ({len(MIGRATIONS)})"
            )
        for number in range(version, len(MIGRATIONS)):
            connection.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        connection.execute(statement)
                connection.execute(f"PRAGMA user_version={number + 1}")
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                connection.close()
                raise
        self._connection = connection

    def close(self) -> Deferred:
        """Run what is queued, close the database and stop the thread."""
        if self._state in ("closing", "closed"):
            return self._closed if self._closed is not None else succeed(None)
        if self._state == "new":
            self._state = "closed"
            return succeed(None)
        self._state = "closing"
        if self._trigger is not None:
            try:
                self._reactor.removeSystemEventTrigger(self._trigger)
            except (ValueError, KeyError):
                pass  # we are being called by that very trigger
            self._trigger = None
        d: Deferred[None] = Deferred()
        self._queue.append((self._disconnect, (), d))
        if not self._busy:
            self._flush()
        d.addBoth(self._stopped)
        self._closed = d
        return d

    def _disconnect(self, connection: sqlite3.Connection | None) -> None:
        if connection is not None:
            connection.close()
        self._connection = None

    def _start_writer(self) -> None:
        """The writer thread is a daemon: a broker's store is closed by its reactor's
        shutdown trigger (which commits what is queued and joins the thread), and a store
        nobody closed (a program or test that forgot it) must not hang the interpreter's
        exit."""
        if self._thread is None and self._state in ("open", "closing"):
            self._thread = threading.Thread(target=self._write_batches, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def _write_batches(self) -> None:
        """In the writer thread: run each batch, hand its outcome to the reactor thread."""
        call = self._reactor.callFromThread
        while True:
            batch = self._inbox.get()
            if batch is None:
                return
            try:
                outcome: list[tuple[bool, Any]] | Failure = self._run_batch(batch)
            except BaseException:
                outcome = Failure()
            call(self._batch_done, outcome, batch)

    def _stopped(self, result: None | Failure) -> None:
        self._state = "closed"
        self._inbox.put(None)
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if isinstance(result, Failure):
            self._log.failure("Closing the store {path}", result, path=str(self.path))
        return None

    # ------------------------------------------------------------------ the writer

    def _submit(self, operation: Operation, *args: object) -> Deferred:
        if self._state != "open":
            return fail(StoreClosed(f"the store is {self._state}"))
        d: Deferred = Deferred()
        self._queue.append((operation, args, d))
        if not self._busy:
            self._flush()
        return d

    def _flush(self) -> None:
        batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        self._busy = True
        self._inbox.put(batch)

    def _run_batch(self, batch: list[tuple[Operation, tuple, Deferred]]) -> list[tuple[bool, Any]]:
        """In the writer thread: one transaction for the batch.

        The operations run one after the other without savepoints: one that fails is rare
        (a duplicate message id, a bug), and two statements more per operation are a good
        part of what a small one costs.  When one does fail, the transaction is rolled back
        and the batch runs again with a savepoint per operation (:meth:`_run_guarded`), so
        the failing one is undone alone and the others commit, as if it had been guarded
        from the start: an operation is a function of the database it reads, so running it
        again after the rollback does the same."""
        connection = self._connection
        results: list[tuple[bool, Any]] = []
        while connection is None and batch:
            # Not connected yet (the first operation is _connect) or no longer (a failed
            # open): run operations on their own until there is a connection.
            (operation, args, _d), batch = batch[0], batch[1:]
            try:
                results.append((True, operation(None, *args)))
            except Exception:
                results.append((False, Failure()))
            connection = self._connection
        if connection is None or not batch:  # the loop above leaves a connection or no batch
            return results
        started = time.perf_counter()
        disconnect = self._disconnect
        connection.execute("BEGIN IMMEDIATE")
        try:
            done: list[tuple[bool, Any]] = []
            for operation, args, _d in batch:
                if operation == disconnect:
                    connection.execute("COMMIT")
                    done.append((True, operation(connection, *args)))
                    return results + done
                try:
                    done.append((True, operation(connection, *args)))
                except Exception:
                    connection.execute("ROLLBACK")
                    connection.execute("BEGIN IMMEDIATE")
                    return results + self._run_guarded(connection, batch, started)
            connection.execute("COMMIT")
            self.commit_latency.observe(time.perf_counter() - started)
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return results + done

    def _run_guarded(self, connection: sqlite3.Connection, batch: list[tuple[Operation, tuple, Deferred]],
                     started: float) -> list[tuple[bool, Any]]:
        """In the writer thread, in an open transaction: ``batch`` with a savepoint per
        operation, so one failing operation does not undo the others; then COMMIT."""
        results: list[tuple[bool, Any]] = []
        for operation, args, _d in batch:
            if operation == self._disconnect:
                connection.execute("COMMIT")
                results.append((True, operation(connection, *args)))
                return results
            connection.execute("SAVEPOINT op")
            try:
                value = operation(connection, *args)
            except Exception:
                connection.execute("ROLLBACK TO op")
                connection.execute("RELEASE op")
                results.append((False, Failure()))
            else:
                connection.execute("RELEASE op")
                results.append((True, value))
        connection.execute("COMMIT")
        self.commit_latency.observe(time.perf_counter() - started)
        return results

    def _batch_done(self, outcome: list[tuple[bool, Any]] | Failure, batch: list[tuple[Operation, tuple, Deferred]]) -> None:
        """Start the next batch first, then fire this one's Deferreds: the writer thread
        commits the next transaction while the reactor runs the callbacks of this one (they
        still fire in order, and only after their commit)."""
        self._busy = False
        self.batches += 1
        if self._queue:
            self._flush()
        if isinstance(outcome, Failure):
            self._log.failure("Store transaction failed", outcome)
            for _operation, _args, d in batch:
                d.errback(outcome)
        else:
            for (ok, value), (_operation, _args, d) in zip(outcome, batch):
                if ok:
                    d.callback(value)
                else:
                    d.errback(value)
        if self._queue and not self._busy:
            self._flush()

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> Deferred:
        def get(c: sqlite3.Connection) -> str | None:
            row = c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            return row[0] if row else None

        return self._submit(get)

    def set_meta(self, key: str, value: str) -> Deferred:
        return self._submit(lambda c: c.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value)) and None)

    # ------------------------------------------------------------------ topics

    def load_topics(self) -> Deferred:
        def load(c: sqlite3.Connection) -> list[TopicRecord]:
            rows = c.execute(f"SELECT {_TOPIC_COLUMNS} FROM topics ORDER BY key").fetchall()
            return [_topic_record(row) for row in rows]

        return self._submit(load)

    def put_topics(self, records: Iterable[TopicRecord]) -> Deferred:
        rows = [_topic_row(r) for r in records]

        def put(c: sqlite3.Connection) -> None:
            c.executemany(_PUT_TOPIC, rows)

        return self._submit(put)

    def delete_topics(self, keys: Iterable[str],
                      subscriptions: Iterable[tuple[str, str, str]] = ()) -> Deferred:
        keys = list(keys)
        doomed = list(subscriptions)

        def delete(c: sqlite3.Connection) -> int:
            count = 0
            for chunk in _chunks(keys):
                count += c.execute(f"DELETE FROM topics WHERE key IN ({_marks(chunk)})", chunk).rowcount
            c.executemany("DELETE FROM subscriptions WHERE subscriber = ? AND kind = ? AND topic = ?", doomed)
            return count

        return self._submit(delete)

    def rename_topics(self, renames: Iterable[tuple[str, TopicRecord]]) -> Deferred:
        renames = list(renames)
        rows = [_topic_row(record) for _old, record in renames]

        def rename(c: sqlite3.Connection) -> None:
            c.executemany("DELETE FROM topics WHERE key = ?", [(old,) for old, _r in renames])
            c.executemany(_PUT_TOPIC, rows)

        return self._submit(rename)

    # ------------------------------------------------------------------ contacts

    def get_contact(self, account: str) -> Deferred:
        def get(c: sqlite3.Connection) -> Contact | None:
            row = c.execute("SELECT mime, data FROM contacts WHERE account = ?", (account,)).fetchone()
            return Contact(row[0], bytes(row[1])) if row else None

        return self._submit(get)

    def set_contact(self, account: str, contact: Contact) -> Deferred:
        return self._submit(lambda c: c.execute(
            "INSERT OR REPLACE INTO contacts (account, mime, data) VALUES (?, ?, ?)",
            (account, contact.mime, contact.data)) and None)

    # ------------------------------------------------------------------ messages

    def add_message(self, record: MessageRecord) -> Deferred:
        return self._submit(lambda c: _insert_message(c, record, record.seq or None))

    def next_seq(self) -> Deferred:
        def get(c: sqlite3.Connection) -> int:
            used = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
            highest = c.execute("SELECT MAX(seq) FROM messages").fetchone()[0]
            return max(used[0] if used else 0, highest or 0) + 1

        return self._submit(get)

    def publish(self, record: MessageRecord, deliveries: Iterable[tuple[str, str]]) -> Deferred:
        rows = [(subscriber, record.seq, PENDING, 0, change) for subscriber, change in deliveries]

        def publish(c: sqlite3.Connection) -> int:
            seq = _insert_message(c, record, record.seq)
            c.executemany("INSERT OR IGNORE INTO deliveries VALUES (?, ?, ?, ?, ?)", rows)
            return seq

        return self._submit(publish)

    def publish_many(self, items: Iterable[tuple[MessageRecord, Iterable[tuple[str, str]]]],
                     flows: Iterable[PacketFlow] = ()) -> Deferred:
        items = list(items)
        flow_rows = [_flow_row(flow) for flow in flows]
        messages = [(record.seq, record.message_id, record.topic, record.publisher, record.client_message_id, record.received,
                     record.expires, record.priority, record.data, record.mode, record.receipt, record.trashed)
                    for record, _deliveries in items]
        deliveries = [(subscriber, record.seq, PENDING, 0, change)
                      for record, pairs in items for subscriber, change in pairs]

        def publish(c: sqlite3.Connection) -> list[int]:
            try:
                c.executemany(
                    "INSERT INTO messages (seq, smuid, topic, publisher, cmuid, received, expires,"
                    " priority, data, mode, receipt, trashed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", messages)
            except sqlite3.IntegrityError:
                raise ValueError("duplicate message among " + ", ".join(repr(row[1]) for row in messages)) from None
            c.executemany("INSERT OR IGNORE INTO deliveries VALUES (?, ?, ?, ?, ?)", deliveries)
            if flow_rows:
                c.executemany(PUT_FLOW, flow_rows)
            return [row[0] for row in messages]

        return self._submit(publish)

    def find_message(self, seq: int) -> Deferred:
        def get(c: sqlite3.Connection) -> MessageRecord | None:
            row = c.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE seq = ?", (seq,)).fetchone()
            return _message_record(row) if row else None

        return self._submit(get)

    def get_messages(self, topic: str, seqs: Iterable[int] | None = None, limit: int | None = None) -> Deferred:
        wanted = None if seqs is None else list(seqs)
        most = -1 if limit is None else limit  # SQLite: a negative LIMIT is no limit

        def get(c: sqlite3.Connection) -> list[MessageRecord]:
            if wanted is None:
                rows = c.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE topic = ? ORDER BY seq LIMIT ?",
                    (topic, most)).fetchall()
            else:
                rows = []
                for chunk in _chunks(wanted):
                    if limit is not None and len(rows) >= limit:
                        break
                    rows += c.execute(
                        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE topic = ? AND seq IN ({_marks(chunk)})"
                        " ORDER BY seq", (topic, *chunk)).fetchall()
                rows = rows[:limit]
            return [_message_record(row) for row in rows]

        return self._submit(get)

    def list_messages(self, topic: str) -> Deferred:
        def seqs(c: sqlite3.Connection) -> list[int]:
            return [row[0] for row in c.execute("SELECT seq FROM messages WHERE topic = ? ORDER BY seq", (topic,))]

        return self._submit(seqs)

    def delete_message(self, seq: int) -> Deferred:
        def delete(c: sqlite3.Connection) -> bool:
            c.execute("DELETE FROM deliveries WHERE seq = ?", (seq,))
            return c.execute("DELETE FROM messages WHERE seq = ?", (seq,)).rowcount > 0

        return self._submit(delete)

    def remove_message(self, topic: str, smuid: str) -> Deferred:
        def remove(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT seq FROM messages WHERE topic = ? AND smuid = ?", (topic, smuid)).fetchone()
            if row is None:
                return False
            c.execute("DELETE FROM deliveries WHERE seq = ?", (row[0],))
            c.execute("DELETE FROM messages WHERE seq = ?", (row[0],))
            return True

        return self._submit(remove)

    def trash_message(self, seq: int, now: float) -> Deferred:
        return self._submit(lambda c: _trash(c, seq, now))

    def move_message(self, seq: int, topic: str, deliveries: Iterable[tuple[str, str]]) -> Deferred:
        rows = [(subscriber, seq, PENDING, 0, change) for subscriber, change in deliveries]

        def move(c: sqlite3.Connection) -> Settled | None:
            row = c.execute(f"SELECT topic FROM messages WHERE seq = ? AND {_LIVE}", (seq,)).fetchone()
            if row is None:
                return None
            released = _pending_of(c, seq)
            c.execute(f"DELETE FROM deliveries WHERE seq = ? AND state = {PENDING}", (seq,))
            c.execute("UPDATE messages SET topic = ? WHERE seq = ?", (topic, seq))
            c.executemany("INSERT OR IGNORE INTO deliveries VALUES (?, ?, ?, ?, ?)", rows)
            return Settled(seq, row[0], None, released)

        return self._submit(move)

    def expire(self, now: float, limit: int) -> Deferred:
        def expire(c: sqlite3.Connection) -> list[Settled]:
            seqs = [row[0] for row in c.execute(
                f"SELECT seq FROM messages WHERE {_LIVE} AND expires IS NOT NULL AND expires <= ?"
                " ORDER BY expires LIMIT ?", (now, limit))]
            return [settled for seq in seqs if (settled := _trash(c, seq, now)) is not None]

        return self._submit(expire)

    def empty_trash(self, before: float) -> Deferred:
        return self._submit(lambda c: c.execute(
            "DELETE FROM messages WHERE trashed IS NOT NULL AND trashed <= ?", (before,)).rowcount)

    def count_messages(self, topics: Iterable[str]) -> Deferred:
        keys = list(topics)

        def count(c: sqlite3.Connection) -> int:
            total = 0
            for chunk in _chunks(keys):
                total += c.execute(
                    f"SELECT COUNT(*) FROM messages WHERE topic IN ({_marks(chunk)})", chunk).fetchone()[0]
            return total

        return self._submit(count)

    def queue_figures(self, top: int = Settings.metrics_top_queues) -> Deferred:
        """Deferred[dict]: for operators: ``pending`` deliveries never sent yet,
        ``unacknowledged`` ones sent at least once and not acknowledged, ``trash``, messages
        per Trash queue key (``a/b/trash``) of the ``top`` fullest queues only (users create
        topics: the figures stay bounded however many there are), ``trash_total`` the
        messages of every Trash and ``trash_queues`` how many Trash queues hold any."""

        def figures(c: sqlite3.Connection) -> dict[str, Any]:
            waiting = dict(c.execute(
                "SELECT d.attempts > 0, COUNT(*) FROM deliveries d JOIN messages m ON m.seq = d.seq"
                f" WHERE d.state = {PENDING} AND m.trashed IS NULL GROUP BY d.attempts > 0").fetchall())
            trash = dict(c.execute(
                "SELECT topic, COUNT(*) AS n FROM messages WHERE trashed IS NOT NULL GROUP BY topic"
                " ORDER BY n DESC, topic LIMIT ?", (max(top, 0),)).fetchall())
            total, queues = c.execute(
                "SELECT COUNT(*), COUNT(DISTINCT topic) FROM messages WHERE trashed IS NOT NULL").fetchone()
            return {"pending": waiting.get(0, 0), "unacknowledged": waiting.get(1, 0), "trash": trash,
                    "trash_total": total, "trash_queues": queues}

        return self._submit(figures)

    # ------------------------------------------------------------------ deliveries

    def pending(self, subscriber: str, limit: int, exclude_topics: Iterable[str] = (),
                max_bytes: int | None = None, skip: Iterable[int] = ()) -> Deferred:
        excluded = sorted(set(exclude_topics))
        skipped = frozenset(skip)

        def get(c: sqlite3.Connection) -> list[Delivery]:
            # The sizes first, the bodies only of the rows within the budget: a window of
            # large messages must not be read whole to keep a few of them.
            where = f" AND m.topic NOT IN ({_marks(excluded)})" if excluded else ""
            rows = c.execute(
                "SELECT d.seq, m.topic, m.priority, d.change, d.attempts, m.mode, length(m.data)"
                " FROM deliveries d JOIN messages m ON m.seq = d.seq"
                f" WHERE d.subscriber = ? AND d.state = {PENDING} AND m.trashed IS NULL AND m.done = 0"
                f"{where} ORDER BY m.priority DESC, d.seq LIMIT ?",
                (subscriber, *excluded, limit + len(skipped))).fetchall()
            rows = [row for row in rows if row[0] not in skipped][:limit]
            rows = rows[:fitting((row[6] for row in rows), max_bytes)]
            bodies: dict[int, bytes] = {}
            for chunk in _chunks(row[0] for row in rows):
                bodies.update(c.execute(f"SELECT seq, data FROM messages WHERE seq IN ({_marks(chunk)})", chunk))
            return [Delivery(seq, topic, priority, change, attempts, mode, bytes(bodies[seq]))
                    for seq, topic, priority, change, attempts, mode, _size in rows if seq in bodies]

        return self._submit(get)

    def pending_counts(self, prefix: str) -> Deferred:
        def count(c: sqlite3.Connection) -> dict[str, int]:
            return dict(c.execute(
                "SELECT d.subscriber, COUNT(*) FROM deliveries d JOIN messages m ON m.seq = d.seq"
                f" WHERE substr(d.subscriber, 1, ?) = ? AND d.state = {PENDING} AND m.trashed IS NULL"
                " AND m.done = 0 GROUP BY d.subscriber", (len(prefix), prefix)).fetchall())

        return self._submit(count)

    def acknowledge(self, subscriber: str, seq: int) -> Deferred:
        def ack(c: sqlite3.Connection) -> Settled | None:
            if c.execute(f"UPDATE deliveries SET state = {ACKED} WHERE subscriber = ? AND seq = ?"
                         f" AND state = {PENDING}", (subscriber, seq)).rowcount == 0:
                return None
            row = c.execute("SELECT topic, mode, receipt FROM messages WHERE seq = ?", (seq,)).fetchone()
            if row is None:
                return Settled(seq, "")
            topic, mode, receipt = row
            due = _receipt(c, seq, final=False) if receipt != "NONE" else None
            released: tuple[str, ...] = ()
            if mode == "ONE":
                released = _pending_of(c, seq)
                c.execute(f"DELETE FROM deliveries WHERE seq = ? AND state = {PENDING}", (seq,))
                c.execute("UPDATE messages SET done = 1 WHERE seq = ?", (seq,))
            return Settled(seq, topic, due, released)

        return self._submit(ack)

    def attempt(self, subscriber: str, seq: int) -> Deferred:
        def count(c: sqlite3.Connection) -> int:
            c.execute(f"UPDATE deliveries SET attempts = attempts + 1 WHERE subscriber = ? AND seq = ?"
                      f" AND state = {PENDING}", (subscriber, seq))
            row = c.execute(f"SELECT attempts FROM deliveries WHERE subscriber = ? AND seq = ?"
                            f" AND state = {PENDING}", (subscriber, seq)).fetchone()
            return int(row[0]) if row else 0

        return self._submit(count)

    def give_up(self, subscriber: str, seq: int, now: float) -> Deferred:
        def give_up(c: sqlite3.Connection) -> Settled | None:
            if c.execute(f"UPDATE deliveries SET state = {DEAD} WHERE subscriber = ? AND seq = ?"
                         f" AND state = {PENDING}", (subscriber, seq)).rowcount == 0:
                return None
            row = c.execute("SELECT topic FROM messages WHERE seq = ?", (seq,)).fetchone()
            if row is None:
                return None
            if _pending_of(c, seq):
                return Settled(seq, row[0])
            return _trash(c, seq, now)

        return self._submit(give_up)

    def backfill(self, subscriber: str, topics: Iterable[str], since: float | None, now: float) -> Deferred:
        keys = list(topics)

        def backfill(c: sqlite3.Connection) -> int:
            added = 0
            for chunk in _chunks(keys):
                marks = _marks(chunk)
                added += c.execute(
                    f"INSERT OR IGNORE INTO deliveries SELECT ?, seq, {PENDING}, 0, 'ADD' FROM messages"
                    f" WHERE topic IN ({marks}) AND {_LIVE} AND done = 0"
                    " AND (expires IS NULL OR expires > ?) AND received >= ?",
                    (subscriber, *chunk, now, since if since is not None else float("-inf"))).rowcount
                if since is not None:
                    c.execute(
                        f"DELETE FROM deliveries WHERE subscriber = ? AND state = {PENDING} AND seq IN"
                        f" (SELECT seq FROM messages WHERE topic IN ({marks}) AND received < ?)",
                        (subscriber, *chunk, since))
            return added

        return self._submit(backfill)

    def drop_pending(self, subscriber: str, topics: Iterable[str]) -> Deferred:
        keys = list(topics)

        def drop(c: sqlite3.Connection) -> int:
            dropped = 0
            for chunk in _chunks(keys):
                dropped += c.execute(
                    f"DELETE FROM deliveries WHERE subscriber = ? AND state = {PENDING} AND seq IN"
                    f" (SELECT seq FROM messages WHERE topic IN ({_marks(chunk)}))",
                    (subscriber, *chunk)).rowcount
            return dropped

        return self._submit(drop)

    # ------------------------------------------------------------------ subscriptions

    def load_subscriptions(self) -> Deferred:
        def get(c: sqlite3.Connection) -> list[SubscriptionRecord]:
            rows = c.execute("SELECT subscriber, kind, topic, changes, since, until FROM subscriptions"
                             " ORDER BY subscriber, kind, topic")
            return [SubscriptionRecord(s, k, t, tuple(filter(None, ch.split(","))), si, un)
                    for s, k, t, ch, si, un in rows]

        return self._submit(get)

    def put_subscription(self, record: SubscriptionRecord) -> Deferred:
        row = (record.subscriber, record.kind, record.topic, ",".join(record.changes),
               record.since, record.until)
        return self._submit(lambda c: c.execute(
            "INSERT OR REPLACE INTO subscriptions VALUES (?, ?, ?, ?, ?, ?)", row) and None)

    def remove_subscription(self, subscriber: str, kind: str, topic: str) -> Deferred:
        return self._submit(lambda c: c.execute(
            "DELETE FROM subscriptions WHERE subscriber = ? AND kind = ? AND topic = ?",
            (subscriber, kind, topic)).rowcount > 0)

    def subscriptions_of(self, subscriber: str) -> Deferred:
        def get(c: sqlite3.Connection) -> list[SubscriptionRecord]:
            rows = c.execute(
                "SELECT subscriber, kind, topic, changes, since, until FROM subscriptions"
                " WHERE subscriber = ? ORDER BY kind, topic", (subscriber,))
            return [SubscriptionRecord(s, k, t, tuple(filter(None, ch.split(","))), si, un)
                    for s, k, t, ch, si, un in rows]

        return self._submit(get)

    # ------------------------------------------------------------------ QoS 2 exchanges

    def put_flows(self, flows: Iterable[PacketFlow]) -> Deferred:
        rows = [_flow_row(flow) for flow in flows]
        return self._submit(lambda c: c.executemany(PUT_FLOW, rows) and None)

    def remove_flow(self, subscriber: str, inbound: bool, packet_id: int) -> Deferred:
        return self._submit(lambda c: c.execute(
            "DELETE FROM flows WHERE subscriber = ? AND inbound = ? AND packet_id = ?",
            (subscriber, int(inbound), packet_id)).rowcount > 0)

    def flows_of(self, subscriber: str) -> Deferred:
        def get(c: sqlite3.Connection) -> list[PacketFlow]:
            rows = c.execute("SELECT subscriber, inbound, packet_id, seq, released FROM flows WHERE subscriber = ?"
                             " ORDER BY inbound DESC, seq, packet_id", (subscriber,))
            return [PacketFlow(s, bool(i), p, q, bool(r)) for s, i, p, q, r in rows]

        return self._submit(get)

    def drop_flows(self, subscriber: str) -> Deferred:
        return self._submit(lambda c: c.execute("DELETE FROM flows WHERE subscriber = ?", (subscriber,)).rowcount)

    # ------------------------------------------------------------------ retained messages

    def put_retained(self, topic: str, data: bytes | None) -> Deferred:
        if data is None:
            return self._submit(lambda c: c.execute("DELETE FROM retained WHERE topic = ?", (topic,)) and None)
        return self._submit(lambda c: c.execute(
            "INSERT OR REPLACE INTO retained (topic, data) VALUES (?, ?)", (topic, data)) and None)

    def load_retained(self) -> Deferred:
        def load(c: sqlite3.Connection) -> list[tuple[str, bytes]]:
            return [(topic, bytes(data)) for topic, data in c.execute(
                "SELECT topic, data FROM retained ORDER BY topic")]

        return self._submit(load)

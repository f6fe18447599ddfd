"""The PostgreSQL store's connection: one writer thread, group commit, reconnection.

Every store call is an operation ``f(connection, *args)`` queued on the reactor thread.  One
thread, the only one that holds the connection, runs the queued operations in batches: a
batch is one transaction, and only once it is committed do the operations' Deferreds fire, in
order, on the reactor thread.  While a batch commits the next calls queue up and share the
next commit.  Every statement is a round trip to the server, so a batch has no savepoints:
when one operation fails (a duplicate message), the batch is rolled back and its operations
run again one transaction each, so that the failing one fails alone (failures are rare; the
round trips of savepoints would be paid by every operation).

Several brokerd nodes share the database, so two transactions may wait for each other's row
locks: PostgreSQL then aborts one with a deadlock (or serialization) error, and the writer
runs that whole batch again (:data:`RETRIES` times at most).

When the server cannot be reached the batch fails with :class:`StoreUnavailable` (a front end
answers its protocol's temporary failure) and the writer stays disconnected: calls made in the
next :attr:`PostgresWriter.backoff` seconds fail at once, without waiting for a connection
timeout, and the first call after that tries again (the backoff doubles up to
:data:`MAX_BACKOFF` while the server stays away).  Nothing is committed twice and nothing the
store acknowledged is lost: a Deferred fires only after its COMMIT returned.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar
from urllib.parse import unquote, urlsplit

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from brokerd.interfaces import IBrokerReactor
from brokerd.store.base import StoreUnavailable
from brokerd.store.latency import Latencies
from brokerd.store.memory import StoreClosed

if TYPE_CHECKING:  # psycopg is the postgresql extra's: the broker runs without it
    from psycopg import Connection, Cursor

MAX_BATCH = 512
"""Operations in one transaction at most."""
MAX_QUEUE = 100_000
"""Operations waiting for the writer at most; more fail at once with StoreUnavailable
(a server that stopped answering cannot make the broker's memory grow without bound)."""
RETRIES = 5
"""Times a batch is run again after a deadlock or serialization failure."""
CONNECT_TIMEOUT = 5
"""Seconds to wait for the server when connecting."""
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 5.0
"""Seconds during which calls fail at once after a failed connection (doubling up to this)."""
SCHEMES = ("postgresql", "postgres")

PgConnection: TypeAlias = "Connection[tuple[Any, ...]]"
"""A psycopg connection with psycopg's default rows (tuples)."""
PgCursor: TypeAlias = "Cursor[tuple[Any, ...]]"
Operation = Callable[..., Any]
_Op = TypeVar("_Op", bound=Operation)


def pipelined(operation: _Op) -> _Op:
    """Mark an operation that reads no result (a publish): the writer sends a run of them in
    one pipeline instead of waiting for each answer."""
    setattr(operation, "pipelined", True)  # a function's attribute: read back by getattr
    return operation


class _OperationFailed(Exception):
    """An operation of a batch failed: run the batch again one operation per transaction."""


def is_postgres_url(url: str) -> bool:
    """Whether ``--store`` names a PostgreSQL database."""
    return urlsplit(url).scheme in SCHEMES


def connection_info(url: str, password_file: Path | None = None) -> str:
    """The libpq connection string of ``postgresql://user[:password]@host:port/db``; a
    password missing from the URL is read from ``password_file`` (its first line).  Raises
    ValueError with a one-line reason for a URL that names no database."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{url!r}: not a postgresql:// URL")
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ValueError("the URL names no database (postgresql://user@host:port/DATABASE)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the URL's port is not a number") from None
    fields: dict[str, Any] = {"dbname": database, "connect_timeout": CONNECT_TIMEOUT,
                              "application_name": "brokerd", "keepalives": 1, "keepalives_idle": 10,
                              "keepalives_interval": 5, "keepalives_count": 3}
    if parts.hostname:
        fields["host"] = unquote(parts.hostname)
    if port is not None:
        fields["port"] = port
    if parts.username:
        fields["user"] = unquote(parts.username)
    password = unquote(parts.password) if parts.password is not None else None
    if password is None and password_file is not None:
        try:
            lines = Path(password_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ValueError(f"{password_file}: {exc.strerror}") from None
        password = lines[0] if lines else ""
    if password is not None:
        fields["password"] = password
    for option in parts.query.split("&") if parts.query else ():
        key, _, value = option.partition("=")
        fields[unquote(key)] = unquote(value)
    return " ".join(f"{key}='{_quote(str(value))}'" for key, value in fields.items())


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def redacted(url: str) -> str:
    """``url`` without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


class _DaemonThread(threading.Thread):
    """A store nobody closed must not keep the interpreter from exiting (a broker's store is
    closed by its reactor's shutdown trigger, which commits what is queued first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.daemon = True


class PostgresWriter:
    """Runs operations on one PostgreSQL connection in one thread, a batch per transaction.

    ``setup(connection)`` runs on every new connection before the first batch (it creates
    the schema); ``reactor`` fires the Deferreds.
    """

    _log = Logger()

    def __init__(self, info: str, reactor: IBrokerReactor, setup: Callable[[PgConnection], None], name: str = "") -> None:
        self._info = info
        self._reactor = reactor
        self._setup = setup
        self.name = name
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="brokerd-pgstore")
        self._pool.threadFactory = _DaemonThread
        self._connection: PgConnection | None = None
        self._queue: list[tuple[Operation, tuple, Deferred]] = []
        self._busy = False
        self._started = False
        self._retry_at = 0.0
        self.backoff = FIRST_BACKOFF
        self.available = True
        """False from a failed connection until the next successful one (stored publishes
        are refused meanwhile)."""
        self.batches = 0
        self.retried = 0
        """Batches run again after a deadlock or serialization failure."""
        self.outages = 0
        self.commit_latency = Latencies()

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._pool.start()
            if self._queue and not self._busy:
                self._flush()

    def stop(self) -> None:
        self._pool.stop()

    def submit(self, operation: Operation, *args: object) -> Deferred:
        if len(self._queue) >= MAX_QUEUE:
            return fail(StoreUnavailable(f"{MAX_QUEUE} store operations are waiting for the database"))
        if not self.available and self._connection is None and time.monotonic() < self._retry_at:
            return fail(StoreUnavailable("the PostgreSQL server cannot be reached"))
        d: Deferred = Deferred()
        self._queue.append((operation, args, d))
        if self._started and not self._busy:
            self._flush()
        return d

    def disconnect(self) -> Deferred:
        """Run what is queued, then close the connection."""
        d: Deferred = Deferred()
        self._queue.append((self._close_connection, (), d))
        if not self._started:
            self._queue.pop()
            return succeed(None)
        if not self._busy:
            self._flush()
        return d

    def _close_connection(self, connection: PgConnection | None) -> None:
        if connection is not None:
            connection.close()
        self._connection = None

    def _flush(self) -> None:
        batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        self._busy = True
        done = deferToThreadPool(self._reactor, self._pool, self._run_batch, batch)
        done.addBoth(self._batch_done, batch)

    # ------------------------------------------------------------------ the writer thread

    def _connect(self) -> PgConnection:
        import psycopg  # the broker starts without psycopg when no PostgreSQL store is used

        try:
            connection = psycopg.connect(self._info, autocommit=False)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {_first_line(exc)}") from None
        try:
            self._setup(connection)
            connection.commit()
        except BaseException:
            connection.close()
            raise
        return connection

    def _run_batch(self, batch: list[tuple[Operation, tuple, Deferred]]) -> list[tuple[bool, Any]] | Failure:
        import psycopg
        from psycopg import errors

        if batch and batch[0][0] == self._close_connection:
            self._close_connection(self._connection)
            return [(True, None)] + [(False, Failure(StoreClosed("the store is closed")))] * (len(batch) - 1)
        try:
            if self._connection is None:
                self._connection = self._connect()
            try:
                return self._transaction(self._connection, batch)
            except _OperationFailed:
                self._connection.rollback()
                return self._one_by_one(self._connection, batch)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                # Another node's transaction locked the same rows in another order.  Running
                # the batch again would meet it again: run each operation in a transaction of
                # its own instead (one operation locks one message at a time: no cycle).
                self._connection.rollback()
                self.retried += 1
                return self._one_by_one(self._connection, batch)
        except StoreUnavailable:
            return Failure()
        except psycopg.Error as exc:
            self._drop_connection()
            return Failure(StoreUnavailable(f"PostgreSQL: {_first_line(exc)}"))

    def _one_by_one(self, connection: PgConnection, batch: list[tuple[Operation, tuple, Deferred]]) -> list[tuple[bool, Any]]:
        from psycopg import errors

        results: list[tuple[bool, Any]] = []
        for entry in batch:
            for attempt in range(RETRIES + 1):
                try:
                    results += self._transaction(connection, [entry])
                    break
                except (errors.DeadlockDetected, errors.SerializationFailure):
                    connection.rollback()
                    self.retried += 1
                    if attempt == RETRIES:
                        results.append((False, Failure(StoreUnavailable(
                            "the database kept aborting the transaction"))))
        return results

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                pass

    def _transaction(self, connection: PgConnection, batch: list[tuple[Operation, tuple, Deferred]]) -> list[tuple[bool, Any]]:
        """One transaction.  Database errors that are no operation's own (a lost connection,
        a deadlock) propagate; an operation's own error ends a batch of one with its failure,
        and a longer batch with _OperationFailed (the caller runs it one by one)."""
        from psycopg import errors

        results: list[tuple[bool, Any]] = []
        started = time.perf_counter()
        index = 0
        while index < len(batch):
            operation, args, _d = batch[index]
            if operation == self._close_connection:
                connection.commit()
                results.append((True, operation(connection, *args)))
                return results + [(False, Failure(StoreClosed("the store is closed")))] * (len(batch) - len(results))
            if len(batch) > 1 and getattr(operation, "pipelined", False):
                end = index
                while end < len(batch) and getattr(batch[end][0], "pipelined", False):
                    end += 1
                results += self._pipelined(connection, batch[index:end])
                index = end
                continue
            index += 1
            try:
                value = operation(connection, *args)
            except (errors.DeadlockDetected, errors.SerializationFailure, errors.OperationalError,
                    errors.AdminShutdown, errors.InterfaceError):
                raise
            except Exception:
                if len(batch) > 1:
                    raise _OperationFailed() from None
                failure = Failure()
                connection.rollback()
                return [(False, failure)]
            results.append((True, value))
        connection.commit()
        self.commit_latency.observe(time.perf_counter() - started)
        return results

    def _pipelined(self, connection: PgConnection, run: list[tuple[Operation, tuple, Deferred]]) -> list[tuple[bool, Any]]:
        """Operations that read no result (``operation.pipelined``: a publish) sent in one
        pipeline: one round trip for them all, not one each.  An error surfaces at the end
        of the pipeline, not at its operation: the batch then runs one by one."""
        from psycopg import errors

        try:
            with connection.pipeline():
                values = [operation(connection, *args) for operation, args, _d in run]
        except (errors.DeadlockDetected, errors.SerializationFailure, errors.OperationalError,
                errors.AdminShutdown, errors.InterfaceError):
            raise
        except Exception:
            raise _OperationFailed() from None
        return [(True, value) for value in values]

    # ------------------------------------------------------------------ back on the reactor

    def _batch_done(self, outcome: list[tuple[bool, Any]] | Failure, batch: list[tuple[Operation, tuple, Deferred]]) -> None:
        self._busy = False
        self.batches += 1
        if isinstance(outcome, Failure):
            self._outage(outcome)
            for _operation, _args, d in batch:
                d.errback(outcome)
            # Calls queued while the server was away fail too: they would wait for the same
            # dead connection (a queued close still runs).
            queued, self._queue = self._queue, []
            for operation, args, d in queued:
                if operation == self._close_connection:
                    self._queue.append((operation, args, d))
                else:
                    d.errback(Failure(StoreUnavailable("the PostgreSQL server cannot be reached")))
        else:
            if not self.available:
                self.available = True
                self.backoff = FIRST_BACKOFF
                self._log.info("PostgreSQL store {name}: connected again", name=self.name)
            if self._queue:
                self._flush()
            for (ok, value), (_operation, _args, d) in zip(outcome, batch):
                if ok:
                    d.callback(value)
                else:
                    d.errback(value)
        if self._queue and not self._busy:
            self._flush()

    def _outage(self, failure: Failure) -> None:
        if self.available:
            self.outages += 1
            self._log.error("PostgreSQL store {name} unavailable: {reason}; stored publishes are refused"
                            " until it is back", name=self.name, reason=str(failure.value))
        else:
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        self.available = False
        self._retry_at = time.monotonic() + self.backoff


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""A PostgreSQL server of the test's own: ``initdb`` in a temp dir, ``postgres`` on a free
loopback port, stopped by a finalizer whatever happens.

The binaries are looked up on PATH, then in ``/usr/lib/postgresql/*/bin`` (Debian's package
``postgresql``, which ``.ci/run`` installs).  Without them the tests skip with a reason, and
fail when ``CI`` is set.  postgres refuses to run as root: under euid 0 the server runs as the
``postgres`` user the Debian package creates (through ``runuser``), in a directory it owns.

The server's files are in memory where there is a tmpfs (``/dev/shm``), see
:func:`memory_directory`.

Fixtures: ``postgres_server`` (one server for the session), ``postgres_url`` (a fresh,
empty database on it per test) and ``own_postgres`` (a server of the test's own, for tests
that stop and start it).
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest

from tests.support.broker import free_port
from tests.support.processes import wait_for_output, wait_for_port

SUPERUSER = "brokerd"
_databases = count(1)


def binaries() -> Path | None:
    """The directory of ``initdb`` and ``postgres``, or None."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).parent
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(directory, "initdb").exists() and Path(directory, "postgres").exists():
            return Path(directory)
    return None


MEMORY = Path("/dev/shm")


def memory_directory() -> Path | None:
    """Where a server's files go: a directory in memory (tmpfs) where there is one, else the
    temp directory.  Each test's fresh database is a copy of the template, some 7.5 MB of
    files and as much WAL, and a session's 40 of them on a disk cost seconds to write and,
    where the file system discards freed blocks, over 20 s to delete.  The crash tests stop
    postgres, not the machine, so the data outlives them in memory as on a disk."""
    return MEMORY if MEMORY.is_dir() and os.access(MEMORY, os.W_OK | os.X_OK) else None


def require_binaries() -> Path:
    found = binaries()
    if found is None:
        reason = "PostgreSQL server binaries (initdb, postgres) not found: apt-get install postgresql"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


class PostgresServer:
    """One server: ``start()``, ``stop()`` (immediate: like a crash, nothing is flushed
    politely), ``start()`` again on the same port and data, ``url(db)``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            try:
                pwd.getpwnam(self.user)
            except KeyError:
                pytest.fail("running as root needs the 'postgres' user (the postgresql package creates it)")
        self.root = Path(tempfile.mkdtemp(prefix="brokerd-pg-", dir=memory_directory()))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self._run(["initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                   "--no-locale", "--no-sync"])

    def _command(self, args: list[str]) -> list[str]:
        args = [str(self.bin / args[0]), *args[1:]]
        return ["runuser", "-u", self.user, "--", *args] if self.user is not None else args

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(self._command(args), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"{args[0]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        log = open(self.log_path, "wb")  # a fresh log per start: "ready" below is this start's
        args = ["postgres", "-D", str(self.data), "-p", str(self.port), "-k", str(self.root),
                "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "max_connections=100",
                # a lock wait is checked for a deadlock after this (the default, 1 s, is the
                # time the racing-acknowledgement tests spent waiting for one to be found)
                "-c", "deadlock_timeout=100ms"]
        self.process = subprocess.Popen(self._command(args), stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        wait_for_port(self.port, self.process, self.log_path, deadline)
        wait_for_output("database system is ready to accept connections", self.process, self.log_path,
                        timeout=max(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Stop at once (``-m immediate``), as a crash would; safe to call twice."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            self._run(["pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30"])
        except (AssertionError, subprocess.TimeoutExpired):
            pass
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(30)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"test_{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer(require_binaries())
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh database for this test on the session's server."""
    return postgres_server.create_database()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server for this test alone (it may stop and start it)."""
    server = PostgresServer(require_binaries())
    try:
        server.start()
        yield server
    finally:
        server.destroy()

"""A real redis-server for the cluster tests: its own process on a free loopback port, in a
temp dir, no persistence, always stopped (killed if need be) when the test is over.  Or a
real Redis Cluster of three such servers in cluster mode, every slot served
(:class:`RedisCluster`), with the blocking :func:`command` helper to set it up and reshard."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import processes
from tests.support.broker import free_port

STARTUP_TIMEOUT = 20.0


def redis_binary() -> str:
    """The redis-server path; skipped locally without one, a failure when ``CI`` is set (CI
    installs the Debian package)."""
    found = shutil.which("redis-server")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (.ci/run installs the redis-server package)")
        pytest.skip("redis-server is not installed")
    return found


def redis_version(binary: str) -> tuple[int, ...]:
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", output)
    if found is None:
        raise AssertionError(f"no version in {output!r}")
    return tuple(int(part) for part in found.groups())


class RedisServer:
    """One redis-server; :meth:`kill` and :meth:`start` again on the same port (a restart)."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.extra = extra
        """More redis-server options (``--requirepass``, ...)."""
        self.binary = redis_binary()
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        log_path = self.directory / "redis.log"
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.directory), "--daemonize", "no", *self.extra]
        self.process = processes.spawn(args, log_path, cwd=self.directory)
        processes.wait_for_output("Ready to accept connections", self.process, log_path, STARTUP_TIMEOUT)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash (no goodbye to the clients)."""
        if self.process is not None:
            processes.stop(self.process, signal.SIGKILL)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process)
            self.process = None


TEST_SECRET = b"brokerd-test-cluster-secret-0001"
"""The secret the test clusters' nodes share unless a test gives its own."""


def cluster_secret(path: Path, *lines: bytes) -> Path:
    """Write a --cluster-secret-file at ``path`` (mode 600): ``lines``, else TEST_SECRET."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(b"".join(line + b"\n" for line in lines or (TEST_SECRET,)))
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


def _encode(*args: Any) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def command(port: int, *args: Any) -> Any:
    """One command to the redis-server on ``port``, its reply (an error reply raises
    RuntimeError).  Blocking, for setting servers up and resharding: a few milliseconds on
    loopback, bounded by a 10 s socket timeout."""
    from brokerd.cluster.connection import RespReader

    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(_encode(*args))
        reader = RespReader(RuntimeError)
        while True:
            data = connection.recv(65536)
            if not data:
                raise AssertionError(f"redis on {port} closed the connection")
            replies = reader.feed(data)
            if replies:
                if isinstance(replies[0], RuntimeError):
                    raise replies[0]
                return replies[0]


CLUSTER_TIMEOUT = 30.0
"""Seconds the three servers get to agree that every slot is served."""


class RedisCluster:
    """Three redis-servers in cluster mode, masters of a third of the slots each (no replicas,
    which sharded pub/sub does not need to be tested), joined with CLUSTER MEET.  ``url``
    names the first one: a node finds the others through it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        binary = redis_binary()
        if redis_version(binary) < (7, 0, 0):
            if os.environ.get("CI"):
                pytest.fail("redis-server is older than 7.0: no sharded pub/sub")
            pytest.skip("redis-server is older than 7.0: no sharded pub/sub")
        self.servers: list[RedisServer] = []
        self.buses: list[int] = []
        """Each server's cluster bus port (chosen free, not the default port + 10000)."""
        for index in range(3):
            server_dir = directory / f"redis{index}"
            self.buses.append(free_port())
            self.servers.append(RedisServer(
                server_dir, "--cluster-enabled", "yes", "--cluster-config-file", str(server_dir / "nodes.conf"),
                "--cluster-port", str(self.buses[-1]), "--cluster-node-timeout", "5000"))

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self) -> RedisCluster:
        for server in self.servers:
            server.start()
        thirds = [(0, 5460), (5461, 10922), (10923, 16383)]
        for server, (first, last) in zip(self.servers, thirds):
            command(server.port, "CLUSTER", "ADDSLOTSRANGE", first, last)
        for server, bus in zip(self.servers[1:], self.buses[1:]):
            command(self.servers[0].port, "CLUSTER", "MEET", "127.0.0.1", server.port, bus)
        self.wait_until_agreed()
        return self

    def node_id(self, server: RedisServer) -> bytes:
        return command(server.port, "CLUSTER", "MYID")  # type: ignore[no-any-return]

    def owner(self, slot: int) -> RedisServer:
        """The master of ``slot`` as the first server sees it."""
        for first, last, master, *_ in command(self.servers[0].port, "CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return next(s for s in self.servers if s.port == int(master[1]))
        raise LookupError(slot)

    def wait_until_agreed(self) -> None:
        """Return once every server says cluster_state:ok and knows the three masters (the
        servers agree through their cluster bus: nothing to wait on but their answers)."""
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while True:
            states = []
            for server in self.servers:
                info = command(server.port, "CLUSTER", "INFO").decode()
                masters = {int(entry[2][1]) for entry in command(server.port, "CLUSTER", "SLOTS")}
                states.append("cluster_state:ok" in info and len(masters) == 3)
            if all(states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the Redis Cluster did not agree in {CLUSTER_TIMEOUT} s: {states}")
            time.sleep(0.05)  # polling the servers' answers, bounded by the deadline

    def move_slot(self, slot: int, to: RedisServer) -> RedisServer:
        """Migrate ``slot`` (it holds no keys: brokerd keeps none) to master ``to`` the way
        redis-cli --cluster reshard does: IMPORTING, MIGRATING, then NODE on every master.
        Returns the master it left."""
        source = self.owner(slot)
        target_id = self.node_id(to)
        command(to.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        command(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        for server in [to, source, *[s for s in self.servers if s not in (to, source)]]:
            command(server.port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return source

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path / "redis-cluster")
    try:
        yield cluster.start()
    finally:
        cluster.stop()

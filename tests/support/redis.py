"""A real redis-server for the cluster tests: its own process on a free loopback port, in a
temp dir, no persistence, always stopped (killed if need be) when the test is over."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()

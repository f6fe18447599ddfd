"""The servers of a fault-injection run, as real processes on loopback ports in one temp dir:
brokerd nodes (``twistd -n brokerd``, killable, stoppable, restartable on the same ports and
data), and the secret file and accounts they share.  Redis and PostgreSQL come from
``tests/support`` (:class:`RedisServer`, :class:`RedisCluster`, :class:`PostgresServer`)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.broker import free_port, twistd
from tests.support.processes import repo_env

PROTOCOLS = ("ssmp", "mcchat", "socketmq", "smqp")
SECRET = b"fault-injection-run-cluster-secret-0001"
ACCOUNTS = {"bob": "bobpw"}
START_TIMEOUT = 60.0
"""Seconds a node gets to listen on every port (a loaded 2-core machine, 3 nodes at once)."""


def write_secret_file(path: Path) -> Path:
    """The cluster secret, readable by its owner only (brokerd refuses a file others can read)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(SECRET + b"\n")
    os.chmod(path, 0o600)
    return path


def write_accounts_file(path: Path) -> Path:
    from brokerd.auth.accounts import PasswordHash, write_accounts

    write_accounts(path, {name: PasswordHash.create(password, n=2) for name, password in ACCOUNTS.items()})
    return path


class NodeProcess:
    """One brokerd node: ``start`` (again after a kill, on the same ports and data directory,
    its log appended), ``kill`` (SIGKILL), ``freeze``/``thaw`` (SIGSTOP/SIGCONT), ``stop``."""

    def __init__(self, directory: Path, name: str, options: list[str]) -> None:
        self.directory = directory
        self.name = name
        self.options = options
        self.ports = {protocol: free_port() for protocol in PROTOCOLS}
        self.log_path = directory / "broker.log"
        self.process: subprocess.Popen | None = None
        self.expected_exit = False
        """True while the run itself has killed the node (and not restarted it yet)."""
        self.starts = 0
        directory.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        args = list(twistd())
        for protocol, port in self.ports.items():
            args += [f"--{protocol}", f"tcp:{port}:interface=127.0.0.1"]
        return [*args, "--data-dir", str(self.directory / "data"), "--node-name", self.name, *self.options]

    def start(self) -> None:
        """Start and return once every listener accepts connections (blocking: run it in a
        thread when clients are running on the reactor)."""
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {self.starts + 1} of {self.name}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.command(), cwd=self.directory, env=repo_env(),
                                            stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT
        for port in self.ports.values():
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.process.returncode} at start:\n{self.tail()}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.name} did not listen on {port}:\n{self.tail()}") from None
                    time.sleep(0.05)  # polling the port, bounded by the deadline
        self.expected_exit = False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        self.expected_exit = True
        if self.alive():
            self.process.kill()  # type: ignore[union-attr]
            self.process.wait(30)  # type: ignore[union-attr]

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> int | None:
        """SIGTERM (SIGCONT first, in case it is frozen), SIGKILL after 15 s; the exit status."""
        if self.process is None:
            return None
        self.expected_exit = True
        if self.process.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

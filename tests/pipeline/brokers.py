"""Real brokers for the streaming tests, as subprocesses on loopback ports.

``twistd_broker`` is the product as users run it (``twistd -n brokerd --ssmp ...``).
``logging_broker`` runs ``tests/pipeline/run_broker.py``: the same makeService, with an
EventLog that records payloads and flushes every 0.2 s (what ``--event-log-payloads`` will
give once tap.py has the option).
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TWISTD = Path(sys.executable).parent / "twistd"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited with {process.returncode}: {process.stderr.read() if process.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the broker did not listen on {port} within {timeout} s")


@contextmanager
def _running(command: list[str], port: int) -> Iterator[int]:
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, process)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextmanager
def twistd_broker(data_dir: Path) -> Iterator[int]:
    port = free_port()
    command = [str(TWISTD), "-n", "--pidfile=", "brokerd", "--ssmp", f"tcp:{port}:interface=127.0.0.1",
               "--open-login", "--data-dir", str(data_dir)]
    with _running(command, port) as listening:
        yield listening


@contextmanager
def logging_broker(data_dir: Path) -> Iterator[int]:
    port = free_port()
    command = [sys.executable, str(Path(__file__).with_name("run_broker.py")), "--port", str(port), "--data-dir", str(data_dir)]
    with _running(command, port) as listening:
        yield listening

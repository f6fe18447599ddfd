"""Real brokers for the streaming tests, as subprocesses on loopback ports.

``twistd_broker`` is the product as users run it (``twistd -n brokerd --ssmp ...``).
``logging_broker`` runs ``tests/pipeline/run_broker.py``: the same makeService, with an
EventLog that records payloads and flushes every 0.2 s (what ``--event-log-payloads`` will
give once tap.py has the option).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import processes
from tests.support.broker import free_port, twistd


@contextmanager
def _running(command: list[str], port: int, log: Path) -> Iterator[int]:
    process = processes.spawn(command, log)
    try:
        processes.wait_for_port(port, process, log, time.monotonic() + 30.0)
        yield port
    finally:
        processes.stop(process)


@contextmanager
def twistd_broker(data_dir: Path) -> Iterator[int]:
    port = free_port()
    command = [*twistd(), "--ssmp", f"tcp:{port}:interface=127.0.0.1", "--open-login", "--data-dir", str(data_dir)]
    with _running(command, port, Path(f"{data_dir}.log")) as listening:
        yield listening


@contextmanager
def logging_broker(data_dir: Path) -> Iterator[int]:
    port = free_port()
    command = [sys.executable, str(Path(__file__).with_name("run_broker.py")), "--port", str(port), "--data-dir", str(data_dir)]
    with _running(command, port, Path(f"{data_dir}.log")) as listening:
        yield listening

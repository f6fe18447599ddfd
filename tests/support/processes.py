"""Child processes started by tests: output to a file, and always stopped.

A test stops what it starts, but a failing assertion can skip its ``finally``, and pytest run in
the background (``nohup pytest &``) passes SIGINT ignored to every child.  So children are
stopped with SIGTERM (twistd and ``reactor.run()`` shut down cleanly on it) and SIGKILL after a
bounded wait, and every process :func:`spawn` started during a test is stopped again after it by the
autouse fixture in ``tests/conftest.py``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STOP_TIMEOUT = 15.0
"""Seconds a child gets to exit after SIGTERM before it is killed."""

_started: list[subprocess.Popen] = []


def default_sigint() -> None:
    """``preexec_fn`` for a process that stands for one started from a terminal: Ctrl-C's
    SIGINT at its default disposition.  A test run started in the background (``cmd &``,
    nohup) ignores SIGINT, its children inherit that, and Python and Twisted then leave it
    ignored, so a test of Ctrl-C would wait for a process that never sees it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def repo_env(**extra: str) -> dict[str, str]:
    """The test's environment with this checkout first on PYTHONPATH (brokerd is not installed)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def spawn(args: Sequence[str], log_path: Path, *, cwd: Path = REPO, env: dict[str, str] | None = None,
          **popen: object) -> subprocess.Popen:
    """Start ``args`` with stdout and stderr in ``log_path`` (a pipe nobody drains can block the
    child), registered to be stopped after the test."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(list(args), cwd=cwd, env=env if env is not None else repo_env(),
                                   stdout=log, stderr=subprocess.STDOUT, **popen)  # type: ignore[call-overload]
    _started.append(process)
    return process


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
    """Send ``sig`` (SIGTERM unless the test is about another signal), wait at most ``timeout``
    seconds, then SIGKILL; return the exit status."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return process.returncode


def mark() -> int:
    """A mark for :func:`stop_started_since`: how many processes were spawned so far."""
    return len(_started)


def stop_started_since(start: int) -> list[list[str]]:
    """Stop every process spawned since ``start`` (a :func:`mark`) that is still running;
    return the command lines it had to stop.  Processes of wider-scoped fixtures, spawned
    before the mark, are left to their fixture."""
    leftover = [process for process in _started[start:] if process.poll() is None]
    for process in leftover:
        stop(process)
    return [list(process.args) for process in leftover]  # type: ignore[arg-type]


def wait_for_port(port: int, process: subprocess.Popen, log_path: Path, deadline: float) -> None:
    """Return once ``port`` on loopback accepts a connection; fail (with the child's log) if the
    child exits or ``deadline`` (``time.monotonic()``) passes."""
    while True:
        if process.poll() is not None:
            raise AssertionError(f"{process.args!r} exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                stop(process)
                raise AssertionError(f"{process.args!r} did not listen on {port}:\n{_tail(log_path)}") from None
            time.sleep(0.05)  # polling the port, bounded by the deadline


def wait_for_output(text: str, process: subprocess.Popen, log_path: Path, timeout: float = 30.0) -> str:
    """Return the child's log once it contains ``text``; fail if the child exits or ``timeout``
    seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        output = log_path.read_text(errors="replace")
        if text in output:
            return output
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in the output of {process.args!r}:\n{output[-2000:]}")
        time.sleep(0.05)  # polling the log file, bounded by the deadline


def _tail(log_path: Path) -> str:
    try:
        return log_path.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"

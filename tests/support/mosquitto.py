"""A real MQTT server for the MQTT client tests: Debian's mosquitto on a free loopback port,
configured in the test's temp dir (anonymous clients, no persistence), always stopped.

brokerd's own MQTT server does not exist yet; mosquitto is the reference the client is checked
against meanwhile.  Import the fixture by name where a module uses it:

    from tests.support.mosquitto import mosquitto  # noqa: F401
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.broker import free_port

STARTUP_TIMEOUT = 20.0
DEBIAN_PATH = "/usr/sbin/mosquitto"


def mosquitto_binary() -> str:
    """The mosquitto path; skipped locally without one, a failure when ``CI`` is set (CI
    installs the Debian package)."""
    found = DEBIAN_PATH if os.access(DEBIAN_PATH, os.X_OK) else shutil.which("mosquitto")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("mosquitto is not installed (.ci/run installs the mosquitto package)")
        pytest.skip("mosquitto is not installed")
    return found


@dataclass
class Mosquitto:
    """A running mosquitto: its port, process and log (its stdout and stderr)."""

    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def endpoint(self) -> str:
        """The Twisted client endpoint string that reaches it."""
        return f"tcp:127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        processes.stop(self.process)


def start_mosquitto(directory: Path, *lines: str, anonymous: bool = True) -> Mosquitto:
    """Write ``mosquitto.conf`` in ``directory`` (a loopback listener on a free port, anonymous
    clients unless ``anonymous`` is False, no persistence, and ``lines``), start ``mosquitto
    -c`` on it and return once the port accepts connections (bounded; the test fails with
    mosquitto's log otherwise)."""
    binary = mosquitto_binary()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "mosquitto.conf"
    config.write_text(
        "\n".join(
            [
                f"listener {port} 127.0.0.1",
                f"allow_anonymous {'true' if anonymous else 'false'}",
                "persistence false",
                "log_dest stderr",
                "log_type all",
                # As root, mosquitto would switch to its own user, which cannot read the test's
                # private temp dir (a password file there).
                *(["user root"] if os.geteuid() == 0 else []),
                *lines,
            ]
        )
        + "\n"
    )
    log_path = directory / "mosquitto.log"
    process = processes.spawn([binary, "-c", str(config)], log_path, cwd=directory)
    processes.wait_for_port(port, process, log_path, time.monotonic() + STARTUP_TIMEOUT)
    return Mosquitto(port, process, log_path)


def password_file(path: Path, users: dict[str, str]) -> Path:
    """A mosquitto ``password_file`` at ``path`` for ``users`` (name: password), hashed by
    mosquitto_passwd from the same package."""
    binary = str(Path(mosquitto_binary()).parent.parent / "bin" / "mosquitto_passwd")
    if not os.access(binary, os.X_OK):
        binary = shutil.which("mosquitto_passwd") or "mosquitto_passwd"
    path.write_text("")
    for name, password in users.items():
        subprocess.run([binary, "-b", str(path), name, password], check=True, capture_output=True, timeout=30)
    return path


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A fresh mosquitto per test (no retained message or session survives into the next)."""
    server = start_mosquitto(tmp_path / "mosquitto")
    try:
        yield server
    finally:
        server.stop()

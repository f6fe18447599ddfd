"""The command-line clients find a broker through its config file (``--config``), as the
try-it broker is started (docs/examples/try-it.toml): no port to repeat on every command."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from brokerd.cli.smqp import DEFAULT_PORT as SMQP_DEFAULT_PORT
from brokerd.config import settings_from
from brokerd.tap import makeService
from tests.support.broker import REPO, free_port
from tests.support.secrets import write_private


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("BROKERD_ADMIN", None)
    return subprocess.run([sys.executable, "-m", f"brokerd.cli.{module}", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO)


def _commands(config: Path) -> dict[str, subprocess.CompletedProcess]:
    given = ("--config", str(config))
    return {
        "create": command("smqp", *given, "create", "/news"),
        "smqp_pub": command("smqp", *given, "pub", "/news", "hello, SMQP"),
        "ssmp_pub": command("ssmp", *given, "pub", "news", "hello"),
        "mcchat_pub": command("mcchat", *given, "pub", "news", "hello"),
        "status": command("ctl", *given, "status", "--interval", "0"),
        # positive control of "it was the config": the same commands on a port nobody listens on
        "elsewhere": command("smqp", "-p", str(free_port()), "create", "/other"),
        "missing": command("smqp", "--config", str(config.parent / "none.toml"), "create", "/news"),
    }


@pytest.mark.slow  # seven client processes, each importing Twisted and brokerd
@pytest_twisted.inlineCallbacks
def test_every_client_reads_the_brokers_config_file(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("ssmp", "mcchat", "smqp", "admin")}
    token = tmp_path / "admin-token"
    write_private(token, "config-token\n")
    config = tmp_path / "broker.toml"
    config.write_text("".join(f'{name} = "tcp:{port}:interface=127.0.0.1"\n' for name, port in ports.items())
                      + f'open-login = true\nsmqp-guest-permissions = "psc"\ndata-dir = "{tmp_path / "data"}"\n'
                      + f'event-log = false\nadmin-token-file = "{token}"\n')
    service = makeService(settings_from({}, str(config)), reactor)
    service.startService()
    try:
        yield service.runtime.front_ends["smqp"].started
        results = yield threads.deferToThread(_commands, config)
    finally:
        yield service.stopService()
    for name in ("create", "smqp_pub", "ssmp_pub", "mcchat_pub", "status"):
        assert results[name].returncode == 0, (name, results[name].stderr)
    assert results["status"].stdout.startswith("brokerd ")
    assert results["elsewhere"].returncode == 2
    assert results["missing"].returncode == 2 and "none.toml" in results["missing"].stderr


def test_brokerd_smqp_defaults_to_the_try_it_brokers_port() -> None:
    try_it = (REPO / "docs/examples/try-it.toml").read_text()
    assert f'smqp = "tcp:{SMQP_DEFAULT_PORT}:interface=127.0.0.1"' in try_it
    assert f"[tcp:127.0.0.1:{SMQP_DEFAULT_PORT}]" in command("smqp", "--help").stdout.replace("\n", " ").replace(" ", "")

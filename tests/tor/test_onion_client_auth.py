"""v3 client authorization: a broker started with --onion-client-auth is reached only by a
client whose tor holds a key ``brokerd-onion add`` made; without it tor cannot even read the
service's descriptor."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import REPO, LineClient
from tests.support.tor import (
    TorNetwork,
    control_command,
    socks_connect_retrying,
    start_onion_broker,
)

pytestmark = pytest.mark.slow

MISSING_CLIENT_AUTHORIZATION = 0xF4
"""Tor's extended SOCKS5 reply: the service needs a client key this tor does not have."""


def onion_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "brokerd.cli.onion", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=cwd)


def test_only_a_client_holding_an_authorized_key_reaches_the_service(tor_network: TorNetwork, tmp_path: Path) -> None:
    assert tor_network.service is not None and tor_network.client is not None
    clients = tmp_path / "clients"
    # The address comes first: a broker without authorization publishes it and keeps the key.
    first = start_onion_broker(tmp_path / "broker", "--open-login", "--tor-control",
                               tor_network.service.control_endpoint, listeners={"ssmp": "onion:8787"})
    first.stop()
    address = first.addresses["ssmp"]
    made = onion_cli("add", str(clients), "alice", "--address", address[0], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert stat_mode(tmp_path / "alice.auth_private") == 0o600
    listed = onion_cli("list", str(clients), cwd=tmp_path)
    assert listed.stdout.startswith("alice\t") and len(listed.stdout.split("\t")[1].strip()) == 52

    (tmp_path / "broker" / "broker.log").rename(tmp_path / "broker" / "broker-1.log")
    broker = start_onion_broker(tmp_path / "broker", "--open-login", "--ping-interval", "600",
                                "--onion-client-auth", str(clients),
                                "--tor-control", tor_network.service.control_endpoint,
                                listeners={"ssmp": "onion:8787"})
    try:
        assert broker.addresses["ssmp"] == address
        assert "1 authorized clients" in broker.log()
        with pytest.raises(ConnectionRefusedError) as refused:  # retried while no descriptor is found yet
            socks_connect_retrying(tor_network.client.socks_port, *address)
        assert refused.value.args[0] == MISSING_CLIENT_AUTHORIZATION
        # The client's tor gets alice's file in its ClientOnionAuthDir, and reloads.
        shutil.copy(tmp_path / "alice.auth_private", tor_network.client.directory / "onion_auth")
        assert "250 OK" in control_command(tor_network.client, "SIGNAL RELOAD")
        client = LineClient(socks_connect_retrying(tor_network.client.socks_port, *address), timeout=60)
        assert client.request("LOGIN alice open") == b"200"
        assert client.request("SUBSCRIBE inner") == b"200"
        assert client.request("PING") == b"000 . PONG"
        client.close()
    finally:
        broker.stop()
        (tor_network.client.directory / "onion_auth" / "alice.auth_private").unlink(missing_ok=True)


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777

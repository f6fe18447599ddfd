"""brokerd's listeners as onion services on the private Tor network (tests/support/tor.py):
published through a running tor's control port or a tor brokerd launches, reached by
clients through another tor's SOCKS port."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import REPO, LineClient, free_port
from tests.support.tor import (
    TorNetwork,
    private_torrc_problems,
    socks_connect_retrying,
    start_onion_broker,
)

pytestmark = pytest.mark.slow


def ssmp_client(network: TorNetwork, address: tuple[str, int]) -> LineClient:
    assert network.client is not None
    return LineClient(socks_connect_retrying(network.client.socks_port, *address), timeout=60.0)


def ssmp_round_trip(network: TorNetwork, address: tuple[str, int], text: bytes) -> None:
    """A subscriber and a publisher, each over its own connection through the client tor."""
    subscriber = ssmp_client(network, address)
    assert subscriber.request("LOGIN bob open") == b"200"
    assert subscriber.request("SUBSCRIBE news") == b"200"
    publisher = ssmp_client(network, address)
    assert publisher.request("LOGIN alice open") == b"200"
    assert publisher.request(b"MCAST news " + text) == b"200"
    assert subscriber.line() == b"000 alice MCAST news " + text
    subscriber.close()
    publisher.close()


def test_ssmp_round_trip_through_an_onion_listener(tor_network: TorNetwork, tmp_path: Path) -> None:
    assert tor_network.service is not None
    broker = start_onion_broker(tmp_path, "--open-login", "--ping-interval", "600", "--tor-control", tor_network.service.control_endpoint,
                                listeners={"ssmp": "onion:8787"})
    try:
        address = broker.addresses["ssmp"]
        assert address[1] == 8787
        ssmp_round_trip(tor_network, address, b"hello over tor")
        log = broker.log()
        assert f"SSMP listening on {address[0]}:8787 (--ssmp onion:8787)" in log
        assert (broker.data_dir / "onion" / "ssmp-8787.hostname").read_text() == address[0] + "\n"
    finally:
        broker.stop()


def ctl_status(admin_port: int) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("BROKERD_ADMIN", None)
    result = subprocess.run([sys.executable, "-m", "brokerd.cli.ctl", "--admin", f"http://127.0.0.1:{admin_port}",
                             "status", "--interval", "0"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_launched_tor_keeps_the_address_across_a_restart(tor_network: TorNetwork, tmp_path: Path) -> None:
    torrc = tor_network.write_torrc(tmp_path / "brokerd-torrc", f"Log notice file {tmp_path / 'launched-tor.log'}", f"Log info file {tmp_path / 'launched-tor-info.log'}")
    assert private_torrc_problems(torrc.read_text()) == []
    admin = free_port()
    options = ("--open-login", "--ping-interval", "600", "--tor-config", str(torrc), "--tor-timeout", "60", "--admin", f"tcp:{admin}:interface=127.0.0.1")
    first = start_onion_broker(tmp_path / "first", *options, listeners={"ssmp": "onion:8787"})
    try:
        address = first.addresses["ssmp"]
        assert f"onion services: {address[0]}:8787" in ctl_status(admin)
    finally:
        first.stop()
    key = first.data_dir / "onion" / "ssmp-8787.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    # The same data directory: the same key, so the same address, and it is reachable.
    (tmp_path / "first" / "broker.log").rename(tmp_path / "first" / "broker-1.log")
    second = start_onion_broker(tmp_path / "first", *options, listeners={"ssmp": "onion:8787"})
    try:
        assert second.addresses["ssmp"] == address
        ssmp_round_trip(tor_network, address, b"back at the same address")
    finally:
        second.stop()

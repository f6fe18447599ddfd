"""Two brokers federated over Tor: each one's SMQP listener is an onion service, and beta's
server link to alpha dials alpha's onion address (``--smqp-link alpha.test=tor:...``).  A
message alpha stored before anyone at beta subscribed reaches beta's subscriber."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.support.broker import REPO
from tests.support.secrets import write_private
from tests.support.tor import TorNetwork, socks_connect_retrying, start_onion_broker

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT = 90


def smqp(network: TorNetwork, address: tuple[str, int], user: str, password_file: Path,
         *args: str) -> subprocess.CompletedProcess:
    assert network.client is not None
    socks_connect_retrying(network.client.socks_port, *address).close()  # the CLI does not retry
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "brokerd.cli.smqp", "--connect",
               f"tor:{address[0]}:{address[1]}:socksPort={network.client.socks_port}", "-u", user,
               "--password-file", str(password_file), "--timeout", str(CLIENT_TIMEOUT), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=CLIENT_TIMEOUT + 30, env=env, cwd=REPO)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_an_smqp_link_over_onion_addresses_carries_a_stored_message(tor_network: TorNetwork, tmp_path: Path) -> None:
    assert tor_network.service is not None and tor_network.client is not None
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts, {**ACCOUNTS, "peer": "peerpw"})
    passwords = {}
    for name, password in (("alice", "alicepw"), ("bob", "bobpw"), ("peer", "peerpw")):
        passwords[name] = tmp_path / f"{name}.pw"
        write_private(passwords[name], password + "\n")
    control = ("--tor-control", tor_network.service.control_endpoint, "--accounts", str(accounts))
    alpha = start_onion_broker(tmp_path / "alpha", *control, "--smqp-domain", "alpha.test",
                               listeners={"smqp": "onion:7720"})
    beta = None
    try:
        at_alpha = alpha.addresses["smqp"]
        smqp(tor_network, at_alpha, "alice", passwords["alice"], "create", "/news")
        smqp(tor_network, at_alpha, "alice", passwords["alice"], "pub", "--header", "Depth:1", "/news",
             "stored at alpha, read at beta")
        link = f"alpha.test=tor:{at_alpha[0]}:{at_alpha[1]}:socksPort={tor_network.client.socks_port}"
        beta = start_onion_broker(tmp_path / "beta", *control, "--smqp-domain", "beta.test", "--smqp-link", link,
                                  "--smqp-link-account", "peer", "--smqp-link-password-file", str(passwords["peer"]),
                                  listeners={"smqp": "onion:7720"})
        at_beta = beta.addresses["smqp"]
        assert at_beta[0] != at_alpha[0]
        smqp(tor_network, at_beta, "alice", passwords["alice"], "create", "/alpha_test")
        smqp(tor_network, at_beta, "alice", passwords["alice"], "create", "/alpha_test/news")
        received = smqp(tor_network, at_beta, "bob", passwords["bob"], "sub", "-C", "1", "/alpha_test/news")
        assert "stored at alpha, read at beta" in received.stdout
        assert "SMQP link to alpha.test" in beta.log() and "is up" in beta.log()
    finally:
        if beta is not None:
            beta.stop()
        alpha.stop()

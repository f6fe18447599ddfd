"""The private Tor network the onion-service tests run on: it comes up, and no torrc the
suite writes could reach beyond loopback or the private network."""
from __future__ import annotations

import pytest

from tests.support.tor import TorNetwork, control_command, private_torrc_problems

pytestmark = pytest.mark.slow


def test_every_torrc_names_only_the_private_network(tor_network: TorNetwork) -> None:
    written = sorted(tor_network.root.rglob("torrc*"))
    assert len(written) >= len(tor_network.nodes) + len(tor_network.authorities) + len(tor_network.relays)
    for path in written:
        assert private_torrc_problems(path.read_text()) == [], path
    authorities = [line for line in tor_network.authorities[0].torrc.read_text().splitlines()
                   if line.startswith("DirAuthority")]
    assert len(authorities) == len(tor_network.authorities)


def test_the_check_refuses_what_could_leave_loopback(tor_network: TorNetwork) -> None:
    fit = tor_network.torrcs()[0].read_text()
    assert private_torrc_problems(fit) == []  # the positive control
    assert private_torrc_problems("SocksPort 9050\n")  # defaults: the public authorities
    for unfit in ("UseDefaultFallbackDirs 1", "ORPort 9001", "SocksPort 0.0.0.0:9050", "FallbackDir 1.2.3.4:80 id=AB",
                  "DirAuthority x orport=1 v3ident=AB 128.31.0.39:9131 " + "A" * 40, "ClientUseIPv6 1"):
        assert private_torrc_problems(fit + unfit + "\n"), unfit


def test_the_client_tor_is_bootstrapped_on_the_private_network(tor_network: TorNetwork) -> None:
    assert tor_network.client is not None
    replies = control_command(tor_network.client, "GETINFO status/bootstrap-phase", "GETINFO ns/all")
    assert "PROGRESS=100" in replies
    listed = {line.split()[1] for line in replies.splitlines() if line.startswith("r ")}
    assert listed == {node.name for node in (*tor_network.authorities, *tor_network.relays)}
    addresses = {line.split()[6] for line in replies.splitlines() if line.startswith("r ")}
    assert addresses == {"127.0.0.1"}

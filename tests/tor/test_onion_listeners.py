"""brokerd's listeners as onion services on the private Tor network (tests/support/tor.py):
published through a running tor's control port or a tor brokerd launches, reached by
clients through another tor's SOCKS port."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.broker import LineClient
from tests.support.tor import TorNetwork, socks_connect, start_onion_broker, tor_network  # noqa: F401

pytestmark = pytest.mark.slow


def ssmp_client(network: TorNetwork, address: tuple[str, int]) -> LineClient:
    assert network.client is not None
    return LineClient(socks_connect(network.client.socks_port, *address), timeout=60.0)


def test_ssmp_round_trip_through_an_onion_listener(tor_network: TorNetwork, tmp_path: Path) -> None:
    assert tor_network.service is not None
    broker = start_onion_broker(tmp_path, "--open-login", "--tor-control", tor_network.service.control_endpoint,
                                listeners={"ssmp": "onion:8787"})
    try:
        address = broker.addresses["ssmp"]
        assert address[1] == 8787
        subscriber = ssmp_client(tor_network, address)
        assert subscriber.request("LOGIN bob open") == b"200"
        assert subscriber.request("SUBSCRIBE news") == b"200"
        publisher = ssmp_client(tor_network, address)
        assert publisher.request("LOGIN alice open") == b"200"
        assert publisher.request("MCAST news hello over tor") == b"200"
        assert subscriber.line() == b"000 alice MCAST news hello over tor"
        log = broker.log()
        assert f"SSMP listening on {address[0]}:8787 (--ssmp onion:8787)" in log
        assert (broker.data_dir / "onion" / "ssmp-8787.hostname").read_text() == address[0] + "\n"
    finally:
        broker.stop()

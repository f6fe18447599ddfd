"""A TLS listener published as an onion service (``onion:PORT:tls=yes``): the broker's
certificate, and client certificates still checked (``cert`` login works for a verified
one; one from another CA fails the handshake)."""
from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from tests.support.broker import LineClient
from tests.support.certs import CertFiles, TestPKI
from tests.support.fixtures import pki  # noqa: F401
from tests.support.tor import TorNetwork, socks_connect_retrying, start_onion_broker

pytestmark = pytest.mark.slow


def tls_over_tor(network: TorNetwork, address: tuple[str, int], pki: TestPKI, cert: CertFiles) -> LineClient:
    assert network.client is not None
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(cert.cert), str(cert.key))
    raw = socks_connect_retrying(network.client.socks_port, *address)
    raw.settimeout(60)
    return LineClient(context.wrap_socket(raw, server_hostname="localhost"), timeout=60)


def test_a_tls_listener_over_an_onion_service_checks_client_certificates(
        tor_network: TorNetwork, pki: TestPKI, tmp_path: Path) -> None:  # noqa: F811
    assert tor_network.service is not None
    broker = start_onion_broker(
        tmp_path, "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), "--tls-ca", str(pki.ca),
        "--ping-interval", "600", "--tor-control", tor_network.service.control_endpoint,
        listeners={"ssmp": "onion:8788:tls=yes"})
    try:
        address = broker.addresses["ssmp"]
        alice = tls_over_tor(tor_network, address, pki, pki.client)
        assert alice.request("LOGIN alice cert") == b"200"
        assert alice.request("PING") == b"000 . PONG"
        with pytest.raises((ssl.SSLError, ConnectionError, EOFError, OSError)):
            stranger = tls_over_tor(tor_network, address, pki, pki.wrong_ca_client)
            stranger.request("LOGIN alice cert")  # TLS 1.3: the refusal shows on the first read
        assert alice.request("PING") == b"000 . PONG"
    finally:
        broker.stop()

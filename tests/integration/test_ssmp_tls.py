"""SSMP over a ``tls:`` listener of the real twistd plugin, with real certificates: the
``cert`` login scheme and what happens to wrong-CA, expired and missing client certificates."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess

import pytest

from tests.support.broker import LineClient, start_broker
from tests.support.fixtures import pki  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def tls_broker(tmp_path, pki):  # noqa: F811
    broker = start_broker(
        tmp_path,
        "--open-login",
        "--tls-cert", str(pki.server.cert),
        "--tls-key", str(pki.server.key),
        "--tls-ca", str(pki.ca),
        listeners={"ssmp": "tls:{port}:interface=127.0.0.1"},
    )
    yield broker
    broker.stop()


def tls_client(port: int, ca, cert=None) -> LineClient:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return LineClient(context.wrap_socket(raw, server_hostname="localhost"))


def test_cert_login_with_cn_san_and_suffix(tls_broker, pki):  # noqa: F811
    port = tls_broker.ports["ssmp"]
    for identifier in ("alice", "alice.example", "alice/laptop", "alice.example/phone-2"):
        client = tls_client(port, pki.ca, pki.client)
        assert client.request(f"LOGIN {identifier} cert") == b"200", identifier
        client.close()


def test_cert_login_refuses_other_names(tls_broker, pki):  # noqa: F811
    port = tls_broker.ports["ssmp"]
    for identifier in ("bob", "alic", "alice/", "alicex", "bob/alice"):
        client = tls_client(port, pki.ca, pki.client)
        assert client.request(f"LOGIN {identifier} cert") == b"401 open cert", identifier
        assert client.closed()


def test_cert_identity_delivers_messages(tls_broker, pki):  # noqa: F811
    port = tls_broker.ports["ssmp"]
    alice = tls_client(port, pki.ca, pki.client)
    assert alice.request("LOGIN alice/one cert") == b"200"
    bob = tls_client(port, pki.ca)
    assert bob.request("LOGIN bob open") == b"200"
    assert bob.request("UCAST alice/one over tls") == b"200"
    assert alice.line() == b"000 bob UCAST alice/one over tls"


def test_client_without_certificate_may_use_other_schemes_never_cert(tls_broker, pki):  # noqa: F811
    port = tls_broker.ports["ssmp"]
    anonymous = tls_client(port, pki.ca)
    assert anonymous.request("LOGIN alice cert") == b"401 open cert"
    assert anonymous.closed()
    plain = tls_client(port, pki.ca)
    assert plain.request("LOGIN alice open") == b"200"


@pytest.mark.parametrize("which", ["wrong_ca_client", "expired_client"])
def test_unverifiable_client_certificates_fail_the_handshake(tls_broker, pki, which):  # noqa: F811
    port = tls_broker.ports["ssmp"]
    with pytest.raises((ssl.SSLError, ConnectionError, EOFError, OSError)):
        client = tls_client(port, pki.ca, getattr(pki, which))
        # TLS 1.3: the client learns of the rejection on its first read.
        client.request("LOGIN alice cert")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_openssl_s_client_as_a_real_client(tls_broker, pki):  # noqa: F811
    port = tls_broker.ports["ssmp"]
    result = subprocess.run(
        [
            "openssl", "s_client", "-quiet", "-connect", f"127.0.0.1:{port}",
            "-cert", str(pki.client.cert), "-key", str(pki.client.key),
            "-CAfile", str(pki.ca), "-verify_return_error",
        ],
        input=b"LOGIN alice/s-client cert\nPING\nCLOSE\n",
        capture_output=True,
        timeout=30,
    )
    assert result.stdout == b"200\n000 . PONG\n200\n", result.stderr


def test_plain_tcp_listener_never_accepts_cert(tmp_path, pki):  # noqa: F811
    broker = start_broker(
        tmp_path,
        "--open-login",
        "--tls-cert", str(pki.server.cert),
        "--tls-key", str(pki.server.key),
        "--tls-ca", str(pki.ca),
    )
    try:
        client = LineClient.connect(broker.ports["ssmp"])
        assert client.request("LOGIN alice cert") == b"401 open cert"
    finally:
        broker.stop()

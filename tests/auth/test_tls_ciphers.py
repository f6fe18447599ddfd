"""brokerd's TLS cipher profile over real handshakes on loopback: a listener and brokerd's own
client refuse every CBC suite and agree on an ECDHE + AEAD suite (TLS 1.2) or TLS 1.3."""
from __future__ import annotations

import socket
import ssl

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.internet import threads
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.ssl import AcceptableCiphers, CertificateOptions, TLSVersion

from brokerd.auth.tls import ServerTLS, client_context
from tests.auth.test_tls import (
    TIMEOUT,
    ReporterFactory,
    needs_openssl,
    s_client,
    serve,  # noqa: F401 - fixture
    twisted_client,
)
from tests.support.certs import SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401

CBC = "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384"
"""TLS 1.2 CBC suites for the test PKI's EC key; Mozilla's intermediate profile has none."""
AEAD = "ECDHE-ECDSA-AES128-GCM-SHA256"


def _handshake(port: int, ca: str, ciphers: str | None, version: ssl.TLSVersion) -> tuple[str, str] | ssl.SSLError:
    """(protocol, cipher) a stdlib client negotiated, or the TLS error (run in a thread)."""
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = context.maximum_version = version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
            with context.wrap_socket(raw, server_hostname=SERVER_HOSTNAME) as tls:
                version_name, cipher = tls.version(), tls.cipher()[0]
                tls.recv(4096)
                return version_name, cipher
    except ssl.SSLError as error:
        return error


def handshake(port: int, pki: TestPKI, ciphers: str | None, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2):  # noqa: F811
    return threads.deferToThread(_handshake, port, str(pki.ca), ciphers, version)


@pytest.fixture(scope="module")
def server_tls(pki: TestPKI) -> ServerTLS:  # noqa: F811
    return ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)


@pytest_twisted.ensureDeferred
async def test_listener_refuses_cbc_suites_and_accepts_aead(serve, server_tls, pki):  # noqa: F811
    server = await serve(server_tls)
    refused = await handshake(server.port, pki, CBC)
    assert isinstance(refused, ssl.SSLError)
    assert "HANDSHAKE_FAILURE" in str(refused) or "NO_SHARED_CIPHER" in str(refused)  # the server's alert
    assert await handshake(server.port, pki, AEAD) == ("TLSv1.2", AEAD)
    negotiated = await handshake(server.port, pki, None)  # a client's default offer: the server picks AEAD
    assert not isinstance(negotiated, ssl.SSLError) and ("GCM" in negotiated[1] or "CHACHA20" in negotiated[1])
    version, cipher = await handshake(server.port, pki, None, ssl.TLSVersion.TLSv1_3)
    assert version == "TLSv1.3" and cipher.startswith("TLS_")


@needs_openssl
@pytest_twisted.ensureDeferred
async def test_openssl_s_client_cbc_is_refused(serve, server_tls, pki):  # noqa: F811
    server = await serve(server_tls)
    refused = await s_client(server.port, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA", "-CAfile", str(pki.ca))
    assert refused.returncode != 0
    assert "handshake failure" in refused.stderr
    accepted = await s_client(server.port, "-tls1_2", "-cipher", AEAD, "-CAfile", str(pki.ca), "-quiet")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == "()\n"


async def _cbc_only_server(pki: TestPKI, ciphers: str):  # noqa: F811
    """A TLS 1.2 listener that offers only ``ciphers`` (not brokerd's profile)."""
    from twisted.internet import reactor

    options = CertificateOptions(
        privateKey=serialization.load_pem_private_key(pki.server.key.read_bytes(), None),
        certificate=x509.load_pem_x509_certificate(pki.server.cert.read_bytes()),
        raiseMinimumTo=TLSVersion.TLSv1_2,
        lowerMaximumSecurityTo=TLSVersion.TLSv1_2,
        acceptableCiphers=AcceptableCiphers.fromOpenSSLCipherString(ciphers),
    )
    factory = ReporterFactory()
    return await SSL4ServerEndpoint(reactor, 0, options, interface="127.0.0.1").listen(factory)


@pytest.mark.parametrize("offered, accepted", [(CBC, False), (AEAD, True)])
@pytest_twisted.ensureDeferred
async def test_brokerd_client_refuses_a_cbc_only_server(pki, offered, accepted):  # noqa: F811
    port = await _cbc_only_server(pki, offered)
    try:
        data, _reason = await twisted_client(port.getHost().port, client_context(SERVER_HOSTNAME, pki.ca))
    finally:
        await port.stopListening()
    assert (data == b"()\n") is accepted

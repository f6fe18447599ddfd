"""A throwaway PKI for TLS tests: one trusted CA, one CA nobody trusts, and the certificates a
test needs to show each outcome of a handshake.

Every client certificate says it is ``alice``, so a test that sees a handshake fail knows it was
the trust (wrong CA, expiry) that failed, not the name.

    pki = make_pki(tmp_path)
    ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    client_context("localhost", pki.ca, pki.client.cert, pki.client.key)
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from brokerd.auth.devcerts import (
    Issued,
    make_ca,
    make_client_cert,
    make_server_cert,
    write_pem,
)

CLIENT_NAME = "alice"
CLIENT_DNS = "alice.example"
CLIENT_NAMES = (CLIENT_NAME, CLIENT_DNS)
"""What peer_names reports for ``TestPKI.client``: CN first, then the DNS subjectAltName."""

SERVER_HOSTNAME = "localhost"
"""The name clients verify the server certificate against (it also covers IP 127.0.0.1)."""


@dataclass(frozen=True)
class CertFiles:
    """A PEM certificate and its PEM private key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class TestPKI:
    """Paths of the test PKI's files (all PEM)."""

    __test__ = False  # a data holder, not a pytest test class

    directory: Path
    ca: Path
    """The CA the server trusts (``--tls-ca``); clients verify the server against it too."""
    wrong_ca: Path
    """A second CA the server does not trust."""
    server: CertFiles
    """Server certificate for localhost and 127.0.0.1, signed by ``ca``."""
    client: CertFiles
    """Valid client certificate: CN ``alice``, SAN DNS:alice.example, signed by ``ca``."""
    expired_client: CertFiles
    """Like ``client`` but expired yesterday."""
    wrong_ca_client: CertFiles
    """Like ``client`` but signed by ``wrong_ca``."""


def make_pki(directory: Path) -> TestPKI:
    """Create the PKI's files in ``directory`` (which must exist) and return their paths."""
    ca, wrong_ca = make_ca("brokerd test CA"), make_ca("brokerd untrusted CA")
    now = datetime.now(timezone.utc)

    def save(name: str, issued: Issued) -> CertFiles:
        files = CertFiles(directory / f"{name}.pem", directory / f"{name}.key")
        write_pem(issued, files.cert, files.key)
        return files

    save("wrong-ca", wrong_ca)
    return TestPKI(
        directory=directory,
        ca=save("ca", ca).cert,
        wrong_ca=directory / "wrong-ca.pem",
        server=save("server", make_server_cert(ca)),
        client=save(CLIENT_NAME, make_client_cert(ca, CLIENT_NAME, dns_names=[CLIENT_DNS])),
        expired_client=save(
            "alice-expired",
            make_client_cert(
                ca,
                CLIENT_NAME,
                dns_names=[CLIENT_DNS],
                not_before=now - timedelta(days=30),
                not_after=now - timedelta(days=1),
            ),
        ),
        wrong_ca_client=save(
            "alice-wrong-ca", make_client_cert(wrong_ca, CLIENT_NAME, dns_names=[CLIENT_DNS])
        ),
    )

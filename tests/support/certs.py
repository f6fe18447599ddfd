"""A throwaway PKI for TLS tests: one trusted CA, one CA nobody trusts, and the certificates a
test needs to show each outcome of a handshake.

Every client certificate says it is ``alice``, so a test that sees a handshake fail knows it was
the trust (wrong CA, expiry) that failed, not the name.

    pki = make_pki(tmp_path)
    ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    client_context("localhost", pki.ca, pki.client.cert, pki.client.key)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import trustme

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
    authority: trustme.CA = field(compare=False, repr=False)
    """The CA behind ``ca``, for a test that needs one more certificate it trusts."""


def make_pki(directory: Path) -> TestPKI:
    """Create the PKI's files in ``directory`` (which must exist) and return their paths.

    Built with ``trustme``: the tests of brokerd's own certificate code (brokerd/auth/devcerts.py,
    ``brokerd-certs``) make theirs with that code; every other TLS test uses this PKI, so a bug
    in devcerts cannot hide itself."""
    ca, wrong_ca = trustme.CA(), trustme.CA()
    now = datetime.now(timezone.utc)

    def save(name: str, leaf: trustme.LeafCert) -> CertFiles:
        files = CertFiles(directory / f"{name}.pem", directory / f"{name}.key")
        leaf.cert_chain_pems[0].write_to_path(str(files.cert))
        leaf.private_key_pem.write_to_path(str(files.key))
        files.key.chmod(0o600)  # brokerd refuses a --tls-key that group or others can read
        return files

    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    wrong_ca.cert_pem.write_to_path(str(directory / "wrong-ca.pem"))
    return TestPKI(
        directory=directory,
        ca=directory / "ca.pem",
        wrong_ca=directory / "wrong-ca.pem",
        server=save("server", ca.issue_cert(SERVER_HOSTNAME, "127.0.0.1")),
        client=save(CLIENT_NAME, ca.issue_cert(CLIENT_DNS, common_name=CLIENT_NAME)),
        expired_client=save(
            "alice-expired",
            ca.issue_cert(CLIENT_DNS, common_name=CLIENT_NAME, not_before=now - timedelta(days=30),
                          not_after=now - timedelta(days=1)),
        ),
        wrong_ca_client=save("alice-wrong-ca", wrong_ca.issue_cert(CLIENT_DNS, common_name=CLIENT_NAME)),
        authority=ca,
    )

"""A tls: admin listener: client certificates named in --admin-cert-names are let in without
a token, other verified certificates are not; and where a listener is reachable."""
from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor, threads
from twisted.internet.testing import MemoryReactorClock

from brokerd.admin.exposure import binds_loopback
from brokerd.config import Settings
from brokerd.tap import StartupError, makeService
from tests.support.broker import free_port
from tests.support.certs import TestPKI
from tests.support.fixtures import pki  # noqa: F401


def _get(port: int, pki: TestPKI, cert: Path | None, key: Path | None) -> int:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("GET", "/api/topics")
        return connection.getresponse().status
    finally:
        connection.close()


def _statuses(port: int, pki: TestPKI, bob: tuple[Path, Path]) -> dict[str, int]:
    return {
        "alice": _get(port, pki, pki.client.cert, pki.client.key),
        "bob": _get(port, pki, *bob),
        "none": _get(port, pki, None, None),
    }


@pytest_twisted.inlineCallbacks
def test_listed_client_certificates_need_no_token(tmp_path: Path, pki: TestPKI) -> None:
    bob = pki.authority.issue_cert(common_name="bob")  # verified, but not listed
    bob_cert, bob_key = tmp_path / "bob.pem", tmp_path / "bob.key"
    bob.cert_chain_pems[0].write_to_path(str(bob_cert))
    bob.private_key_pem.write_to_path(str(bob_key))
    admin = free_port()
    settings = Settings(listeners={"ssmp": [f"tcp:{free_port()}:interface=127.0.0.1"]}, data_dir=tmp_path / "d",
                        event_log=False, tls_cert=pki.server.cert, tls_key=pki.server.key, tls_ca=pki.ca,
                        admin=f"tls:{admin}", admin_cert_names="alice, carol")
    service = makeService(settings, reactor)
    service.startService()
    try:
        statuses = yield threads.deferToThread(_statuses, admin, pki, (bob_cert, bob_key))
    finally:
        yield service.stopService()
    assert statuses == {"alice": 200, "bob": 401, "none": 401}


def test_certificate_names_need_a_tls_listener_with_a_ca(tmp_path: Path) -> None:
    settings = Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, data_dir=tmp_path,
                        admin="tcp:0:interface=127.0.0.1", admin_cert_names="alice")
    with pytest.raises(StartupError, match="--admin-cert-names needs a tls: --admin listener and --tls-ca"):
        makeService(settings, MemoryReactorClock())


@pytest.mark.parametrize(("endpoint", "local"), [
    ("tcp:8081:interface=127.0.0.1", True), ("tcp:8081:127.0.0.1", True), ("tcp:8081:interface=\\:\\:1", True),
    ("tls:8081:interface=localhost", True), ("unix:/run/brokerd/admin.sock", True), ("tcp:8081", False),
    ("tcp:8081:interface=0.0.0.0", False), ("tcp:8081:interface=10.0.0.1", False), ("onion:80", False),
    ("tls:8081", False),
])
def test_binds_loopback(endpoint: str, local: bool) -> None:
    assert binds_loopback(endpoint) is local

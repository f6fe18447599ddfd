"""brokerd.auth.devcerts: the certificates must pass a strict RFC 5280 verifier (cryptography's),
not just "load", since real TLS stacks are what will judge them."""
from __future__ import annotations

import ipaddress
import stat
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from brokerd.auth import devcerts



def now() -> datetime:
    """The time at the call: a test run later than the module's import (a long, shuffled run)
    must not verify against a moment before its certificates were made."""
    return datetime.now(timezone.utc)


@pytest.fixture(scope="module")
def ca() -> devcerts.Issued:
    return devcerts.make_ca("test CA")


def _verify_server(ca: devcerts.Issued, leaf: devcerts.Issued, name: str, when: datetime | None = None) -> None:
    subject: x509.verification.Subject
    try:
        subject = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    verifier = PolicyBuilder().store(Store([ca.certificate])).time(when or now()).build_server_verifier(
        subject
    )
    verifier.verify(leaf.certificate, [])


def _verify_client(ca: devcerts.Issued, leaf: devcerts.Issued, when: datetime | None = None):
    verifier = PolicyBuilder().store(Store([ca.certificate])).time(when or now()).build_client_verifier()
    return verifier.verify(leaf.certificate, [])


def _sans(issued: devcerts.Issued) -> list[str]:
    try:
        extension = issued.certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except x509.ExtensionNotFound:
        return []
    return [str(name.value) for name in extension.value]


def _usage(issued: devcerts.Issued) -> list[x509.ObjectIdentifier]:
    return list(issued.certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_ca_is_a_self_signed_ca(ca):
    certificate = ca.certificate
    assert ca.common_name == "test CA"
    assert certificate.issuer == certificate.subject
    certificate.verify_directly_issued_by(certificate)
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is True


def test_server_certificate_covers_localhost_and_loopback_by_default(ca):
    server = devcerts.make_server_cert(ca)
    assert server.common_name == "localhost"
    assert _sans(server) == ["localhost", "127.0.0.1"]
    assert _usage(server) == [ExtendedKeyUsageOID.SERVER_AUTH]
    _verify_server(ca, server, "localhost")
    _verify_server(ca, server, "127.0.0.1")


def test_server_certificate_extra_names_come_first(ca):
    server = devcerts.make_server_cert(ca, ["broker.example", "10.1.2.3", "localhost"])
    assert server.common_name == "broker.example"
    assert _sans(server) == ["broker.example", "10.1.2.3", "localhost", "127.0.0.1"]
    _verify_server(ca, server, "broker.example")
    _verify_server(ca, server, "10.1.2.3")
    with pytest.raises(VerificationError):
        _verify_server(ca, server, "other.example")


def test_server_name_too_long_for_a_cn_is_still_a_subject_alt_name(ca):
    long_name = "a" * 60 + ".example"
    server = devcerts.make_server_cert(ca, [long_name])
    assert server.common_name == "localhost"
    _verify_server(ca, server, long_name)


def test_client_certificate_names_and_usage(ca):
    client = devcerts.make_client_cert(
        ca, "alice", dns_names=["alice.example"], uris=["urn:brokerd:alice"]
    )
    assert client.common_name == "alice"
    assert _sans(client) == ["alice.example", "urn:brokerd:alice"]
    assert _usage(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    verified = _verify_client(ca, client)
    assert verified.chain[0] == client.certificate


def test_client_certificate_without_extra_names_has_no_subject_alt_names(ca):
    assert _sans(devcerts.make_client_cert(ca, "bob")) == []


def test_client_certificate_from_another_ca_does_not_verify(ca):
    other = devcerts.make_ca("other CA")
    client = devcerts.make_client_cert(other, "alice", dns_names=["alice.example"])
    assert client.certificate.issuer == other.certificate.subject
    with pytest.raises(VerificationError):
        _verify_client(ca, client)


def test_explicit_validity_makes_expired_certificates():
    ca = devcerts.make_ca(not_before=now() - timedelta(days=30))
    client = devcerts.make_client_cert(
        ca,
        "alice",
        dns_names=["alice.example"],
        not_before=now() - timedelta(days=10),
        not_after=now() - timedelta(days=1),
    )
    assert client.certificate.not_valid_after_utc < now()
    with pytest.raises(VerificationError):
        _verify_client(ca, client)
    _verify_client(ca, client, when=now() - timedelta(days=2))


def test_days_sets_the_default_validity(ca):
    server = devcerts.make_server_cert(ca, days=3)
    lifetime = server.certificate.not_valid_after_utc - server.certificate.not_valid_before_utc
    assert timedelta(days=3) <= lifetime <= timedelta(days=3, minutes=11)
    assert server.certificate.not_valid_before_utc <= now()


def test_validity_must_not_end_before_it_starts():
    with pytest.raises(ValueError):
        devcerts.validity(not_before=now(), not_after=now() - timedelta(seconds=1))


def test_write_and_read_pem_round_trip(ca, tmp_path):
    cert, key = tmp_path / "ca.pem", tmp_path / "ca.key"
    key.write_text("old, readable")
    key.chmod(0o644)
    devcerts.write_pem(ca, cert, key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    again = devcerts.read_pem(cert, key)
    assert again.certificate == ca.certificate
    assert again.key.private_numbers() == ca.key.private_numbers()


def test_read_pem_rejects_a_key_of_another_certificate(ca, tmp_path):
    devcerts.write_pem(ca, tmp_path / "ca.pem", tmp_path / "ca.key")
    other = devcerts.make_client_cert(ca, "bob")
    devcerts.write_pem(other, tmp_path / "bob.pem", tmp_path / "bob.key")
    with pytest.raises(ValueError, match="does not match"):
        devcerts.read_pem(tmp_path / "ca.pem", tmp_path / "bob.key")

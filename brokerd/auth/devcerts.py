"""Development certificates: a private CA, a server certificate and client certificates.

Real deployments bring their own PKI; this exists so that trying TLS and ``cert`` login (and
testing them) takes one command instead of an OpenSSL recipe.  It uses ``cryptography`` only:
pyOpenSSL stays confined to :mod:`brokerd.auth.tls`.

Keys are EC P-256: quick to generate (tests make many) and accepted by every TLS stack we meet.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 365
DEFAULT_SERVER_NAMES = ("localhost", "127.0.0.1")
_CLOCK_SKEW = timedelta(minutes=5)
_MAX_COMMON_NAME = 64


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def common_name(self) -> str:
        attributes = self.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(attributes[0].value) if attributes else ""


def validity(
    days: int = DEFAULT_DAYS,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> tuple[datetime, datetime]:
    """The validity window: explicit bounds win (tests make expired certificates that way);
    otherwise from a few minutes ago (clock skew between hosts) to ``days`` from now."""
    start = not_before or datetime.now(timezone.utc) - _CLOCK_SKEW
    end = not_after or start + _CLOCK_SKEW + timedelta(days=days)
    if end <= start:
        raise ValueError("not_after must be later than not_before")
    return start, end


def make_ca(
    name: str = "brokerd development CA",
    *,
    days: int = DEFAULT_DAYS,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> Issued:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(name)
    builder = _builder(subject, subject, key.public_key(), validity(days, not_before, not_after))
    builder = (
        builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
    )
    return Issued(builder.sign(key, hashes.SHA256()), key)


def make_server_cert(
    ca: Issued,
    names: Sequence[str] = (),
    *,
    days: int = DEFAULT_DAYS,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> Issued:
    """A TLS server certificate for ``names`` plus localhost and 127.0.0.1 (so the loopback
    setups in docs and tests always verify).  The first name is also the CN (the first that
    fits X.509's 64 characters); names that parse as IP addresses become IP subjectAltNames,
    the others DNS ones."""
    all_names = _unique([*names, *DEFAULT_SERVER_NAMES])
    sans = [_server_san(name) for name in all_names]
    common_name = next(name for name in all_names if len(name) <= _MAX_COMMON_NAME)
    return _issue(
        ca,
        common_name,
        sans,
        ExtendedKeyUsageOID.SERVER_AUTH,
        validity(days, not_before, not_after),
    )


def make_client_cert(
    ca: Issued,
    name: str,
    *,
    dns_names: Iterable[str] = (),
    uris: Iterable[str] = (),
    days: int = DEFAULT_DAYS,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> Issued:
    """A TLS client certificate whose CN is ``name``; every DNS and URI subjectAltName is
    another identifier the holder may log in as."""
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in _unique(dns_names)]
    sans += [x509.UniformResourceIdentifier(u) for u in _unique(uris)]
    return _issue(
        ca, name, sans, ExtendedKeyUsageOID.CLIENT_AUTH, validity(days, not_before, not_after)
    )


def write_pem(issued: Issued, cert_path: Path, key_path: Path) -> None:
    """Write the certificate (PEM) and the unencrypted key (PKCS#8 PEM, mode 0600: it is a
    secret even in development, and ssh-style tools complain about readable keys)."""
    key_pem = issued.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as key_file:
        os.fchmod(key_file.fileno(), 0o600)
        key_file.write(key_pem)
    cert_path.write_bytes(issued.certificate.public_bytes(serialization.Encoding.PEM))


def read_pem(cert_path: Path, key_path: Path) -> Issued:
    """Load what :func:`write_pem` wrote (the CA, when issuing more client certificates).
    Raises OSError or ValueError for missing or unusable files."""
    certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: not an EC private key")
    if _spki(certificate.public_key()) != _spki(key.public_key()):
        raise ValueError(f"{key_path}: the key does not match {cert_path}")
    return Issued(certificate, key)


def _issue(
    ca: Issued,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    window: tuple[datetime, datetime],
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(_name(common_name), ca.certificate.subject, key.public_key(), window)
    builder = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    window: tuple[datetime, datetime],
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(window[0])
        .not_valid_after(window[1])
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _server_san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )

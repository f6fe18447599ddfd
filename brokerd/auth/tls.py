"""TLS for brokerd's listeners and clients: the only module that touches pyOpenSSL.

Twisted's ``ssl:`` strport cannot ask for client certificates, and SSMP's ``cert`` login needs
them, so TLS listeners use brokerd's own ``tls:PORT[:interface=ADDR][:backlog=N]`` endpoint,
built from one :class:`ServerTLS` (``--tls-cert``/``--tls-key``/``--tls-ca``).

With a CA the server asks every client for a certificate and verifies it.  It does not insist:
a client without one still connects and may use another login scheme.  A certificate that does
not verify (another CA, expired) fails the handshake, so every certificate :func:`peer_names`
sees has been verified.

Listeners and brokerd's own clients speak TLS 1.2 and 1.3 with the cipher suites of Mozilla's
"intermediate" profile minus its DHE ones (:data:`TLS12_CIPHERS`): forward secrecy and AEAD only,
so no CBC suite (Lucky13-style padding oracles) is ever negotiated (docs/tls.md).

Certificates and keys go to pyOpenSSL as ``cryptography`` objects: its own X509/PKey wrappers
are deprecated where a context takes a certificate or key (only the trust store's ``add_cert``
still takes an X509, without complaint).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    ISSLTransport,
    IStreamServerEndpoint,
)
from twisted.internet.ssl import (
    AcceptableCiphers,
    Certificate,
    CertificateOptions,
    TLSVersion,
    optionsForClientTLS,
    trustRootFromCertificates,
)
from twisted.logger import Logger, LogLevel

from brokerd.errors import ConfigurationError
from brokerd.interfaces import IBrokerReactor

_log = Logger()

_TLS_KEY_TYPES = (
    rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, dsa.DSAPrivateKey, ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
)
"""The private keys pyOpenSSL can put in a context."""

TLS12_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)
"""The TLS 1.2 suites offered and accepted, in preference order: ECDHE key exchange with an
AEAD cipher.  TLS 1.3 has its own suites (OpenSSL's defaults, all AEAD), not set here."""
_CIPHERS = AcceptableCiphers.fromOpenSSLCipherString(TLS12_CIPHERS)
_PROFILE: dict[str, Any] = {"raiseMinimumTo": TLSVersion.TLSv1_2, "acceptableCiphers": _CIPHERS}
"""The CertificateOptions every server and client context of brokerd is built with."""


@dataclass(frozen=True)
class ServerTLS:
    """What every TLS listener of one broker shares: its certificate and the client-CA policy."""

    context_factory: CertificateOptions
    verifies_clients: bool

    @classmethod
    def from_files(cls, cert: Path, key: Path, ca: Path | None) -> ServerTLS:
        """Load ``--tls-cert`` (a PEM certificate, optionally followed by its chain),
        ``--tls-key`` and the optional ``--tls-ca`` bundle.  Every problem is reported now, as a
        one-line ConfigurationError naming the option, rather than at the first handshake."""
        chain, pkey = _read_identity("--tls-cert", cert, "--tls-key", key)
        authorities = _read_certificates("--tls-ca", ca) if ca is not None else []
        options = _server_options(chain, pkey, authorities)
        try:
            options.getContext()  # builds the SSL context now: OpenSSL checks key and chain
        except SSL.Error as error:
            raise ConfigurationError(
                f"--tls-cert {cert}: unusable with --tls-key {key}: {_one_line(error)}"
            )
        return cls(context_factory=options, verifies_clients=bool(authorities))


def _server_options(
    chain: list[x509.Certificate],
    private_key: PrivateKeyTypes,
    authorities: list[x509.Certificate],
) -> CertificateOptions:
    """``trustRoot`` would also set VERIFY_FAIL_IF_NO_PEER_CERT and lock out clients without a
    certificate, so the CA goes in through ``caCerts``/``verify`` with requireCertificate off."""
    verify_options: dict[str, Any] = {}
    if authorities:
        verify_options = {
            "verify": True,
            "caCerts": [crypto.X509.from_cryptography(c) for c in authorities],
            "requireCertificate": False,
        }
    # pyOpenSSL takes cryptography's objects (and deprecates its own, which the tests fail on:
    # setup.cfg's filterwarnings)
    return CertificateOptions(
        privateKey=private_key, certificate=chain[0], extraCertChain=chain[1:],  # type: ignore[arg-type]  # Twisted's hints say PKey, X509
        **_PROFILE, **verify_options)


def listen_endpoint(reactor: IBrokerReactor, tls: ServerTLS, description: str) -> IStreamServerEndpoint:
    """The server endpoint for ``tls:PORT[:interface=ADDR][:backlog=N]``; a colon inside an
    address is written ``\\:`` as in Twisted's strports (``tls:8788:interface=\\:\\:1``)."""
    port, interface, backlog = _parse_tls_description(description)
    return SSL4ServerEndpoint(
        reactor, port, tls.context_factory, backlog=backlog, interface=interface
    )


def _parse_tls_description(description: str) -> tuple[int, str, int]:
    """(port, interface, backlog) from a ``tls:`` description, or ConfigurationError."""
    fields = split_escaped(description)
    if fields[0] != "tls" or len(fields) < 2:
        raise _bad_endpoint(description, "expected tls:PORT[:interface=ADDR][:backlog=N]")
    port = _number(description, "port", fields[1], 0, 65535)
    options: dict[str, str] = {}
    for field in fields[2:]:
        name, equals, value = field.partition("=")
        if not equals or name not in ("interface", "backlog"):
            raise _bad_endpoint(description, f"unknown option {field!r}")
        if name in options:
            raise _bad_endpoint(description, f"{name} given twice")
        if not value:
            raise _bad_endpoint(description, f"{name} is empty")
        options[name] = value
    backlog = _number(description, "backlog", options.get("backlog", "50"), 1, 65535)
    return port, options.get("interface", ""), backlog


def split_escaped(description: str) -> list[str]:
    """Split on ``:`` except where escaped with a backslash (``\\:`` is a literal colon), as
    Twisted's endpoint strings do (server and client ones alike)."""
    fields, current, characters = [], [], iter(description)
    for character in characters:
        if character == "\\":
            current.append(next(characters, ""))
        elif character == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(character)
    fields.append("".join(current))
    return fields


def _number(description: str, name: str, text: str, low: int, high: int) -> int:
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise _bad_endpoint(description, f"{name} must be a number from {low} to {high}")
    return int(text)


def _bad_endpoint(description: str, reason: str) -> ConfigurationError:
    return ConfigurationError(f"bad TLS endpoint {description!r}: {reason}")


def peer_names(transport: object) -> tuple[str, ...]:
    """The names a verified client certificate vouches for: its subject CN, then its DNS and
    URI subjectAltNames, without duplicates.  Empty for anything else (plain TCP, no client
    certificate, a server that does not verify clients, a handshake not finished yet); never
    raises, because a login attempt must not be able to crash the connection."""
    if not ISSLTransport.providedBy(transport):
        return ()
    try:
        connection = transport.getHandle()  # type: ignore[attr-defined]  # TLS transports have it (ISystemHandle); ISSLTransport does not declare it
        if not connection.get_verify_mode() & SSL.VERIFY_PEER:
            return ()  # the certificate, if any, was never checked against a CA
        certificate = connection.get_peer_certificate(as_cryptography=True)
        if certificate is None:
            return ()
        return certificate_names(certificate)
    except Exception:
        _log.failure("Could not read the client certificate's names", level=LogLevel.warn)
        return ()


def certificate_names(certificate: x509.Certificate) -> tuple[str, ...]:
    """CN first, then DNS subjectAltNames, then URI ones, each in certificate order, exactly as
    written.  (service_identity's extract_patterns lower-cases URIs, keeps only their scheme
    and rest, and raises ValueError for a URI with two colons such as ``urn:x:y``; the names are
    identities here, not hostname patterns, so they are read with cryptography directly.)"""
    names = [
        str(attribute.value)
        for attribute in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ]
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        pass
    else:
        names += extension.value.get_values_for_type(x509.DNSName)
        names += extension.value.get_values_for_type(x509.UniformResourceIdentifier)
    return tuple(dict.fromkeys(name for name in names if name))


def client_context(
    hostname: str,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> IOpenSSLClientConnectionCreator:
    """TLS options for brokerd's own clients: verify the server as ``hostname`` against ``ca``
    (the platform's trust store when None) and present ``cert`` when given.  ``key`` may be
    left out when the key follows the certificate in the same file."""
    trust = None
    if ca is not None:
        trust = trustRootFromCertificates(
            [Certificate(crypto.X509.from_cryptography(c)) for c in _read_certificates("CA", ca)]
        )
    if cert is None:
        if key is not None:
            raise ConfigurationError(f"client key {key}: given without a client certificate")
        return optionsForClientTLS(hostname, trustRoot=trust, extraCertificateOptions=_PROFILE)
    chain, pkey = _read_identity("client certificate", cert, "client key", key or cert)
    return optionsForClientTLS(
        hostname,
        trustRoot=trust,
        extraCertificateOptions={
            "privateKey": pkey,
            "certificate": chain[0],
            "extraCertChain": chain[1:],
            **_PROFILE,
        },
    )


def _read_identity(
    cert_label: str, cert: Path, key_label: str, key: Path
) -> tuple[list[x509.Certificate], PrivateKeyTypes]:
    """A certificate chain and the private key of its first certificate."""
    chain = _read_certificates(cert_label, cert)
    private_key = _read_private_key(key_label, key)
    if _spki(private_key.public_key()) != _spki(chain[0].public_key()):
        raise ConfigurationError(
            f"{key_label} {key}: the key does not match the certificate in {cert_label} {cert}"
        )
    if not isinstance(private_key, _TLS_KEY_TYPES):
        raise ConfigurationError(
            f"{key_label} {key}: unusable key type: {type(private_key).__name__}"
        )
    return chain, private_key


def _read(label: str, path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigurationError(f"{label} {path}: cannot read: {error.strerror or error}")


def _read_certificates(label: str, path: Path) -> list[x509.Certificate]:
    """Every PEM certificate in the file, in order (a leaf and its chain, or a CA bundle)."""
    data = _read(label, path)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise ConfigurationError(f"{label} {path}: not a PEM certificate file: {_one_line(error)}")
    return certificates


def _read_private_key(label: str, path: Path) -> PrivateKeyTypes:
    data = _read(label, path)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigurationError(f"{label} {path}: the key is encrypted; give an unencrypted key")
    except (ValueError, UnsupportedAlgorithm) as error:
        raise ConfigurationError(f"{label} {path}: not a PEM private key: {_one_line(error)}")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )

"""OpenPGP for socket.mq: the only module that uses an OpenPGP library (pysequoia).

pysequoia (Sequoia-PGP, Rust) was chosen after trying the candidates on this machine
(docs/socketmq.md has the numbers): it ships as a self-contained wheel, encrypts and signs in
about 2 ms and decrypts and verifies in under 1 ms, validates the signer's certificate
(expiry, revocation, binding signatures) by policy, and needs no keyring directory or agent.

Everything here is synchronous CPU work on bytes; callers on the reactor thread run it in the
reactor's thread pool.  Every failure is a :class:`PGPError`, never a library exception.
"""
from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import pysequoia
from pysequoia.packet import PacketPile, Tag

CONTENT_TYPE = "application/pgp-encrypted"
SECURITY_METHOD = "OpenPGP"

Certificate: TypeAlias = pysequoia.Cert
"""An OpenPGP certificate, as the other modules name it (they do not import pysequoia)."""


class PGPError(Exception):
    """A message could not be opened: not for us, malformed, or not signed by a known key."""


@dataclass(frozen=True)
class Identity:
    """A client (or server) known by its certificate."""

    fingerprint: str
    user_id: str
    """The certificate's first User ID (the application name), or its fingerprint."""
    cert: pysequoia.Cert


def _identity(cert: pysequoia.Cert) -> Identity:
    user_ids = cert.user_ids
    fingerprint = cert.fingerprint
    return Identity(fingerprint, str(user_ids[0]) if user_ids else fingerprint, cert)


def _one_line(error: Exception) -> str:
    """pysequoia errors may carry a Rust backtrace (RUST_BACKTRACE): keep the first line."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Keyring:
    """Public keys of the clients allowed to connect (the draft's keyRing)."""

    def __init__(self, certs: list[pysequoia.Cert] | None = None) -> None:
        self._certs: dict[str, Identity] = {}
        for cert in certs or ():
            self.add(cert)

    @classmethod
    def from_armored(cls, data: bytes | str) -> Keyring:
        """Every certificate in ``data`` (armored or binary, concatenated); PGPError if none."""
        raw = data.encode("ascii", "replace") if isinstance(data, str) else data
        if not raw.strip():
            return cls()
        try:
            certs = pysequoia.Cert.split_bytes(raw)
        except Exception as exc:
            raise PGPError(f"not an OpenPGP key ring: {_one_line(exc)}") from None
        return cls(certs)

    def add(self, cert: pysequoia.Cert) -> None:
        """Add a certificate; secret parts, if a careless key ring has any, are not kept."""
        cert = _public(cert)
        self._certs[cert.fingerprint] = _identity(cert)

    def certs(self) -> list[pysequoia.Cert]:
        return [identity.cert for identity in self._certs.values()]

    def get(self, fingerprint: str) -> Identity | None:
        return self._certs.get(fingerprint.lower())

    def __len__(self) -> int:
        return len(self._certs)


class SecretKey:
    """A key pair that signs and decrypts: the server's, or a client's."""

    def __init__(self, tsk: pysequoia.Tsk) -> None:
        self._tsk = tsk
        self.cert = tsk.extract_certificate()

    @classmethod
    def generate(cls, user_id: str) -> SecretKey:
        return cls(pysequoia.Tsk.generate(user_id))

    @classmethod
    def from_armored(cls, data: bytes | str) -> SecretKey:
        raw = data.encode("ascii", "replace") if isinstance(data, str) else data
        try:
            return cls(pysequoia.Tsk.from_bytes(raw))
        except Exception as exc:
            raise PGPError(f"not an OpenPGP secret key: {_one_line(exc)}") from None

    @classmethod
    def load_or_create(cls, path: Path, user_id: str) -> SecretKey:
        """Read the armored secret key at ``path``; create it (mode 0600) when missing."""
        try:
            return cls.from_armored(path.read_bytes())
        except FileNotFoundError:
            pass
        key = cls.generate(user_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(key.armored_secret())
        return key

    @property
    def fingerprint(self) -> str:
        return self.cert.fingerprint

    def armored_public(self) -> str:
        return str(self.cert)

    def armored_secret(self) -> str:
        return str(self._tsk)

    # ------------------------------------------------------------------ messages

    def seal(self, data: bytes, recipient: pysequoia.Cert, armor: bool = False) -> bytes:
        """``data`` encrypted to ``recipient`` and signed by this key."""
        try:
            return pysequoia.encrypt(
                data, recipients=[recipient], signer=self._tsk.signer(), armor=armor
            )
        except Exception as exc:
            raise PGPError(f"cannot encrypt: {_one_line(exc)}") from None

    def open(self, message: bytes, senders: Keyring | list[pysequoia.Cert]) -> tuple[bytes, Identity]:
        """Decrypt ``message`` (armored or binary) with this key and verify that one of
        ``senders`` signed it; returns the plaintext and the signer."""
        if not _is_encrypted(message):
            raise PGPError("not an OpenPGP message encrypted to a public key")
        certs = senders.certs() if isinstance(senders, Keyring) else list(senders)
        try:
            result = pysequoia.decrypt(message, decryptor=self._tsk.decryptor(), store=lambda ids: certs)
        except Exception as exc:
            raise PGPError(_one_line(exc)) from None
        signatures = result.valid_sigs
        if not signatures or result.bytes is None:
            raise PGPError("no valid signature")
        fingerprint = signatures[0].certificate
        for cert in certs:
            if cert.fingerprint == fingerprint:
                return result.bytes, _identity(cert)
        raise PGPError("signed by an unknown key")


def _is_encrypted(message: bytes) -> bool:
    """True if the message starts with a public-key encrypted session key packet.  (Sequoia's
    decrypt also accepts a message that is only signed; that must not count as secure.)"""
    try:
        first = next(iter(PacketPile.from_bytes(message)), None)
    except Exception:
        return False
    return first is not None and first.tag == Tag.PKESK


def parse_cert(data: bytes | str) -> pysequoia.Cert:
    """One public certificate (armored or binary)."""
    raw = data.encode("ascii", "replace") if isinstance(data, str) else data
    try:
        cert = pysequoia.Cert.from_bytes(raw)
    except Exception as exc:
        raise PGPError(f"not an OpenPGP certificate: {_one_line(exc)}") from None
    return _public(cert)


def _public(cert: pysequoia.Cert) -> pysequoia.Cert:
    """The certificate without secret key material (its armored form is public only)."""
    return pysequoia.Cert.from_bytes(str(cert).encode("ascii"))


# ---------------------------------------------------------------------- WebSocket proof


def new_nonce() -> str:
    return base64.urlsafe_b64encode(os.urandom(18)).decode("ascii")


def client_proof(key: SecretKey, server: pysequoia.Cert, server_nonce: str, client_nonce: str) -> str:
    """The ``proof`` of an OpenPGP ``auth``: both nonces, signed by the client and encrypted
    to the server, so it only works on the connection whose ``hello`` carried ``server_nonce``."""
    body = json.dumps({"server_nonce": server_nonce, "client_nonce": client_nonce}).encode()
    return key.seal(body, server, armor=True).decode("ascii")


def check_client_proof(
    key: SecretKey, proof: str, keyring: Keyring, server_nonce: str
) -> tuple[Identity, str]:
    """(the client, its nonce) from a proof made by :func:`client_proof`; PGPError otherwise."""
    plaintext, identity = key.open(proof.encode("ascii", "replace"), keyring)
    try:
        fields = json.loads(plaintext)
        nonce, client_nonce = fields["server_nonce"], fields["client_nonce"]
    except (ValueError, TypeError, KeyError):
        raise PGPError("the proof is not a socket.mq proof") from None
    if nonce != server_nonce or not isinstance(client_nonce, str) or len(client_nonce) > 128:
        raise PGPError("the proof was made for another connection")
    return identity, client_nonce


def server_proof(key: SecretKey, client: pysequoia.Cert, client_nonce: str) -> str:
    """The server's answer: the client's nonce, signed by the server, encrypted to the client."""
    body = json.dumps({"client_nonce": client_nonce}).encode()
    return key.seal(body, client, armor=True).decode("ascii")


def check_server_proof(key: SecretKey, proof: str, server: pysequoia.Cert, client_nonce: str) -> None:
    """Raise PGPError unless ``proof`` is the server's signature over our nonce."""
    plaintext, _identity = key.open(proof.encode("ascii", "replace"), [server])
    try:
        ok = json.loads(plaintext)["client_nonce"] == client_nonce
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise PGPError("the server's proof does not answer our nonce")

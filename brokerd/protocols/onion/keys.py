"""The keys of onion services: each service's own key, kept in DATA_DIR so that its .onion
address survives a restart, and the x25519 keys of v3 client authorization.

A service key is Tor's own ``ED25519-V3:<base64>`` blob, in ``DATA_DIR/onion/NAME.key``
(mode 0600 in a 0700 directory: whoever reads it can impersonate the service), beside
``NAME.hostname`` (the address, for people and tools).  Client authorization uses Tor's file
formats, so keys made here work with any Tor and keys made by others work here:
``NAME.auth`` (``descriptor:x25519:<public key>``, what the service is given) and
``NAME.auth_private`` (``<address>:descriptor:x25519:<private key>``, what the client's
tor reads from its ``ClientOnionAuthDir``).
"""
from __future__ import annotations

import base64
import os
import re
from pathlib import Path

from brokerd.errors import ConfigurationError

KEYS_DIR = "onion"
"""Where the service keys live, under DATA_DIR."""

_KEY_BLOB = re.compile(r"ED25519-V3:[A-Za-z0-9+/=]{80,100}")
_BASE32_KEY = re.compile(r"[A-Z2-7]{52}")
_CLIENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ONION_ADDRESS = re.compile(r"[a-z2-7]{56}\.onion")


def keys_dir(data_dir: Path) -> Path:
    """DATA_DIR/onion, made (mode 0700) when missing."""
    directory = Path(data_dir) / KEYS_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def read_service_key(path: Path) -> str | None:
    """The key blob in ``path``; None when the file does not exist yet (a new service).
    ConfigurationError for a file that is not a key or that others may read."""
    try:
        text = path.read_text().strip()
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigurationError(f"{path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigurationError(f"{path}: the onion service key is readable by others (mode {mode:o}): chmod 600 it")
    if not _KEY_BLOB.fullmatch(text):
        raise ConfigurationError(f"{path}: not an onion service key (ED25519-V3:...)")
    return text


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner may read (never to an existing one: a key
    is made once)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").rstrip("=")


def make_client_key() -> tuple[str, str]:
    """A new x25519 key pair for v3 client authorization: (private, public), each in base32
    as Tor writes them."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    private = X25519PrivateKey.generate()
    return _b32(private.private_bytes_raw()), _b32(private.public_key().public_bytes_raw())


def check_client_name(name: str) -> str:
    if not _CLIENT_NAME.fullmatch(name):
        raise ConfigurationError(f"{name!r}: a client name is 1-64 letters, digits, '.', '_' or '-'")
    return name


def auth_line(public: str) -> str:
    """A ``NAME.auth`` file's line: what the service is given for one client."""
    return f"descriptor:x25519:{public}\n"


def auth_private_line(address: str, private: str) -> str:
    """A ``NAME.auth_private`` file's line: what the client's tor needs to reach ``address``."""
    return f"{address.removesuffix('.onion')}:descriptor:x25519:{private}\n"


def authorized_clients(directory: Path) -> dict[str, str]:
    """Client name -> public key, from the ``*.auth`` files of ``directory`` (Tor's
    ``authorized_clients`` format).  ConfigurationError naming the file for one that does not
    parse, and for a directory without any: a service for nobody is a mistake."""
    try:
        files = sorted(Path(directory).glob("*.auth"))
    except OSError as exc:
        raise ConfigurationError(f"--onion-client-auth {directory}: {exc.strerror}") from None
    if not Path(directory).is_dir():
        raise ConfigurationError(f"--onion-client-auth {directory}: not a directory")
    clients = {}
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigurationError(f"--onion-client-auth {path}: {exc.strerror}") from None
        kind, _, public = text.rpartition(":")
        if kind != "descriptor:x25519" or not _BASE32_KEY.fullmatch(public):
            raise ConfigurationError(f"--onion-client-auth {path}: expected descriptor:x25519:<base32 public key>")
        clients[path.stem] = public
    if not clients:
        raise ConfigurationError(f"--onion-client-auth {directory}: no NAME.auth file (brokerd-onion add makes one)")
    return clients

"""Onion service keys and client-authorization files, without Tor: the checks that keep a
readable key or a malformed client file from being used, and brokerd-onion's files."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from brokerd.cli.onion import main as onion_main
from brokerd.errors import ConfigurationError
from brokerd.protocols.onion.keys import authorized_clients, make_client_key, read_service_key, write_private

KEY = "ED25519-V3:" + base64.b64encode(bytes(range(64))).decode()
ADDRESS = "a" * 56 + ".onion"


def test_a_service_key_is_read_only_when_only_its_owner_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "ssmp-8787.key"
    assert read_service_key(path) is None  # none yet: a new service
    write_private(path, KEY)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_service_key(path) == KEY  # the positive control
    path.chmod(0o644)
    with pytest.raises(ConfigurationError, match="readable by others"):
        read_service_key(path)
    path.chmod(0o600)
    path.write_text("RSA1024:abc")
    with pytest.raises(ConfigurationError, match="not an onion service key"):
        read_service_key(path)
    with pytest.raises(FileExistsError):
        write_private(path, KEY)  # a key is made once


def test_client_keys_are_a_matching_x25519_pair_in_tors_base32() -> None:
    private, public = make_client_key()
    assert len(private) == len(public) == 52
    raw = base64.b32decode(private + "====")
    derived = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    assert base64.b32encode(derived).decode().rstrip("=") == public


def test_brokerd_onion_add_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clients = tmp_path / "clients"
    private = tmp_path / "alice.auth_private"
    assert onion_main(["add", str(clients), "alice", "--address", ADDRESS, "--private", str(private)]) == 0
    public = (clients / "alice.auth").read_text().strip()
    assert public.startswith("descriptor:x25519:")
    line = private.read_text().strip()
    assert line.startswith("a" * 56 + ":descriptor:x25519:") and private.stat().st_mode & 0o777 == 0o600
    assert authorized_clients(clients) == {"alice": public.rsplit(":", 1)[1]}
    capsys.readouterr()
    assert onion_main(["list", str(clients)]) == 0
    assert capsys.readouterr().out == f"alice\t{public.rsplit(':', 1)[1]}\n"
    assert onion_main(["add", str(clients), "alice", "--address", ADDRESS, "--private", str(private)]) == 1
    assert "exists" in capsys.readouterr().err
    assert onion_main(["add", str(clients), "bob", "--address", "example.com"]) == 1
    assert "not a v3 onion address" in capsys.readouterr().err
    assert onion_main(["add", str(clients), "../bob", "--address", ADDRESS]) == 1


def test_a_malformed_client_file_or_an_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no NAME.auth file"):
        authorized_clients(tmp_path)
    (tmp_path / "eve.auth").write_text("descriptor:x25519:not-base32\n")
    with pytest.raises(ConfigurationError, match="eve.auth: expected descriptor:x25519:"):
        authorized_clients(tmp_path)
    with pytest.raises(ConfigurationError, match="not a directory"):
        authorized_clients(tmp_path / "eve.auth")

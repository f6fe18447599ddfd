"""brokerd-certs: the files it writes must work with brokerd's own TLS loader, and every
mistake must end with a message and exit status 1 (cannot do it) or 2 (bad command line)."""
from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from brokerd.auth.tls import ServerTLS, certificate_names, client_context
from brokerd.cli.certs import main

INIT_FILES = ("ca.pem", "ca.key", "server.pem", "server.key")


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _sans(path: Path) -> list[str]:
    extension = _load(path).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return [str(name.value) for name in extension.value]


def test_init_creates_a_usable_ca_and_server_certificate(tmp_path, capsys):
    directory = tmp_path / "pki"
    assert main(["init", str(directory)]) == 0
    for name in INIT_FILES:
        assert (directory / name).is_file()
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((directory / key).stat().st_mode) == 0o600
    _load(directory / "server.pem").verify_directly_issued_by(_load(directory / "ca.pem"))
    assert _sans(directory / "server.pem") == ["localhost", "127.0.0.1"]
    tls = ServerTLS.from_files(
        directory / "server.pem", directory / "server.key", directory / "ca.pem"
    )
    assert tls.verifies_clients
    assert "--tls-ca" in capsys.readouterr().out


def test_init_server_names_and_days(tmp_path):
    arguments = ["init", str(tmp_path), "--server-name", "broker.example"]
    assert main([*arguments, "--server-name", "10.0.0.7", "--days", "2"]) == 0
    server = _load(tmp_path / "server.pem")
    assert _sans(tmp_path / "server.pem") == [
        "broker.example",
        "10.0.0.7",
        "localhost",
        "127.0.0.1",
    ]
    lifetime = server.not_valid_after_utc - server.not_valid_before_utc
    assert lifetime.days == 2


def test_init_refuses_to_replace_files_without_force(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    first_ca = (tmp_path / "ca.pem").read_bytes()
    assert main(["init", str(tmp_path)]) == 1
    assert "already exist" in capsys.readouterr().err
    assert (tmp_path / "ca.pem").read_bytes() == first_ca
    assert main(["init", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() != first_ca


def test_client_certificate_signed_by_the_directory_ca(tmp_path):
    assert main(["init", str(tmp_path)]) == 0
    san = ["--san", "DNS:bob.example", "--san", "URI:urn:brokerd:bob"]
    assert main(["client", str(tmp_path), "bob", *san, "--days", "5"]) == 0
    cert, key = tmp_path / "bob.pem", tmp_path / "bob.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    certificate = _load(cert)
    certificate.verify_directly_issued_by(_load(tmp_path / "ca.pem"))
    assert certificate_names(certificate) == ("bob", "bob.example", "urn:brokerd:bob")
    assert (certificate.not_valid_after_utc - certificate.not_valid_before_utc).days == 5
    client_context("localhost", tmp_path / "ca.pem", cert, key)  # loads cleanly


def test_client_without_ca_fails(tmp_path, capsys):
    assert main(["client", str(tmp_path), "bob"]) == 1
    assert "run 'init' first" in capsys.readouterr().err
    assert not (tmp_path / "bob.pem").exists()


def test_client_in_missing_directory_fails(tmp_path, capsys):
    assert main(["client", str(tmp_path / "nowhere"), "bob"]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_client_refuses_to_replace_files_without_force(tmp_path):
    assert main(["init", str(tmp_path)]) == 0
    assert main(["client", str(tmp_path), "bob"]) == 0
    assert main(["client", str(tmp_path), "bob"]) == 1
    assert main(["client", str(tmp_path), "bob", "--force"]) == 0


def test_unreadable_ca_key_fails(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    (tmp_path / "ca.key").write_bytes(b"not a key")
    assert main(["client", str(tmp_path), "bob"]) == 1
    assert "cannot load the CA" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arguments",
    [
        [],
        ["frobnicate"],
        ["init"],
        ["init", "DIR", "--days", "0"],
        ["init", "DIR", "--days", "soon"],
        ["init", "DIR", "--days", "99999999"],
        ["init", "DIR", "--server-name", "bad name"],
        ["init", "DIR", "--server-name", ""],
        ["client", "DIR"],
        ["client", "DIR", "../escape"],
        ["client", "DIR", ".hidden"],
        ["client", "DIR", "a" * 65],
        ["client", "DIR", "ca"],
        ["client", "DIR", "server"],
        ["client", "DIR", "bob", "--san", "IP:10.0.0.1"],
        ["client", "DIR", "bob", "--san", "DNS:"],
        ["client", "DIR", "bob", "--san", "DNS:bad name"],
        ["client", "DIR", "bob", "--san", "URI:no-scheme"],
        ["client", "DIR", "bob", "--san", "bob.example"],
    ],
)
def test_bad_command_lines_exit_2_and_write_nothing(arguments, tmp_path, capsys):
    directory = tmp_path / "DIR"
    if arguments[:1] == ["client"]:
        assert main(["init", str(directory)]) == 0
    before = sorted(directory.iterdir()) if directory.exists() else []
    arguments = [str(directory) if a == "DIR" else a for a in arguments]
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2
    assert "usage:" in capsys.readouterr().err
    after = sorted(directory.iterdir()) if directory.exists() else []
    assert after == before


def test_runs_as_a_module(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "brokerd.cli.certs", "init", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "server.pem").is_file()
    done = subprocess.run(
        [sys.executable, "-m", "brokerd.cli.certs", "client", str(tmp_path), "ca"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2
    assert "taken by the CA" in done.stderr

"""Secret files (tokens, passwords, keys, password hashes) that group or others may access are
refused at start-up and by ``--check-config``, one line naming the option; the same files at
mode 600 are accepted.  One check serves every kind (brokerd.config.check_private_mode)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from brokerd.auth.accounts import PasswordHash, write_accounts
from brokerd.config import SECRET_FILES, Settings
from brokerd.tap import startup_problems
from tests.integration.test_startup import assert_one_line_failure, check_config, daemon, stop_daemon
from tests.support.broker import free_port
from tests.support.certs import make_pki
from tests.support.redis import cluster_secret
from tests.support.secrets import write_private

LOOSE = "must not be accessible to group or others"


def _listener() -> dict[str, list[str]]:
    return {"ssmp": [f"tcp:{free_port()}:interface=127.0.0.1"]}


def _settings_with(kind: str, tmp_path: Path) -> tuple[Settings, Path]:
    """Settings a broker accepts, with the secret file of ``kind`` (mode 600) and what it needs."""
    settings = Settings(listeners=_listener(), data_dir=tmp_path / "data", event_log=False)
    path = tmp_path / kind
    if kind == "tls_key":
        pki = make_pki(tmp_path)
        settings.tls_cert, path = pki.server.cert, pki.server.key
    elif kind == "accounts_file":
        write_accounts(path, {"alice": PasswordHash.create("alicepw", n=2)})
    elif kind in ("cluster_secret_file", "cluster_password_file"):
        settings.cluster = "redis://127.0.0.1:1"
        settings.cluster_secret_file = cluster_secret(tmp_path / "cluster_secret_file")
        if kind == "cluster_password_file":
            write_private(path, "redis-password\n")
    elif kind == "store_password_file":
        settings.store = "postgresql://brokerd@127.0.0.1:1/brokerd"
        write_private(path, "pg-password\n")
    elif kind == "admin_token_file":
        settings.admin = f"tcp:{free_port()}:interface=127.0.0.1"
        write_private(path, "t0ken\n")
    else:  # secret_file, smqp_link_password_file, socketmq_key: read when used
        write_private(path, "s3cret\n")
    setattr(settings, kind, path)
    return settings, path


@pytest.mark.parametrize("kind", sorted(SECRET_FILES))
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_each_secret_file_open_to_group_or_others_is_refused(tmp_path: Path, kind: str, mode: int) -> None:
    settings, path = _settings_with(kind, tmp_path)
    for starting in (True, False):  # at start, and --check-config
        assert startup_problems(settings, starting=starting) == []  # mode 600: accepted (positive control)
    os.chmod(path, mode)
    for starting in (True, False):
        problems = startup_problems(settings, starting=starting)
        assert problems == [f"{SECRET_FILES[kind]} {path}: the file {LOOSE} (chmod 600 {path})"], problems


@pytest.mark.slow  # twistd started twice, as a daemon the second time
def test_the_broker_refuses_to_start_with_a_world_readable_admin_token(tmp_path: Path) -> None:
    token = write_private(tmp_path / "admin-token", "t0ken\n")
    options = ("--data-dir", "data", "--ssmp", f"tcp:{free_port()}:interface=127.0.0.1",
               "--admin", f"tcp:{free_port()}:interface=127.0.0.1", "--admin-token-file", str(token))
    os.chmod(token, 0o644)
    assert_one_line_failure(daemon(tmp_path, *options), tmp_path, f"--admin-token-file {token}: the file {LOOSE}")
    os.chmod(token, 0o600)  # positive control: the same broker starts
    started = daemon(tmp_path, *options)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert (tmp_path / "d.pid").exists()
    finally:
        stop_daemon(tmp_path)


@pytest.mark.slow  # twistd --check-config run twice
def test_check_config_names_every_loose_secret_file(tmp_path: Path) -> None:
    secret = write_private(tmp_path / "secret", "s3cret\n")
    accounts = tmp_path / "accounts"
    write_accounts(accounts, {"alice": PasswordHash.create("alicepw", n=2)})
    options = ("--data-dir", "data", "--ssmp", f"tcp:{free_port()}:interface=127.0.0.1",
               "--secret-file", str(secret), "--accounts", str(accounts))
    assert check_config(tmp_path, *options).stdout.strip() == "brokerd: configuration OK"
    os.chmod(secret, 0o644)
    os.chmod(accounts, 0o640)
    result = check_config(tmp_path, *options)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"brokerd: --secret-file {secret}: the file {LOOSE} (chmod 600 {secret})",
        f"brokerd: --accounts {accounts}: the file {LOOSE} (chmod 600 {accounts})",
    ], result.stderr

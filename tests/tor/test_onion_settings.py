"""onion: listeners and the tor settings: what --check-config refuses, with one line each,
and a tor that cannot be reached stopping the broker with its line (no Tor network needed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.broker import REPO, free_port, repo_env, twistd

pytestmark = pytest.mark.slow  # brokerd started seven times: 15-30 s on a busy machine


def check(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brokerd.cli.server", "--data-dir", str(tmp_path / "data"),
                           "--check-config", *options], capture_output=True, text=True, timeout=60,
                          env=repo_env(), cwd=REPO)


def test_check_config_accepts_onion_listeners_and_refuses_bad_ones(tmp_path: Path) -> None:
    torrc = tmp_path / "torrc"
    torrc.write_text("# the launched tor's options\nSocksPort 0\nLog notice stdout\n")
    fine = check(tmp_path, "--ssmp", "onion:8787", "--mqtt", "onion:1883", "--tor-config", str(torrc))
    assert fine.returncode == 0, fine.stderr  # the positive control
    (tmp_path / "clients").mkdir()
    (tmp_path / "bad.torrc").write_text("SocksPort\n")
    for options, line in (
        (("--ssmp", "onion:eighty"), "--ssmp onion:eighty: expected onion:PORT[:tls=yes]"),
        (("--ssmp", "onion:8787:hiddenServiceDir=/x"), "unknown option 'hiddenServiceDir=/x'"),
        (("--ssmp", "onion:8788:tls=yes"), "tls=yes needs --tls-cert and --tls-key"),
        (("--ssmp", "onion:8787", "--tor-control", "tcp:127.0.0.1:9051", "--tor-config", str(torrc)),
         "--tor-control and --tor-config exclude each other"),
        (("--ssmp", "onion:8787", "--tor-config", str(tmp_path / "bad.torrc")), "line 1: expected 'Option value'"),
        (("--ssmp", "onion:8787", "--onion-client-auth", str(tmp_path / "clients")), "no NAME.auth file"),
    ):
        refused = check(tmp_path, *options)
        assert refused.returncode == 1 and line in refused.stderr, (options, refused.stderr)


def test_an_unreachable_tor_stops_the_broker_with_one_critical_line(tmp_path: Path) -> None:
    nobody = free_port()
    log_path = tmp_path / "broker.log"
    process = processes.spawn([*twistd(), "--data-dir", str(tmp_path / "data"), "--ssmp", "onion:8787",
                               "--tor-control", f"tcp:127.0.0.1:{nobody}", "--tor-timeout", "10"], log_path)
    process.wait(60)
    log = log_path.read_text()
    assert "--ssmp onion:8787: cannot listen: " in log and "#critical]" in log, log
    assert "Connection refused" in log

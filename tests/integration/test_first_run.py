"""What a new user meets first: one-line start-up errors, --version everywhere, and
subscribers that end quietly on Ctrl-C."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brokerd import __version__
from tests.support.broker import REPO, start_broker, twistd
from tests.support.certs import TestPKI
from tests.support.fixtures import pki  # noqa: F401
from tests.support.processes import default_sigint

pytestmark = pytest.mark.slow

ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _twistd(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([*twistd(), "--ssmp", "tcp:0:interface=127.0.0.1", "--data-dir", str(tmp_path / "d"),
                           *options], capture_output=True, text=True, timeout=60, env=ENV, cwd=tmp_path)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0
    output = (done.stdout + done.stderr).strip().splitlines()
    assert len(output) == 1, output
    return output[0]


def test_start_up_errors_are_one_line_naming_the_option(tmp_path: Path, pki: TestPKI) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text("colour = 'blue'\n")
    assert _one_line(_twistd(tmp_path, "--max-connections", "lots")) == "brokerd: max-connections: 'lots' is not a number"
    assert _one_line(_twistd(tmp_path, "--config", str(config))) == "brokerd: unknown setting 'colour'"
    missing = _one_line(_twistd(tmp_path, "--secret-file", str(tmp_path / "nope")))
    assert missing == f"brokerd: --secret-file {tmp_path / 'nope'}: No such file or directory"
    mismatched = _one_line(_twistd(tmp_path, "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.client.key)))
    assert mismatched.startswith("brokerd: --tls-key") or mismatched.startswith("brokerd: --tls-cert")
    assert _one_line(_twistd(tmp_path, "--log-level", "loud")).startswith("brokerd: --log-level loud: expected one of")
    # the same broker with good options starts (and its help text is still there on request)
    assert "--admin=" in subprocess.run([*twistd(), "--help"], capture_output=True, text=True, env=ENV,
                                        timeout=60).stdout


@pytest.mark.parametrize("module", ["brokerd.cli.ssmp", "brokerd.cli.mcchat", "brokerd.cli.smqp", "brokerd.cli.certs",
                                    "brokerd.cli.accounts", "brokerd.cli.ctl", "brokerd.pipeline.cli"])
def test_every_command_has_version(module: str) -> None:
    """Each console script's entry point (setup.cfg) answers --version."""
    launcher = f"import sys; from {module} import main; sys.argv[1:] = ['--version']; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith(f" {__version__}"), done


def test_twistd_brokerd_version(tmp_path: Path) -> None:
    done = subprocess.run([*twistd(), "--version"], capture_output=True, text=True, env=ENV, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == f"brokerd {__version__}\n"


def _first_line(process: subprocess.Popen, publish: list[str], deadline: float) -> bytes:
    """Publish until the subscriber prints its first line (its subscription may take a moment
    to be in place: nothing is retained for SSMP and MCCHAT), then return that line."""
    while time.monotonic() < deadline:
        subprocess.run(publish, capture_output=True, env=ENV, timeout=30, check=True)
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            return process.stdout.readline()
    raise AssertionError("the subscriber printed nothing")


def test_ctrl_c_ends_subscribers_quietly(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, "--open-login", "--smqp-guest-permissions", "psc", listeners={
        "ssmp": "tcp:{port}:interface=127.0.0.1", "mcchat": "tcp:{port}:interface=127.0.0.1",
        "smqp": "tcp:{port}:interface=127.0.0.1"})
    python = sys.executable
    ports = broker.ports
    try:
        created = subprocess.run([python, "-m", "brokerd.cli.smqp", "-p", str(ports["smqp"]), "create", "/news"],
                                 capture_output=True, env=ENV, timeout=30)
        assert created.returncode == 0, created
        cases = {
            "ssmp": ([python, "-m", "brokerd.cli.ssmp", "-p", str(ports["ssmp"]), "sub", "news"],
                     [python, "-m", "brokerd.cli.ssmp", "-p", str(ports["ssmp"]), "pub", "news", "hello"]),
            "mcchat": ([python, "-m", "brokerd.cli.mcchat", "-p", str(ports["mcchat"]), "sub", "news"],
                       [python, "-m", "brokerd.cli.mcchat", "-p", str(ports["mcchat"]), "pub", "news", "hello"]),
            "smqp": ([python, "-m", "brokerd.cli.smqp", "-p", str(ports["smqp"]), "sub", "/news"],
                     [python, "-m", "brokerd.cli.smqp", "-p", str(ports["smqp"]), "pub", "/news", "hello"]),
        }
        for name, (subscribe, publish) in cases.items():
            # faulthandler: a subscriber that does not end is made to print where it is stuck
            process = subprocess.Popen(subscribe, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=dict(ENV, PYTHONFAULTHANDLER="1"), preexec_fn=default_sigint)
            try:
                line = _first_line(process, publish, time.monotonic() + 30)
                assert b"hello" in line, (name, line)
                process.send_signal(signal.SIGINT)
                try:
                    _out, err = process.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    process.send_signal(signal.SIGABRT)
                    _out, err = process.communicate(timeout=30)
                    raise AssertionError(f"{name}: still running 30 s after Ctrl-C:\n{err.decode(errors='replace')}")
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            assert (name, process.returncode, err) == (name, 0, b"")
    finally:
        broker.stop()

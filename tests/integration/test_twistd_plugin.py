"""The real ``twistd brokerd`` in a subprocess: the command-line contract end to end."""
from __future__ import annotations

import subprocess

import pytest

from tests.support import processes
from tests.support.broker import REPO, LineClient, free_port, start_broker, twistd
from tests.support.secrets import write_private

pytestmark = pytest.mark.slow


def test_twistd_lists_the_plugin():
    command = twistd()[:3] + ["--help"]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "brokerd" in out


def test_ssmp_conversation_through_the_plugin(tmp_path):
    broker = start_broker(tmp_path, "--open-login", "--anonymous")
    try:
        port = broker.ports["ssmp"]
        alice, bob, anon = LineClient.connect(port), LineClient.connect(port), LineClient.connect(port)
        assert alice.request("LOGIN alice open") == b"200"
        assert bob.request("LOGIN bob open") == b"200"
        assert anon.request("LOGIN . open") == b"200"
        assert bob.request("SUBSCRIBE news PRESENCE") == b"200"
        assert alice.request("SUBSCRIBE news") == b"200"
        assert bob.line() == b"000 alice SUBSCRIBE news"
        assert anon.request("MCAST news from nobody") == b"200"
        assert alice.line() == b"000 . MCAST news from nobody"
        assert bob.line() == b"000 . MCAST news from nobody"
        alice.close()
        assert bob.line() == b"000 alice UNSUBSCRIBE news"
        assert bob.request("CLOSE") == b"200"
        assert bob.closed()
        assert broker.data_dir.is_dir()
    finally:
        # twistd stops cleanly on SIGTERM, then re-raises the signal to report it.
        assert broker.stop() in (0, -15)
    assert "Server Shut Down." in broker.log()
    assert "Traceback" not in broker.log()


def test_secret_file_login(tmp_path):
    secret = tmp_path / "secret"
    write_private(secret, "correct horse\n")
    broker = start_broker(tmp_path, "--secret-file", str(secret))
    try:
        port = broker.ports["ssmp"]
        ok = LineClient.connect(port)
        assert ok.request("LOGIN alice secret correct horse") == b"200"
        bad = LineClient.connect(port)
        assert bad.request("LOGIN alice secret wrong") == b"401 secret"
        assert bad.closed()
        no_open = LineClient.connect(port)
        assert no_open.request("LOGIN alice open") == b"401 secret"
    finally:
        broker.stop()


def test_config_file_with_command_line_override(tmp_path):
    port = free_port()
    config = tmp_path / "brokerd.toml"
    config.write_text(
        f'ssmp = ["tcp:{port}:interface=127.0.0.1"]\n'
        'open-login = true\n'
        'login-timeout = 60\n'
        'max-subscriptions = 1\n'
    )
    broker = start_broker(tmp_path, "--config", str(config), "--max-subscriptions", "2", listeners={}, wait_for=(port,)
    )
    try:
        c = LineClient.connect(port)
        assert c.request("LOGIN alice open") == b"200"
        assert c.request("SUBSCRIBE a") == b"200"
        assert c.request("SUBSCRIBE b") == b"200"
        assert c.request("SUBSCRIBE c") == b"413"
    finally:
        broker.stop()


def test_login_timeout_option(tmp_path):
    broker = start_broker(tmp_path, "--open-login", "--login-timeout", "0.5")
    try:
        silent = LineClient.connect(broker.ports["ssmp"], timeout=5)
        assert silent.closed()
        assert silent.buffer == b""
    finally:
        broker.stop()


def run_twistd(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*twistd(), "--data-dir", str(tmp_path / "d"), *args],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )


def test_port_in_use_is_one_clear_line_and_nonzero_exit(tmp_path):
    broker = start_broker(tmp_path, "--open-login")
    try:
        port = broker.ports["ssmp"]
        result = run_twistd(tmp_path, "--ssmp", f"tcp:{port}:interface=127.0.0.1")
        assert result.returncode == 1
        output = result.stdout + result.stderr
        errors = [line for line in output.splitlines() if "brokerd: " in line]
        assert len(errors) == 1, output
        assert f"brokerd: --ssmp tcp:{port}:interface=127.0.0.1: cannot listen: " in errors[0]
        assert "Address already in use" in errors[0]
        assert "Traceback" not in output
    finally:
        broker.stop()


def test_a_later_listener_that_cannot_bind_ends_the_process_at_once(tmp_path):
    """SSMP binds, then SMQP's port is taken: the SMQP front end has already opened its store,
    whose thread must not keep the process alive (holding the SSMP port, answering nothing)."""
    import socket as socketlib

    with socketlib.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        smqp = f"tcp:{port}:interface=127.0.0.1"
        ssmp_port = free_port()
        try:
            result = subprocess.run(
                [*twistd(), "--data-dir", str(tmp_path / "d"),
                 "--ssmp", f"tcp:{ssmp_port}:interface=127.0.0.1", "--smqp", smqp],
                capture_output=True, text=True, cwd=REPO, timeout=30,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"the broker did not exit: {exc.stdout!r}") from None
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    errors = [line for line in output.splitlines() if "brokerd: " in line]
    assert len(errors) == 1 and f"brokerd: --smqp {smqp}: cannot listen: " in errors[0], output
    assert "Traceback" not in output
    with socketlib.socket() as probe:  # the SSMP port was released with the process
        probe.bind(("127.0.0.1", ssmp_port))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ssmp", "nonsense:1"], "--ssmp nonsense:1: not a valid endpoint"),
        (["--ssmp", "tls:0"], "a tls: listener needs --tls-cert and --tls-key"),
        (["--secret-file", "/nonexistent/secret"], "--secret-file /nonexistent/secret"),
        (["--tls-cert", "/nonexistent/c.pem"], "--tls-cert and --tls-key go together"),
        (["--max-connections", "lots"], "max-connections: 'lots' is not a number"),
        (["--config", "/nonexistent.toml"], "--config /nonexistent.toml"),
    ],
)
def test_bad_options_are_one_clear_error(tmp_path, args, message):
    result = run_twistd(tmp_path, *args)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_unix_socket_listener(tmp_path):
    import socket as socketlib
    import time

    path = tmp_path / "ssmp.sock"
    args = [*twistd(), "--ssmp", f"unix:{path}", "--open-login", "--data-dir", str(tmp_path / "d")]
    log = tmp_path / "broker.log"
    process = processes.spawn(args, log)
    try:
        deadline = time.monotonic() + 30
        while not path.exists():  # polling: no event says the socket file is there
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        sock = socketlib.socket(socketlib.AF_UNIX)
        sock.connect(str(path))
        client = LineClient(sock)
        assert client.request("LOGIN alice open") == b"200"
        assert client.request("PING") == b"000 . PONG"
    finally:
        processes.stop(process)

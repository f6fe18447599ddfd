"""Start-up as an operator meets it: ``twistd brokerd`` in daemon mode (no ``-n``), the
``brokerd`` command, ``--check-config``, the data-directory lock, the default listeners and the
start-up log.  Real commands in subprocesses, real sockets.

Root ignores permission bits, so the tests of unreadable files and unwritable directories run
the broker without the capabilities that let root do so (``setpriv``), as any other user runs.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.broker import REPO, LineClient, free_port, repo_env

pytestmark = pytest.mark.slow

TWISTD = [sys.executable, "-c",
          "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"]
"""``twistd`` run by the interpreter running the tests (this checkout first on PYTHONPATH)."""
BROKERD = [sys.executable, "-m", "brokerd.cli.server"]
"""The ``brokerd`` console command (setup.cfg's entry point ``brokerd.cli.server:main``)."""
START_TIMEOUT = 60.0


def as_a_user() -> list[str]:
    """A command prefix under which permission bits apply: as root, drop the capabilities
    that bypass them (the process keeps uid 0 and so can still read this checkout)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be tested")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def daemon(tmp_path: Path, *options: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``twistd --pidfile d.pid -l d.log brokerd OPTIONS`` in ``tmp_path``, as a user types it;
    it returns once the daemon reported its start (or its failure)."""
    try:
        return subprocess.run([*prefix, *TWISTD, "--pidfile", "d.pid", "-l", "d.log", "brokerd", *options],
                              cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"twistd did not return: {exc.stdout!r} {exc.stderr!r}") from None


def assert_one_line_failure(result: subprocess.CompletedProcess, tmp_path: Path, expected: str) -> None:
    output = result.stdout + result.stderr
    if result.returncode == 0:
        stop_daemon(tmp_path)  # it started after all: no daemon outlives the test
    assert result.returncode != 0, output
    assert result.stdout == "" and result.stderr.count("\n") == 1, output
    assert result.stderr.startswith("brokerd: ") and expected in result.stderr, output
    assert not (tmp_path / "d.pid").exists(), output


def wait_until_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.05)  # polling a process that is not our child, bounded by the deadline


def stop_daemon(tmp_path: Path) -> None:
    """SIGTERM the daemon of ``tmp_path`` (if its pid file is there) and wait for it to go."""
    pid_file = tmp_path / "d.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until_gone(pid)
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
            raise


# Daemon mode: every start-up error is one line on the terminal, a non-zero exit, no pid file.


def test_daemon_with_a_busy_port_exits_with_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = daemon(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{port}:interface=127.0.0.1")
    assert_one_line_failure(result, tmp_path, f"--ssmp tcp:{port}:interface=127.0.0.1: cannot listen: "
                                              f"127.0.0.1:{port}: Address already in use")


def test_daemon_with_a_unix_socket_in_a_missing_directory_exits_with_one_line(tmp_path):
    result = daemon(tmp_path, "--data-dir", "data", "--ssmp", f"unix:{tmp_path}/missing/ssmp.sock")
    assert_one_line_failure(result, tmp_path, f"--ssmp unix:{tmp_path}/missing/ssmp.sock: cannot listen: "
                                              f"{tmp_path}/missing: no such directory")


@pytest.mark.parametrize("options, line", [
    (["--max-connections", "lots"], "brokerd: max-connections: 'lots' is not a number"),
    (["--smqp-max-notify-window", "2000"], "brokerd: smqp-max-notify-window: at most 1024, not '2000'"),
    (["--no-such-option"], "brokerd: option --no-such-option not recognized (--help lists the options)"),
    (["--ssmp"], "brokerd: option --ssmp requires argument (--help lists the options)"),
])
def test_daemon_with_a_bad_option_exits_with_one_line(tmp_path, options, line):
    result = daemon(tmp_path, "--data-dir", "data", *options)
    assert_one_line_failure(result, tmp_path, line)


def test_daemon_with_an_unreadable_accounts_file_exits_with_one_line(tmp_path):
    accounts = tmp_path / "accounts.txt"
    accounts.write_text("")
    accounts.chmod(0)
    result = daemon(tmp_path, "--data-dir", "data", "--smqp", f"tcp:{free_port()}:interface=127.0.0.1",
                    "--accounts", str(accounts), prefix=tuple(as_a_user()))
    assert_one_line_failure(result, tmp_path, f"{accounts}")
    assert "Permission denied" in result.stderr


@pytest.mark.parametrize("unwritable", ["data", "data/events"])
def test_daemon_with_an_unwritable_data_dir_exits_with_one_line(tmp_path, unwritable):
    (tmp_path / unwritable).mkdir(parents=True)
    (tmp_path / unwritable).chmod(0o555)
    result = daemon(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{free_port()}:interface=127.0.0.1",
                    prefix=tuple(as_a_user()))
    assert_one_line_failure(result, tmp_path, "--data-dir data: ")
    assert "not writable: Permission denied" in result.stderr


def test_daemon_with_an_unwritable_smqp_store_exits_with_one_line(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "smqp.sqlite3").write_bytes(b"")
    (tmp_path / "data" / "smqp.sqlite3").chmod(0o444)
    result = daemon(tmp_path, "--data-dir", "data", "--smqp", f"tcp:{free_port()}:interface=127.0.0.1",
                    prefix=tuple(as_a_user()))
    assert_one_line_failure(result, tmp_path, "data/smqp.sqlite3 (the SMQP store): cannot be read and written")


def test_daemon_starts_answers_logs_json_and_stops_on_sigterm(tmp_path):
    port = free_port()
    try:
        result = daemon(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{port}:interface=127.0.0.1",
                        "--open-login", "--log-format", "json")
        assert result.returncode == 0 and result.stdout == result.stderr == "", result
        pid = int((tmp_path / "d.pid").read_text())
        client = LineClient.connect(port)
        assert client.request("LOGIN alice open") == b"200"
        assert (tmp_path / "data" / "brokerd.lock").read_text().strip() == str(pid)
        # A second broker on the same data directory is refused, in daemon mode too.
        second = tmp_path / "second"
        second.mkdir()
        refused = daemon(second, "--data-dir", str(tmp_path / "data"), "--ssmp", f"tcp:{free_port()}")
        assert_one_line_failure(refused, second, f"--data-dir {tmp_path / 'data'} is in use by another broker "
                                                 f"(pid {pid}): give each broker its own --data-dir")
        client.close()
    finally:
        stop_daemon(tmp_path)
    assert not (tmp_path / "d.pid").exists()
    events = [json.loads(line) for line in (tmp_path / "d.log").read_text().splitlines()]
    messages = [event["message"] for event in events]
    assert f"SSMP listening on 127.0.0.1:{port} (--ssmp tcp:{port}:interface=127.0.0.1)" in messages, messages
    assert any(m.startswith("ssmp: login alice from 127.0.0.1:") for m in messages), messages
    assert messages[-1] == "Server Shut Down."
    assert all(event["level"] in ("debug", "info", "warn", "error", "critical") for event in events)


# The brokerd command: a foreground server.


def start_brokerd(cwd: Path, *options: str, wait_for: int | None = None) -> subprocess.Popen:
    log = cwd / f"brokerd-{processes.mark()}.log"
    process = processes.spawn([*BROKERD, *options], log, cwd=cwd, preexec_fn=processes.default_sigint)
    process.log_path = log  # type: ignore[attr-defined]
    if wait_for is not None:
        processes.wait_for_port(wait_for, process, log, time.monotonic() + START_TIMEOUT)
    return process


def test_brokerd_command_runs_in_the_foreground_without_a_pid_file_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    process = start_brokerd(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{port}:interface=127.0.0.1",
                            "--open-login", wait_for=port)
    client = LineClient.connect(port)
    assert client.request("LOGIN alice open") == b"200"
    names = sorted(p.name for p in tmp_path.iterdir() if p != process.log_path)  # type: ignore[attr-defined]
    assert names == ["data"]  # beside the test's own log of the command's output: no twistd.pid
    assert processes.stop(process, signal.SIGINT) in (0, -signal.SIGINT)
    log = process.log_path.read_text()  # type: ignore[attr-defined]
    assert f"SSMP listening on 127.0.0.1:{port}" in log and "Server Shut Down." in log, log
    assert "Traceback" not in log
    # Stopped means stopped: the port and the data directory are free again.
    again = start_brokerd(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{port}:interface=127.0.0.1",
                          wait_for=port)
    assert processes.stop(again) in (0, -signal.SIGTERM)


def test_brokerd_command_writes_a_pid_file_only_when_asked(tmp_path):
    port = free_port()
    process = start_brokerd(tmp_path, "--pidfile", "b.pid", "--data-dir", "data", "--open-login",
                            "--ssmp", f"tcp:{port}:interface=127.0.0.1", wait_for=port)
    assert (tmp_path / "b.pid").read_text() == str(process.pid)
    # An answer means the reactor runs, so its SIGTERM handler is in place (the port is bound
    # just before): the stop below is the clean one that removes the pid file.
    assert LineClient.connect(port).request("LOGIN alice open") == b"200"
    assert processes.stop(process) in (0, -signal.SIGTERM)
    assert not (tmp_path / "b.pid").exists()


def test_second_brokerd_on_one_data_dir_is_refused_and_the_lock_survives_no_kill(tmp_path):
    port = free_port()
    first = start_brokerd(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{port}:interface=127.0.0.1",
                          wait_for=port)
    second = subprocess.run([*BROKERD, "--data-dir", "data", "--ssmp", f"tcp:{free_port()}:interface=127.0.0.1"],
                            cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=START_TIMEOUT)
    assert second.returncode == 1, second
    assert second.stderr == (f"brokerd: --data-dir data is in use by another broker (pid {first.pid}): "
                             "give each broker its own --data-dir\n"), second
    # kill -9 leaves the lock file, not the lock: the next broker starts.
    assert processes.stop(first, signal.SIGKILL) == -signal.SIGKILL
    third = start_brokerd(tmp_path, "--data-dir", "data", "--ssmp", f"tcp:{port}:interface=127.0.0.1",
                          wait_for=port)
    assert processes.stop(third) in (0, -signal.SIGTERM)


# Checking a configuration without starting.


def check_config(cwd: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BROKERD, "--check-config", *options], cwd=cwd, env=repo_env(),
                          capture_output=True, text=True, timeout=START_TIMEOUT)


def test_check_config_prints_one_line_per_problem(tmp_path):
    config = tmp_path / "brokerd.toml"
    config.write_text(textwrap.dedent("""\
        ssmp = "nonsense:1"
        max-connections = "lots"
        mqtt-max-keep-alive = 70000
        mqtt-anonymous = "flase"
        colour = "blue"
        accounts = "/nonexistent/accounts.txt"
        """))
    result = check_config(tmp_path, "--config", str(config), "--log-level", "loud")
    assert result.returncode == 1
    assert result.stdout == ""
    assert sorted(result.stderr.splitlines()) == sorted([
        "brokerd: max-connections: 'lots' is not a number",
        "brokerd: mqtt-max-keep-alive: at most 65535, not 70000",
        "brokerd: mqtt-anonymous: 'flase' is not a boolean (true or false)",
        "brokerd: unknown setting 'colour'",
        "brokerd: --log-level loud: expected one of debug, info, warn, error, critical",
        "brokerd: --accounts /nonexistent/accounts.txt: No such file or directory",
        "brokerd: --ssmp nonsense:1: not a valid endpoint (Unknown endpoint type: 'nonsense')",
    ]), result.stderr


def test_check_config_accepts_a_good_config_without_starting(tmp_path):
    """The example config checks out, while its ports are taken (a broker running on it may
    be restarted with a config checked beforehand) and without making its data directory."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = check_config(tmp_path, "--config", str(REPO / "docs" / "examples" / "try-it.toml"),
                              "--ssmp", f"tcp:{port}:interface=127.0.0.1", "--data-dir", "data")
    assert (result.returncode, result.stdout, result.stderr) == (0, "brokerd: configuration OK\n", "")
    assert not (tmp_path / "data").exists()
    unwritable = tmp_path / "ro"
    unwritable.mkdir(mode=0o555)
    result = subprocess.run([*as_a_user(), *BROKERD, "--check-config", "--data-dir", "ro"], cwd=tmp_path,
                            env=repo_env(), capture_output=True, text=True, timeout=START_TIMEOUT)
    assert result.returncode == 1 and result.stderr == "brokerd: --data-dir ro: not writable: Permission denied\n"


# The default listeners bind loopback, and the log says so.

_NETNS_SCRIPT = """
import json, socket, subprocess, sys, time
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
log = open(sys.argv[1], "wb")
broker = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
deadline = time.monotonic() + 60
for port in (8787, 1502, 7720, 8080, 1883):
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert broker.poll() is None and time.monotonic() < deadline, open(sys.argv[1]).read()
            time.sleep(0.05)
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            address, port = local.split(":")
            listening.append([address, int(port, 16)])
broker.terminate()
print(json.dumps({"listening": listening, "status": broker.wait(30)}))
"""


def test_default_listeners_bind_loopback_only_and_say_how_to_listen_beyond(tmp_path):
    """With no listener option, in a network namespace of its own (so the default ports are
    free): every listening socket is on 127.0.0.1, and the log says so, one line each."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip for a network namespace of its own")
    script = tmp_path / "netns.py"
    script.write_text(_NETNS_SCRIPT)
    log = tmp_path / "broker.log"
    result = subprocess.run(["unshare", "-n", "--", sys.executable, str(script), str(log), *BROKERD,
                             "--data-dir", str(tmp_path / "data")],
                            cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + log.read_text()
    report = json.loads(result.stdout)
    loopback = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
    assert sorted(report["listening"]) == sorted([loopback, port] for port in (8787, 1502, 7720, 8080, 1883)), report
    text = log.read_text()
    for role, option, port in (("SSMP", "ssmp", 8787), ("MCCHAT", "mcchat", 1502), ("SMQP", "smqp", 7720),
                               ("socket.mq", "socketmq", 8080), ("MQTT", "mqtt", 1883)):
        line = f"{role} listening on 127.0.0.1:{port} (--{option} tcp:{port}:interface=127.0.0.1)"
        assert text.count(line) == 1, text
    assert ("No listener option: every listener binds 127.0.0.1 only (this host); to listen beyond it, give "
            "listener options naming an interface, e.g. --ssmp tcp:8787:interface=0.0.0.0") in text

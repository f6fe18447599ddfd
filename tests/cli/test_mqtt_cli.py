"""``brokerd-mqtt`` as users run it: real subprocesses against Debian's mosquitto (brokerd's
own MQTT server does not exist yet).  Every wait (mosquitto's port, a subscriber being ready,
a command finishing) is bounded."""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import processes
from tests.support.broker import free_port
from tests.support.imports import run_and_list_heavy
from tests.support.mosquitto import Mosquitto, mosquitto, password_file, start_mosquitto  # noqa: F401

pytestmark = pytest.mark.slow  # a mosquitto and a subprocess per command

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
COMMAND_TIMEOUT = 30.0
VERSIONS = pytest.mark.parametrize("version", ["3.1.1", "5"])


def command(*arguments: str | bytes) -> list[str | bytes]:
    return [sys.executable, "-m", "brokerd.cli.mqtt", *arguments]


def mqtt(*arguments: str | bytes) -> subprocess.CompletedProcess:
    """Run ``python -m brokerd.cli.mqtt`` to its end (bounded), its standard input empty."""
    return subprocess.run(
        command(*arguments), cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL, capture_output=True,
        timeout=COMMAND_TIMEOUT, check=False,
    )  # fmt: skip


class Subscriber:
    """A ``brokerd-mqtt sub`` running in the background.  It runs with ``-d`` so that its log
    says when the subscription is in place: publishing starts only then."""

    def __init__(self, *arguments: str, stdin: int = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(
            command("-d", *arguments), cwd=ROOT, env=ENV, stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Ctrl-C as from a terminal, even when the test run itself ignores SIGINT; the
            # function only resets one signal disposition, safe between fork and exec.
            preexec_fn=processes.default_sigint,  # noqa: PLW1509
        )  # fmt: skip
        self._log: queue.Queue[bytes] = queue.Queue()
        self._out: queue.Queue[bytes] = queue.Queue()
        self.log: list[bytes] = []
        self.out: list[bytes] = []
        threading.Thread(target=self._read, args=(self.process.stderr, self._log), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stdout, self._out), daemon=True).start()

    @staticmethod
    def _read(stream: Any, lines: queue.Queue[bytes]) -> None:
        """Every line of ``stream``, then b"" at its end."""
        for line in stream:
            lines.put(line)
        lines.put(b"")

    def output_line(self) -> bytes:
        """The next line it prints (bounded)."""
        try:
            line = self._out.get(timeout=COMMAND_TIMEOUT)
        except queue.Empty:
            pytest.fail(f"the subscriber printed nothing: {b''.join(self.log)!r}")
        self.out.append(line)
        return line

    def wait_until_subscribed(self) -> None:
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            try:
                line = self._log.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"the subscriber never subscribed: {b''.join(self.log)!r}")
            self.log.append(line)
            if b"Subscribed to" in line:
                return
            if not line:
                pytest.fail(f"the subscriber ended: {b''.join(self.log)!r}")

    def finish(self) -> tuple[int, bytes, bytes]:
        """Its exit status, standard output and the rest of its log, once it exits (bounded)."""
        try:
            self.process.wait(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            pytest.fail("the subscriber did not exit")
        for lines, seen in ((self._out, self.out), (self._log, self.log)):
            while (line := lines.get(timeout=COMMAND_TIMEOUT)) != b"":
                seen.append(line)
        return self.process.returncode, b"".join(self.out), b"".join(self.log)


@pytest.fixture
def subscribe() -> Iterator[Callable[..., Subscriber]]:
    """Starts ``sub`` processes; any still running when the test ends (it failed) is killed."""
    started: list[Subscriber] = []

    def start(*arguments: str, stdin: int = subprocess.DEVNULL) -> Subscriber:
        started.append(Subscriber(*arguments, stdin=stdin))
        return started[-1]

    yield start
    for subscriber in started:
        if subscriber.process.poll() is None:
            subscriber.process.kill()
            subscriber.process.wait(timeout=10)


@VERSIONS
def test_sub_count_2_prints_a_qos0_and_a_qos1_message(
    mosquitto: Mosquitto, subscribe: Callable[..., Subscriber], version: str  # noqa: F811
) -> None:
    server = ["--server", mosquitto.endpoint, "--mqtt-version", version]
    subscriber = subscribe(*server, "sub", "cli/#", "other", "--qos", "1", "--count", "2")
    subscriber.wait_until_subscribed()

    first = mqtt(*server, "pub", "cli/zero", "hello world", "--qos", "0")
    assert (first.returncode, first.stdout, first.stderr) == (0, b"", b"")
    # Not UTF-8 at the end: printed with the replacement character.
    second = mqtt(*server, "pub", "cli/one", b"caf\xc3\xa9 \xff", "--qos", "1")
    assert (second.returncode, second.stdout, second.stderr) == (0, b"", b"")

    status, out, log = subscriber.finish()
    assert status == 0, log
    assert out.decode("utf-8") == "cli/zero hello world\ncli/one caf\u00e9 \ufffd\n"


def test_pub_qos2_retained_reaches_a_later_subscriber(
    mosquitto: Mosquitto, subscribe: Callable[..., Subscriber]  # noqa: F811
) -> None:
    server = ["--server", mosquitto.endpoint]
    published = mqtt(*server, "pub", "kept", "last", "--qos", "2", "--retain")
    assert (published.returncode, published.stderr) == (0, b"")
    subscriber = subscribe(*server, "sub", "kept", "--count", "1")
    status, out, log = subscriber.finish()
    assert (status, out) == (0, b"kept last\n"), log


def test_sub_ends_at_the_end_of_its_input(
    mosquitto: Mosquitto, subscribe: Callable[..., Subscriber]  # noqa: F811
) -> None:
    server = ["--server", mosquitto.endpoint]
    subscriber = subscribe(*server, "sub", "eof", stdin=subprocess.PIPE)
    subscriber.wait_until_subscribed()
    assert mqtt(*server, "pub", "eof", "before the end", "--qos", "1").returncode == 0
    # The message may still be on its way: close the input only once it is printed.
    assert subscriber.output_line() == b"eof before the end\n"
    subscriber.process.stdin.close()  # type: ignore[union-attr]
    status, out, log = subscriber.finish()
    assert (status, out) == (0, b"eof before the end\n"), log


def test_sub_interrupted_exits_quietly(
    mosquitto: Mosquitto, subscribe: Callable[..., Subscriber]  # noqa: F811
) -> None:
    subscriber = subscribe("--server", mosquitto.endpoint, "sub", "quiet")
    subscriber.wait_until_subscribed()
    subscriber.process.send_signal(signal.SIGINT)
    status, out, log = subscriber.finish()
    assert (status, out) == (0, b""), log
    assert b"Traceback" not in log and b"brokerd-mqtt:" not in log


@pytest.mark.parametrize("subcommand", [["pub", "t", "x", "--qos", "1"], ["sub", "t"]], ids=["pub", "sub"])
def test_an_unreachable_server_is_one_line_and_status_1(subcommand: list[str]) -> None:
    nobody = free_port()  # free, so nothing listens there
    result = mqtt("--server", f"tcp:127.0.0.1:{nobody}", *subcommand)
    assert result.returncode == 1
    assert result.stdout == b""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"brokerd-mqtt: cannot connect to tcp:127.0.0.1:{nobody}: ")
    assert "refused" in lines[0]


@VERSIONS
def test_a_refused_login_is_one_line_and_status_1(tmp_path: Path, version: str) -> None:
    users = password_file(tmp_path / "passwords", {"alice": "secret"})
    server = start_mosquitto(tmp_path / "closed", f"password_file {users}", anonymous=False)
    try:
        (tmp_path / "right").write_text("secret\n")
        (tmp_path / "wrong").write_text("guess\n")
        where = ["--server", server.endpoint, "--mqtt-version", version, "--username", "alice"]
        refused = mqtt(*where, "--password-file", str(tmp_path / "wrong"), "pub", "t", "x")
        assert refused.returncode == 1
        [line] = refused.stderr.decode().splitlines()
        reason = "return code 5 (not authorized)" if version == "3.1.1" else "0x87 Not authorized"
        assert line == f"brokerd-mqtt: {server.endpoint}: the server refused the connection: {reason}"
        accepted = mqtt(*where, "--password-file", str(tmp_path / "right"), "pub", "t", "x")
        assert (accepted.returncode, accepted.stderr) == (0, b"")
    finally:
        server.stop()


def test_usage_errors_are_status_2() -> None:
    result = mqtt("pub", "a/+", "x")
    assert result.returncode == 2
    assert b"topic name contains a wildcard" in result.stderr


@VERSIONS
def test_pub_at_qos_0_over_plain_tcp_imports_no_twisted(
    mosquitto: Mosquitto, subscribe: Callable[..., Subscriber], version: str  # noqa: F811
) -> None:
    """One QoS 0 publish needs a socket and the codec (brokerd.cli.oneshot), not Twisted's
    reactor and TLS, whose import took longer than the publish; the message arrives."""
    server = ["--server", mosquitto.endpoint, "--mqtt-version", version]
    subscriber = subscribe(*server, "sub", "quick", "--count", "1")
    subscriber.wait_until_subscribed()
    done = run_and_list_heavy("brokerd.cli.mqtt", [*server, "pub", "quick", "fast"], ROOT, ENV, COMMAND_TIMEOUT)
    assert (done.stdout, done.stderr) == (b"0 \n", b"")  # exit 0, none of them imported
    status, out, log = subscriber.finish()
    assert (status, out) == (0, b"quick fast\n"), log

"""``brokerd-ssmp`` as users run it: real subprocesses against a real ``twistd brokerd``.

Each broker is started once per module and stopped at the end; every wait (the port opening,
a subscriber being ready, a command finishing) is bounded.
"""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.broker import free_port, twistd
from tests.support.certs import CLIENT_NAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401
from tests.support.imports import run_and_list_heavy
from tests.support.secrets import write_private

pytestmark = pytest.mark.slow  # real twistd brokers and a subprocess per command

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
STARTUP_TIMEOUT = 20.0
COMMAND_TIMEOUT = 30.0
SECRET = "correct horse battery staple"


@dataclass
class Running:
    """A broker started with twistd: its SSMP port and its log file."""

    port: int
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        processes.stop(self.process)


def start_broker(directory: Path, *options: str, listener: str = "tcp") -> Running:
    """``twistd -n brokerd`` on a free loopback port; waits (bounded) until it accepts."""
    port = free_port()
    log = directory / "twistd.log"
    command = [
        *twistd(),
        "--ssmp", f"{listener}:{port}:interface=127.0.0.1",
        "--data-dir", str(directory / "data"),
        *options,
    ]  # fmt: skip
    process = processes.spawn(command, log, env=ENV)
    processes.wait_for_port(port, process, log, time.monotonic() + STARTUP_TIMEOUT)
    return Running(port, process, log)


@pytest.fixture(scope="module")
def open_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    broker = start_broker(tmp_path_factory.mktemp("open"), "--open-login")
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def secret_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A broker without open login: only the shared secret."""
    directory = tmp_path_factory.mktemp("secret")
    write_private(directory / "secret", SECRET + "\n")
    broker = start_broker(directory, "--secret-file", str(directory / "secret"))
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def tls_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: TestPKI  # noqa: F811
) -> Iterator[Running]:
    """A TLS listener that asks for client certificates ('cert' login only)."""
    broker = start_broker(
        tmp_path_factory.mktemp("tls"),
        "--tls-cert", str(pki.server.cert),
        "--tls-key", str(pki.server.key),
        "--tls-ca", str(pki.ca),
        listener="tls",
    )  # fmt: skip
    yield broker
    broker.stop()


def ssmp(*arguments: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """Run ``python -m brokerd.cli.ssmp`` to its end (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "brokerd.cli.ssmp", *arguments],
        cwd=ROOT,
        env=ENV,
        input=stdin,
        capture_output=True,
        timeout=COMMAND_TIMEOUT,
    )


class Subscriber:
    """A ``brokerd-ssmp sub`` running in the background.  It runs with ``-d`` so that its log
    says when the subscriptions are in place: publishing starts only then."""

    def __init__(self, *arguments: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "brokerd.cli.ssmp", "-d", "sub", *arguments],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._log: queue.Queue[bytes] = queue.Queue()
        self._seen: list[bytes] = []
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        for line in self.process.stderr:  # type: ignore[union-attr]
            self._log.put(line)
        self._log.put(b"")

    def wait_until_subscribed(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                line = self._log.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.process.kill()
                pytest.fail(f"the subscriber never subscribed: {b''.join(self._seen)!r}")
            self._seen.append(line)
            if b"Subscribed to" in line:
                return
            if not line:
                pytest.fail(f"the subscriber ended: {b''.join(self._seen)!r}")

    def finish(self) -> tuple[int, bytes]:
        """Its exit status and standard output, once it exits by itself (bounded)."""
        try:
            out, _ = self.process.communicate(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate(timeout=10)
            pytest.fail("the subscriber did not exit after its count of messages")
        return self.process.returncode, out


Subscribe = Callable[..., Subscriber]


@pytest.fixture
def subscribe() -> Iterator[Subscribe]:
    """Starts ``sub`` processes; any still running when the test ends (it failed) is killed."""
    started: list[Subscriber] = []

    def start(*arguments: str) -> Subscriber:
        started.append(Subscriber(*arguments))
        return started[-1]

    yield start
    for subscriber in started:
        if subscriber.process.poll() is None:
            subscriber.process.kill()
            subscriber.process.communicate(timeout=10)


def _connect(broker: Running) -> list[str]:
    return ["--port", str(broker.port)]


# ---------------------------------------------------------------------------- plain


def test_sub_prints_count_messages_then_exits(open_broker: Running, subscribe: Subscribe) -> None:
    subscriber = subscribe("news", "sport", "-C", "3", *_connect(open_broker))
    subscriber.wait_until_subscribed()

    published = ssmp(*_connect(open_broker), "pub", "news", "hello world")
    assert (published.returncode, published.stdout, published.stderr) == (0, b"", b"")
    from_stdin = ssmp(
        "pub", "sport", "-s", "--connect", f"tcp:127.0.0.1:{open_broker.port}",
        stdin=b"goal\n\nfull time\n",
    )  # fmt: skip
    assert from_stdin.returncode == 0, from_stdin.stderr

    status, out = subscriber.finish()
    assert status == 0
    assert out == b"news hello world\nsport goal\nsport full time\n"


def test_sub_verbose_shows_the_sender_and_hex_for_binary(
    open_broker: Running, tmp_path: Path, subscribe: Subscribe
) -> None:
    subscriber = subscribe("bin", "-C", "2", "-v", "--binary-hex", *_connect(open_broker))
    subscriber.wait_until_subscribed()
    (tmp_path / "blob").write_bytes(b"\x00\x01\xfe\xff")
    blob = ssmp(*_connect(open_broker), "-i", "sensor-1", "pub", "bin", "-f", str(tmp_path / "blob"))
    text = ssmp(*_connect(open_broker), "-i", "sensor-2", "pub", "bin", "--binary", "text")
    assert (blob.returncode, text.returncode) == (0, 0)
    status, out = subscriber.finish()
    assert status == 0
    assert out == b"sensor-1 bin 0001feff\nsensor-2 bin 74657874\n"


def test_sub_format_and_ucast(open_broker: Running, subscribe: Subscribe) -> None:
    subscriber = subscribe(
        "inbox", "-i", "carol", "-C", "1", "--format", "{verb} from {sender}: {payload}",
        *_connect(open_broker),
    )  # fmt: skip
    subscriber.wait_until_subscribed()
    sent = ssmp(*_connect(open_broker), "-i", "dave", "ucast", "carol", "hi carol")
    assert sent.returncode == 0, sent.stderr
    assert subscriber.finish() == (0, b"UCAST from dave: hi carol\n")


def test_ucast_to_nobody_is_refused_with_exit_1(open_broker: Running) -> None:
    result = ssmp(*_connect(open_broker), "ucast", "nobody-here", "hello?")
    assert result.returncode == 1
    assert result.stderr == b"brokerd-ssmp: UCAST to nobody-here refused: 404 not found\n"


def test_bcast_is_accepted(open_broker: Running) -> None:
    result = ssmp(*_connect(open_broker), "bcast", "anyone sharing a topic")
    assert (result.returncode, result.stderr) == (0, b"")


# ---------------------------------------------------------------------------- errors


def test_pub_without_open_login_exits_1_with_a_clear_message(secret_broker: Running) -> None:
    result = ssmp(*_connect(secret_broker), "-i", "eve", "pub", "news", "hello")
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f"brokerd-ssmp: tcp:127.0.0.1:{secret_broker.port}: login as eve with scheme open refused: "
        "401 unauthorized (the broker accepts: secret)\n".encode()
    )


def test_wrong_secret_exits_1(secret_broker: Running, tmp_path: Path) -> None:
    (tmp_path / "wrong").write_text("guess\n")
    wrong = str(tmp_path / "wrong")
    result = ssmp(*_connect(secret_broker), "-i", "eve", "--secret-file", wrong, "pub", "news", "x")
    assert result.returncode == 1
    assert b"refused: 401 unauthorized (the broker accepts: secret)" in result.stderr


def test_right_secret_publishes(secret_broker: Running, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")
    secret = str(tmp_path / "secret")
    result = ssmp("--secret-file", secret, *_connect(secret_broker), "pub", "news", "x")
    assert (result.returncode, result.stderr) == (0, b"")


def test_no_broker_is_a_connection_error() -> None:
    result = ssmp("--port", str(free_port()), "pub", "news", "hello")
    assert result.returncode == 2
    assert result.stderr.startswith(b"brokerd-ssmp: cannot connect to tcp:127.0.0.1:")
    assert result.stderr.count(b"\n") == 1


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["pub", "news"], b"give exactly one of MESSAGE, -f FILE or -s"),
        (["pub", "bad topic", "x"], b"topic 'bad topic'"),
        (["--connect", "tcp:h:1", "--port", "2", "pub", "t", "x"], b"either --connect or --host"),
        (["--scheme", "secret", "pub", "t", "x"], b"--scheme secret needs --secret-file"),
        (["sub", "t", "--format", "{nope}"], b"--format"),
    ],
)
def test_usage_errors_exit_2(arguments: list[str], message: bytes) -> None:
    result = ssmp(*arguments)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_message_ssmp_cannot_carry_is_refused_before_connecting() -> None:
    result = ssmp("--port", "1", "pub", "news", "x" * 1025)
    assert result.returncode == 2
    assert result.stderr == (
        b"brokerd-ssmp: message 1: an SSMP payload carries 1 to 1024 bytes, not 1025\n"
    )


# ---------------------------------------------------------------------------- TLS


def _tls(broker: Running, pki: TestPKI) -> list[str]:  # noqa: F811
    return [
        "--port", str(broker.port), "--tls-hostname", "localhost", "--ca", str(pki.ca),
        "--cert", str(pki.client.cert), "--key", str(pki.client.key),
    ]  # fmt: skip


def test_tls_client_certificate_login(
    tls_broker: Running, pki: TestPKI, subscribe: Subscribe  # noqa: F811
) -> None:
    subscriber = subscribe(
        "-i", f"{CLIENT_NAME}/sub", "-C", "1", "-v", "secure", *_tls(tls_broker, pki)
    )
    subscriber.wait_until_subscribed()
    result = ssmp(*_tls(tls_broker, pki), "-i", CLIENT_NAME, "pub", "secure", "over TLS")
    assert (result.returncode, result.stderr) == (0, b"")
    assert subscriber.finish() == (0, b"alice secure over TLS\n")


def test_tls_identifier_outside_the_certificate_is_refused(
    tls_broker: Running, pki: TestPKI  # noqa: F811
) -> None:
    result = ssmp(*_tls(tls_broker, pki), "-i", "mallory", "pub", "secure", "x")
    assert result.returncode == 1
    assert b"login as mallory with scheme cert refused: 401" in result.stderr


# ---------------------------------------------------------------------------- start-up



def test_pub_over_plain_tcp_imports_no_twisted(open_broker: Running, subscribe: Subscribe) -> None:
    """What one publish needs is a socket and the codec (brokerd.cli.oneshot): importing
    Twisted's reactor, TLS and the like took longer than the publish.  The message arrives
    (positive control), and 'sub' (Twisted's client) still has them all."""
    subscriber = subscribe("quick", "-C", "1", *_connect(open_broker))
    subscriber.wait_until_subscribed()
    done = run_and_list_heavy("brokerd.cli.ssmp", [*_connect(open_broker), "pub", "quick", "fast"], ROOT, ENV,
                              COMMAND_TIMEOUT)
    assert (done.stdout, done.stderr) == (b"0 \n", b"")  # exit 0, none of them imported
    assert subscriber.finish() == (0, b"quick fast\n")
    refused = run_and_list_heavy("brokerd.cli.ssmp", [*_connect(open_broker), "ucast", "nobody", "x"], ROOT, ENV,
                                 COMMAND_TIMEOUT)
    assert refused.stdout == b"1 \n" and refused.stderr == b"brokerd-ssmp: UCAST to nobody refused: 404 not found\n"

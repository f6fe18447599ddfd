"""The protocol clients say why their connection ended and exit non-zero, against a real
broker: a subscriber closed by ``brokerd-ctl close`` (or by a newer login of its identity), a
broker that cannot be reached (the line names the address tried), and ``--retry``, which
connects again with one line per attempt.  ``brokerd-ctl status --json`` whose reader left
early ends quietly.

Each subscriber first prints a message published to it (the positive control: it was
connected and subscribed), then the operator closes it.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import REPO, RunningBroker, free_port, start_broker
from tests.support.processes import repo_env

pytestmark = pytest.mark.slow

TIMEOUT = 30.0
LISTENERS = {protocol: "tcp:{port}:interface=127.0.0.1" for protocol in ("ssmp", "mcchat", "smqp", "mqtt", "admin")}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("closes"), "--open-login", "--smqp-guest-permissions", "psc",
                           listeners=LISTENERS)
    try:
        yield running
    finally:
        running.stop()


def command(module: str, *arguments: str) -> list[str]:
    return [sys.executable, "-m", f"brokerd.cli.{module}", *arguments]


def run(module: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(module, *arguments), capture_output=True, text=True, timeout=TIMEOUT,
                          env=repo_env(), cwd=REPO, stdin=subprocess.DEVNULL)


def ctl(broker: RunningBroker, *arguments: str) -> subprocess.CompletedProcess:
    return run("ctl", "--admin", f"http://127.0.0.1:{broker.ports['admin']}", *arguments)


class Client:
    """A client command running in the background, its output read line by line."""

    def __init__(self, module: str, *arguments: str) -> None:
        self.process = subprocess.Popen(command(module, *arguments), env=repo_env(), cwd=REPO, text=True,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: dict[str, queue.Queue[str]] = {"out": queue.Queue(), "err": queue.Queue()}
        for name, stream in (("out", self.process.stdout), ("err", self.process.stderr)):
            threading.Thread(target=self._read, args=(stream, self.lines[name]), daemon=True).start()

    @staticmethod
    def _read(stream: object, lines: queue.Queue[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)
        lines.put("")

    def line(self, stream: str = "out") -> str:
        try:
            return self.lines[stream].get(timeout=TIMEOUT)
        except queue.Empty:
            self.process.kill()
            pytest.fail(f"no line on std{stream} within {TIMEOUT} s")

    def exit_status(self) -> int:
        try:
            return self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail("the client did not exit")

    def errors(self) -> list[str]:
        """Its stderr lines, once it has exited."""
        self.exit_status()
        lines = []
        while (line := self.line("err")) != "":
            lines.append(line)
        return lines

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT)


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    started: list[Client] = []
    yield started
    for client in started:
        client.kill()


def session_of(broker: RunningBroker, protocol: str, subscribed_to: str) -> str:
    """The id of the ``protocol`` session subscribed to ``subscribed_to`` (waits for it)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        listing = ctl(broker, "sessions").stdout
        for row in listing.splitlines():
            fields = row.split("\t")
            if fields[1] == protocol and subscribed_to in fields[4].split(","):
                return fields[0]
        assert time.monotonic() < deadline, listing
        time.sleep(0.1)


def smqp_session(broker: RunningBroker, channel: str) -> str:
    deadline = time.monotonic() + TIMEOUT
    while True:
        listing = ctl(broker, "sessions").stdout
        for row in listing.splitlines():
            if row.split("\t")[2] == f"guest:{channel}":
                return row.split("\t")[0]
        assert time.monotonic() < deadline, listing
        time.sleep(0.1)


def publish_until_printed(broker: RunningBroker, client: Client, publish: list[str], text: str) -> None:
    """Publish until the subscriber prints ``text`` (its subscription may not be in place for
    the first publish)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        done = run(*publish)
        assert done.returncode == 0, done.stderr
        try:
            line = client.lines["out"].get(timeout=0.5)
        except queue.Empty:
            assert time.monotonic() < deadline, "the subscriber printed nothing"
            continue
        assert text in line, line
        return


SUBSCRIBERS = {
    # protocol: (subscriber arguments, publish arguments, the reason its line gives)
    "ssmp": (["sub", "news"], ["ssmp", "pub", "news", "before"], "closed by the operator, or brokerd-ssmp-"),
    "mcchat": (["sub", "news"], ["ssmp", "pub", "news", "before"], "(no reason given)"),
    "mqtt": (["-V", "5", "sub", "news"], ["ssmp", "pub", "news", "before"],
             "(the server disconnected: 0x98 Administrative action: closed by the operator)"),
}


@pytest.mark.parametrize("protocol", sorted(SUBSCRIBERS))
def test_a_subscriber_closed_by_the_operator_says_so_and_exits(broker: RunningBroker, clients: list[Client],
                                                                protocol: str) -> None:
    arguments, publish, reason = SUBSCRIBERS[protocol]
    port = broker.ports[protocol]
    publish = [publish[0], "-p", str(broker.ports[publish[0]]), *publish[1:]]
    subscriber = Client(protocol, "-p", str(port), *arguments)
    clients.append(subscriber)
    session_of(broker, protocol, "news")
    publish_until_printed(broker, subscriber, publish, "before")
    closed = ctl(broker, "close", session_of(broker, protocol, "news"))
    assert closed.returncode == 0, closed.stderr
    assert subscriber.exit_status() != 0
    errors = subscriber.errors()
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"brokerd-{protocol}: tcp:127.0.0.1:{port}: the broker closed the connection ("), errors
    assert reason in errors[0], errors


def test_an_smqp_subscriber_gives_the_brokers_421(broker: RunningBroker, clients: list[Client]) -> None:
    port = str(broker.ports["smqp"])
    assert run("smqp", "-p", port, "create", "/closes").returncode == 0
    subscriber = Client("smqp", "-p", port, "-c", "closing", "sub", "/closes")
    clients.append(subscriber)
    session = smqp_session(broker, "closing")
    publish_until_printed(broker, subscriber, ["smqp", "-p", port, "pub", "/closes", "before"], "before")
    assert ctl(broker, "close", session).returncode == 0
    assert subscriber.exit_status() == 2
    assert subscriber.errors() == [f"brokerd-smqp: tcp:127.0.0.1:{port}: the broker closed the connection "
                                   "(421 Closed by the operator)\n"]


def test_a_newer_login_of_the_same_identity_ends_the_ssmp_subscriber(broker: RunningBroker,
                                                                     clients: list[Client]) -> None:
    port = str(broker.ports["ssmp"])
    subscriber = Client("ssmp", "-p", port, "-i", "twin", "sub", "twins")
    clients.append(subscriber)
    session_of(broker, "ssmp", "twins")
    publish_until_printed(broker, subscriber, ["ssmp", "-p", port, "pub", "twins", "before"], "before")
    assert run("ssmp", "-p", port, "-i", "twin", "pub", "elsewhere", "x").returncode == 0  # the same identity
    assert subscriber.exit_status() == 2
    errors = subscriber.errors()
    assert len(errors) == 1 and "closed by the operator, or twin logged in elsewhere" in errors[0], errors


def test_retry_connects_again_with_a_line_per_attempt(broker: RunningBroker, clients: list[Client]) -> None:
    """Closed and kept out for longer than one retry's wait: a line for the close, one for the
    refused login, then the subscription is back and prints again."""
    port = str(broker.ports["ssmp"])
    subscriber = Client("ssmp", "-p", port, "-i", "stubborn", "sub", "again", "--retry")
    clients.append(subscriber)
    publish = ["ssmp", "-p", port, "pub", "again", "message"]
    publish_until_printed(broker, subscriber, publish, "message")
    kept = ctl(broker, "close", session_of(broker, "ssmp", "again"), "--for", "4")
    assert kept.returncode == 0, kept.stderr
    where = f"brokerd-ssmp: tcp:127.0.0.1:{port}:"
    closed = subscriber.line("err")
    assert closed.startswith(f"{where} the broker closed the connection (") and closed.endswith(
        "; connecting again in 3 s\n"), closed
    refused = subscriber.line("err")
    assert refused.startswith(f"{where} login as stubborn with scheme open refused: 401"), refused
    session_of(broker, "ssmp", "again")  # back, and subscribed again
    publish_until_printed(broker, subscriber, publish, "message")
    assert subscriber.process.poll() is None


@pytest.mark.parametrize("client", [["ssmp", "pub", "news", "x"], ["mcchat", "pub", "news", "x"],
                                    ["mqtt", "pub", "news", "x"], ["smqp", "list"]])
def test_a_broker_that_cannot_be_reached_is_named(client: list[str]) -> None:
    port = free_port()
    done = run(client[0], "-p", str(port), *client[1:])
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"brokerd-{client[0]}: cannot connect to tcp:127.0.0.1:{port}: "), lines
    assert "refused" in lines[0].lower(), lines


def test_ctl_whose_reader_left_ends_quietly(broker: RunningBroker) -> None:
    arguments = command("ctl", "--admin", f"http://127.0.0.1:{broker.ports['admin']}", "status", "--json")
    whole = subprocess.run(arguments, capture_output=True, text=True, timeout=TIMEOUT, env=repo_env(), cwd=REPO)
    assert whole.returncode == 0 and whole.stdout.startswith("{"), whole  # positive control
    reading, writing = os.pipe()
    os.close(reading)  # the reader is gone before the first write: every write fails with EPIPE
    try:
        done = subprocess.run(arguments, stdout=writing, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT,
                              env=repo_env(), cwd=REPO)
    finally:
        os.close(writing)
    assert (done.returncode, done.stderr) == (0, "")

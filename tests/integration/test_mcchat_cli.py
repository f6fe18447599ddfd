"""``brokerd-mcchat`` as a user runs it (a subprocess) against a real broker: topics, pub (an
argument or standard input), sub with a count, the exit codes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import threads
from twisted.internet.task import deferLater

from brokerd.protocols.mcchat.client import MCChatClientProtocol
from tests.support.live import TIMEOUT, Inbox, LiveBroker, reactor, synced

pytestmark = pytest.mark.slow


def command(live: LiveBroker | None, *args: str) -> list[str]:
    port = str(live.port("mcchat")) if live is not None else "1"
    return [sys.executable, "-m", "brokerd.cli.mcchat", "-p", port, "--timeout", "5", *args]


async def run(live: LiveBroker | None, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return await threads.deferToThread(  # type: ignore[no-any-return]
        subprocess.run, command(live, *args), input=stdin, capture_output=True, timeout=30
    )


async def finished(process: subprocess.Popen) -> tuple[bytes, bytes]:
    """The process's output once it exits; killed (and the test failed) after 30 s."""
    try:
        return await threads.deferToThread(process.communicate, timeout=30)  # type: ignore[no-any-return]
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.communicate()


async def subscribed(probe: MCChatClientProtocol, topic: str) -> None:
    """Wait (bounded) until the subprocess has subscribed to ``topic``."""
    for _ in range(int(TIMEOUT / 0.05)):
        if topic in await probe.topics():
            return
        await deferLater(reactor(), 0.05)
    raise AssertionError(f"nobody subscribed to {topic!r} within {TIMEOUT} s")


@pytest_twisted.ensureDeferred
async def test_topics_pub_and_stdin(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        inbox = Inbox()
        listener = await live.mcchat(inbox)
        listener.subscribe("caf\u00e9")
        listener.subscribe("news")
        await synced(listener)
        listed = await run(live, "topics")
        assert (listed.returncode, listed.stdout) == (0, "caf\u00e9\nnews\n".encode())
        sent = await run(live, "pub", "caf\u00e9", "h\u00e9llo", "-u", "Zo\u00eb")
        assert sent.returncode == 0, sent.stderr
        assert inbox.messages == [("caf\u00e9", "Zo\u00eb", "h\u00e9llo")]
        lines = await run(live, "pub", "news", "-s", "-u", "bot", stdin=b"one\ntwo\n")
        assert lines.returncode == 0, lines.stderr
        assert inbox.messages[1:] == [("news", "bot", "one"), ("news", "bot", "two")]
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_sub_prints_count_messages_then_exits(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    process = subprocess.Popen(command(live, "sub", "room", "-C", "2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        publisher = await live.mcchat()
        await subscribed(publisher, "room")
        publisher.publish("room", "alice", "first")
        publisher.publish("room", "alice", "second \u2713")
        out, err = await finished(process)
        assert process.returncode == 0, err
        assert out == "room <alice> first\nroom <alice> second \u2713\n".encode()
    finally:
        stop(process)
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_sub_exits_1_when_the_broker_closes_the_connection(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    process = subprocess.Popen(command(live, "sub", "room"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        await subscribed(await live.mcchat(), "room")
        for session in list(live.mcchat_factory().live):
            if session.subscribed:
                session._close()
        _out, err = await finished(process)
        assert process.returncode == 1
        assert b"closed the connection" in err
    finally:
        stop(process)
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_usage_and_connection_errors_exit_2() -> None:
    refused = await run(None, "topics")
    assert refused.returncode == 2 and b"cannot connect" in refused.stderr
    both = await run(None, "pub", "t", "m", "-s")
    assert both.returncode == 2 and b"exactly one of MESSAGE or -s" in both.stderr
    bad_topic = await run(None, "sub", "a\x01" + "b" * 300)
    assert bad_topic.returncode == 2 and b"longer than 256 bytes" in bad_topic.stderr

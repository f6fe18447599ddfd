"""Bad MCCHAT clients on real sockets: an unknown opcode and an over-long string close the
connection; a client that sends nothing is closed after the idle timeout; a client that floods
without reading loses what it is sent and stops being read, with the server's buffer for it
bounded, is no longer read, loses what others send it (counted), and other clients are served
meanwhile."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol

from brokerd.protocols.mcchat.codec import encode_msg, encode_sub
from tests.support.live import TIMEOUT, Inbox, LiveBroker, mcchat_session, reactor, synced
from tests.support.collect import eventually


class Raw(Protocol):
    """A client that writes what the test says and records what it gets."""

    def __init__(self, read: bool = True) -> None:
        self.read = read
        self.received = b""
        self.lost: Deferred = Deferred()

    def connectionMade(self) -> None:
        if not self.read:
            # A small receive buffer, so the kernel does not absorb megabytes of the flood.
            self.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            self.transport.pauseProducing()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: object = None) -> None:
        self.lost.callback(None)


async def raw(live: LiveBroker, read: bool = True) -> Raw:
    endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("mcchat"))
    return await connectProtocol(endpoint, Raw(read))  # type: ignore[no-any-return]


@pytest_twisted.ensureDeferred
async def test_unknown_opcode_closes_after_what_came_before(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        inbox = Inbox()
        listener = await live.mcchat(inbox)
        listener.subscribe("t")
        await synced(listener)
        bad = await raw(live)
        bad.transport.write(encode_msg(b"t", b"b", b"before") + b"\x09" + encode_msg(b"t", b"b", b"after"))
        await bad.lost.addTimeout(TIMEOUT, reactor())
        assert bad.received == b"\x00\x01"
        await inbox.count(1)
        assert inbox.messages == [("t", "b", "before")]
        assert live.mcchat_factory().stats.protocol_errors == 1
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_a_string_over_the_limit_closes_the_connection(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        bad = await raw(live)
        bad.transport.write(b"\x03topic\x00user\x00" + b"m" * 70_000)
        await bad.lost.addTimeout(TIMEOUT, reactor())
        assert bad.received == b"\x00\x01"
        assert live.broker.stats.connections == 0
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_that_sends_nothing_is_closed(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path, mcchat_idle_timeout=0.2)
    try:
        listener = await live.mcchat()
        listener.subscribe("keeps-me")
        await synced(listener)
        silent = await raw(live)
        await silent.lost.addTimeout(TIMEOUT, reactor())
        assert silent.received == b"\x00\x01"
        # The listener's last word was heard no later than the sweep that closed ``silent``;
        # a second silent client, connected after that sweep, is closed once the listener has
        # been silent for longer than the limit too, so this is the listener's last chance.
        later = await raw(live)
        await later.lost.addTimeout(TIMEOUT, reactor())
        assert live.mcchat_factory().stats.idle_closed == 2  # the two silent ones only
        await synced(listener)  # a subscriber may stay silent: it is still served
        assert listener.is_open
    finally:
        await live.stop()


async def _flood(live: LiveBroker, packet: bytes, setup: bytes) -> None:
    """The flooder writes 16 MiB and never reads.  Once the server's buffer for it is over
    the limit the server stops reading it (so it cannot make more output) and drops what
    others send it, and the others are served meanwhile."""
    flooder = await raw(live, read=False)
    flooder.transport.write(setup)
    for _ in range(16 * 1024 * 1024 // len(packet)):
        flooder.transport.write(packet)
    await eventually(lambda: any(s.send == s._drop for s in live.mcchat_factory().live), "a pause")
    session = mcchat_session(live, flooder)
    transport = session.transport
    queued = len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    assert queued <= live.settings.max_output_buffer + 512 * 1024  # plus what one read makes
    assert transport.producerPaused
    other = await live.mcchat()
    drops = live.broker.stats.slow_consumer_drops
    other.publish("t", "other", "to the flooder too")
    assert "t" in await other.topics().addTimeout(TIMEOUT, reactor())
    assert live.broker.stats.slow_consumer_drops >= drops + 1
    assert session.dropped >= 1
    flooder.transport.abortConnection()
    await flooder.lost.addTimeout(TIMEOUT, reactor())
    await eventually(lambda: live.broker.stats.connections == 1, "the flooder to be gone")


@pytest_twisted.ensureDeferred
async def test_a_client_flooding_msgs_without_reading(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path, max_output_buffer=64 * 1024)
    try:
        await _flood(live, encode_msg(b"t", b"f", b"x" * 1000), encode_sub(b"t"))
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_flooding_tlrqs_without_reading(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path, max_output_buffer=64 * 1024)
    try:
        topics = b"".join(encode_sub(b"t" if i == 0 else b"topic-%04d-" % i + b"x" * 200) for i in range(40))
        await _flood(live, b"\x04" * 64, topics)
    finally:
        await live.stop()

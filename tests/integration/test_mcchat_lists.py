"""MCCHAT topic lists on real sockets: a TL answer or a discovery snapshot is written as the
client reads, never queued whole (a one-byte TLRQ must not cost the broker megabytes); every
TLRQ is answered with the topics of its moment; the Discovery goes away with its broker."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest_twisted
from twisted.internet.defer import gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.mcchat.codec import encode_msg, encode_sub, encode_tl, encode_unsub
from brokerd.protocols.mcchat.listing import CHUNK
from brokerd.protocols.mcchat.server import MCChatServerFactory
from tests.support.live import TIMEOUT, Inbox, LiveBroker, mcchat_session, reactor, synced
from tests.support.collect import Collector, called

INFO = b"\x00\x01"
LIMIT = 64 * 1024


async def raw(live: LiveBroker, read: bool = True) -> Collector:
    endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("mcchat"))
    return await connectProtocol(endpoint, Collector(read))  # type: ignore[no-any-return]


def queued(session) -> int:
    transport = session.transport
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


@pytest_twisted.ensureDeferred
async def test_lists_asked_for_and_never_read_stay_within_the_output_limit(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path, max_output_buffer=LIMIT, max_subscriptions=4096)
    try:
        topics = [b"topic-%05d-" % i + b"x" * 240 for i in range(3000)]  # a TL of ~770 KB
        holder = await raw(live)
        holder.transport.write(b"".join(encode_sub(t) for t in topics) + b"\x04")
        answer = encode_tl(topics)
        await holder.until(len(INFO) + len(answer))
        askers = [await raw(live, read=False) for _ in range(4)]
        for asker in askers[:2]:
            asker.transport.write(b"\x04" * 10)  # ten TLRQs, ~7.6 MB of answers
        for asker in askers[2:]:  # ten discovery snapshots, ~7.8 MB
            asker.transport.write((encode_sub(b"") + encode_unsub(b"")) * 9 + encode_sub(b""))
        sessions = [mcchat_session(live, asker) for asker in askers]
        await gatherResults([called(s, "pauseProducing", lambda s=s: s.transport.producerPaused)
                             for s in sessions])  # every asker paused
        for session in sessions:
            assert queued(session) <= LIMIT + CHUNK + 1024
            assert session._lists.busy

        # an innocent client is served meanwhile: it publishes, is delivered to, and lists
        inbox = Inbox()
        other = await live.mcchat(inbox)
        other.subscribe("innocent")
        other.publish("innocent", "me", "still served")
        await inbox.count(1)
        assert inbox.messages == [("innocent", "me", "still served")]
        assert b"innocent" in [t.encode() for t in await other.topics().addTimeout(TIMEOUT, reactor())]

        # a message for a discovery asker whose snapshot is half written waits behind it
        other.subscribe("late")
        await synced(other)
        announced = encode_msg(b"", b"", b"late")

        # once they read, they get every answer whole and in order: the lists written before
        # the pause hold the old topics, the others the topics of their moment
        now = topics + [b"innocent", b"late"]
        askers[0].start_reading()
        new_tl = encode_tl(now)
        await askers[0].until_one_of([INFO + answer * k + new_tl * (10 - k) for k in range(1, 10)])
        askers[2].start_reading()
        snapshot = b"".join(encode_msg(b"", b"", t) for t in topics)
        later = b"".join(encode_msg(b"", b"", t) for t in now)
        heard = encode_msg(b"", b"", b"innocent") + announced
        await askers[2].until_one_of([INFO + snapshot * k + heard + later * (10 - k) for k in range(1, 10)])
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_tlrq_sub_tlrq_in_one_read_lists_the_new_topic(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        client = await raw(live)
        client.transport.write(encode_sub(b"old") + b"\x04" + encode_sub(b"fresh") + b"\x04")
        expected = INFO + encode_tl([b"old"]) + encode_tl([b"old", b"fresh"])
        await client.until(len(expected))
        assert client.received == expected
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_the_discovery_goes_with_its_broker() -> None:
    """Nothing outside a broker keeps its Discovery (or the broker) alive once its MCCHAT
    connections and listener are gone.  (Built by hand, not by makeService: the start-up
    log lines of a service would keep their sources in Twisted's log buffer.)"""
    broker = Broker()
    factory = MCChatServerFactory(broker, Settings(), reactor())
    factory.noisy = False
    port = reactor().listenTCP(0, factory, interface="127.0.0.1")
    endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", port.getHost().port)
    watcher = await connectProtocol(endpoint, Collector())
    watcher.transport.write(encode_sub(b"") + encode_sub(b"t") + b"\x04")
    await watcher.until(len(INFO + encode_msg(b"", b"", b"t") + encode_tl([b"t"])))
    [served] = factory.live
    ended = called(served, "connectionLost", lambda: not factory.live and broker.stats.connections == 0)
    watcher.transport.loseConnection()
    await ended
    await port.stopListening()
    discovery, kept = weakref.ref(factory.discovery), weakref.ref(broker)
    del broker, factory, port, watcher, served, ended
    gc.collect()
    assert discovery() is None
    assert kept() is None

"""The shard layer against scripted Redis Cluster masters on loopback sockets: what a real
Redis 7 never answers to sharded pub/sub (``-ASK``, a slot bouncing between two masters) or
only in a race (``-MOVED`` to a SSUBSCRIBE), driven through the real connections.  The
engine is a recorder; tests/integration/test_cluster_shards.py runs the whole engine on a
real Redis Cluster."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol

from brokerd.cluster import slots
from brokerd.cluster.address import parse
from brokerd.cluster.connection import RespReader
from brokerd.cluster.redis_engine import ClusterStats
from brokerd.cluster.seal import Sealer
from brokerd.cluster.shards import MAX_REDIRECTS, Shards
from tests.support.live import TIMEOUT, reactor
from tests.support.redis import TEST_SECRET

CHANNEL = b"brokerd:t:room"
SLOT = slots.hash_slot(CHANNEL)


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


class Master(Protocol):
    def connectionMade(self) -> None:
        self.reader = RespReader(RuntimeError)

    def dataReceived(self, data: bytes) -> None:
        for command in self.reader.feed(data):
            self.factory.commands.append(command)
            self.transport.write(self.factory.answer(command))
            waits, self.factory.waits = self.factory.waits, []
            for condition, d in waits:
                if condition(self.factory.commands):
                    d.callback(None)
                else:
                    self.factory.waits.append((condition, d))


class ScriptedMaster(Factory):
    """A Redis Cluster master on a loopback port: ``CLUSTER SLOTS`` answers ``ranges`` (first
    slot, last slot, master); other commands get ``script(command)``."""

    protocol = Master

    def __init__(self) -> None:
        self.commands: list[list[bytes]] = []
        self.waits: list[tuple[Callable[[list], bool], Deferred]] = []
        self.ranges: list[tuple[int, int, ScriptedMaster]] = []
        self.script: Callable[[list[bytes]], bytes] = lambda command: b"+OK\r\n"
        self.port = 0

    async def listen(self) -> ScriptedMaster:
        endpoint = endpoints.TCP4ServerEndpoint(reactor(), 0, interface="127.0.0.1")
        self.listening = await endpoint.listen(self)
        self.port = self.listening.getHost().port
        return self

    def answer(self, command: list[bytes]) -> bytes:
        if command[:2] == [b"CLUSTER", b"SLOTS"]:
            return b"*%d\r\n" % len(self.ranges) + b"".join(
                b"*3\r\n:%d\r\n:%d\r\n*2\r\n" % (first, last) + bulk(b"127.0.0.1") + b":%d\r\n" % master.port
                for first, last, master in self.ranges)
        return self.script(command)

    def until(self, condition: Callable[[list], bool]) -> Deferred:
        d: Deferred = Deferred()
        if condition(self.commands):
            d.callback(None)
        else:
            self.waits.append((condition, d))
        return d.addTimeout(TIMEOUT, reactor())

    def spublishes(self) -> list[list[bytes]]:
        return [command for command in self.commands if command[0] == b"SPUBLISH"]


class Recorder:
    """What the shard layer needs of the engine, recorded."""

    def __init__(self) -> None:
        self.reactor = reactor()
        self.password = self.username = None
        self.stats = ClusterStats()
        self.sealer = Sealer([TEST_SECRET], bytes(8), 15.0)
        self.backlog = 0
        self.refused: list[str] = []
        self.ready: Deferred = Deferred()
        self.waits: list[tuple[Callable[[], bool], Deferred]] = []

    def acknowledged(self, size: int, reply: Any) -> None:
        self.backlog -= size
        if isinstance(reply, Exception):
            self.refused.append(str(reply))
        waits, self.waits = self.waits, []
        for condition, d in waits:
            if condition():
                d.callback(None)
            else:
                self.waits.append((condition, d))

    def until(self, condition: Callable[[], bool]) -> Deferred:
        """Fires once ``condition()`` holds after a publish was answered (or dropped)."""
        d: Deferred = Deferred()
        if condition():
            d.callback(None)
        else:
            self.waits.append((condition, d))
        return d.addTimeout(TIMEOUT, reactor())

    def received(self, name: bytes, data: bytes) -> None:
        pass

    def went_down(self, server: str, why: str) -> None:
        pass

    def shards_ready(self) -> None:
        if not self.ready.called:
            self.ready.callback(None)


async def started(a: ScriptedMaster) -> tuple[Recorder, Shards]:
    engine = Recorder()
    shards = Shards(engine, parse(f"redis://127.0.0.1:{a.port}"))
    shards.start()
    await engine.ready.addTimeout(TIMEOUT, reactor())
    return engine, shards


def publish(engine: Recorder, shards: Shards, data: bytes) -> None:
    assert shards.publish(CHANNEL, data)
    engine.backlog += len(data)
    shards.write()


@pytest_twisted.ensureDeferred
async def test_an_ask_sends_the_publish_once_to_the_named_master_after_asking() -> None:
    a, b = await ScriptedMaster().listen(), await ScriptedMaster().listen()
    a.ranges = b.ranges = [(0, 16383, a)]
    a.script = lambda command: (b"-ASK %d 127.0.0.1:%d\r\n" % (SLOT, b.port) if command[0] == b"SPUBLISH"
                                else b"+OK\r\n")
    b.script = lambda command: b":1\r\n" if command[0] == b"SPUBLISH" else b"+OK\r\n"
    engine, shards = await started(a)
    try:
        publish(engine, shards, b"envelope")
        await b.until(lambda commands: [b"SPUBLISH", CHANNEL, b"envelope"] in commands)
        asked = [c for c in b.commands if c[0] in (b"ASKING", b"SPUBLISH")]
        assert asked == [[b"ASKING"], [b"SPUBLISH", CHANNEL, b"envelope"]]  # ASKING right before it
        await engine.until(lambda: engine.backlog == 0)  # answered: its bytes left the backlog
        assert shards.map is not None and shards.map.owner(SLOT) == ("127.0.0.1", a.port)  # ASK moves nothing
        assert engine.stats.redirects == 1 and engine.refused == []
        publish(engine, shards, b"next")  # so the next one goes to A again
        await a.until(lambda commands: [b"SPUBLISH", CHANNEL, b"next"] in commands)
    finally:
        await shards.stop()
        await a.listening.stopListening()
        await b.listening.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_slot_bouncing_between_two_masters_drops_the_publish_after_a_bound() -> None:
    a, b = await ScriptedMaster().listen(), await ScriptedMaster().listen()
    a.ranges = b.ranges = [(0, 8191, a), (8192, 16383, b)]  # both connected from the start
    a.script = lambda command: (b"-MOVED %d 127.0.0.1:%d\r\n" % (SLOT, b.port) if command[0] == b"SPUBLISH"
                                else b"+OK\r\n")
    b.script = lambda command: (b"-MOVED %d 127.0.0.1:%d\r\n" % (SLOT, a.port) if command[0] == b"SPUBLISH"
                                else b"+OK\r\n")
    engine, shards = await started(a)
    try:
        data = engine.sealer.seal(CHANNEL, b"\xb1" + bytes(8) + (3).to_bytes(4, "big"))  # an envelope's head: 3 messages
        publish(engine, shards, data)
        await engine.until(lambda: engine.stats.dropped_unreachable == 3)
        assert len(a.spublishes()) + len(b.spublishes()) == MAX_REDIRECTS + 1  # then no more
        assert engine.backlog == 0 and engine.stats.redirects == MAX_REDIRECTS + 1
    finally:
        await shards.stop()
        await a.listening.stopListening()
        await b.listening.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_moved_answer_to_ssubscribe_subscribes_on_the_new_owner() -> None:
    a, b = await ScriptedMaster().listen(), await ScriptedMaster().listen()
    a.ranges = b.ranges = [(0, 16383, a)]

    def confirm(command: list[bytes]) -> bytes:
        return b"*3\r\n" + bulk(b"ssubscribe") + bulk(command[1]) + b":1\r\n"

    a.script = lambda command: (b"-MOVED %d 127.0.0.1:%d\r\n" % (SLOT, b.port) if command[0] == b"SSUBSCRIBE"
                                else b"+OK\r\n")
    b.script = lambda command: confirm(command) if command[0] == b"SSUBSCRIBE" else b"+OK\r\n"
    engine, shards = await started(a)
    a.ranges = b.ranges = [(0, 16383, b)]  # the slots moved to B after the node read the map
    try:
        shards.follow(CHANNEL, True)
        await shards.when_following(CHANNEL, at=("127.0.0.1", b.port)).addTimeout(TIMEOUT, reactor())
        assert [b"SSUBSCRIBE", CHANNEL] in a.commands  # tried on A first
        assert all(CHANNEL not in shard.requested for key, shard in shards.shards.items() if key[1] != b.port)
        assert engine.stats.redirects == 1
    finally:
        await shards.stop()
        await a.listening.stopListening()
        await b.listening.stopListening()

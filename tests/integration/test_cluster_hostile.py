"""A client of the cluster's Redis that holds the cluster secret but is not a node (a buggy or
compromised node: sealing keeps every other stranger out, tests/integration/test_cluster_sealing.py)
writes damaged messages, sealed, on every channel the nodes read, between the messages of a real publisher: a deeply nested JSON array and a
short ``state`` entry on the control channel, garbage on a topic's channel and on a node's own
channel.  The nodes drop and count them, keep their Redis connections (no outage), log no
error with a traceback and at most one line per interval about them, and the innocent
messages of a real node still arrive, every one, in order (the positive control).

Then 5,000 envelopes with distinct protocol names: the figures keep one series per known
protocol and ``other``, never one per name."""
from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import globalLogPublisher

from brokerd.cluster import directory as control
from brokerd.cluster import envelope, frames
from brokerd.cluster.connection import RespReader, channel
from brokerd.cluster.damaged import INTERVAL
from brokerd.cluster.redis_engine import CONTROL_CHANNEL
from brokerd.cluster.seal import Sealer
from brokerd.core.message import MULTICAST, Message
from tests.integration.cluster_nodes import TIMEOUT, Node, Waiter, reactor, ssmp_subscribed
from tests.integration.test_cluster_routing import poll_until
from tests.support.redis import TEST_SECRET, RedisServer, _encode, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

TOPIC = b"room"
LABELS = b"labels"
ROUNDS = 20
FORGED_PROTOCOLS = 5000
STRANGER = b"\x07" * 8
"""The instance id the stranger's envelopes claim (no node's)."""
SEALER = Sealer([TEST_SECRET], STRANGER, 15.0)


class Stranger(Protocol):
    """A plain Redis client: writes commands, counts the replies."""

    def connectionMade(self) -> None:
        self.reader = RespReader(RuntimeError)
        self.replies = Waiter()

    def dataReceived(self, data: bytes) -> None:
        for reply in self.reader.feed(data):
            self.replies(reply)

    def publish(self, *messages: tuple[bytes, bytes]) -> Deferred:
        """SPUBLISH each (channel, data), sealed with the cluster secret, so that the nodes'
        decoders read them; fires once Redis answered them all."""
        expected = len(self.replies.items) + len(messages)
        self.transport.write(b"".join(_encode("SPUBLISH", name, SEALER.seal(name, data)) for name, data in messages))
        return self.replies.count(expected).addTimeout(TIMEOUT, reactor())


def attacks(node_channel: bytes) -> list[tuple[bytes, bytes]]:
    origin = STRANGER.hex()
    return [
        (CONTROL_CHANNEL, b"[" * 100_000 + b"]" * 100_000),
        (CONTROL_CHANNEL, control.encode(origin, "x", control.STATE, addresses=[["ssmp"]])),
        (CONTROL_CHANNEL, control.encode(origin, "x", control.JOIN, t=[[]], p="ssmp", m="m", pr=True)),
        (channel(TOPIC), envelope.MAGIC.to_bytes(1, "big") + STRANGER + b"\xff\xff\xff\xff\x00garbage"),
        (node_channel, b"\x04ssmp" + envelope.MAGIC.to_bytes(1, "big") + b"short"),
        (node_channel, b"\x02@b\xff\xff"),
        (node_channel, frames.service(origin, "socketmq", b"[" * 100_000 + b"\n")),
        (node_channel, frames.service(origin, "socketmq", b'{"k":"answer","token":7}\n')),
    ]


class LogWatch:
    """Every log event of the test: failures (tracebacks), critical lines, and the lines about
    damaged messages."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def tracebacks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "log_failure" in e or getattr(e.get("log_level"), "name", "") == "critical"]

    def damaged_lines(self) -> int:
        return sum(1 for e in self.events if "damaged message" in (e.get("log_format") or ""))


def protocol_labels(metrics: str) -> set[str]:
    return set(re.findall(r'(?:protocol|receiver)="([^"]*)"', metrics))


def scrape(node: Node) -> str:
    from brokerd.admin.metrics import exposition

    figures = node.service.operations.figures
    return exposition(figures.snapshot(), None).decode()


@pytest_twisted.ensureDeferred
async def test_damaged_messages_from_a_stranger_are_dropped_and_a_nodes_messages_still_arrive_in_order(
        tmp_path: Path, redis_server: RedisServer) -> None:
    watch = LogWatch()
    globalLogPublisher.addObserver(watch)
    started = time.monotonic()
    first = await Node(tmp_path / "node1", redis_server.url, "node1").start()
    second = await Node(tmp_path / "node2", redis_server.url, "node2").start()
    try:
        pub = await first.ssmp(b"pub")
        sub = await second.ssmp(b"sub")
        await ssmp_subscribed(sub, TOPIC)
        counted = await second.ssmp(b"counted")
        await ssmp_subscribed(counted, LABELS)
        await second.engine.when_following(TOPIC).addTimeout(TIMEOUT, reactor())
        await second.engine.when_following(LABELS).addTimeout(TIMEOUT, reactor())
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), *redis_server.address)
        stranger: Stranger = await endpoint.connect(Factory.forProtocol(Stranger)).addTimeout(TIMEOUT, reactor())
        bad = attacks(second.engine.node_channel)

        for index in range(ROUNDS):
            # Redis answered the stranger's publishes before it takes node 1's next message, so
            # node 2 reads each round's damaged messages before that round's innocent one.
            await stranger.publish(*bad)
            pub.send(b"MCAST room innocent-%d" % index)
        await sub.next_line(lambda line: line.endswith(b"innocent-%d" % (ROUNDS - 1))).addTimeout(TIMEOUT, reactor())
        got = [line.rsplit(b" ", 1)[1] for line in sub.lines.items if b" MCAST " in line]
        assert got == [b"innocent-%d" % index for index in range(ROUNDS)]
        for node in (first, second):
            assert node.engine.stats.outages == 0 and node.engine.connected
        assert second.engine.stats.bad_envelopes == ROUNDS * (len(bad) - 2)
        socketmq_remote = second.engine._services["socketmq"].__self__
        assert socketmq_remote.stats["bad"] == ROUNDS * 2  # the two socket.mq service frames
        assert first.engine.stats.bad_envelopes >= (ROUNDS - 1) * 3  # the control channel's

        forged = [(channel(LABELS), envelope.encode(STRANGER, [Message(MULTICAST, LABELS, b"f-%d" % index,
                                                                        f"p{index}", b"who")]))
                  for index in range(FORGED_PROTOCOLS)]
        await stranger.publish(*forged)
        received = Waiter()
        poll_until(lambda: second.engine.stats.messages_received >= ROUNDS + FORGED_PROTOCOLS, received)
        await received.count(1).addTimeout(6 * TIMEOUT, reactor())
        metrics = scrape(second)
        labels = protocol_labels(metrics)
        assert {"ssmp", "other"} <= labels  # the node's own messages and the forged ones are counted
        assert labels <= envelope.PROTOCOLS | {envelope.OTHER}
        routed_other = [line for line in metrics.splitlines()
                        if line.startswith('brokerd_messages_routed_total{protocol="other",receiver="ssmp"}')]
        assert len(routed_other) == 1 and float(routed_other[0].split()[-1]) > 0, routed_other

        stranger.transport.loseConnection()
        assert watch.tracebacks() == []
        elapsed = time.monotonic() - started
        # Three reporters saw damaged messages (each node's engine, node 2's socket.mq service):
        # each logs its first at once, then one line per INTERVAL at most.
        assert 3 <= watch.damaged_lines() <= 3 * (1 + math.ceil(elapsed / INTERVAL))
    finally:
        globalLogPublisher.removeObserver(watch)
        await second.stop()
        await first.stop()

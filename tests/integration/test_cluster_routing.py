"""Three brokerd nodes sharing one real redis-server: a message published on node 1 in any
protocol reaches the subscribers of every protocol on every node, once each and in order;
a node that loses Redis keeps serving its own clients and routes again once Redis is back.

(SMQP is not in the matrix: a cluster with an SMQP listener needs the shared PostgreSQL
store, test_cluster_options checks that such a node refuses to start.)"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults

from tests.integration.cluster_nodes import TIMEOUT, Inbox, Node, Waiter, reactor, ssmp_subscribed
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

TOPIC = b"room"


def ssmp_payloads(client: Any) -> list[bytes]:
    return [line.split(b" ", 4)[4] for line in client.lines.items if line.split(b" ", 3)[2:3] == [b"MCAST"]]


class Subscribers:
    """One subscriber of each protocol on one node, subscribed to TOPIC."""

    @classmethod
    async def on(cls, node: Node, tag: str) -> Subscribers:
        self = cls()
        self.node = node
        self.ssmp = await node.ssmp(f"sub-{tag}".encode())
        await ssmp_subscribed(self.ssmp, TOPIC)
        self.mc_inbox = Inbox()
        self.mcchat = await node.mcchat(self.mc_inbox)
        self.mcchat.subscribe(TOPIC)
        await self.mcchat.sync().addTimeout(TIMEOUT, reactor())
        self.events = Waiter()
        self.socketmq = await node.socketmq()
        await self.socketmq.subscribe(TOPIC.decode(), self.events).addTimeout(TIMEOUT, reactor())
        return self

    def payloads(self) -> dict[str, list[bytes]]:
        return {
            "ssmp": ssmp_payloads(self.ssmp),
            "mcchat": [m[2].encode() for m in self.mc_inbox.messages],
            "socketmq": [event.data for event in self.events.items],
        }

    def waits(self, last: bytes) -> list[Deferred]:
        """One Deferred per subscriber, firing once it saw ``last``."""
        return [
            self.ssmp.lines.until(lambda lines: any(line.endswith(b" " + last) for line in lines)),
            self.mc_inbox.until(lambda inbox: any(m[2].encode() == last for m in inbox.messages)),
            self.events.until(lambda items: any(event.data == last for event in items)),
        ]

    def until(self, last: bytes) -> Deferred:
        """Fires once every subscriber saw ``last``."""
        return gatherResults(self.waits(last))


async def cluster(tmp_path: Path, redis: RedisServer, count: int = 3, **fields: Any) -> list[Node]:
    nodes = []
    for index in range(1, count + 1):
        nodes.append(await Node(tmp_path / f"node{index}", redis.url, f"node{index}", **fields).start())
    return nodes


async def stop_all(nodes: list[Node]) -> None:
    for node in nodes:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_every_protocol_reaches_every_protocol_on_every_node_once_in_order(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server)
    try:
        groups = [await Subscribers.on(node, f"n{i}") for i, node in enumerate(nodes, 1)]
        for node in nodes[1:]:
            await node.engine.when_following(TOPIC).addTimeout(TIMEOUT, reactor())
        origin = nodes[0]
        ssmp_pub = await origin.ssmp(b"publisher")
        mc_pub = await origin.mcchat(Inbox())
        web_pub = await origin.socketmq()

        sent: dict[str, list[bytes]] = {"ssmp": [], "mcchat": [], "socketmq": []}
        for i in range(20):
            for protocol in sent:
                sent[protocol].append(f"{protocol}-{i}".encode())
            ssmp_pub.send(b"MCAST room ssmp-%d" % i)
            mc_pub.publish("room", "mc", f"mcchat-{i}")
            await web_pub.publish("room", f"socketmq-{i}").addTimeout(TIMEOUT, reactor())
        ssmp_pub.send(b"MCAST room the-end")
        for group in groups:
            await group.until(b"the-end").addTimeout(TIMEOUT, reactor())

        for group in groups:
            for receiver, payloads in group.payloads().items():
                assert payloads[-1] == b"the-end", (group.node.name, receiver)
                assert len(payloads) == 61, (group.node.name, receiver, payloads)  # each once
                for protocol, expected in sent.items():
                    got = [p for p in payloads if p.startswith(protocol.encode() + b"-")]
                    assert got == expected, (group.node.name, receiver, protocol)  # in order
        stats = [node.engine.stats for node in nodes]
        assert stats[0].messages_sent == 61
        assert all(s.messages_received == 61 for s in stats[1:])
        assert stats[0].messages_received == 0  # its own echo is skipped
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_node_subscribes_in_redis_only_to_topics_with_local_members(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server, count=2)
    try:
        first, second = nodes
        sub = await second.ssmp(b"s")
        await ssmp_subscribed(sub, b"wanted")
        await second.engine.when_following(b"wanted").addTimeout(TIMEOUT, reactor())
        assert topic_channels(second) == {b"brokerd:t:wanted"}
        pub = await first.ssmp(b"p")
        pub.send(b"MCAST unwanted nobody-there", b"MCAST wanted hello")
        await sub.next_line(lambda line: line.endswith(b"hello")).addTimeout(TIMEOUT, reactor())
        assert second.engine.stats.messages_received == 1  # the unwanted topic never came here
        assert [line for line in sub.lines.items if b"MCAST" in line] == [b"000 p MCAST wanted hello"]
        before = len(sub.lines.items)
        sub.send(b"UNSUBSCRIBE wanted")
        await sub.lines.count(before + 1).addTimeout(TIMEOUT, reactor())
        assert sub.lines.items[before] == b"200"
        assert topic_channels(second) == set()
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_redis_killed_and_restarted_mid_traffic(tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server, count=2)
    try:
        first, second = nodes
        local = await first.ssmp(b"local")
        await ssmp_subscribed(local, TOPIC)
        remote = await second.ssmp(b"remote")
        await ssmp_subscribed(remote, TOPIC)
        await second.engine.when_following(TOPIC).addTimeout(TIMEOUT, reactor())
        pub = await first.ssmp(b"pub")
        pub.send(b"MCAST room before")
        await remote.next_line(lambda line: line.endswith(b"before")).addTimeout(TIMEOUT, reactor())

        redis_server.kill()
        down = Waiter()
        for node in nodes:
            poll_until(lambda node=node: node.engine.stats.outages >= 1, down)
        await down.count(2)
        # Redis is gone: node 1 still serves its own subscriber, and counts what it could not send.
        pub.send(b"MCAST room during")
        await local.next_line(lambda line: line.endswith(b"during")).addTimeout(TIMEOUT, reactor())
        assert first.engine.stats.dropped_unreachable >= 1
        assert first.engine.stats.connected == 0
        metrics = scrape(first)
        assert "brokerd_cluster_connected 0.0" in metrics
        assert "brokerd_cluster_outages_total 1.0" in metrics
        assert 'brokerd_cluster_dropped_total{reason="unreachable"} 1.0' in metrics

        redis_server.start()
        for node in nodes:
            await node.engine.when_connected().addTimeout(TIMEOUT, reactor())
        await second.engine.when_following(TOPIC).addTimeout(TIMEOUT, reactor())
        pub.send(b"MCAST room after")
        await remote.next_line(lambda line: line.endswith(b"after")).addTimeout(TIMEOUT, reactor())
        assert [p for p in ssmp_payloads(remote)] == [b"before", b"after"]
        assert ssmp_payloads(local) == [b"before", b"during", b"after"]
        assert "brokerd_cluster_connected 1.0" in scrape(first)
    finally:
        await stop_all(nodes)


def scrape(node: Node) -> str:
    """What GET /metrics would answer on ``node``."""
    from brokerd.admin.metrics import exposition

    figures = node.service.operations.figures
    return exposition(figures.snapshot(), None).decode()


def topic_channels(node: Node) -> set[bytes]:
    return {name for name in node.engine.following if name.startswith(b"brokerd:t:")}


def poll_until(condition: Any, done: Waiter, interval: float = 0.05) -> None:
    """Call ``done(True)`` once ``condition()`` holds, checking every ``interval`` on the
    reactor (the engine's state has no event of its own for a test to wait on); the caller's
    wait on ``done`` is bounded."""
    if condition():
        done(True)
        return
    reactor().callLater(interval, poll_until, condition, done, interval)

"""Three brokerd nodes on a real three-master Redis Cluster (``--cluster`` names one master;
each node finds the others with CLUSTER SLOTS): topics whose channels live on different
shards reach every node in every protocol, UCAST and presence cross nodes, and a topic's slot
moved to another master during traffic keeps being delivered (the publisher follows the
MOVED answer, the subscribers subscribe again on the new owner)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import gatherResults
from twisted.logger import formatEvent, globalLogPublisher

from brokerd.cluster import slots
from brokerd.cluster.connection import channel
from tests.integration.cluster_nodes import TIMEOUT, Inbox, Node, Waiter, reactor, ssmp_subscribed
from tests.integration.test_cluster_addresses import settled, until_members
from tests.integration.test_cluster_routing import cluster, poll_until, scrape, ssmp_payloads, stop_all
from tests.support.redis import RedisCluster, RedisServer, command, redis_cluster, redis_server  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def logged() -> Iterator[list[dict[str, Any]]]:
    """The engine's log events (brokerd.cluster) and every logged failure, while the test runs."""
    seen: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None or str(event.get("log_namespace", "")).startswith("brokerd.cluster"):
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


def lines(events: list[dict[str, Any]], text: str) -> list[str]:
    return [formatEvent(event) for event in events if text in formatEvent(event)]


def topics_on_every_shard(redis: RedisCluster) -> list[bytes]:
    """One topic per master: ``room-N`` names whose channels hash to three different masters
    (checked against the cluster's own CLUSTER KEYSLOT)."""
    found: dict[int, bytes] = {}
    index = 0
    while len(found) < 3:
        topic = b"room-%d" % index
        slot = slots.hash_slot(channel(topic))
        assert command(redis.servers[0].port, "CLUSTER", "KEYSLOT", channel(topic)) == slot
        found.setdefault(redis.owner(slot).port, topic)
        index += 1
    return list(found.values())


class Receivers:
    """An SSMP, an MCCHAT and a socket.mq subscriber of ``topics`` on one node."""

    @classmethod
    async def on(cls, node: Node, topics: list[bytes]) -> Receivers:
        self = cls()
        self.node = node
        self.ssmp = await node.ssmp(b"sub-" + node.name.encode())
        self.inbox = Inbox()
        self.mcchat = await node.mcchat(self.inbox)
        self.events = Waiter()
        self.socketmq = await node.socketmq()
        for topic in topics:
            await ssmp_subscribed(self.ssmp, topic)
            self.mcchat.subscribe(topic.decode())
            await self.socketmq.subscribe(topic.decode(), self.events).addTimeout(TIMEOUT, reactor())
        await self.mcchat.sync().addTimeout(TIMEOUT, reactor())
        return self

    def payloads(self) -> dict[str, list[bytes]]:
        return {
            "ssmp": ssmp_payloads(self.ssmp),
            "mcchat": [m[2].encode() for m in self.inbox.messages],
            "socketmq": [event.data for event in self.events.items],
        }

    def until(self, last: bytes) -> Any:
        return gatherResults([
            self.ssmp.lines.until(lambda lines: any(line.endswith(b" " + last) for line in lines)),
            self.inbox.until(lambda inbox: any(m[2].encode() == last for m in inbox.messages)),
            self.events.until(lambda items: any(event.data == last for event in items)),
        ])


@pytest_twisted.ensureDeferred
async def test_topics_on_three_shards_reach_every_node_in_every_protocol(
        tmp_path: Path, redis_cluster: RedisCluster) -> None:
    topics = topics_on_every_shard(redis_cluster)
    nodes = await cluster(tmp_path, redis_cluster)
    try:
        assert all(node.engine.shards.cluster and node.engine.stats.shards == 3 for node in nodes)
        receivers = [await Receivers.on(node, topics) for node in nodes]
        for node in nodes:
            for topic in topics:  # each node subscribed on the master that owns the topic's slot
                owner = redis_cluster.owner(slots.hash_slot(channel(topic))).address
                await node.engine.when_following(topic, at=owner).addTimeout(TIMEOUT, reactor())

        # Node 1 publishes on room A in SSMP, node 2 on room B in MCCHAT, node 3 on room C in
        # socket.mq; every receiver of every node gets each message once, in order.
        ssmp_pub = await nodes[0].ssmp(b"publisher")
        mc_pub = await nodes[1].mcchat(Inbox())
        web_pub = await nodes[2].socketmq()
        sent: dict[bytes, list[bytes]] = {topic: [] for topic in topics}
        for i in range(10):
            for topic in topics:
                sent[topic].append(b"%s-%d" % (topic, i))
            ssmp_pub.send(b"MCAST %s %s-%d" % (topics[0], topics[0], i))
            mc_pub.publish(topics[1].decode(), "mc", f"{topics[1].decode()}-{i}")
            await web_pub.publish(topics[2].decode(), f"{topics[2].decode()}-{i}").addTimeout(TIMEOUT, reactor())
        # Each topic's last message from its own publisher: order holds per publisher and topic.
        ssmp_pub.send(b"MCAST %s end-%s" % (topics[0], topics[0]))
        mc_pub.publish(topics[1].decode(), "mc", f"end-{topics[1].decode()}")
        await web_pub.publish(topics[2].decode(), f"end-{topics[2].decode()}").addTimeout(TIMEOUT, reactor())
        for group in receivers:
            for topic in topics:
                await group.until(b"end-" + topic).addTimeout(TIMEOUT, reactor())

        for group in receivers:
            for protocol, payloads in group.payloads().items():
                for topic in topics:
                    got = [p for p in payloads if p.startswith(topic + b"-")]
                    assert got == sent[topic], (group.node.name, protocol, topic)  # once each, in order
        assert sum(node.engine.stats.envelopes_sent for node in nodes) >= 3
        assert all(node.engine.stats.redirects == 0 for node in nodes)  # the slot map was right
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_ucast_and_presence_across_nodes_on_a_cluster(tmp_path: Path, redis_cluster: RedisCluster) -> None:
    nodes = await cluster(tmp_path, redis_cluster)
    try:
        # The node channels (unicasts) and the control channel (presence) of the three nodes:
        # on more than one master, so this crosses shards.
        owners = {redis_cluster.owner(slots.hash_slot(name)).port
                  for name in [b"brokerd:c", *(node.engine.node_channel for node in nodes)]}
        alice = await nodes[2].ssmp(b"alice")
        sender = await nodes[0].ssmp(b"bob")
        await settled(on=nodes[0], address=("ssmp", b"alice"))
        before = len(sender.lines.items)
        sender.send(b"UCAST alice hello across shards", b"UCAST nobody lost")
        await sender.lines.count(before + 2).addTimeout(TIMEOUT, reactor())
        assert sender.lines.items[before:] == [b"200", b"404"]
        line = await alice.next_line(lambda line: b"UCAST" in line).addTimeout(TIMEOUT, reactor())
        assert line == b"000 bob UCAST alice hello across shards"

        member = await nodes[1].ssmp(b"member")
        await ssmp_subscribed(member, b"lobby")
        await until_members(nodes[0], b"lobby", 1)
        watcher = await nodes[0].ssmp(b"watcher")
        watcher.send(b"SUBSCRIBE lobby PRESENCE")
        await watcher.next_line(lambda line: line == b"000 member SUBSCRIBE lobby").addTimeout(TIMEOUT, reactor())
        member.send(b"UNSUBSCRIBE lobby")
        await watcher.next_line(lambda line: line == b"000 member UNSUBSCRIBE lobby").addTimeout(TIMEOUT, reactor())
        assert len(owners) >= 1 and all(node.engine.stats.shards == 3 for node in nodes)
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_slot_moved_to_another_master_during_traffic(
        tmp_path: Path, redis_cluster: RedisCluster, logged: list[dict[str, Any]]) -> None:
    topic = topics_on_every_shard(redis_cluster)[0]
    slot = slots.hash_slot(channel(topic))
    nodes = await cluster(tmp_path, redis_cluster)
    try:
        publisher_node, *receiving = nodes
        subscribers = []
        for node in receiving:
            client = await node.ssmp(b"sub-" + node.name.encode())
            await ssmp_subscribed(client, topic)
            subscribers.append(client)
            await node.engine.when_following(topic).addTimeout(TIMEOUT, reactor())
        pub = await publisher_node.ssmp(b"pub")
        for i in range(5):
            pub.send(b"MCAST %s before-%d" % (topic, i))
        for client in subscribers:
            await client.next_line(lambda line: line.endswith(b"before-4")).addTimeout(TIMEOUT, reactor())

        source = redis_cluster.owner(slot)
        target = next(server for server in redis_cluster.servers if server is not source)
        for i in range(5):  # in flight while the slot moves: may reach a node before or after it
            pub.send(b"MCAST %s during-%d" % (topic, i))
        assert redis_cluster.move_slot(slot, target) is source
        for i in range(5, 10):
            pub.send(b"MCAST %s during-%d" % (topic, i))

        # The old owner ends the receivers' subscriptions; they subscribe on the new one.
        for node in receiving:
            await node.engine.when_following(topic, at=target.address).addTimeout(TIMEOUT, reactor())
        for i in range(5):
            pub.send(b"MCAST %s after-%d" % (topic, i))
        for client in subscribers:
            await client.next_line(lambda line: line.endswith(b"after-4")).addTimeout(TIMEOUT, reactor())

        assert publisher_node.engine.stats.redirects >= 1  # a SPUBLISH answered MOVED, sent again
        assert publisher_node.engine.shards.map.owner(slot) == target.address
        for client in subscribers:
            got = ssmp_payloads(client)
            assert got[:5] == [b"before-%d" % i for i in range(5)]
            assert got[-5:] == [b"after-%d" % i for i in range(5)]  # all of them, in order
            during = got[5:-5]
            assert during == sorted(during, key=lambda p: int(p.split(b"-")[1]))  # in order, none twice
            assert set(during) <= {b"during-%d" % i for i in range(10)}
        for node in receiving:
            assert node.engine.stats.redirects >= 1  # the sunsubscribe (or a MOVED) was followed
            assert channel(topic) not in node.engine.shards.shards[source.address].following
        assert publisher_node.engine.stats.dropped_unreachable == 0
        metrics = scrape(publisher_node)
        assert "brokerd_cluster_shards 3.0" in metrics
        assert "brokerd_cluster_redirects_total 0.0" not in metrics
        assert len(lines(logged, "no longer serves channel")) >= len(receiving)  # one per re-subscription
        assert lines(logged, "unreachable") == [] and [e for e in logged if e.get("log_failure")] == []
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_master_killed_and_restarted(
        tmp_path: Path, redis_cluster: RedisCluster, logged: list[dict[str, Any]]) -> None:
    """One shard down: each node counts one outage, keeps serving its own clients, reconnects
    with backoff, subscribes again on the master once it is back, and routes through it."""
    topics = topics_on_every_shard(redis_cluster)
    nodes = await cluster(tmp_path, redis_cluster, count=2)
    try:
        first, second = nodes
        victim = redis_cluster.owner(slots.hash_slot(channel(topics[1])))
        local = await first.ssmp(b"local")
        remote = await second.ssmp(b"remote")
        for topic in topics[:2]:
            await ssmp_subscribed(local, topic)
            await ssmp_subscribed(remote, topic)
            await second.engine.when_following(topic).addTimeout(TIMEOUT, reactor())
        pub = await first.ssmp(b"pub")
        pub.send(b"MCAST %s before" % topics[1])
        await remote.next_line(lambda line: line.endswith(b"before")).addTimeout(TIMEOUT, reactor())

        victim.kill()
        down = Waiter()
        for node in nodes:
            poll_until(lambda node=node: node.engine.stats.outages >= 1, down)
        await down.count(2)
        pub.send(b"MCAST %s during" % topics[1])
        await local.next_line(lambda line: line.endswith(b"during")).addTimeout(TIMEOUT, reactor())
        assert first.engine.stats.dropped_unreachable >= 1  # for the master that is down
        assert first.engine.stats.connected == 0
        assert "brokerd_cluster_connected 0.0" in scrape(first)

        victim.start()  # the same port and nodes.conf: the same master, its slots again
        redis_cluster.wait_until_agreed()
        for node in nodes:
            await node.engine.when_connected().addTimeout(TIMEOUT, reactor())
        await second.engine.when_following(topics[1], at=victim.address).addTimeout(TIMEOUT, reactor())
        pub.send(b"MCAST %s after" % topics[1])
        await remote.next_line(lambda line: line.endswith(b"after")).addTimeout(TIMEOUT, reactor())
        assert [p for p in ssmp_payloads(remote) if p in (b"before", b"during", b"after")] == [b"before", b"after"]
        assert all(node.engine.stats.outages == 1 for node in nodes)  # one outage, however many retries
        down_lines = lines(logged, "is unreachable")
        assert len(down_lines) == 2, down_lines  # one line per node, however many attempts failed
        assert all(f"127.0.0.1:{victim.port}" in line for line in down_lines)  # naming the master
        assert len(lines(logged, "again; routing between nodes resumed")) == 2
        assert [e for e in logged if e.get("log_failure")] == []
        assert "brokerd_cluster_connected 1.0" in scrape(first)
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_plain_server_is_one_shard(tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server, count=2)
    try:
        for node in nodes:
            assert node.engine.shards.cluster is False
            assert node.engine.stats.shards == 1
            assert set(node.engine.shards.shards) == {redis_server.address}
        sub = await nodes[1].ssmp(b"s")
        await ssmp_subscribed(sub, b"plain")
        await nodes[1].engine.when_following(b"plain", at=redis_server.address).addTimeout(TIMEOUT, reactor())
        pub = await nodes[0].ssmp(b"p")
        pub.send(b"MCAST plain hello")
        await sub.next_line(lambda line: line.endswith(b"hello")).addTimeout(TIMEOUT, reactor())
    finally:
        await stop_all(nodes)

"""Addresses and presence across the nodes of a cluster (one real redis-server): an SSMP UCAST
reaches a session on another node, a login on node 2 replaces the same login on node 1,
presence watchers see the members of every node (and MCCHAT's topic list their topics), and
a node killed with SIGKILL drops out of presence once its heartbeats stop."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
import pytest_twisted

from tests.integration.cluster_nodes import TIMEOUT, Inbox, LineProtocol, Node, reactor, ssmp_subscribed
from tests.integration.test_cluster_routing import cluster, stop_all
from tests.support.broker import start_broker
from tests.support.redis import RedisServer, cluster_secret, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

FAST = {"cluster_heartbeat": 0.2, "cluster_node_timeout": 1.0}
"""Short heartbeats, so that a dead node's sessions leave within the tests' bounded waits."""


async def settled(*nodes: Node, on: Node, address: tuple[str, bytes]) -> None:
    """Wait until ``on`` knows which node has ``address`` (a login announced on the control
    channel takes one Redis round trip to arrive)."""
    from twisted.internet.defer import Deferred

    d: Deferred = Deferred()

    def check() -> None:
        if address in on.engine.directory.owner:
            d.callback(None)
        elif not d.called:
            reactor().callLater(0.02, check)

    check()
    await d.addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_ucast_reaches_a_session_on_another_node(tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server, count=3)
    try:
        alice = await nodes[2].ssmp(b"alice")
        sender = await nodes[0].ssmp(b"bob")
        await settled(on=nodes[0], address=("ssmp", b"alice"))
        before = len(sender.lines.items)
        sender.send(b"UCAST alice hello across", b"UCAST nobody lost")
        await sender.lines.count(before + 2).addTimeout(TIMEOUT, reactor())
        assert sender.lines.items[before:] == [b"200", b"404"]  # found on node 3; nowhere
        line = await alice.next_line(lambda line: b"UCAST" in line).addTimeout(TIMEOUT, reactor())
        assert line == b"000 bob UCAST alice hello across"
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_login_on_one_node_replaces_the_same_login_on_another(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server, count=2)
    try:
        old = await nodes[0].ssmp(b"carol")
        other = await nodes[0].ssmp(b"dave")
        new = await nodes[1].ssmp(b"carol")
        await old.lost.addTimeout(TIMEOUT, reactor())  # closed, as one node closes the older login
        assert nodes[0].broker.session_for("ssmp", b"carol") is None
        assert not other.lost.called  # only the replaced one
        await settled(on=nodes[0], address=("ssmp", b"carol"))
        other.send(b"UCAST carol to-the-new-one")
        line = await new.next_line(lambda line: b"UCAST" in line).addTimeout(TIMEOUT, reactor())
        assert line == b"000 dave UCAST carol to-the-new-one"
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_presence_and_topic_lists_see_every_node(tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server, count=3)
    try:
        early = await nodes[1].ssmp(b"early")
        await ssmp_subscribed(early, b"lobby")
        mc = await nodes[2].mcchat(Inbox())
        mc.subscribe("lobby")
        await mc.sync().addTimeout(TIMEOUT, reactor())
        # The watcher on node 1 must know both before it asks: wait for the announcements.
        await until_members(nodes[0], b"lobby", 2)
        watcher = await nodes[0].ssmp(b"watcher")
        watcher.send(b"SUBSCRIBE lobby PRESENCE")
        mc_name = b"mcchat:127.0.0.1:%d" % mc.transport.getHost().port
        await watcher.next_line(lambda line: line.startswith(b"000 " + mc_name)).addTimeout(TIMEOUT, reactor())
        assert b"000 early SUBSCRIBE lobby" in watcher.lines.items  # the current members of every node

        late = await nodes[2].ssmp(b"late")
        await ssmp_subscribed(late, b"lobby")
        await watcher.next_line(lambda line: line == b"000 late SUBSCRIBE lobby").addTimeout(TIMEOUT, reactor())
        late.send(b"UNSUBSCRIBE lobby")
        await watcher.next_line(lambda line: line == b"000 late UNSUBSCRIBE lobby").addTimeout(TIMEOUT, reactor())

        # MCCHAT's topic list on node 1 names a topic whose only members are on node 2, from
        # when it gets one to when it loses the last.
        lister = await nodes[0].mcchat(Inbox())
        assert "elsewhere" not in await lister.topics().addTimeout(TIMEOUT, reactor())
        only_there = await nodes[1].ssmp(b"there")
        await ssmp_subscribed(only_there, b"elsewhere")
        await until_members(nodes[0], b"elsewhere", 1)
        assert "elsewhere" in await lister.topics().addTimeout(TIMEOUT, reactor())
        only_there.send(b"UNSUBSCRIBE elsewhere")
        await until_members(nodes[0], b"elsewhere", 0, at_most=True)
        assert "elsewhere" not in await lister.topics().addTimeout(TIMEOUT, reactor())
    finally:
        await stop_all(nodes)


async def until_members(node: Node, topic: bytes, count: int, at_most: bool = False) -> None:
    """Wait until ``node`` knows at least (``at_most``: at most) ``count`` members of ``topic``
    on the other nodes (their announcements take a Redis round trip)."""
    from twisted.internet.defer import Deferred

    d: Deferred = Deferred()

    def check() -> None:
        known = len(node.engine.members(topic))
        if (known <= count) if at_most else (known >= count):
            d.callback(None)
        elif not d.called:
            reactor().callLater(0.02, check)

    check()
    await d.addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_a_killed_nodes_sessions_leave_presence(tmp_path: Path, redis_server: RedisServer) -> None:
    (node,) = await cluster(tmp_path, redis_server, count=1, **FAST)
    (tmp_path / "victim").mkdir()
    victim_node = start_broker(
        tmp_path / "victim", "--open-login", "--no-event-log", "--cluster", redis_server.url,
        "--cluster-secret-file", str(cluster_secret(tmp_path / "victim.secret")), "--node-name", "victim", "--cluster-heartbeat", "0.2", "--cluster-node-timeout", "1")
    try:
        from twisted.internet import endpoints
        from twisted.internet.protocol import Factory

        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", victim_node.ports["ssmp"])
        victim: LineProtocol = await endpoint.connect(Factory.forProtocol(LineProtocol))
        await victim.login(b"victim")
        await ssmp_subscribed(victim, b"hall")
        await until_members(node, b"hall", 1)
        watcher = await node.ssmp(b"watcher")
        watcher.send(b"SUBSCRIBE hall PRESENCE")
        await watcher.next_line(lambda line: line == b"000 victim SUBSCRIBE hall").addTimeout(TIMEOUT, reactor())

        victim_node.stop(signal.SIGKILL)
        await watcher.next_line(lambda line: line == b"000 victim UNSUBSCRIBE hall").addTimeout(TIMEOUT, reactor())
        assert node.engine.members(b"hall") == []
        assert ("ssmp", b"victim") not in node.engine.directory.owner
    finally:
        victim_node.stop(signal.SIGKILL)
        await stop_all([node])

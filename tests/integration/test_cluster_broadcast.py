"""SSMP BCAST and UCAST under one access policy across the nodes of a cluster (one real
redis-server, three nodes, one UAL file): a BCAST on node 1 reaches every peer sharing a topic
the sender may publish to, on every node, once each, in order; peers of topics it may only
read, and anonymous senders, get what one node gives them (nothing; ``405``).  A UCAST to a
session on another node is refused with one node's code when the sender may not publish to
the recipient's login topic."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from tests.integration.cluster_nodes import TIMEOUT, LineProtocol, Node, reactor, ssmp_subscribed
from tests.integration.test_cluster_routing import cluster, stop_all
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

UAL = """\
/lobby     *  ps
/news      *  ps
/readonly  *  s
/accounts/a3  *  p
"""


async def members_known(node: Node, topic: bytes, count: int) -> None:
    """Wait until ``node`` knows ``count`` members of ``topic`` on the other nodes (each join
    is announced on the control channel, one Redis round trip away)."""
    d: Deferred = Deferred()

    def check() -> None:
        if len(node.engine.members(topic)) >= count:
            d.callback(None)
        elif not d.called:
            reactor().callLater(0.02, check)

    check()
    await d.addTimeout(TIMEOUT, reactor())


def bcasts(client: LineProtocol) -> list[bytes]:
    return [line for line in client.lines.items if b" BCAST " in line]


async def joined(node: Node, name: bytes, *topics: bytes) -> LineProtocol:
    client = await node.ssmp(name)
    for topic in topics:
        await ssmp_subscribed(client, topic)
    return client


@pytest_twisted.ensureDeferred
async def test_bcast_reaches_the_peers_of_every_node_once_and_only_where_allowed(
        tmp_path: Path, redis_server: RedisServer) -> None:
    ual = tmp_path / "ual"
    ual.write_text(UAL)
    nodes = await cluster(tmp_path, redis_server, count=3, ual_file=ual, anonymous=True, event_log=True)
    try:
        sam = await joined(nodes[0], b"sam", b"lobby", b"readonly")
        nina = await joined(nodes[0], b"nina", b"news")
        local = await joined(nodes[0], b"a1", b"lobby")
        both = await joined(nodes[1], b"a2", b"lobby", b"readonly")  # shares two topics with sam
        far = await joined(nodes[2], b"a3", b"lobby")
        reader = await joined(nodes[2], b"r3", b"readonly", b"news")  # sam may not publish to readonly
        await members_known(nodes[0], b"lobby", 2)
        await members_known(nodes[0], b"readonly", 2)
        await members_known(nodes[0], b"news", 1)

        anonymous = await nodes[0].ssmp(b".")
        anonymous.send(b"BCAST from-nobody")
        assert await anonymous.next_line(lambda line: line != b"200").addTimeout(TIMEOUT, reactor()) == b"405"

        before = len(sam.lines.items)
        sam.send(b"BCAST hello-all", b"BCAST second")
        await sam.lines.count(before + 2).addTimeout(TIMEOUT, reactor())
        assert sam.lines.items[before:] == [b"200", b"200"]
        nina.send(b"BCAST news-flash")  # sent after sam's, from the same node: it arrives after them
        for peer in (local, both, far):
            await peer.next_line(lambda line: line.endswith(b"BCAST second")).addTimeout(TIMEOUT, reactor())
        await reader.next_line(lambda line: b"news-flash" in line).addTimeout(TIMEOUT, reactor())

        expected = [b"000 sam BCAST hello-all", b"000 sam BCAST second"]
        assert bcasts(local) == expected
        assert bcasts(both) == expected  # once, although it shares lobby and readonly with sam
        assert bcasts(far) == expected
        assert bcasts(reader) == [b"000 nina BCAST news-flash"]  # nothing of sam's: readonly
        assert bcasts(sam) == [] and bcasts(nina) == []  # a sender does not get its own
    finally:
        await stop_all(nodes)
    # The event log: each node records its own deliveries of each BCAST (stopping flushed it).
    fanout = {node.name: sorted((r["session"], r["fanout"]) for r in event_records(node)
                                if r.get("message") == "broadcast" and r["kind"] == "accepted")
              for node in nodes}
    assert fanout == {
        "node1": [("nina", 0), ("sam", 1), ("sam", 1)],  # a1; nina's peer is on node 3
        "node2": [("sam", 1), ("sam", 1)],  # a2, once
        "node3": [("nina", 1), ("sam", 1), ("sam", 1)],  # a3; r3 for nina's
    }


def event_records(node: Node) -> list[dict]:
    import json

    return [json.loads(line) for path in sorted((node.data_dir / "events").rglob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


@pytest_twisted.ensureDeferred
async def test_ucast_to_another_node_is_refused_as_on_one_node_when_the_policy_says_so(
        tmp_path: Path, redis_server: RedisServer) -> None:
    ual = tmp_path / "ual"
    ual.write_text(UAL)
    nodes = await cluster(tmp_path, redis_server, count=3, ual_file=ual)
    try:
        allowed = await nodes[2].ssmp(b"a3")
        closed = await nodes[2].ssmp(b"r3")  # nobody may publish to accounts/r3
        local = await nodes[0].ssmp(b"r1")  # the same on node 1, for comparison
        sender = await nodes[0].ssmp(b"sam")
        for address in (b"a3", b"r3"):
            await until_owner(nodes[0], ("ssmp", address))
        before = len(sender.lines.items)
        sender.send(b"UCAST r1 psst", b"UCAST r3 psst", b"UCAST nobody psst", b"UCAST a3 hello")
        await sender.lines.count(before + 4).addTimeout(TIMEOUT, reactor())
        assert sender.lines.items[before:] == [b"405", b"405", b"404", b"200"]
        line = await allowed.next_line(lambda line: b"UCAST" in line).addTimeout(TIMEOUT, reactor())
        assert line == b"000 sam UCAST a3 hello"
        assert not [line for line in closed.lines.items + local.lines.items if b"UCAST" in line]
    finally:
        await stop_all(nodes)


async def until_owner(node: Node, address: tuple[str, bytes]) -> None:
    d: Deferred = Deferred()

    def check() -> None:
        if address in node.engine.directory.principals:
            d.callback(None)
        elif not d.called:
            reactor().callLater(0.02, check)

    check()
    await d.addTimeout(TIMEOUT, reactor())

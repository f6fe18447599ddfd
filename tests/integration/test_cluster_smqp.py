"""Three brokerd nodes sharing one redis-server (``--cluster``) and one PostgreSQL database
(``--store postgresql://``), with SMQP listening beside SSMP, MCCHAT and socket.mq: the 4x4
matrix (a publisher of every protocol on node 1, a subscriber of every protocol on every
node: each gets every message once, in order per publisher), and SMQP durable subscribers
served by another node than the one the messages were published on."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults

from brokerd.protocols.smqp.client import SMQPError
from tests.integration.cluster_nodes import TIMEOUT, Inbox, Node, Waiter, reactor
from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.integration import test_cluster_routing as routing
from tests.integration.test_cluster_routing import poll_until
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - the fixtures
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

TOPIC = b"room"
SMQP_TOPIC = "/room"
PROTOCOLS = ("ssmp", "mcchat", "socketmq", "smqp")


class AckingSMQP:
    """Collects an SMQP session's NOTIFY MESSAGEs and acknowledges each (310) as it comes, as
    a two-phase subscriber does; ``payloads`` is the first section of each, in arrival order."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.payloads: list[bytes] = []
        self.smuids: list[str] = []
        self.waiter = Waiter()
        self.acks: list[Deferred] = []
        client.notifyReceived = self.got

    def got(self, notify: Any) -> None:
        self.payloads.append(notify.body.sections[0].data)
        self.smuids.append(notify.body.get("Smuid"))
        self.acks.append(self.client.acknowledge())
        self.waiter(notify.body.sections[0].data)

    def until(self, last: bytes) -> Deferred:
        return self.waiter.until(lambda items: last in items)

    async def acknowledged(self) -> None:
        """Every acknowledgement sent so far was answered."""
        await gatherResults(list(self.acks)).addTimeout(TIMEOUT, reactor())


class Subscribers(routing.Subscribers):
    """One subscriber of each protocol on one node, subscribed to TOPIC (/room for SMQP)."""

    smqp: AckingSMQP | None = None

    @classmethod
    async def on(cls, node: Node, tag: str, smqp: bool = True) -> Subscribers:  # type: ignore[override]
        self = await super().on(node, tag)
        if smqp:
            session = await node.smqp("alice", f"sub_{tag}", ACCOUNTS["alice"])
            self.smqp = AckingSMQP(session)
            await session.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        return self  # type: ignore[return-value]

    def payloads(self) -> dict[str, list[bytes]]:
        found = super().payloads()
        if self.smqp is not None:
            found["smqp"] = list(self.smqp.payloads)
        return found

    def waits(self, last: bytes) -> list[Deferred]:
        waits = super().waits(last)
        if self.smqp is not None:
            waits.append(self.smqp.until(last))
        return waits


async def cluster(tmp_path: Path, redis: RedisServer, store: str, count: int = 3) -> list[Node]:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    nodes = []
    for index in range(1, count + 1):
        node = Node(tmp_path / f"node{index}", redis.url, f"node{index}", store=store, accounts_file=accounts)
        nodes.append(await node.start())
    return nodes


async def stop_all(nodes: list[Node]) -> None:
    for node in nodes:
        await node.stop()


async def create_room(node: Node) -> None:
    """alice creates /room (the topic tree is in PostgreSQL, every node sees it)."""
    owner = await node.smqp("alice", "owner", ACCOUNTS["alice"])
    await owner.create_topic(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())



async def publish_acknowledged(node: Node, count: int) -> tuple[list[bytes], Any]:
    """``count`` SMQP and ``count`` SSMP publishes to the durable topic on ``node``, in turn,
    each answered 200 (stored) before the next: the payloads in the order sent, and the SMQP
    publisher (still logged in)."""
    smqp_pub = await node.smqp("alice", "publisher", ACCOUNTS["alice"])
    ssmp_pub = await node.ssmp(b"publisher")
    sent = []
    for i in range(count):
        reply = await smqp_pub.publish(SMQP_TOPIC, f"m{i}", [("text/plain", f"smqp-{i}".encode())]) \
            .addTimeout(TIMEOUT, reactor())
        assert reply.code == 200, reply
        before = len(ssmp_pub.lines.items)
        ssmp_pub.send(b"MCAST room ssmp-%d" % i)
        await ssmp_pub.lines.count(before + 1).addTimeout(TIMEOUT, reactor())
        assert ssmp_pub.lines.items[before] == b"200", ssmp_pub.lines.items
        sent += [f"smqp-{i}".encode(), f"ssmp-{i}".encode()]
    return sent, smqp_pub

@pytest_twisted.ensureDeferred
async def test_four_protocols_reach_every_protocol_on_every_node_once_in_order(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """Publishers of the four protocols on node 1; a subscriber of each of the four protocols
    on every node.  The SMQP subscribers of nodes 2 and 3 subscribe once every node runs
    (node 1 learns of their subscriptions from their nodes' announcements) and are served
    live: their nodes are told of node 1's stored messages."""
    nodes = await cluster(tmp_path, redis_server, postgres_url)
    try:
        await create_room(nodes[0])
        for node in nodes[1:]:
            await holds(lambda node=node: node.smqp_factory.tree.get("room") is not None)
        groups = [await Subscribers.on(node, f"n{i}") for i, node in enumerate(nodes, 1)]
        for node in nodes[1:]:
            await node.engine.when_following(TOPIC).addTimeout(TIMEOUT, reactor())
        durable = nodes[0].broker.durable
        await holds(lambda: all(durable.index.count_of(f"alice:sub_n{i}") for i in (2, 3)))
        origin = nodes[0]
        ssmp_pub = await origin.ssmp(b"publisher")
        mc_pub = await origin.mcchat(Inbox())
        web_pub = await origin.socketmq()
        smqp_pub = await origin.smqp("alice", "publisher", ACCOUNTS["alice"])

        sent: dict[str, list[bytes]] = {protocol: [] for protocol in PROTOCOLS}
        for i in range(20):
            for protocol in sent:
                sent[protocol].append(f"{protocol}-{i}".encode())
            ssmp_pub.send(b"MCAST room ssmp-%d" % i)
            mc_pub.publish("room", "mc", f"mcchat-{i}")
            await web_pub.publish("room", f"socketmq-{i}").addTimeout(TIMEOUT, reactor())
            reply = await smqp_pub.publish(SMQP_TOPIC, f"m{i}", [("text/plain", f"smqp-{i}".encode())]) \
                .addTimeout(TIMEOUT, reactor())
            assert reply.code == 200, reply
        ssmp_pub.send(b"MCAST room the-end")
        for group in groups:
            await group.until(b"the-end").addTimeout(TIMEOUT, reactor())

        total = 20 * len(PROTOCOLS) + 1
        for group in groups:
            if group.smqp is not None:
                await group.smqp.acknowledged()
            for receiver, payloads in group.payloads().items():
                assert payloads[-1] == b"the-end", (group.node.name, receiver, payloads)
                assert len(payloads) == total, (group.node.name, receiver, payloads)  # each once
                for protocol, expected in sent.items():
                    got = [p for p in payloads if p.startswith(protocol.encode() + b"-")]
                    assert got == expected, (group.node.name, receiver, protocol)  # in order
        stats = [node.engine.stats for node in nodes]
        assert stats[0].messages_sent == total
        assert all(s.messages_received == total for s in stats[1:])
    finally:
        await stop_all(nodes)


def durable_payloads(inbox: AckingSMQP) -> list[bytes]:
    return list(inbox.payloads)


@pytest_twisted.ensureDeferred
async def test_durable_subscriber_served_by_node_2_after_publishing_on_node_1(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """alice:durable subscribes to /room on node 1 and leaves; SMQP and SSMP publishers on node
    1 are answered 200 (committed in PostgreSQL); alice:durable logs in on node 2 and gets
    every message once, in order, two-phase; after its acknowledgements nothing is pending
    for it on any node."""
    nodes = await cluster(tmp_path, redis_server, postgres_url, count=2)
    try:
        first, second = nodes
        await create_room(first)
        subscriber = await first.smqp("alice", "durable", ACCOUNTS["alice"])
        await subscriber.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        await subscriber.quit().addTimeout(TIMEOUT, reactor())

        sent, smqp_pub = await publish_acknowledged(first, 10)

        client = await second.smqp("alice", "durable", ACCOUNTS["alice"])
        inbox = AckingSMQP(client)
        await inbox.until(sent[-1]).addTimeout(TIMEOUT, reactor())
        await inbox.acknowledged()
        assert durable_payloads(inbox) == sent
        assert len(set(inbox.smuids)) == len(sent)
        await client.quit().addTimeout(TIMEOUT, reactor())

        # Acknowledged on node 2: back on node 1 it gets only what was published since.
        again = await first.smqp("alice", "durable", ACCOUNTS["alice"])
        later = AckingSMQP(again)
        reply = await smqp_pub.publish(SMQP_TOPIC, "later", [("text/plain", b"later")]).addTimeout(TIMEOUT, reactor())
        assert reply.code == 200, reply
        await later.until(b"later").addTimeout(TIMEOUT, reactor())
        await later.acknowledged()
        assert durable_payloads(later) == [b"later"]
    finally:
        await stop_all(nodes)


async def holds(condition: Any) -> None:
    """Wait (bounded) until ``condition()`` holds: another node's announcement was applied."""
    seen = Waiter()
    poll_until(condition, seen)
    await seen.count(1).addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_topic_created_on_node_1_is_usable_on_running_node_2(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """Both nodes run before /room exists; alice creates it on node 1; node 2 reads the tree
    again on node 1's announcement: there a SUBSCRIBE and a PUBLISH to /room are answered
    200 (404 before the change), and so is a topic made under /room on node 2, seen on node 1."""
    nodes = await cluster(tmp_path, redis_server, postgres_url, count=2)
    try:
        first, second = nodes
        client = await second.smqp("alice", "early", ACCOUNTS["alice"])
        with pytest.raises(SMQPError) as missing:
            await client.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        assert missing.value.code == 404
        await create_room(first)
        await holds(lambda: second.smqp_factory.tree.get("room") is not None)
        await client.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())  # raises unless 200
        reply = await client.publish(SMQP_TOPIC, "m", [("text/plain", b"on node 2")]).addTimeout(TIMEOUT, reactor())
        assert reply.code == 200, reply
        await client.create_topic(SMQP_TOPIC + "/inner").addTimeout(TIMEOUT, reactor())
        await holds(lambda: first.smqp_factory.tree.get("room/inner") is not None)
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_smqp_subscriber_on_node_2_receives_node_1_publishes_live(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """alice:live logs in on node 2 and subscribes to /room once both nodes run; node 1
    learns the subscription from node 2's announcement, so its SMQP and SSMP publishes are
    stored for alice:live, and node 2, told of the pending deliveries, offers them to the
    connected session at once: it gets every message once, in order, without reconnecting."""
    nodes = await cluster(tmp_path, redis_server, postgres_url, count=2)
    try:
        first, second = nodes
        await create_room(first)
        await holds(lambda: second.smqp_factory.tree.get("room") is not None)
        client = await second.smqp("alice", "live", ACCOUNTS["alice"])
        inbox = AckingSMQP(client)
        await client.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        await holds(lambda: first.broker.durable.covers(TOPIC))

        sent, _publisher = await publish_acknowledged(first, 10)
        await inbox.until(sent[-1]).addTimeout(TIMEOUT, reactor())
        await inbox.acknowledged()
        assert durable_payloads(inbox) == sent
        assert len(set(inbox.smuids)) == len(sent)

        # Unsubscribed on node 2: node 1 reads its subscriptions again and stores no more for it.
        await client.unsubscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        await holds(lambda: not first.broker.durable.covers(TOPIC))
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_changes_made_while_redis_is_away_are_read_again_once_it_is_back(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """Redis killed: /room is created on node 1 and alice:away subscribes to /room on node 2
    (both committed in PostgreSQL, their announcements lost).  Once Redis is back every node
    reads the durable state again: node 2 has /room, node 1 stores its publishes for
    alice:away, and the subscriber, connected on node 2 throughout, gets them live."""
    nodes = await cluster(tmp_path, redis_server, postgres_url, count=2)
    try:
        first, second = nodes
        owner = await first.smqp("alice", "owner", ACCOUNTS["alice"])
        client = await second.smqp("alice", "away", ACCOUNTS["alice"])
        inbox = AckingSMQP(client)
        redis_server.kill()
        await holds(lambda: all(node.engine.stats.outages >= 1 for node in nodes))

        await owner.create_topic(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        with pytest.raises(SMQPError) as missing:  # node 2 did not hear of it
            await client.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        assert missing.value.code == 404

        redis_server.start()
        for node in nodes:
            await node.engine.when_connected().addTimeout(TIMEOUT, reactor())
        await holds(lambda: second.smqp_factory.tree.get("room") is not None)
        redis_server.kill()
        await holds(lambda: all(node.engine.stats.outages >= 2 for node in nodes))
        await client.subscribe(SMQP_TOPIC).addTimeout(TIMEOUT, reactor())
        assert not first.broker.durable.covers(TOPIC)  # node 1 did not hear of it

        redis_server.start()
        for node in nodes:
            await node.engine.when_connected().addTimeout(TIMEOUT, reactor())
        await holds(lambda: first.broker.durable.covers(TOPIC))
        reply = await owner.publish(SMQP_TOPIC, "m", [("text/plain", b"after")]).addTimeout(TIMEOUT, reactor())
        assert reply.code == 200, reply
        await inbox.until(b"after").addTimeout(TIMEOUT, reactor())
        await inbox.acknowledged()
        assert durable_payloads(inbox) == [b"after"]
    finally:
        await stop_all(nodes)


async def nodes_seen(node: Node, names: set[str]) -> None:
    """Wait (bounded) until ``node``'s directory lists exactly ``names`` as the other live nodes."""
    seen = Waiter()
    poll_until(lambda: node.engine.other_nodes() == names, seen)
    await seen.count(1).addTimeout(TIMEOUT, reactor())


async def redirected(node: Node) -> tuple[int, tuple[str, ...]]:
    """A LOGIN on ``node``: the refusal's code and lines."""
    client = await node.smqp_connection()
    try:
        await client.login("bob", "extra", ACCOUNTS["bob"]).addTimeout(TIMEOUT, reactor())
    except SMQPError as error:
        await client.when_closed().addTimeout(TIMEOUT, reactor())
        return error.code, tuple(error.lines)
    raise AssertionError("the LOGIN over the limit was accepted")


@pytest_twisted.ensureDeferred
async def test_login_over_the_limit_is_redirected_to_the_live_nodes_of_the_directory(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """Every node may be given the same ``--smqp-redirect NAME=host:port`` list: node 1, at
    its connection limit, answers LOGIN with 311 and the SMQP address of another live node in
    turn (never its own); a node that left is skipped once the directory drops it; with no
    live node left the LOGIN gets 421."""
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    common = {"store": postgres_url, "accounts_file": accounts, "cluster_heartbeat": 0.5}
    second = await Node(tmp_path / "node2", redis_server.url, "node2", **common).start()
    third = await Node(tmp_path / "node3", redis_server.url, "node3", **common).start()
    targets = {"node2": f"127.0.0.1:{second.port('smqp')}", "node3": f"127.0.0.1:{third.port('smqp')}"}
    listed = f"node1=127.0.0.1:1,node2={targets['node2']},node3={targets['node3']}"
    first = await Node(tmp_path / "node1", redis_server.url, "node1", smqp_redirect=listed, **common).start()
    nodes = [first, second, third]
    try:
        await nodes_seen(first, {"node2", "node3"})
        first.broker.admissions.max_listener_connections = 1
        inside = await first.smqp("alice", "inside", ACCOUNTS["alice"])  # under the limit: served
        assert (await inside.noop()).code == 200

        answers = [await redirected(first) for _ in range(4)]
        assert answers == [(311, ("Redirect request", targets[name])) for name in ("node2", "node3") * 2]
        # The target is a node that serves: the client logs in there.
        moved = await second.smqp("bob", "moved", ACCOUNTS["bob"])
        assert (await moved.noop()).code == 200

        await second.stop()
        await nodes_seen(first, {"node3"})
        assert [await redirected(first) for _ in range(2)] == [(311, ("Redirect request", targets["node3"]))] * 2

        await third.stop()
        await nodes_seen(first, set())
        code, lines = await redirected(first)
        assert code == 421, lines
        assert (await inside.noop()).code == 200  # the admitted session is untouched
    finally:
        await stop_all(nodes)

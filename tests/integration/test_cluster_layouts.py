"""Durable delivery is the core's, whatever front ends a node runs.

Two nodes share a redis-server and a PostgreSQL database.  Node 1 runs one front end only
(SSMP, MCCHAT or socket.mq: no SMQP listener), node 2 runs only SMQP.  alice's SMQP
subscription on node 2 gets what is published on node 1 while she is online, while she is
logged out, and while node 2 is down: node 1's core stores every publish for her before it
answers (SSMP's 200, socket.mq's result), node 2 serves it when it is back, and once she has
acknowledged them nothing is pending for her any more."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from tests.integration.cluster_nodes import TIMEOUT, Inbox, Node, reactor
from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.integration.test_cluster_smqp import AckingSMQP
from tests.support.collect import eventually
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - the fixtures
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

ROOM = "/room"
OFFLINE_COUNT = 20


class Publisher:
    """A publisher of one protocol on node 1 that waits for what its protocol answers: SSMP's
    200 and socket.mq's result come once the message is stored; MCCHAT answers nothing, so a
    round trip (TLRQ) only shows the node has handled it."""

    def __init__(self, protocol: str, client: Any) -> None:
        self.protocol = protocol
        self.client = client

    @classmethod
    async def on(cls, node: Node, protocol: str) -> Publisher:
        if protocol == "ssmp":
            return cls(protocol, await node.ssmp(b"publisher"))
        if protocol == "mcchat":
            return cls(protocol, await node.mcchat(Inbox()))
        return cls(protocol, await node.socketmq())

    async def publish(self, text: str) -> None:
        client = self.client
        if self.protocol == "ssmp":
            before = len(client.lines.items)
            client.send(b"MCAST room " + text.encode())
            await client.lines.count(before + 1)
            assert client.lines.items[before] == b"200", client.lines.items
        elif self.protocol == "mcchat":
            client.publish("room", "publisher", text)
            await client.sync().addTimeout(TIMEOUT, reactor())
        else:
            result = await client.publish("room", text).addTimeout(TIMEOUT, reactor())
            assert result is None or getattr(result, "code", 200) == 200, result


def node_1(tmp_path: Path, redis: RedisServer, store: str, protocol: str) -> Node:
    return Node(tmp_path / "node1", redis.url, "node1", protocols=(protocol,), store=store,
                accounts_file=tmp_path / "accounts")


def node_2(tmp_path: Path, redis: RedisServer, store: str) -> Node:
    return Node(tmp_path / "node2", redis.url, "node2", protocols=("smqp",), store=store,
                accounts_file=tmp_path / "accounts")


async def alice(node: Node) -> AckingSMQP:
    return AckingSMQP(await node.smqp("alice", "durable", ACCOUNTS["alice"]))


@pytest.mark.parametrize("protocol", ["ssmp", "mcchat", "socketmq"])
@pytest_twisted.ensureDeferred
async def test_a_node_without_smqp_keeps_its_publishes_for_smqp_subscribers(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str, protocol: str) -> None:
    write_test_accounts(tmp_path / "accounts")
    first = await node_1(tmp_path, redis_server, postgres_url, protocol).start()
    second = await node_2(tmp_path, redis_server, postgres_url).start()
    nodes = [first, second]
    try:
        owner = await second.smqp("alice", "owner", ACCOUNTS["alice"])
        await owner.create_topic(ROOM).addTimeout(TIMEOUT, reactor())
        subscriber = await alice(second)
        await subscriber.client.subscribe(ROOM).addTimeout(TIMEOUT, reactor())
        durable = first.broker.durable
        assert durable is not None, "node 1 has a store, so its core keeps durable messages"
        await eventually(lambda: durable.topics.reachable("room") and durable.index.count_of("alice:durable"),
                         "node 1 to read the topic and alice's subscription")
        publisher = await Publisher.on(first, protocol)

        await publisher.publish("online")  # alice is logged in on node 2
        await subscriber.until(b"online").addTimeout(TIMEOUT, reactor())
        await subscriber.acknowledged()
        await subscriber.client.quit().addTimeout(TIMEOUT, reactor())

        await publisher.publish("while-logged-out")
        subscriber = await alice(second)
        await subscriber.until(b"while-logged-out").addTimeout(TIMEOUT, reactor())
        await subscriber.acknowledged()
        assert subscriber.payloads == [b"while-logged-out"]
        await subscriber.client.quit().addTimeout(TIMEOUT, reactor())

        await second.stop()
        sent = [f"offline-{i}" for i in range(OFFLINE_COUNT)]
        for text in sent:
            await publisher.publish(text)  # answered with node 2 down: stored by node 1
        second = nodes[1] = await node_2(tmp_path, redis_server, postgres_url).start()
        subscriber = await alice(second)
        await subscriber.until(sent[-1].encode()).addTimeout(TIMEOUT, reactor())
        await subscriber.acknowledged()
        assert subscriber.payloads == [text.encode() for text in sent]  # each once, in order
        await subscriber.client.quit().addTimeout(TIMEOUT, reactor())

        subscriber = await alice(second)  # nothing is pending any more: only what comes next
        await publisher.publish("after")
        await subscriber.until(b"after").addTimeout(TIMEOUT, reactor())
        await subscriber.acknowledged()
        assert subscriber.payloads == [b"after"]
    finally:
        for node in nodes:
            await node.stop()

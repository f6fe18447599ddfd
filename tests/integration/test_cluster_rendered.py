"""Rendered sections across nodes: the publishing node ships the wire bytes it rendered for its
own members, and a node whose members all take those formats sends them as they are.  Every
subscriber of a receiving node gets exactly the bytes the same subscriber on the publishing node
gets (its raw stream, compared whole), for runs, single messages, a binary payload MCCHAT cannot
carry (the run is decoded there and the payload dropped for MCCHAT as on one node) and a message
with details (decoded)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from brokerd.core.message import MULTICAST, Details, Message
from tests.integration.cluster_nodes import TIMEOUT, reactor
from tests.integration.test_cluster_routing import Subscribers, cluster, stop_all
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

RUN = 40


def record(protocol: Any) -> list[bytes]:
    """Every chunk of bytes ``protocol`` receives from now on (its ``dataReceived`` wrapped)."""
    chunks: list[bytes] = []
    received = protocol.dataReceived

    def data_received(data: bytes) -> None:
        chunks.append(data)
        received(data)

    protocol.dataReceived = data_received
    return chunks


class Raw:
    """The raw streams of one node's three subscribers, from when they were subscribed."""

    def __init__(self, group: Subscribers) -> None:
        self.group = group
        self.streams = {
            "ssmp": record(group.ssmp),
            "mcchat": record(group.mcchat),
            "socketmq": record(group.socketmq.connection),
        }

    def joined(self) -> dict[str, bytes]:
        return {name: b"".join(chunks) for name, chunks in self.streams.items()}


async def all_saw(groups: list[Subscribers], last: bytes) -> None:
    for group in groups:
        await group.until(last).addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_remote_subscribers_get_the_bytes_the_publishing_node_sends(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await cluster(tmp_path, redis_server)
    try:
        groups = [await Subscribers.on(node, f"n{i}") for i, node in enumerate(nodes, 1)]
        for node in nodes[1:]:
            await node.engine.when_following(b"room").addTimeout(TIMEOUT, reactor())
        raws = [Raw(group) for group in groups]
        origin = nodes[0]
        pub = await origin.ssmp(b"publisher")

        # A run in one write (rendered once on node 1, sent as it is by nodes 2 and 3).
        pub.send(*[b"MCAST room run-%d" % i for i in range(RUN)], b"MCAST room run-end")
        await all_saw(groups, b"run-end")
        # Single messages, each awaited.
        for i in range(3):
            pub.send(b"MCAST room one-%d" % i)
            await all_saw(groups, b"one-%d" % i)
        decoded_before = [node.engine.stats.envelopes_decoded for node in nodes[1:]]
        assert decoded_before == [0, 0]
        # A binary payload (SSMP's length prefix: 5 bytes with a NUL): MCCHAT cannot carry it,
        # so node 1 ships no MCCHAT bytes and the other nodes decode the run.
        pub.send(b"MCAST room \x00\x04b\x00in!")
        pub.send(b"MCAST room after-binary")
        await all_saw(groups, b"after-binary")
        # A message with details (an embedding program's): decoded on the receiving nodes.
        details = Details(content_type="text/plain", message_id="m-1")
        origin.broker.publish(Message(MULTICAST, b"room", b"with-details", "ssmp", b"embedded", details=details))
        pub.send(b"MCAST room the-end")
        await all_saw(groups, b"the-end")

        expected = [b"run-%d" % i for i in range(RUN)] + [b"run-end", b"one-0", b"one-1", b"one-2"]
        tail = [b"after-binary", b"with-details", b"the-end"]
        for group in groups:
            payloads = group.payloads()
            assert payloads["mcchat"] == expected + tail, group.node.name  # the binary one dropped
            assert payloads["socketmq"] == expected + [b"b\x00in!"] + tail, group.node.name
            assert len(payloads["ssmp"]) == len(expected) + 1 + len(tail), group.node.name

        local = raws[0].joined()
        assert local["ssmp"].count(b"\n") == len(expected) + 1 + len(tail)
        assert local["mcchat"].count(b"\x03room\x00") == len(expected) + len(tail)
        for raw in raws[1:]:
            assert raw.joined() == local, raw.group.node.name

        for node in nodes[1:]:
            stats = node.engine.stats
            # The binary message's run and the detailed message were decoded; nothing else was.
            assert stats.envelopes_decoded == 2, node.name
            assert stats.messages_received == len(expected) + 1 + len(tail)
            assert stats.envelopes_received >= 7
            # Delivery figures as on the publishing node, whose three subscribers are the same.
            assert node.broker.stats.delivered == origin.broker.stats.delivered, node.name
            assert node.broker.stats.routed_by == origin.broker.stats.routed_by, node.name
        assert origin.broker.stats.delivered == 3 * (len(expected) + len(tail)) + 2  # binary: ssmp + socketmq
    finally:
        await stop_all(nodes)

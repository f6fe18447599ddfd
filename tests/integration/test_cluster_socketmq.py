"""socket.mq request-reply across the nodes of a cluster (one real redis-server, three nodes,
one socket.mq policy file): a POST on node 1 for an application registered on node 3 is
answered by that application through node 1; an application nobody serves gets 404, a request
the policy refuses gets 496 (refused on node 1, and on node 3 when its policy refuses it), a
second registration of the name on another node 409, and once the application is gone, 404."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from brokerd.protocols.socketmq.api import Client, SocketMQError
from brokerd.protocols.socketmq.policy import load_policy
from tests.integration.cluster_nodes import TIMEOUT, Node, reactor
from tests.integration.test_cluster_routing import cluster, stop_all
from tests.support.collect import eventually
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

POLICY = """\
security = "disabled"

[[allow]]
clients = ["*"]
request = ["echo/ok-*", "nobody/*"]

[[allow]]
clients = ["@authenticated"]
serve = ["*"]
"""

STRICTER = POLICY.replace("echo/ok-*", "echo/ok-1")


def hub(node: Node) -> Any:
    return node.service.runtime.socketmq_hub


async def until(condition: Any) -> None:
    """Wait (bounded) until ``condition()`` holds: a registration is announced on the control
    channel, one Redis round trip away."""
    await eventually(condition, "a registration announced on the control channel")


async def request(node: Node, application: str, request_id: str, body: bytes = b"", **options: Any) -> Any:
    client = Client(f"http://127.0.0.1:{node.port('socketmq')}")
    node.clients.append(client)
    return await client.request(application, request_id, body, **options).addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_a_request_on_node_1_is_answered_by_the_application_on_node_3(
        tmp_path: Path, redis_server: RedisServer) -> None:
    policy = tmp_path / "socketmq.toml"
    policy.write_text(POLICY)
    nodes = await cluster(tmp_path, redis_server, count=3, socketmq_policy=policy)
    try:
        served: list[tuple[str, bytes, str | None]] = []

        def on_request(incoming: Any) -> None:
            served.append((incoming.request_id, incoming.body, incoming.content_type))
            incoming.respond(200, b"pong " + incoming.body, "text/plain")

        app = await nodes[2].socketmq()
        await app.login("open", "echo-app").addTimeout(TIMEOUT, reactor())
        await app.serve("echo", on_request).addTimeout(TIMEOUT, reactor())
        await until(lambda: all(hub(node).remote.served_elsewhere("echo") for node in nodes[:2]))

        reply = await request(nodes[0], "echo", "ok-1", b"hi", content_type="text/x-ping")
        assert (reply.status, reply.body) == (200, b"pong hi")
        assert reply.headers.getRawHeaders("content-type") == ["text/plain"]
        assert served == [("ok-1", b"hi", "text/x-ping")]

        assert (await request(nodes[0], "nobody", "ok-1")).status == 404
        refused = await request(nodes[0], "echo", "secret-1", b"no")  # refused by node 1's policy
        assert refused.status == 496
        assert hub(nodes[2]).remote.stats["served"] == 1  # it never left node 1

        other = await nodes[1].socketmq()
        await other.login("open", "impostor").addTimeout(TIMEOUT, reactor())
        with pytest.raises(SocketMQError) as info:
            await other.serve("echo", on_request).addTimeout(TIMEOUT, reactor())
        assert info.value.status == 409  # served on node 3, as a second registration on one node

        hub(nodes[2]).policy = load_policy(_write(tmp_path / "stricter.toml", STRICTER))
        refused = await request(nodes[0], "echo", "ok-2", b"no")  # node 1 allows it, node 3 does not
        assert refused.status == 496 and [s[0] for s in served] == ["ok-1"]
        reply = await request(nodes[1], "echo", "ok-1", b"again")  # and from node 2, still served
        assert (reply.status, reply.body) == (200, b"pong again")

        await app.close().addTimeout(TIMEOUT, reactor())
        await until(lambda: hub(nodes[0]).remote.served_elsewhere("echo") is None)
        assert (await request(nodes[0], "echo", "ok-1")).status == 404
    finally:
        await stop_all(nodes)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path

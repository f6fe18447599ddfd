"""A password-protected Redis: the password from --cluster-password-file or from the URL lets a
node in and routing works; a wrong one keeps the node out (it keeps serving its own clients)."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from tests.integration.cluster_nodes import TIMEOUT, Node, reactor, ssmp_subscribed
from tests.integration.test_cluster_routing import stop_all
from tests.support.redis import RedisServer
from tests.support.secrets import write_private

pytestmark = pytest.mark.slow


@pytest.fixture
def locked_redis(tmp_path: Path):
    server = RedisServer(tmp_path / "redis", "--requirepass", "s3cret").start()
    try:
        yield server
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_password_file_and_url_password(tmp_path: Path, locked_redis: RedisServer) -> None:
    secret = tmp_path / "redis-password"
    write_private(secret, "s3cret\n")
    url = f"redis://127.0.0.1:{locked_redis.port}"
    nodes = [
        await Node(tmp_path / "n1", url, "n1", cluster_password_file=secret).start(),
        await Node(tmp_path / "n2", f"redis://:s3cret@127.0.0.1:{locked_redis.port}/0", "n2").start(),
    ]
    try:
        sub = await nodes[1].ssmp(b"sub")
        await ssmp_subscribed(sub, b"room")
        await nodes[1].engine.when_following(b"room").addTimeout(TIMEOUT, reactor())
        pub = await nodes[0].ssmp(b"pub")
        pub.send(b"MCAST room let-in")
        line = await sub.next_line(lambda line: b"MCAST" in line).addTimeout(TIMEOUT, reactor())
        assert line == b"000 pub MCAST room let-in"
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_wrong_password_keeps_the_node_out_but_serving(tmp_path: Path, locked_redis: RedisServer) -> None:
    node = Node(tmp_path / "n1", f"redis://:wrong@127.0.0.1:{locked_redis.port}", "n1")
    from brokerd.tap import makeService

    node.service = makeService(node.settings, reactor())
    node.service.startService()
    try:
        from tests.integration.test_cluster_routing import poll_until
        from tests.integration.cluster_nodes import Waiter

        refused = Waiter()
        poll_until(lambda: node.engine.stats.outages >= 1, refused)
        await refused.count(1)
        assert not node.engine.connected
        local = await node.ssmp(b"local")
        await ssmp_subscribed(local, b"room")
        other = await node.ssmp(b"other")
        other.send(b"MCAST room still-served")
        line = await local.next_line(lambda line: b"MCAST" in line).addTimeout(TIMEOUT, reactor())
        assert line == b"000 other MCAST room still-served"
    finally:
        await stop_all([node])

"""The dead-node bound of docs/cluster.md (node liveness), checked: a node process killed with
SIGKILL has its session leave presence on another node within ``--cluster-node-timeout`` of
the kill, plus the stated tolerance.

The bound is counted from the last message the surviving node received from the dead one,
which is at or before the kill (plus its time through Redis); each node wakes up at the
quietest node's deadline instead of sweeping periodically, so no sweep interval is added.
TOLERANCE is what remains: that message's time through Redis and the reactor's lateness on a
loaded test machine.  This is a bound check, not a benchmark: the heartbeat is chosen two
thirds of the timeout so that a node sweeping once per heartbeat (up to timeout + heartbeat)
misses the bound."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.protocol import Factory

from tests.integration.cluster_nodes import TIMEOUT, LineProtocol, Node, reactor, ssmp_subscribed
from tests.support.broker import start_broker
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

NODE_TIMEOUT = 3.0
HEARTBEAT = 2.0
TOLERANCE = 0.4
"""Seconds beyond NODE_TIMEOUT: the victim's last message in transit and reactor lateness
(there is no sweep interval to add: see the module docstring)."""


@pytest_twisted.ensureDeferred
async def test_a_killed_nodes_session_leaves_presence_within_the_node_timeout(
        tmp_path: Path, redis_server: RedisServer) -> None:
    node = await Node(tmp_path / "survivor", redis_server.url, "survivor", cluster_heartbeat=HEARTBEAT,
                      cluster_node_timeout=NODE_TIMEOUT).start()
    (tmp_path / "victim").mkdir()
    victim_node = start_broker(
        tmp_path / "victim", "--open-login", "--no-event-log", "--cluster", redis_server.url, "--node-name",
        "victim", "--cluster-heartbeat", str(HEARTBEAT), "--cluster-node-timeout", str(NODE_TIMEOUT))
    try:
        watcher = await node.ssmp(b"watcher")
        watcher.send(b"SUBSCRIBE hall PRESENCE")
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", victim_node.ports["ssmp"])
        victim: LineProtocol = await endpoint.connect(Factory.forProtocol(LineProtocol))
        await victim.login(b"victim")
        await ssmp_subscribed(victim, b"hall")
        await watcher.next_line(lambda line: line == b"000 victim SUBSCRIBE hall").addTimeout(TIMEOUT, reactor())
        assert node.engine.other_nodes() == {"victim"}

        killed_at = time.monotonic()
        victim_node.process.send_signal(signal.SIGKILL)
        await watcher.next_line(lambda line: line == b"000 victim UNSUBSCRIBE hall").addTimeout(
            NODE_TIMEOUT + TIMEOUT, reactor())
        left_after = time.monotonic() - killed_at
        assert left_after <= NODE_TIMEOUT + TOLERANCE, f"left presence {left_after:.2f} s after the kill"
        # The positive side: it is the silence that expired it, not something sooner.
        assert left_after >= NODE_TIMEOUT - HEARTBEAT - TOLERANCE, left_after
        assert node.engine.members(b"hall") == [] and node.engine.other_nodes() == set()
    finally:
        victim_node.stop(signal.SIGKILL)
        await node.stop()

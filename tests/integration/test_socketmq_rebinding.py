"""socket.mq's ``self`` origin against DNS rebinding, over real WebSocket handshakes: a page
whose name was made to resolve to the broker sends its own name in both Host and Origin, so
they agree; ``self`` must still refuse it, because that name is not one of the broker's.
The broker's own names (loopback addresses, localhost, ``--server-names``) keep working."""
from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.protocol import Factory

from tests.integration.test_socketmq_hardening import (
    FrameClient, innocent_is_served, innocent_subscriber, post_from, response_head, upgrade_from,
)
from tests.support.live import TIMEOUT, reactor
from tests.support.socketmq import LiveBrokerd

REBOUND = "rebind.attacker.example"


async def opened_session(port: int, host: str, origin: str) -> FrameClient:
    """A WebSocket opened with this Host and Origin, once the broker said hello."""
    client: FrameClient = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(
        Factory.forProtocol(lambda: FrameClient(upgrade_from(host, origin))))
    await client.opened.addTimeout(TIMEOUT, reactor())
    await client.frames.count(1)  # hello: a session started
    return client


@pytest_twisted.ensureDeferred
async def test_self_refuses_a_rebound_name_and_serves_the_brokers_own(tmp_path: Any) -> None:
    brokerd = LiveBrokerd(tmp_path, server_names="broker.example")
    await brokerd.start()
    opened: list[FrameClient] = []
    try:
        innocent = await innocent_subscriber(brokerd, "calm")
        port = brokerd.http_port.getHost().port
        rebound = f"{REBOUND}:{port}"
        refused = await response_head(port, upgrade_from(rebound, f"http://{rebound}"))
        assert refused.startswith(b"HTTP/1.1 403 "), refused
        posted = await response_head(port, post_from(rebound, f"http://{rebound}"))
        assert posted.startswith(b"HTTP/1.1 403 "), posted
        assert len(brokerd.broker.sessions()) == 1  # only the innocent one
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"broker.example:{port}"):
            opened.append(await opened_session(port, host, f"http://{host}"))
        assert len(brokerd.broker.sessions()) == 4
        await innocent_is_served(brokerd, innocent, "calm", b"served during the attack")
    finally:
        for client in opened:
            client.transport.loseConnection()
        await brokerd.stop()

"""socket.mq's WebSocket keep-alive on real sockets: a peer that stops answering pings is
dropped, while one that answers them stays and is served.  Waits are on events (a ping, the
close), each bounded by TIMEOUT."""
from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import endpoints
from twisted.internet.defer import Deferred

from brokerd.protocols.socketmq.limits import SUBPROTOCOL
from tests.integration.test_socketmq_pubsub import RawWebSocket
from tests.support.live import TIMEOUT, Waiter, reactor
from tests.support.socketmq import LiveBrokerd

pytestmark = pytest.mark.slow

PING_INTERVAL = 0.2
PONG_TIMEOUT = 1.0
"""Short, so that the test is; the pong timeout long enough that a busy machine's slow turn of
the reactor does not drop the answering client before it has read its ping."""


class AnsweringWebSocket(RawWebSocket):
    """Answers the server's pings (Autobahn's default) and records them."""

    def __init__(self) -> None:
        super().__init__()
        self.pings = Waiter()

    def onPing(self, payload: bytes) -> None:
        self.pings(payload)
        super().onPing(payload)


class SilentWebSocket(AnsweringWebSocket):
    """A dead peer as the server sees it: it records the pings and never answers them."""

    def onPing(self, payload: bytes) -> None:
        self.pings(payload)


async def connect(brokerd: LiveBrokerd, kind: type[RawWebSocket]) -> Any:
    port = brokerd.http_port.getHost().port
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/socket.mq/ws", protocols=[SUBPROTOCOL])
    factory.protocol = kind
    protocol = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(factory)
    await protocol.opened.addTimeout(TIMEOUT, reactor())
    await protocol.messages.count(1)  # hello
    return protocol


@pytest.fixture
def brokerd(tmp_path: Any) -> Any:
    broker = LiveBrokerd(tmp_path, ping_interval=PING_INTERVAL, pong_timeout=PONG_TIMEOUT)
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


@pytest_twisted.ensureDeferred
async def test_a_peer_that_stops_answering_pings_is_dropped_and_one_that_answers_stays(brokerd: LiveBrokerd) -> None:
    answering = await connect(brokerd, AnsweringWebSocket)  # first: pinged no later than the other
    silent = await connect(brokerd, SilentWebSocket)
    assert await silent.pings.count(1) == [b""]
    code, _reason = await silent.closed.addTimeout(TIMEOUT, reactor())
    assert code == 1006  # dropped without a close frame: a dead peer would not answer one
    assert brokerd.broker.stats.connections == 1
    await answering.pings.count(2)  # pinged, answered, silent again, pinged again
    answering.sendMessage(b'{"type":"subscribe","id":1,"event":"still-here"}')
    (_hello, (result, _binary)) = await answering.messages.count(2)
    assert b'"id":1,"status":200' in result
    assert not answering.closed.called

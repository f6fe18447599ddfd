"""socket.mq's WebSocket keep-alive and close handshake on the hub's clock: sessions on
StringTransports, time on a MemoryReactorClock (a task.Clock), frames asserted as bytes.
Nothing here may wait for the global reactor: a timer scheduled there would never run."""
from __future__ import annotations

import pytest
from twisted.internet.error import ConnectionAborted
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.server import build_site
from brokerd.protocols.websocket import CLOSE_HANDSHAKE_TIMEOUT
from tests.protocols.socketmq.test_adapter import Server, masked, send

PING_INTERVAL = 30.0
PONG_TIMEOUT = 10.0
TICK = min(PING_INTERVAL, PONG_TIMEOUT) / 4
"""The keep-alive sweep's period (brokerd.protocols.socketmq.keepalive)."""
PING = b"\x89\x00"
"""An empty, unmasked, final WebSocket ping frame (RFC 6455 section 5.5.2)."""
PONG = masked(b"", opcode=0xA)
"""The client's answer: an empty, masked pong frame."""
SUBSCRIBE = b'{"type":"subscribe","id":1,"event":"news"}'


class KeepAliveServer(Server):
    """The in-memory socket.mq Site with the keep-alive's options set."""

    def __init__(self) -> None:
        self.clock = MemoryReactorClock()
        self.broker = Broker()
        settings = Settings(ping_interval=PING_INTERVAL, pong_timeout=PONG_TIMEOUT)
        self.hub = Hub(self.broker, self.clock, settings, portal=build_portal(open_login=True))
        self.site = build_site(self.hub, demo=False)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the clock, one sweep period at a time."""
        self.clock.pump([TICK] * round(seconds / TICK))


def ended(transport: StringTransport) -> None:
    """What the reactor reports once an aborted connection is gone."""
    transport.protocol.connectionLost(Failure(ConnectionAborted()))


@pytest.fixture
def server() -> KeepAliveServer:
    return KeepAliveServer()


def test_a_silent_session_is_pinged_once_the_ping_interval_has_passed(server: KeepAliveServer) -> None:
    ws = server.websocket()
    server.advance(PING_INTERVAL - TICK)
    assert ws.value() == b""
    server.advance(TICK)
    assert ws.value() == PING
    server.advance(PONG_TIMEOUT - TICK)
    assert ws.value() == PING and not ws.disconnecting  # one ping, then the wait for its pong


def test_a_session_that_does_not_answer_the_ping_is_dropped_and_one_that_does_stays(server: KeepAliveServer) -> None:
    silent, answering = server.websocket(), server.websocket()
    server.advance(PING_INTERVAL)
    assert silent.value() == answering.value() == PING
    answering.clear()
    answering.protocol.dataReceived(PONG)
    server.advance(PONG_TIMEOUT - TICK)
    assert not silent.disconnecting
    server.advance(TICK)
    assert silent.disconnected  # aborted: a dead peer would not answer a close frame either
    assert not answering.disconnecting and answering.value() == b""
    session = silent.protocol
    ended(silent)
    assert session.closed and session not in server.broker.sessions()
    server.advance(PING_INTERVAL)
    assert answering.value() == PING and not answering.disconnecting  # the pong reset its silence


def test_messages_count_as_life_before_and_after_a_ping(server: KeepAliveServer) -> None:
    ws = server.websocket()
    for n in range(3):  # a message within every ping interval: never pinged
        server.advance(PING_INTERVAL - TICK)
        assert b'"status":200' in send(ws, SUBSCRIBE.replace(b"news", b"n%d" % n))
    server.advance(PING_INTERVAL)  # silent from the first sweep after the message on
    assert ws.value() == b""
    server.advance(TICK)
    assert ws.value() == PING
    ws.clear()
    assert b'"status":200' in send(ws, SUBSCRIBE)  # instead of the pong
    server.advance(PONG_TIMEOUT)
    assert not ws.disconnecting and ws.value() == b""


def test_a_ping_from_the_client_is_answered_and_counts_as_life(server: KeepAliveServer) -> None:
    ws = server.websocket()
    server.advance(PING_INTERVAL)
    assert ws.value() == PING
    ws.clear()
    ws.protocol.dataReceived(masked(b"hi", opcode=0x9))
    assert ws.value() == b"\x8a\x02hi"  # its pong
    server.advance(PONG_TIMEOUT)
    assert not ws.disconnecting


def test_the_sweep_runs_only_while_sessions_are_open(server: KeepAliveServer) -> None:
    assert server.clock.getDelayedCalls() == []
    first, second = server.websocket(), server.websocket()
    keepalive = first.protocol.factory.keepalive
    assert len(server.clock.getDelayedCalls()) == 1 and len(keepalive.sweep.live) == 2
    ended(first)
    assert len(server.clock.getDelayedCalls()) == 1
    ended(second)
    assert server.clock.getDelayedCalls() == [] and not keepalive.sweep.live


def test_a_client_that_does_not_answer_our_close_frame_is_dropped_on_the_clock(server: KeepAliveServer) -> None:
    unanswered, answered = server.websocket(), server.websocket()
    for ws in (unanswered, answered):
        ws.protocol.dataReceived(masked(b"not json"))
        assert ws.value()[:1] == b"\x88" and ws.value()[2:4] == b"\x03\xef"  # close, 1007
    answered.protocol.dataReceived(masked(b"\x03\xef", opcode=0x8))
    assert answered.disconnected  # the close handshake is done: the server drops at once
    server.advance(CLOSE_HANDSHAKE_TIMEOUT - TICK)
    assert not unanswered.disconnecting
    server.advance(TICK)
    assert unanswered.disconnected


def test_no_timer_goes_to_the_global_reactor() -> None:
    """Autobahn's own timers (auto-ping, close handshake) would be txaio's reactor's."""
    from twisted.internet import reactor

    before = set(reactor.getDelayedCalls())
    server = KeepAliveServer()
    ws = server.websocket()
    ws.protocol.dataReceived(masked(b"not json"))
    assert ws.value()[:1] == b"\x88" and not ws.disconnecting  # closing: waiting for the answer
    assert [call for call in reactor.getDelayedCalls() if call not in before and call.active()] == []
    assert len(server.clock.getDelayedCalls()) == 2  # the sweep and the close handshake's timeout
    ended(ws)
    assert server.clock.getDelayedCalls() == []

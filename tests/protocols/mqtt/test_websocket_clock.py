"""MQTT over WebSocket's timers on the MQTT front end's clock: the socket.mq Site that serves
``/mqtt`` on StringTransports, the HTTP connection's deadline on the Site's MemoryReactorClock,
the MQTT connection and its WebSocket on the MQTT factory's Clock (tests/protocols/mqtt/
harness.py), frames asserted as bytes.  Nothing here may wait for the global reactor: a timer
scheduled there would never run, and one left there outlives the test."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.internet.error import ConnectionAborted
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from brokerd.auth.realm import build_portal
from brokerd.frontend import WebSocketMounts
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import MQTT_311, Connect
from brokerd.protocols.mqtt.websocket import mount
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.server import build_site
from brokerd.protocols.websocket import CLOSE_HANDSHAKE_TIMEOUT
from tests.protocols.mqtt.harness import Harness
from tests.protocols.socketmq.test_adapter import http_connection, masked

REQUEST_HEAD = (
    b"GET /mqtt HTTP/1.1\r\nHost: broker\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
UPGRADE = REQUEST_HEAD + b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
"""The opening handshake with RFC 6455's sample key (section 1.3) and MQTT's subprotocol (6.0)."""
CONNACK = b"\x82\x04\x20\x02\x00\x00"
"""A binary message holding the 3.1.1 CONNACK of an accepted CONNECT (3.2)."""
CLOSE_NORMAL = b"\x88\x02\x03\xe8"
"""The server's close frame, 1000, as it closes an MQTT connection (RFC 6455 section 5.5.1)."""
CLOSE_TEXT = b"\x88\x2b\x03\xebMQTT is sent in binary WebSocket messages"
"""The server's close frame for a text message, 1003 (MQTT-6.0.0-1)."""
KEEP_ALIVE = 2
"""A CONNECT's Keep Alive, in seconds: the server closes after 1.5 times that of silence."""
SWEEP = 1.0
"""The MQTT factory's keep-alive sweep period (server.MQTTServerFactory): silence is seen that late."""
TICK = 0.25
"""The step the MQTT factory's clock advances by (harness.Harness.elapse)."""


class Connection(StringTransport):
    """A StringTransport whose ``unregisterProducer`` without a producer does nothing, as a
    TCP (or TLS) transport's does: the MQTT protocol unregisters as it closes, Autobahn again
    as it drops the connection."""

    def unregisterProducer(self) -> None:
        if self.producer is not None:
            super().unregisterProducer()


class WebSocketServer(Harness):
    """An MQTT front end on a Clock, mounted at ``/mqtt`` on a socket.mq Site whose own clock
    (the HTTP connections' deadlines) is another one."""

    def __init__(self) -> None:
        super().__init__()
        self.site_clock = MemoryReactorClock()
        mounts = WebSocketMounts()
        mount(mounts, self.factory)
        hub = Hub(self.broker, self.site_clock, self.settings, portal=build_portal(open_login=True))
        self.hub = hub
        self.site = build_site(hub, demo=False, mounts=mounts)

    def http(self) -> StringTransport:
        """A new HTTP connection to the Site."""
        return http_connection(self.site, Connection())

    def websocket(self, keep_alive: int = 0) -> StringTransport:
        """An upgraded ``/mqtt`` connection whose CONNECT (with ``keep_alive``; 0: none) was
        accepted; what the server wrote is cleared."""
        transport = self.http()
        transport.protocol.dataReceived(UPGRADE)
        head, _, rest = transport.value().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        assert b"\r\nSec-WebSocket-Protocol: mqtt" in head and rest == b""
        transport.clear()
        transport.protocol.dataReceived(masked(encode(Connect(f"c{id(transport)}", keep_alive=keep_alive), MQTT_311),
                                               opcode=0x2))
        assert transport.value() == CONNACK
        transport.clear()
        return transport


def ended(transport: StringTransport) -> None:
    """What the reactor reports once an aborted connection is gone."""
    transport.protocol.connectionLost(Failure(ConnectionAborted()))


@pytest.fixture
def server() -> WebSocketServer:
    return WebSocketServer()


@pytest.fixture
def global_reactor() -> Iterator[set[object]]:
    """The global reactor's delayed calls before the test (and a check that no new one is
    left after it)."""
    from twisted.internet import reactor

    before = set(reactor.getDelayedCalls())
    yield before
    assert new_global_timers(before) == []


def new_global_timers(before: set[object]) -> list[object]:
    """The global reactor's pending delayed calls that were not there ``before``."""
    from twisted.internet import reactor

    return [call for call in reactor.getDelayedCalls() if call not in before and call.active()]


def test_a_client_that_does_not_answer_our_close_frame_is_dropped_on_the_clock(server: WebSocketServer) -> None:
    unanswered, answered = server.websocket(), server.websocket()
    for ws in (unanswered, answered):
        ws.protocol.dataReceived(masked(b"not MQTT"))  # a text message: closed with 1003
        assert ws.value() == CLOSE_TEXT and not ws.disconnecting
    answered.protocol.dataReceived(masked(b"\x03\xeb", opcode=0x8))
    assert answered.disconnected  # the close handshake is done: the server drops at once
    ended(answered)
    server.elapse(CLOSE_HANDSHAKE_TIMEOUT - TICK)
    assert not unanswered.disconnecting
    server.elapse(TICK)
    assert unanswered.disconnected  # aborted, with nothing more written
    assert unanswered.value() == CLOSE_TEXT
    ended(unanswered)
    assert server.broker.stats.connections == 0


def test_the_close_after_an_mqtt_keep_alive_timeout_is_bounded_on_the_same_clock(server: WebSocketServer) -> None:
    silent, answering = server.websocket(KEEP_ALIVE), server.websocket(KEEP_ALIVE)
    server.elapse(1.5 * KEEP_ALIVE + SWEEP)  # 3.1.2.10: the server closes the network connection
    assert silent.value() == answering.value() == CLOSE_NORMAL
    answering.protocol.dataReceived(masked(b"\x03\xe8", opcode=0x8))
    assert answering.disconnected
    ended(answering)
    server.elapse(CLOSE_HANDSHAKE_TIMEOUT - TICK)
    assert not silent.disconnecting
    server.elapse(TICK)
    assert silent.disconnected


def test_the_opening_handshake_leaves_no_timer_on_the_global_reactor(server: WebSocketServer,
                                                                      global_reactor: set[object]) -> None:
    """Autobahn's opening-handshake timer would be txaio's reactor's, from the upgrade until
    it succeeds or the connection has ended (so still there after a refusal): the whole
    upgrade request has arrived before Autobahn sees it, so it never had anything to do."""
    refused = server.http()
    refused.protocol.dataReceived(REQUEST_HEAD + b"\r\n")  # no subprotocol mqtt: refused (6.0)
    assert refused.value().startswith(b"HTTP/1.1 400 ") and refused.disconnecting
    accepted = server.websocket()
    assert new_global_timers(global_reactor) == []
    ended(refused)
    ended(accepted)


def test_the_close_handshake_leaves_no_timer_on_the_global_reactor(server: WebSocketServer,
                                                                    global_reactor: set[object]) -> None:
    ws = server.websocket()
    before = set(server.clock.getDelayedCalls())  # the MQTT factory's keep-alive sweep
    ws.protocol.dataReceived(masked(b"not MQTT"))
    assert ws.value() == CLOSE_TEXT and not ws.disconnecting  # closing: waiting for the answer
    assert new_global_timers(global_reactor) == []
    assert [call.getTime() for call in server.clock.getDelayedCalls() if call not in before] \
        == [server.clock.seconds() + CLOSE_HANDSHAKE_TIMEOUT]
    ended(ws)
    assert set(server.clock.getDelayedCalls()) == before  # the close handshake's timer is cancelled


def test_an_unfinished_upgrade_to_mqtt_gets_408_after_the_handshake_timeout_on_the_sites_clock(
        server: WebSocketServer, global_reactor: set[object]) -> None:
    """The opening handshake's deadline is the HTTP connection's (--socketmq-handshake-timeout
    from the request's first byte), on the clock of the Site that owns the connection."""
    slow, prompt = server.http(), server.http()
    slow.protocol.dataReceived(REQUEST_HEAD)
    prompt.protocol.dataReceived(REQUEST_HEAD)
    server.site_clock.advance(server.hub.handshake_timeout - 1)
    prompt.protocol.dataReceived(b"Sec-WebSocket-Protocol: mqtt\r\n\r\n")
    assert prompt.value().startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert slow.value() == b"" and not slow.disconnecting
    server.site_clock.advance(1)
    assert slow.value().startswith(b"HTTP/1.1 408 Request Timeout\r\n") and slow.disconnecting
    assert not prompt.disconnecting
    ended(prompt)

"""socket.mq publish-subscribe end to end on real sockets: WebSocket subscribers, delivery
across protocols (SSMP -> socket.mq and socket.mq -> SSMP), binary payloads carried intact,
the brokerless server's subscribe callback (accept and reject), and bad WebSocket input."""
from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import endpoints
from twisted.internet.defer import Deferred

from brokerd.protocols.socketmq.api import Client, Server, SocketMQError, Subscription
from tests.support.collect import called
from tests.support.live import TIMEOUT, Waiter, reactor
from tests.support.socketmq import LiveBrokerd


@pytest.fixture
def brokerd(tmp_path: Any) -> Any:
    broker = LiveBrokerd(tmp_path)
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


async def ws_client(brokerd: LiveBrokerd, **kwargs: Any) -> Client:
    client = brokerd.track(Client(brokerd.url, **kwargs))
    await client.connect()
    return client


@pytest_twisted.ensureDeferred
async def test_ssmp_mcast_reaches_socketmq_subscriber(brokerd: LiveBrokerd) -> None:
    client = await ws_client(brokerd)
    events = Waiter()
    await client.subscribe("a/b", events)
    sam = await brokerd.ssmp(b"sam")
    sam.send(b"MCAST a/b hello from ssmp")
    (event,) = await events.count(1)
    assert (event.event, event.data, event.binary) == ("a/b", b"hello from ssmp", False)
    assert (event.sender, event.protocol) == ("sam", "ssmp")


@pytest_twisted.ensureDeferred
async def test_socketmq_publish_reaches_ssmp_subscriber(brokerd: LiveBrokerd) -> None:
    sam = await brokerd.ssmp(b"sam")
    sam.send(b"SUBSCRIBE a/b")
    await sam.lines.count(2)
    assert sam.lines.items[1] == b"200"
    client = await ws_client(brokerd)
    await client.publish("a/b", "hi from the web")
    line = await sam.next_line(lambda line: b"MCAST" in line)
    assert line == b"000 socketmq:anonymous MCAST a/b hi from the web"


@pytest_twisted.ensureDeferred
async def test_binary_payload_is_carried_intact(brokerd: LiveBrokerd) -> None:
    payload = bytes(range(256)) * 3 + b"\n\x00\n"
    subscriber = await ws_client(brokerd)
    events = Waiter()
    await subscriber.subscribe("bin", events)
    publisher = await ws_client(brokerd)
    await publisher.publish("bin", payload)
    (event,) = await events.count(1)
    assert event.binary and event.data == payload and event.protocol == "socketmq"


@pytest_twisted.ensureDeferred
async def test_publisher_does_not_get_its_own_event(brokerd: LiveBrokerd) -> None:
    client = await ws_client(brokerd)
    events = Waiter()
    await client.subscribe("echo/self", events)
    other = await ws_client(brokerd)
    others = Waiter()
    await other.subscribe("echo/self", others)
    await client.publish("echo/self", "one")
    assert [event.data for event in await others.count(1)] == [b"one"]  # it was published
    # the publisher's connection gets the next event, which the broker routed after "one":
    # had "one" come back to its publisher, it would be first
    await other.publish("echo/self", "two")
    assert [event.data for event in await events.count(1)] == [b"two"]


@pytest_twisted.ensureDeferred
async def test_subscribe_twice_and_unsubscribe_unknown(brokerd: LiveBrokerd) -> None:
    client = await ws_client(brokerd)
    await client.subscribe("t", Waiter())
    with pytest.raises(SocketMQError) as twice:
        await client.subscribe("t", Waiter())
    assert twice.value.status == 409
    await client.unsubscribe("t")
    with pytest.raises(SocketMQError) as unknown:
        await client.unsubscribe("t")
    assert unknown.value.status == 404


@pytest_twisted.ensureDeferred
async def test_brokerless_subscribe_callback_accepts_and_rejects() -> None:
    decisions: list[tuple[str, Any]] = []

    def on_subscribe(subscription: Subscription) -> None:
        decisions.append((subscription.event, subscription.client_id))
        if subscription.event.startswith("public/"):
            subscription.accept()
        else:
            reactor().callLater(0.01, subscription.reject, 451)

    server = Server("sensor", lambda request: request.respond(200), on_subscribe=on_subscribe)
    await server.listen("tcp:0:interface=127.0.0.1")
    client = Client(f"http://127.0.0.1:{server.port}")
    try:
        await client.connect()
        events = Waiter()
        await client.subscribe("public/temperature", events)
        with pytest.raises(SocketMQError) as rejected:
            await client.subscribe("private/secrets", Waiter())
        assert rejected.value.status == 451
        assert server.publish("public/temperature", "21.5") == 1
        assert server.publish("private/secrets", "nobody") == 0
        (event,) = await events.count(1)
        assert (event.data, event.sender) == (b"21.5", "sensor")
        assert decisions == [("public/temperature", None), ("private/secrets", None)]
    finally:
        connection = client.connection
        await client.close()
        await server.close()
    code, _reason = await connection.closed  # close() leaves the code for others waiting
    assert code == 1000


class RawWebSocket(WebSocketClientProtocol):
    """Sends whatever the test gives it; records messages and the close code."""

    def __init__(self) -> None:
        super().__init__()
        self.messages = Waiter()
        self.closed: Deferred = Deferred()
        self.opened: Deferred = Deferred()

    def onOpen(self) -> None:
        self.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages((payload, isBinary))

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        if not self.opened.called:
            self.opened.errback(ConnectionError(f"{code} {reason}"))
        self.closed.callback((code, reason))


async def raw_ws(brokerd: LiveBrokerd, protocols: list[str] | None = None) -> RawWebSocket:
    port = brokerd.http_port.getHost().port
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/socket.mq/ws", protocols=protocols if protocols is not None else ["socketmq.v1"])
    factory.protocol = RawWebSocket
    factory.setProtocolOptions(maxMessagePayloadSize=0, maxFramePayloadSize=0)
    protocol: RawWebSocket = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(factory)
    await protocol.opened.addTimeout(TIMEOUT, reactor())
    await protocol.messages.count(1)  # hello
    return protocol


@pytest_twisted.ensureDeferred
async def test_websocket_without_subprotocol_is_refused(brokerd: LiveBrokerd) -> None:
    from tests.integration.test_socketmq_request_reply import raw_http

    upgrade = (
        b"GET /socket.mq/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    )
    refused = await raw_http(brokerd, upgrade + b"\r\n")
    assert refused.startswith(b"HTTP/1.1 400 ") and b"socketmq.v1" in refused
    with pytest.raises(ConnectionError):
        await raw_ws(brokerd, protocols=["other.v9"])
    assert brokerd.broker.stats.connections == 0


@pytest_twisted.ensureDeferred
async def test_malformed_json_closes_with_1007(brokerd: LiveBrokerd) -> None:
    ws = await raw_ws(brokerd)
    ws.sendMessage(b'{"type": "subscribe", "event": ')
    code, _reason = await ws.closed.addTimeout(TIMEOUT, reactor())
    assert code == 1007


@pytest_twisted.ensureDeferred
async def test_binary_message_without_header_closes_with_1007(brokerd: LiveBrokerd) -> None:
    ws = await raw_ws(brokerd)
    ws.sendMessage(b"\x00\x01 no header", isBinary=True)
    code, _reason = await ws.closed.addTimeout(TIMEOUT, reactor())
    assert code == 1007


@pytest_twisted.ensureDeferred
async def test_invalid_requests_get_results_and_the_connection_stays(brokerd: LiveBrokerd) -> None:
    ws = await raw_ws(brokerd)
    ws.sendMessage(b'{"type": "teleport", "id": 1}')
    ws.sendMessage(b'{"type": "subscribe", "id": 2, "event": ""}')
    ws.sendMessage(b'{"type": "subscribe", "id": 3, "event": "ok"}')
    items = await ws.messages.count(4)
    results = [item[0] for item in items[1:]]
    assert b'"id":1,"status":501' in results[0]
    assert b'"id":2,"status":400' in results[1]
    assert b'"id":3,"status":200' in results[2]


@pytest_twisted.ensureDeferred
async def test_oversized_websocket_message_closes_with_1009(brokerd: LiveBrokerd) -> None:
    ws = await raw_ws(brokerd)
    ws.sendMessage(b'{"type":"publish","event":"big"}\n' + b"x" * (2 << 20), isBinary=True)
    code, _reason = await ws.closed.addTimeout(TIMEOUT, reactor())
    assert code == 1009


@pytest_twisted.ensureDeferred
async def test_connections_are_counted_and_released(brokerd: LiveBrokerd) -> None:
    client = await ws_client(brokerd)
    assert brokerd.broker.stats.connections == 1
    released = called(brokerd.broker.admissions, "_release", lambda: brokerd.broker.stats.connections == 0)
    await client.close()
    brokerd.clients.remove(client)
    await released

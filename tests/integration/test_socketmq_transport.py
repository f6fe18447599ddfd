"""socket.mq transport behaviour on real sockets: TLS listeners (HTTPS and WSS) with client
certificate identities, slow WebSocket consumers (bounded buffer, drop and count, the
``dropped`` notice, disconnect after SLOW_CONSUMER_TIMEOUT) and the connection limit."""
from __future__ import annotations

import json
import os
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateResponseAccept
from twisted.internet import endpoints
from twisted.internet.defer import Deferred

from brokerd.auth.tls import ServerTLS, client_context, listen_endpoint
from brokerd.core.message import MULTICAST, Message
from brokerd.protocols.socketmq import session as session_module
from brokerd.protocols.socketmq.api import Client, IncomingRequest
from tests.integration.test_socketmq_pubsub import RawWebSocket
from tests.support.certs import CLIENT_NAME, SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401
from tests.support.live import TIMEOUT, reactor, sleep
from tests.support.socketmq import LiveBrokerd

BUFFER = 64 * 1024


@pytest.fixture
def tls_brokerd(tmp_path: Any, pki: TestPKI) -> Any:  # noqa: F811
    broker = LiveBrokerd(tmp_path)
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    endpoint = listen_endpoint(reactor(), tls, "tls:0:interface=127.0.0.1")
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start(endpoint)))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


@pytest.fixture
def small_buffer_brokerd(tmp_path: Any) -> Any:
    broker = LiveBrokerd(tmp_path, max_output_buffer=BUFFER)
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


@pytest_twisted.ensureDeferred
async def test_https_request_carries_the_client_certificate_identity(tls_brokerd: LiveBrokerd, pki: TestPKI) -> None:  # noqa: F811
    seen: list[IncomingRequest] = []

    def on_request(request: IncomingRequest) -> None:
        seen.append(request)
        request.respond(200, b"hello " + (request.client_id or "?").encode())

    # The application itself connects over WSS with its certificate: authenticated by TLS.
    app = tls_brokerd.track(
        Client(tls_brokerd.tls_url, tls=client_context(SERVER_HOSTNAME, pki.ca, pki.client.cert, pki.client.key))
    )
    connection = await app.connect()
    await app.serve("greeter", on_request)
    (session,) = [s for s in tls_brokerd.broker.sessions() if s.client_id == CLIENT_NAME]
    assert session.names[0] == CLIENT_NAME and connection.identity is None

    caller = tls_brokerd.track(
        Client(tls_brokerd.tls_url, tls=client_context(SERVER_HOSTNAME, pki.ca, pki.client.cert, pki.client.key))
    )
    reply = await caller.request("greeter", "hi", b"")
    assert (reply.status, reply.body) == (200, b"hello alice")
    anonymous = tls_brokerd.track(Client(tls_brokerd.tls_url, tls=client_context(SERVER_HOSTNAME, pki.ca)))
    reply = await anonymous.request("greeter", "hi", b"")
    assert (reply.status, reply.body) == (200, b"hello ?")
    assert [r.client_id for r in seen] == [CLIENT_NAME, None]


async def stalled_subscriber(brokerd: LiveBrokerd, event: str, deflate: bool = False) -> tuple[RawWebSocket, Any]:
    port = brokerd.http_port.getHost().port
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/socket.mq/ws", protocols=["socketmq.v1"])
    factory.protocol = RawWebSocket
    factory.setProtocolOptions(maxMessagePayloadSize=0, maxFramePayloadSize=0)
    if deflate:
        factory.setProtocolOptions(
            perMessageCompressionOffers=[PerMessageDeflateOffer()],
            perMessageCompressionAccept=lambda response: PerMessageDeflateResponseAccept(response),
        )
    ws: RawWebSocket = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(factory)
    await ws.opened.addTimeout(TIMEOUT, reactor())
    ws.sendMessage(json.dumps({"type": "subscribe", "id": 1, "event": event}).encode())
    await ws.messages.count(2)
    assert b'"status":200' in ws.messages.items[1][0]
    (session,) = [s for s in brokerd.broker.sessions() if brokerd.broker.is_subscribed(s, event.encode())]
    ws.transport.pauseProducing()  # the client stops reading
    return ws, session


def buffered(transport: Any) -> int:
    return len(transport.dataBuffer) + transport._tempDataLen  # noqa: SLF001 - the number under test


@pytest.mark.slow
@pytest.mark.parametrize("path", ["fast-path", "send-prepared-message", "deflate"])
@pytest_twisted.ensureDeferred
async def test_slow_consumer_is_bounded_then_told_what_it_missed(
    small_buffer_brokerd: LiveBrokerd, monkeypatch: Any, path: str
) -> None:
    """The same bound and notice whichever way the session sends (session.FAST_FANOUT, or
    Autobahn's sendPreparedMessage, which compresses when deflate was negotiated)."""
    brokerd = small_buffer_brokerd
    if path != "fast-path":
        monkeypatch.setattr(session_module, "FAST_FANOUT", False)
    monkeypatch.setattr(brokerd.hub, "deflate", path == "deflate")
    ws, session = await stalled_subscriber(brokerd, "flood", deflate=path == "deflate")
    assert len(session.websocket_extensions_in_use) == (path == "deflate")
    size = 16384
    sent = 0
    for _round in range(200):
        for _ in range(50):
            payload = os.urandom(size // 2).hex().encode()  # new each time: deflate halves it, no more
            brokerd.broker.publish(Message(MULTICAST, b"flood", payload, "ssmp", b"firehose"))
            sent += 1
            assert buffered(session.transport) <= BUFFER + 2 * len(payload)
        if session.dropped:
            break
        await sleep(0.01)
    assert session.dropped > 0
    assert brokerd.broker.stats.slow_consumer_drops == session.dropped
    ws.transport.resumeProducing()
    received = await ws.messages.until(lambda items: any(b'"type":"dropped"' in item[0][:40] for item in items))
    notice = next(json.loads(item[0]) for item in received if b'"type":"dropped"' in item[0][:40])
    assert notice == {"type": "dropped", "count": session.dropped}
    events = [item for item in received if item[0].startswith(b'{"type":"event"')]
    assert len(events) + session.dropped <= sent


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_consumer_congested_too_long_is_disconnected(small_buffer_brokerd: LiveBrokerd, monkeypatch: Any) -> None:
    monkeypatch.setattr(session_module, "SLOW_CONSUMER_TIMEOUT", 0.5)
    brokerd = small_buffer_brokerd
    ws, session = await stalled_subscriber(brokerd, "flood")
    for _ in range(int(TIMEOUT / 0.05)):  # keep the pressure on until the broker gives up
        for _ in range(100):
            brokerd.broker.publish(Message(MULTICAST, b"flood", b"y" * 16384, "ssmp", b"firehose"))
        if session.closed:
            break
        await sleep(0.05)
    assert session.dropped > 0
    assert session.closed and session not in brokerd.broker.sessions()
    assert brokerd.broker.stats.connections == 0
    ws.transport.resumeProducing()  # the stalled client only notices once it reads again
    await ws.closed.addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_connection_limit_answers_503(tmp_path: Any) -> None:
    brokerd = LiveBrokerd(tmp_path, max_connections=1)
    await brokerd.start()
    try:
        first = brokerd.track(Client(brokerd.url))
        await first.connect()
        second = brokerd.track(Client(brokerd.url))
        reply = await second.request("any", "x", b"")
        assert reply.status == 503
        assert brokerd.broker.stats.refused_connections == 1
    finally:
        await brokerd.stop()


@pytest_twisted.ensureDeferred
async def test_demo_page_and_javascript_client_are_served(tmp_path: Any) -> None:
    from brokerd.protocols.socketmq.api import read_body
    from twisted.web.client import Agent, HTTPConnectionPool

    brokerd = LiveBrokerd(tmp_path)
    await brokerd.start()
    agent = Agent(reactor(), pool=HTTPConnectionPool(reactor(), persistent=False))
    try:
        page = await agent.request(b"GET", (brokerd.url + "/socket.mq/demo/").encode())
        html = await read_body(page)
        assert page.code == 200 and b'from "/socket.mq/socketmq.js"' in html
        script = await agent.request(b"GET", (brokerd.url + "/socket.mq/socketmq.js").encode())
        source = await read_body(script)
        assert script.headers.getRawHeaders(b"Content-Type") == [b"text/javascript; charset=utf-8"]
        assert b"export function connect" in source
        redirect = await agent.request(b"GET", (brokerd.url + "/socket.mq/demo").encode())
        await read_body(redirect)
        assert redirect.code in (301, 302, 303, 307, 308)
        root = await agent.request(b"GET", (brokerd.url + "/").encode())  # docs/socketmq.md: / goes to the demo
        await read_body(root)
        assert root.code in (301, 302, 303, 307, 308)
        assert root.headers.getRawHeaders(b"Location") == [b"/socket.mq/demo/"]
        missing = await agent.request(b"GET", (brokerd.url + "/elsewhere").encode())
        await read_body(missing)
        assert missing.code == 404
    finally:
        await brokerd.stop()

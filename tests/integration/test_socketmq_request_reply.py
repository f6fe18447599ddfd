"""socket.mq request-reply end to end on real sockets: brokerless (an embedded Server) and
brokered (an application registered on brokerd over its WebSocket), with every documented
status brokerd itself answers: 404, 405, 409, 413, 496, 502, 503, 504."""
from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory

from brokerd.protocols.socketmq.api import Client, IncomingRequest, Server, SocketMQError, listen
from tests.support.collect import called
from tests.support.live import TIMEOUT, LineProtocol, Waiter, reactor
from tests.support.socketmq import LiveBrokerd


@pytest.fixture
def brokerd(tmp_path: Any) -> Any:
    broker = LiveBrokerd(tmp_path, socketmq_request_timeout=0.5)
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


def echo(request: IncomingRequest) -> None:
    request.respond(200, b"echo " + request.request_id.encode() + b": " + request.body, "text/plain")


async def application(brokerd: LiveBrokerd, name: str, on_request: Any, identity: str = "app") -> Client:
    app = brokerd.track(Client(brokerd.url))
    await app.connect()
    await app.login("open", identity)
    await app.serve(name, on_request)
    return app


# ---------------------------------------------------------------------- brokerless


@pytest_twisted.ensureDeferred
async def test_brokerless_request_reply() -> None:
    seen: list[IncomingRequest] = []

    def on_request(request: IncomingRequest) -> None:
        seen.append(request)
        reactor().callLater(0.01, request.respond, 201, b"created " + request.body)

    server: Server = await listen("tcp:0:interface=127.0.0.1", "store", None, on_request)
    client = Client(f"http://127.0.0.1:{server.port}")
    try:
        reply = await client.request("store", "put-1", b"\x00payload", content_type="application/x-thing", interface_version="2")
        assert (reply.status, reply.body) == (201, b"created \x00payload")
        assert reply.headers.getRawHeaders(b"Socket-MQ-Version") == [b"1"]
        (request,) = seen
        assert (request.application, request.request_id, request.client_id) == ("store", "put-1", None)
        assert (request.version, request.content_type) == ("2", "application/x-thing")
        other = await client.request("elsewhere", "x", b"")
        assert other.status == 404
    finally:
        await client.close()
        await server.close()


@pytest_twisted.ensureDeferred
async def test_brokerless_callback_failure_is_500() -> None:
    def on_request(request: IncomingRequest) -> None:
        raise RuntimeError("boom")

    server = Server("fragile", on_request)
    await server.listen("tcp:0:interface=127.0.0.1")
    client = Client(f"http://127.0.0.1:{server.port}")
    try:
        reply = await client.request("fragile", "x", b"")
        assert reply.status == 500
    finally:
        await client.close()
        await server.close()


# ---------------------------------------------------------------------- brokered


@pytest_twisted.ensureDeferred
async def test_brokered_request_is_forwarded_and_the_reply_relayed(brokerd: LiveBrokerd) -> None:
    await application(brokerd, "echo", echo)
    client = brokerd.track(Client(brokerd.url))
    reply = await client.request("echo", "greeting", b"hello")
    assert (reply.status, reply.body) == (200, b"echo greeting: hello")
    assert reply.headers.getRawHeaders(b"Content-Type") == [b"text/plain"]
    odd = await client.request("echo", "spaces & ümlauts", b"")
    assert odd.body == "echo spaces & ümlauts: ".encode()


@pytest_twisted.ensureDeferred
async def test_unregistered_application_is_404(brokerd: LiveBrokerd) -> None:
    client = brokerd.track(Client(brokerd.url))
    reply = await client.request("nobody", "x", b"")
    assert reply.status == 404
    assert b"no application nobody" in reply.body


@pytest_twisted.ensureDeferred
async def test_anonymous_client_may_not_serve(brokerd: LiveBrokerd) -> None:
    app = brokerd.track(Client(brokerd.url))
    await app.connect()
    with pytest.raises(SocketMQError) as refused:
        await app.serve("echo", echo)
    assert refused.value.status == 496


@pytest_twisted.ensureDeferred
async def test_second_server_of_an_application_is_409(brokerd: LiveBrokerd) -> None:
    await application(brokerd, "echo", echo, "first")
    second = brokerd.track(Client(brokerd.url))
    await second.connect()
    await second.login("open", "second")
    with pytest.raises(SocketMQError) as conflict:
        await second.serve("echo", echo)
    assert conflict.value.status == 409


@pytest_twisted.ensureDeferred
async def test_silent_application_is_504_and_late_answer_is_404(brokerd: LiveBrokerd) -> None:
    held: list[IncomingRequest] = []
    app = await application(brokerd, "slow", held.append)
    client = brokerd.track(Client(brokerd.url))
    reply = await client.request("slow", "x", b"")
    assert reply.status == 504
    assert len(held) == 1
    # The application's late answer is refused; the token is gone.
    errors = Waiter()
    app.connection.on_error = errors  # type: ignore[union-attr]
    held[0].respond(200, b"too late")
    (result,) = await errors.count(1)
    assert result.status == 404


@pytest_twisted.ensureDeferred
async def test_application_going_away_is_502(brokerd: LiveBrokerd) -> None:
    app = await application(brokerd, "flaky", lambda request: reactor().callLater(0.05, app.connection.dropConnection, True))
    client = brokerd.track(Client(brokerd.url))
    reply = await client.request("flaky", "x", b"")
    assert reply.status == 502
    assert "flaky" not in brokerd.hub.applications


@pytest_twisted.ensureDeferred
async def test_application_leaves_on_close_and_name_is_free_again(brokerd: LiveBrokerd) -> None:
    app = await application(brokerd, "echo", echo)
    left = called(brokerd.hub, "unregister", lambda: "echo" not in brokerd.hub.applications)
    await app.close()
    brokerd.clients.remove(app)
    await left
    await application(brokerd, "echo", echo, "again")


async def raw_http(brokerd: LiveBrokerd, data: bytes) -> bytes:
    port = brokerd.http_port.getHost().port
    client: LineProtocol = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(Factory.forProtocol(LineProtocol))
    client.transport.write(data)
    await client.lost.addTimeout(TIMEOUT, reactor())
    return b"\n".join(client.lines.items) + b"\n" + client._buffer


@pytest_twisted.ensureDeferred
async def test_oversized_body_is_413_before_it_is_sent(brokerd: LiveBrokerd) -> None:
    await application(brokerd, "echo", echo)
    response = await raw_http(
        brokerd, b"POST /socket.mq/echo/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n\r\n" + b"x" * 1000
    )
    assert response.startswith(b"HTTP/1.1 413 ")


@pytest_twisted.ensureDeferred
async def test_oversized_chunked_body_is_413(brokerd: LiveBrokerd) -> None:
    await application(brokerd, "echo", echo)
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(20))
    response = await raw_http(
        brokerd, b"POST /socket.mq/echo/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    )
    assert response.startswith(b"HTTP/1.1 413 ")


@pytest_twisted.ensureDeferred
async def test_get_on_a_request_url_is_405_and_bad_version_is_400(brokerd: LiveBrokerd) -> None:
    response = await raw_http(brokerd, b"GET /socket.mq/echo/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 405 ") and b"Allow: OPTIONS, POST" in response
    response = await raw_http(
        brokerd, b"POST /socket.mq/echo/x HTTP/1.1\r\nHost: a\r\nSocket-MQ-Version: 7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    assert response.startswith(b"HTTP/1.1 400 ")
    response = await raw_http(
        brokerd, b"POST /socket.mq/public-key/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    assert response.startswith(b"HTTP/1.1 404 ")


@pytest_twisted.ensureDeferred
async def test_congested_application_is_503(brokerd: LiveBrokerd) -> None:
    app = await application(brokerd, "busy", lambda request: None)
    (session,) = [s for s in brokerd.broker.sessions() if getattr(s, "client_id", None) == "app"]
    session.pauseProducing()  # as Twisted does when its output buffer is over the limit
    try:
        client = brokerd.track(Client(brokerd.url))
        reply = await client.request("busy", "x", b"")
        assert reply.status == 503
    finally:
        session.resumeProducing()
    assert app.connection is not None

"""socket.mq under attack, on real sockets: each test plays one attack against a live broker
and checks the documented answer (a result, a close code, an HTTP status) while an innocent
client on another connection keeps being served."""
from __future__ import annotations

import json
import os
import struct
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import globalLogPublisher

from brokerd.protocols.socketmq.api import Client
from tests.integration.test_socketmq_pubsub import brokerd, raw_ws  # noqa: F401 - fixture
from tests.support.fixtures import pki  # noqa: F401
from tests.support.live import TIMEOUT, Waiter, reactor
from tests.support.socketmq import LiveBrokerd


@pytest.fixture
def failures() -> Any:
    """Every logged failure (a traceback in the broker's log) while the test runs."""
    seen: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None:
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


async def innocent_subscriber(brokerd: LiveBrokerd, event: str) -> Waiter:
    """A well-behaved WebSocket client subscribed to ``event``; its Waiter collects events."""
    client = brokerd.track(Client(brokerd.url))
    await client.connect()
    events = Waiter()
    await client.subscribe(event, events)
    return events


async def innocent_is_served(brokerd: LiveBrokerd, events: Waiter, event: str, text: bytes) -> None:
    """An SSMP publish reaches the innocent subscriber."""
    sam = await brokerd.ssmp(b"sam")
    sam.send(b"MCAST " + event.encode() + b" " + text)
    await events.until(lambda items: any(item.data == text for item in items))


# ---------------------------------------------------------------------- lone surrogates


def results(ws: Any) -> list[dict[str, Any]]:
    return [json.loads(payload) for payload, _binary in ws.messages.items[1:]]


@pytest.mark.parametrize(
    "auth",
    [
        {"method": "secret", "identity": "\ud800", "secret": "s"},
        {"method": "secret", "identity": "app", "secret": "\udfff"},
        {"method": "open", "identity": "a\ud800b"},
    ],
)
@pytest_twisted.ensureDeferred
async def test_lone_surrogate_in_auth_is_a_400_result(brokerd: LiveBrokerd, failures: list, auth: dict) -> None:
    innocent = await innocent_subscriber(brokerd, "calm")
    ws = await raw_ws(brokerd)
    ws.sendMessage(json.dumps({"type": "auth", "id": 1, **auth}).encode())  # ensure_ascii: \ud800 escapes
    ws.sendMessage(json.dumps({"type": "subscribe", "id": 2, "event": "after"}).encode())
    await ws.messages.count(3)
    first, second = results(ws)
    assert (first["id"], first["status"]) == (1, 400)
    assert "not valid Unicode" in first["reason"]
    assert (second["id"], second["status"]) == (2, 200)  # the connection stays usable
    await innocent_is_served(brokerd, innocent, "calm", b"still here")
    assert failures == []


@pytest_twisted.ensureDeferred
async def test_lone_surrogate_as_request_id_is_a_400_result_with_null_id(brokerd: LiveBrokerd, failures: list) -> None:
    ws = await raw_ws(brokerd)
    ws.sendMessage(json.dumps({"type": "subscribe", "id": "x\ud800", "event": "hijack"}).encode())
    ws.sendMessage(json.dumps({"type": "subscribe", "id": 2, "event": "allowed"}).encode())
    await ws.messages.count(3)
    refused, accepted = results(ws)
    assert refused["id"] is None and refused["status"] == 400 and "id must be" in refused["reason"]
    assert (accepted["id"], accepted["status"]) == (2, 200)
    (session,) = brokerd.broker.sessions()
    assert brokerd.broker.is_subscribed(session, b"allowed")
    assert not brokerd.broker.is_subscribed(session, b"hijack")  # refused requests change nothing
    assert failures == []


# ---------------------------------------------------------------------- WebSocket fragments

UPGRADE = (
    b"GET /socket.mq/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: socketmq.v1\r\n\r\n"
)


def client_frame(opcode: int, payload: bytes = b"", fin: bool = True) -> bytes:
    """One masked client-to-server frame (RFC 6455 section 5.2)."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        header = bytes((opcode | (0x80 if fin else 0), 0x80 | size))
    else:
        header = struct.pack("!BBH", opcode | (0x80 if fin else 0), 0x80 | 126, size)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class FrameClient(Protocol):
    """A WebSocket client at the frame level: sends whatever frames the test writes, parses
    the server's frames into (opcode, payload)."""

    def __init__(self, upgrade: bytes = UPGRADE) -> None:
        self.upgrade = upgrade
        self.frames = Waiter()
        self.opened: Deferred = Deferred()
        self.lost: Deferred = Deferred()
        self._buffer = b""
        self._open = False

    def connectionMade(self) -> None:
        self.transport.write(self.upgrade)

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        if not self._open:
            head, found, rest = self._buffer.partition(b"\r\n\r\n")
            if not found:
                return
            assert head.startswith(b"HTTP/1.1 101 "), head
            self._open, self._buffer = True, rest
            self.opened.callback(self)
        while len(self._buffer) >= 2:
            opcode, size = self._buffer[0] & 0x0F, self._buffer[1] & 0x7F
            start = 2
            if size == 126:
                (size,), start = struct.unpack("!H", self._buffer[2:4]), 4
            elif size == 127:
                (size,), start = struct.unpack("!Q", self._buffer[2:10]), 10
            if len(self._buffer) < start + size:
                return
            self.frames((opcode, self._buffer[start : start + size]))
            self._buffer = self._buffer[start + size :]

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback(None)

    def close_code(self) -> Deferred:
        """Fires with the code of the server's close frame."""
        d = self.frames.until(lambda frames: any(opcode == 8 for opcode, _ in frames))
        return d.addCallback(lambda frames: struct.unpack("!H", next(p for o, p in frames if o == 8)[:2])[0])


async def frame_client(brokerd: LiveBrokerd) -> FrameClient:
    port = brokerd.http_port.getHost().port
    client: FrameClient = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(
        Factory.forProtocol(FrameClient)
    )
    await client.opened.addTimeout(TIMEOUT, reactor())
    await client.frames.count(1)  # hello
    return client


async def flood_empty_continuations(client: FrameClient, batches: int = 400, batch: int = 1000) -> int:
    """Start a text message and send empty continuation frames until the server closes
    (or ``batches * batch`` frames went out); the number of frames sent."""
    client.transport.write(client_frame(0x1, b"", fin=False))
    closing = client.close_code()
    sent = 0
    empty = client_frame(0x0, b"", fin=False)
    for _ in range(batches):
        if closing.called:
            break
        client.transport.write(empty * batch)
        sent += batch
        await sleep_turn()
    return sent


def sleep_turn() -> Deferred:
    """Let the reactor run once (so the broker reads what was written)."""
    d: Deferred = Deferred()
    reactor().callLater(0, d.callback, None)
    return d


@pytest_twisted.ensureDeferred
async def test_endless_empty_continuation_frames_close_with_1009(brokerd: LiveBrokerd) -> None:
    innocent = await innocent_subscriber(brokerd, "calm")
    attacker = await frame_client(brokerd)
    sent = await flood_empty_continuations(attacker)
    code = await attacker.close_code().addTimeout(TIMEOUT, reactor())
    assert code == 1009
    assert sent < 400 * 1000  # closed long before the flood ended
    await innocent_is_served(brokerd, innocent, "calm", b"served during the flood")


@pytest_twisted.ensureDeferred
async def test_frame_overhead_counts_against_the_message_budget(tmp_path: Any) -> None:
    """With the frame count limit lifted, the bytes charged per frame still end the message."""
    brokerd = LiveBrokerd(tmp_path, socketmq_max_frames=10_000_000)
    await brokerd.start()
    try:
        innocent = await innocent_subscriber(brokerd, "calm")
        attacker = await frame_client(brokerd)
        await flood_empty_continuations(attacker)
        code = await attacker.close_code().addTimeout(TIMEOUT, reactor())
        assert code == 1009
        (reason,) = [payload[2:] for opcode, payload in attacker.frames.items if opcode == 8]
        assert b"bytes" in reason
        await innocent_is_served(brokerd, innocent, "calm", b"served during the flood")
    finally:
        await brokerd.stop()


@pytest_twisted.ensureDeferred
async def test_a_fragmented_message_within_the_limits_is_delivered(brokerd: LiveBrokerd) -> None:
    client = await frame_client(brokerd)
    text = json.dumps({"type": "subscribe", "id": 7, "event": "pieces"}).encode()
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    frames = [client_frame(0x1, pieces[0], fin=False)]
    frames += [client_frame(0x0, piece, fin=False) for piece in pieces[1:-1]]
    frames += [client_frame(0x0, pieces[-1], fin=True)]
    client.transport.write(b"".join(frames))
    (_hello, (opcode, payload)) = await client.frames.count(2)
    assert opcode == 1 and json.loads(payload)["status"] == 200
    client.transport.loseConnection()
    await client.lost.addTimeout(TIMEOUT, reactor())


# ---------------------------------------------------------------------- slow requests (slowloris)


class Trickle(Protocol):
    """Sends ``head`` at once, then ``rest`` one byte every ``interval`` seconds, until done or
    the server closes; records what the server answered."""

    def __init__(self, head: bytes, rest: bytes, interval: float = 0.05) -> None:
        self.head, self.rest, self.interval = head, rest, interval
        self.received = b""
        self.lost: Deferred = Deferred()
        self._call: Any = None

    def connectionMade(self) -> None:
        self.transport.write(self.head)
        self._next()

    def _next(self) -> None:
        if self.rest:
            self.transport.write(self.rest[:1])
            self.rest = self.rest[1:]
            self._call = reactor().callLater(self.interval, self._next)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self.lost.callback(None)


async def trickle(brokerd: LiveBrokerd, head: bytes, rest: bytes) -> Trickle:
    port = brokerd.http_port.getHost().port
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    return await endpoint.connect(Factory.forProtocol(lambda: Trickle(head, rest)))


PAD = b"X-Pad: " + b"a" * 400 + b"\r\n"
"""400 header bytes at 20 per second: 20 s, twice the test's bound on any wait."""
SLOW_REQUESTS = {
    "request line": (b"", b"POST /socket.mq/echo/slow-request-line-" + b"x" * 400 + b" HTTP/1.1\r\n\r\n"),
    "POST headers": (b"POST /socket.mq/echo/x HTTP/1.1\r\n", b"Host: a\r\n" + PAD + b"\r\n"),
    "POST body": (b"POST /socket.mq/echo/x HTTP/1.1\r\nHost: a\r\nContent-Length: 400\r\n\r\n", b"b" * 400),
    "WebSocket upgrade": (b"GET /socket.mq/ws HTTP/1.1\r\n", UPGRADE.split(b"\r\n", 1)[1][:-2] + PAD + b"\r\n"),
}


DEADLINE = 0.4
"""The deadline under test, in real seconds: the honest request and the innocent subscriber's
message, both served during the attack, take a few milliseconds; the attacker, at 20 bytes a
second, would need 20 s for its 400 bytes."""


@pytest.mark.parametrize("attack", sorted(SLOW_REQUESTS))
@pytest_twisted.ensureDeferred
async def test_slow_request_is_408_and_closed_while_others_are_served(tmp_path: Any, attack: str) -> None:
    """Each deadline on its own: the handshake limit is far above the test's bound when the
    read limit is under test, and the other way round."""
    from tests.integration.test_socketmq_request_reply import application, echo

    upgrade = attack in ("WebSocket upgrade", "request line")
    brokerd = LiveBrokerd(
        tmp_path,
        socketmq_request_read_timeout=600.0 if upgrade else DEADLINE,
        socketmq_handshake_timeout=DEADLINE if upgrade else 600.0,
    )
    await brokerd.start()
    try:
        await application(brokerd, "echo", echo)
        innocent = await innocent_subscriber(brokerd, "calm")
        head, rest = SLOW_REQUESTS[attack]
        attacker = await trickle(brokerd, head, rest)
        caller = brokerd.track(Client(brokerd.url))
        reply = await caller.request("echo", "honest", b"hi")  # served while the attack runs
        assert (reply.status, reply.body) == (200, b"echo honest: hi")
        await innocent_is_served(brokerd, innocent, "calm", b"served during the attack")
        await attacker.lost.addTimeout(TIMEOUT, reactor())
        assert attacker.received.startswith(b"HTTP/1.1 408 ")
        assert attacker.rest  # closed before the request was complete
    finally:
        await brokerd.stop()


# ---------------------------------------------------------------------- browsers: Origin and CORS


class HeadClient(Protocol):
    """Sends one request; ``head`` fires with the response's status line and headers."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.head: Deferred = Deferred()
        self._buffer = b""

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        if b"\r\n\r\n" in self._buffer and not self.head.called:
            self.head.callback(self._buffer.partition(b"\r\n\r\n")[0])
            self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if not self.head.called:
            self.head.callback(self._buffer)


async def response_head(port: int, request: bytes, tls: Any = None) -> bytes:
    if tls is None:
        endpoint: Any = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    else:
        endpoint = endpoints.SSL4ClientEndpoint(reactor(), "127.0.0.1", port, tls)
    client: HeadClient = await endpoint.connect(Factory.forProtocol(lambda: HeadClient(request)))
    return await client.head.addTimeout(TIMEOUT, reactor())


def upgrade_from(host: str, origin: str | None) -> bytes:
    request = UPGRADE.replace(b"Host: 127.0.0.1\r\n", b"Host: " + host.encode() + b"\r\n")
    if origin is not None:
        request = request.replace(b"\r\n\r\n", b"\r\nOrigin: " + origin.encode() + b"\r\n\r\n")
    return request


def post_from(host: str, origin: str | None, method: bytes = b"POST", extra: bytes = b"") -> bytes:
    lines = [method + b" /socket.mq/echo/cors HTTP/1.1", b"Host: " + host.encode(), b"Content-Length: 2", b"Connection: close"]
    if origin is not None:
        lines.append(b"Origin: " + origin.encode())
    return b"\r\n".join(lines) + b"\r\n" + extra + b"\r\nhi"


def header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


@pytest_twisted.ensureDeferred
async def test_websocket_from_another_site_is_refused(tmp_path: Any) -> None:
    brokerd = LiveBrokerd(tmp_path, socketmq_origins="self https://app.example")
    await brokerd.start()
    try:
        innocent = await innocent_subscriber(brokerd, "calm")
        port = brokerd.http_port.getHost().port
        host = f"127.0.0.1:{port}"
        refused = await response_head(port, upgrade_from(host, "https://evil.example"))
        assert refused.startswith(b"HTTP/1.1 403 ")
        assert len(brokerd.broker.sessions()) == 1  # only the innocent one
        for origin in (f"http://{host}", "https://app.example", None):  # self, listed, a program
            accepted = await response_head(port, upgrade_from(host, origin))
            assert accepted.startswith(b"HTTP/1.1 101 "), (origin, accepted)
        await innocent_is_served(brokerd, innocent, "calm", b"served during the attack")
    finally:
        await brokerd.stop()


@pytest_twisted.ensureDeferred
async def test_wss_with_a_client_certificate_refuses_another_site(tmp_path: Any, pki: Any) -> None:  # noqa: F811
    """The hijacking of RFC 6455 section 10.2: the browser presents alice's certificate to a
    page of any site; only a page of the broker's own origin gets alice's session."""
    from brokerd.auth.tls import ServerTLS, client_context, listen_endpoint
    from tests.support.certs import CLIENT_NAME, SERVER_HOSTNAME

    brokerd = LiveBrokerd(tmp_path)
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    await brokerd.start(listen_endpoint(reactor(), tls, "tls:0:interface=127.0.0.1"))
    try:
        port = brokerd.tls_port.getHost().port
        alice = client_context(SERVER_HOSTNAME, pki.ca, pki.client.cert, pki.client.key)
        host = f"{SERVER_HOSTNAME}:{port}"
        refused = await response_head(port, upgrade_from(host, "https://evil.example"), alice)
        assert refused.startswith(b"HTTP/1.1 403 ")
        assert brokerd.broker.sessions() == []
        endpoint = endpoints.SSL4ClientEndpoint(reactor(), "127.0.0.1", port, alice)
        same_origin = upgrade_from(host, f"https://{host}")
        page: FrameClient = await endpoint.connect(Factory.forProtocol(lambda: FrameClient(same_origin)))
        await page.frames.count(1)  # hello: the WebSocket is open
        assert [s.client_id for s in brokerd.broker.sessions()] == [CLIENT_NAME]
        page.transport.loseConnection()
        await page.lost.addTimeout(TIMEOUT, reactor())
    finally:
        await brokerd.stop()


@pytest_twisted.ensureDeferred
async def test_post_and_preflight_from_another_site(tmp_path: Any) -> None:
    from tests.integration.test_socketmq_request_reply import application

    seen: list[Any] = []

    def echo(request: Any) -> None:
        seen.append(request.body)
        request.respond(200, b"echo " + request.body)

    brokerd = LiveBrokerd(tmp_path, socketmq_origins="self https://app.example")
    await brokerd.start()
    try:
        await application(brokerd, "echo", echo)
        port = brokerd.http_port.getHost().port
        host = f"127.0.0.1:{port}"

        forged = await response_head(port, post_from(host, "https://evil.example"))
        assert forged.startswith(b"HTTP/1.1 403 ") and header(forged, b"Access-Control-Allow-Origin") is None
        same = await response_head(port, post_from(host, f"http://{host}"))
        assert same.startswith(b"HTTP/1.1 200 ") and header(same, b"Access-Control-Allow-Origin") is None
        program = await response_head(port, post_from(host, None))
        assert program.startswith(b"HTTP/1.1 200 ")
        listed = await response_head(port, post_from(host, "https://app.example"))
        assert listed.startswith(b"HTTP/1.1 200 ")
        assert header(listed, b"Access-Control-Allow-Origin") == b"https://app.example"
        assert header(listed, b"Access-Control-Allow-Credentials") == b"true"
        assert header(listed, b"Vary") == b"Origin"
        assert seen == [b"hi", b"hi", b"hi"]  # the forged POST never reached the application

        asks = b"Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type, interface-version\r\n"
        allowed = await response_head(port, post_from(host, "https://app.example", b"OPTIONS", asks))
        assert allowed.startswith(b"HTTP/1.1 204 ")
        assert header(allowed, b"Access-Control-Allow-Origin") == b"https://app.example"
        assert header(allowed, b"Access-Control-Allow-Methods") == b"POST"
        assert header(allowed, b"Access-Control-Allow-Headers") == b"content-type, interface-version"
        refused = await response_head(port, post_from(host, "https://evil.example", b"OPTIONS", asks))
        assert refused.startswith(b"HTTP/1.1 403 ") and header(refused, b"Access-Control-Allow-Origin") is None
        assert seen == [b"hi", b"hi", b"hi"]
    finally:
        await brokerd.stop()

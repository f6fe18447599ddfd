"""The socket.mq front end in memory: its Site on a StringTransport, a MemoryReactorClock for the
request timeout, the Broker for pub/sub.  HTTP responses and WebSocket frames are asserted as
bytes; client frames are masked by hand (RFC 6455 section 5.3), not by brokerd's client."""
from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.error import ConnectionAborted
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from brokerd.auth.realm import build_portal
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Message
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.protocols.socketmq import limits
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.server import build_site
from brokerd.protocols.socketmq.session import SLOW_CONSUMER_TIMEOUT
from tests.protocols.recording import RecordingEvents

UPGRADE = (
    b"GET /socket.mq/ws HTTP/1.1\r\nHost: broker\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: socketmq.v1\r\n\r\n"
)
"""The opening handshake with RFC 6455's sample key (section 1.3)."""


def masked(payload: bytes, opcode: int = 0x1) -> bytes:
    """One final client frame (text by default), masked with a fixed key."""
    key = b"\x37\xfa\x21\x3d"
    assert len(payload) < 126
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def text_frame(payload: bytes) -> bytes:
    """One final unmasked server text frame."""
    assert len(payload) < 126
    return bytes([0x81, len(payload)]) + payload


def payloads(data: bytes) -> list[bytes]:
    """The payloads of the unmasked server frames in ``data``."""
    out = []
    while data:
        length, start = data[1] & 0x7F, 2
        if length == 126:
            length, start = int.from_bytes(data[2:4], "big"), 4
        assert length < 127 and not data[1] & 0x80
        out.append(data[start:start + length])
        data = data[start + length:]
    return out


def http_connection(site: Any, transport: StringTransport | None = None) -> StringTransport:
    """A new connection to ``site`` on ``transport`` (by default a new StringTransport)."""
    channel = site.buildProtocol(None)
    transport = transport if transport is not None else StringTransport()
    transport.protocol = channel  # autobahn hands the connection over through it, as on TCP
    channel.makeConnection(transport)
    return transport


class Server:
    """A socket.mq Site around one Broker, connections on StringTransports."""

    def __init__(self, events: Any = NULL_EVENT_LOG, **broker: Any) -> None:
        self.clock = MemoryReactorClock()
        self.broker = Broker(**broker)
        self.hub = Hub(self.broker, self.clock, portal=build_portal(open_login=True), events=events)
        self.site = build_site(self.hub, demo=False)

    def connect(self) -> StringTransport:
        return http_connection(self.site)

    def websocket(self) -> StringTransport:
        """An upgraded connection, its hello frame read and cleared."""
        transport = self.connect()
        transport.protocol.dataReceived(UPGRADE)
        head, _, frames = transport.value().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        assert b"\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head  # RFC 6455's answer
        assert b"\r\nSec-WebSocket-Protocol: socketmq.v1" in head
        assert frames[:1] == b"\x81"
        hello = json.loads(frames[2:])
        assert (hello["type"], hello["version"], hello["security"]) == ("hello", limits.PROTOCOL_VERSION, "disabled")
        transport.clear()
        return transport


def send(transport: StringTransport, message: bytes) -> bytes:
    """Send one masked text frame; return (and clear) what the server wrote."""
    transport.protocol.dataReceived(masked(message))
    out = transport.value()
    transport.clear()
    return out


@pytest.fixture
def server() -> Server:
    return Server()


def test_subscribe_then_events_from_the_broker_are_frames(server: Server) -> None:
    ws = server.websocket()
    assert send(ws, b'{"type":"subscribe","id":1,"event":"a/b"}') == text_frame(
        b'{"type":"result","id":1,"status":200,"reason":"OK"}')
    server.broker.publish(Message(MULTICAST, b"a/b", b"hello", "ssmp", b"sam"))
    server.broker.publish(Message(MULTICAST, b"a/other", b"not for a/b", "ssmp", b"sam"))
    assert ws.value() == text_frame(b'{"type":"event","event":"a/b","from":"sam","protocol":"ssmp","data":"hello"}')


def test_a_publisher_does_not_get_its_own_event_but_other_subscribers_do(server: Server) -> None:
    publisher, other = server.websocket(), server.websocket()
    for ws in (publisher, other):
        assert b'"status":200' in send(ws, b'{"type":"subscribe","id":1,"event":"t"}')
    assert send(publisher, b'{"type":"publish","id":2,"event":"t","data":"yo"}') == text_frame(
        b'{"type":"result","id":2,"status":200,"reason":"OK"}')
    assert other.value() == text_frame(
        b'{"type":"event","event":"t","from":"anonymous","protocol":"socketmq","data":"yo"}')


def test_a_message_that_is_not_json_closes_with_1007(server: Server) -> None:
    ws = server.websocket()
    reason = b"not a JSON message: JSONDecodeError"
    assert send(ws, b"not json") == bytes([0x88, 2 + len(reason)]) + (1007).to_bytes(2, "big") + reason


def test_request_reply_through_a_registered_application(server: Server) -> None:
    app = server.websocket()
    assert b'"status":200' in send(app, b'{"type":"auth","id":1,"method":"open","identity":"app"}')
    assert send(app, b'{"type":"register","id":2,"application":"store"}') == text_frame(
        b'{"type":"result","id":2,"status":200,"reason":"OK"}')
    http = server.connect()
    http.protocol.dataReceived(b"POST /socket.mq/store/put-1 HTTP/1.1\r\nHost: broker\r\n"
                               b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello")
    assert http.value() == b""  # waiting for the application
    [forwarded] = payloads(app.value())
    handle = json.loads(forwarded.partition(b"\n")[0])["request"]  # the hub's own numbering
    assert forwarded == (  # the JSON header, a newline, the body as it came
        b'{"type":"request","request":"%s","application":"store","request_id":"put-1","content_type":"text/plain"}'
        b"\nhello" % handle.encode())
    answer = b'{"type":"respond","id":3,"request":"%s","status":201,"data":"ok"}' % handle.encode()
    app.clear()
    send(app, answer)
    head, _, body = http.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 201 ") and body == b"ok"
    assert b"\r\nContent-Type: application/octet-stream\r\n" in head  # the application named none


def test_a_request_nobody_answers_times_out_on_the_clock(server: Server) -> None:
    app = server.websocket()
    send(app, b'{"type":"auth","id":1,"method":"open","identity":"app"}')
    send(app, b'{"type":"register","id":2,"application":"slow"}')
    http = server.connect()
    http.protocol.dataReceived(b"POST /socket.mq/slow/r HTTP/1.1\r\nHost: broker\r\nContent-Length: 0\r\n\r\n")
    server.clock.advance(server.hub.request_timeout - 0.001)
    assert http.value() == b""
    server.clock.advance(0.001)
    assert http.value().startswith(b"HTTP/1.1 504 Gateway Timeout\r\n")


def test_unregistered_application_is_404(server: Server) -> None:
    http = server.connect()
    http.protocol.dataReceived(b"POST /socket.mq/app/r1 HTTP/1.1\r\nHost: broker\r\nContent-Length: 2\r\n\r\nhi")
    head, _, body = http.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n") and b"\r\nSocket-Mq-Version: 1\r\n" in head
    assert body == b"no application app is registered\n"


def test_idle_time_between_keep_alive_requests_is_not_a_slow_request(server: Server) -> None:
    http = server.connect()
    request = b"POST /socket.mq/app/r%d HTTP/1.1\r\nHost: broker\r\nContent-Length: 2\r\n\r\nhi"
    http.protocol.dataReceived(request % 1)
    assert http.value().startswith(b"HTTP/1.1 404 Not Found\r\n")
    http.clear()
    server.clock.advance(server.hub.read_timeout + 1)  # idle between requests, under the idle timeout
    assert server.hub.read_timeout + 1 < limits.HTTP_IDLE_TIMEOUT and not http.disconnecting
    http.protocol.dataReceived(request % 2)
    assert http.value().startswith(b"HTTP/1.1 404 Not Found\r\n")
    http.clear()
    # the control: a request that takes longer than the deadline to arrive is refused
    http.protocol.dataReceived(b"POST /socket.mq/app/r3 HTTP/1.1\r\nHost: broker\r\n")
    server.clock.advance(server.hub.read_timeout)
    assert http.value().startswith(b"HTTP/1.1 408 Request Timeout\r\n") and http.disconnecting


TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nSocket-MQ-Version: 1\r\n"
             b"Content-Length: 35\r\nConnection: close\r\n\r\nthe request did not arrive in time\n")


def test_a_websocket_handshake_gets_the_handshake_timeout_from_its_first_byte(server: Server) -> None:
    assert server.hub.handshake_timeout < server.hub.read_timeout  # the defaults, 10 s and 30 s
    head, last = UPGRADE[:-2], UPGRADE[-2:]
    slow, prompt = server.connect(), server.connect()
    slow.protocol.dataReceived(head)
    prompt.protocol.dataReceived(head)
    server.clock.advance(server.hub.handshake_timeout - 0.001)
    assert slow.value() == b"" and not slow.disconnecting
    prompt.protocol.dataReceived(last)  # complete in time: upgraded, no deadline any more
    assert prompt.value().startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    server.clock.advance(0.001)
    assert slow.value() == TIMED_OUT and slow.disconnecting
    server.clock.advance(server.hub.read_timeout)
    assert not prompt.disconnecting


def test_a_request_line_gets_the_shorter_of_both_timeouts_and_a_post_then_the_read_timeout(server: Server) -> None:
    line_only, post = server.connect(), server.connect()
    line_only.protocol.dataReceived(b"POST /socket.mq/app/r1 HTTP/1.1")  # no end of line yet
    post.protocol.dataReceived(b"POST /socket.mq/app/r2 HTTP/1.1\r\nHost: broker\r\n")
    server.clock.advance(server.hub.handshake_timeout)
    assert line_only.value() == TIMED_OUT and line_only.disconnecting
    assert post.value() == b"" and not post.disconnecting  # a request's headers: the read timeout
    server.clock.advance(server.hub.read_timeout - server.hub.handshake_timeout - 0.001)
    assert not post.disconnecting
    server.clock.advance(0.001)
    assert post.value() == TIMED_OUT and post.disconnecting


def test_an_announced_body_over_the_limit_is_413_and_closed(server: Server) -> None:
    http = server.connect()
    too_big = limits.MAX_BODY + 1
    http.protocol.dataReceived(b"POST /socket.mq/app/r1 HTTP/1.1\r\nHost: broker\r\nContent-Length: %d\r\n\r\n" % too_big)
    body = f"the request body is larger than {limits.MAX_BODY} bytes\n".encode()
    assert http.value() == (
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nSocket-MQ-Version: 1\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    assert http.disconnecting


def test_a_connection_over_the_broker_limit_gets_503() -> None:
    server = Server(max_connections=1)
    first = server.connect()
    second = server.connect()
    assert first.value() == b"" and not first.disconnecting  # the one allowed is served
    assert second.value() == (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nSocket-MQ-Version: 1\r\n"
        b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n")
    assert second.disconnecting


def test_a_slow_consumer_episode_is_one_event_and_a_consumer_congested_too_long_is_closed() -> None:
    events = RecordingEvents()
    server = Server(events=events)
    ws = server.websocket()
    assert b'"status":200' in send(ws, b'{"type":"auth","id":1,"method":"open","identity":"dave"}')
    assert b'"status":200' in send(ws, b'{"type":"subscribe","id":2,"event":"flood"}')
    (session,) = [s for s in server.broker.sessions() if server.broker.is_subscribed(s, b"flood")]
    session.pauseProducing()  # as Twisted does when the output buffer is over the limit
    for n in range(5):
        server.broker.publish(Message(MULTICAST, b"flood", b"m%d" % n, "ssmp", b"firehose"))
    assert events.of("dropped") == []  # nothing per message
    server.clock.advance(SLOW_CONSUMER_TIMEOUT - 1)
    session.resumeProducing()  # congested for less than the limit: it stays
    assert events.of("dropped") == [
        {"protocol": "socketmq", "kind": "dropped", "session": "dave", "reason": "slow_consumer",
         "dropped": 5, "outcome": "dropped"}
    ]
    assert not session.closed and not ws.disconnecting
    session.pauseProducing()  # and stays congested until the broker disconnects it
    server.broker.publish(Message(MULTICAST, b"flood", b"lost", "ssmp", b"firehose"))
    server.clock.advance(SLOW_CONSUMER_TIMEOUT - 1)
    assert not ws.disconnected
    server.clock.advance(1)
    assert ws.disconnected  # aborted, not closed politely: the client is not reading
    ws.protocol.connectionLost(Failure(ConnectionAborted()))  # what the reactor then reports
    assert session.closed and session not in server.broker.sessions()
    assert [r["dropped"] for r in events.of("dropped")] == [5, 1]


def _ours(server: Server, name: str) -> list[Any]:
    """The pending delayed calls of brokerd's own timers called ``name``."""
    return [call for call in server.clock.getDelayedCalls() if getattr(call.func, "__name__", "") == name]


def test_the_request_deadline_and_the_admission_end_with_the_http_connection() -> None:
    server = Server()
    http = server.connect()
    http.protocol.dataReceived(b"GET /socket.mq/ws HTTP/1.1\r\n")
    assert len(_ours(server, "_too_slow")) == 1 and server.broker.stats.connections == 1
    http.protocol.connectionLost(Failure(ConnectionAborted()))
    assert _ours(server, "_too_slow") == [] and server.broker.stats.connections == 0
    server.clock.advance(server.hub.read_timeout)
    assert http.value() == b""  # no 408 after the end


def test_the_congestion_timer_and_the_handed_over_admission_end_with_the_websocket() -> None:
    server = Server(max_connections=1)
    ws = server.websocket()
    assert server.broker.stats.connections == 1  # the HTTP channel's count, now the session's
    assert server.connect().disconnecting  # still counted: the limit is full
    session = ws.protocol
    session.pauseProducing()
    assert len(_ours(server, "_too_slow")) == 1
    ws.protocol.connectionLost(Failure(ConnectionAborted()))
    assert _ours(server, "_too_slow") == [] and server.broker.stats.connections == 0
    again = server.connect()
    assert again.value() == b"" and not again.disconnecting


def test_portal_logins_and_refusals_are_events() -> None:
    events = RecordingEvents()
    server = Server(events=events)
    ws = server.websocket()
    refused = send(ws, b'{"type":"auth","id":1,"method":"secret","identity":"eve","secret":"guess"}')
    assert b'"status":200' not in refused and b'"id":1' in refused
    assert b'"status":200' in send(ws, b'{"type":"auth","id":2,"method":"open","identity":"carol"}')
    source = f"{ws.getPeer().host}:{ws.getPeer().port}"
    assert [(r["session"], r["scheme"], r["reason"], r["source"]) for r in events.of("auth_failure")] == [
        ("eve", "secret", "scheme not enabled", source)]
    assert [(r["session"], r["scheme"], r["outcome"], r["source"]) for r in events.of("login")] == [
        ("carol", "open", "ok", source)]

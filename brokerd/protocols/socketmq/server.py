"""The socket.mq front end: one twisted.web Site per ``--socketmq`` listener.

The plugin in :mod:`~brokerd.protocols.socketmq.plugin` is brokerd's entry point (brokered mode: many applications on one
port, events are broker topics).  :func:`build_site` is shared with the embedded, brokerless
Server API in :mod:`brokerd.protocols.socketmq.api`.

The Site's channel and request classes add what twisted.web leaves out: the broker's connection
limit (the count moves to the WebSocket session when a connection upgrades), a bound on request
bodies enforced while they arrive, deadlines for receiving a request, and no per-request
access log.

twisted.web's own timeout is an idle timeout: every byte restarts it, so a request sent one byte
every few seconds (slowloris) would hold its connection forever.  The channel therefore gives
each request a deadline from its first byte: its request line within the handshake timeout, the
WebSocket upgrade (a request for WEBSOCKET_PATH or a mounted path) whole within the handshake
timeout, any other
request's headers and body within the read timeout; then 408 and close.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import IResource

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.frontend import WebSocketMounts
from brokerd.protocols.lifecycle import ConnectionLifecycle
from brokerd.protocols.socketmq import limits
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.resource import RootResource, SocketMQResource
from brokerd.protocols.socketmq.session import SocketMQWebSocketFactory

SERVER_KEY_USER_ID = "brokerd socket.mq server"
WEBSOCKET_PATH = b"/socket.mq/ws"
"""The path whose request is a WebSocket opening handshake (resource.py serves it)."""


def _raw_response(status: bytes, body: bytes) -> bytes:
    return b"".join(
        (
            b"HTTP/1.1 ", status, b"\r\nContent-Type: text/plain; charset=utf-8\r\n",
            b"Socket-MQ-Version: ", str(limits.PROTOCOL_VERSION).encode(), b"\r\n",
            b"Content-Length: ", str(len(body)).encode(), b"\r\nConnection: close\r\n\r\n", body,
        )
    )


def _request_target(line: bytes) -> bytes:
    """The path of a request line (``GET /socket.mq/ws?x HTTP/1.1`` -> ``/socket.mq/ws``)."""
    parts = line.split(b" ")
    return parts[1].partition(b"?")[0] if len(parts) == 3 else b""


class SocketMQChannel(ConnectionLifecycle, http.HTTPChannel):
    """An HTTP connection counted against the broker's connection limit, whose requests must
    arrive within their deadline (see the module docstring), on the shared connection
    lifecycle (brokerd.protocols.lifecycle; twisted.web's channel is its own producer, and the
    output limit is the WebSocket session's, set when the connection upgrades)."""

    _log = Logger()
    site: SocketMQSite
    """Set by the site that built the channel (Twisted's Site.buildProtocol)."""
    refused = False
    _deadline: DelayedCall | None = None
    """The deadline of the request being received, None between requests."""
    _started = 0.0
    _handling = False
    """True from a request's last byte until its response is done (no deadline then)."""

    def lifecycle_broker(self) -> Broker:
        return self.site.hub.broker

    def lifecycle_clock(self) -> IReactorTime:
        return self.site.reactor

    def connectionMade(self) -> None:
        super().connectionMade()
        if not self.open_connection(None):
            self.refused = True
            self.transport.write(_raw_response(b"503 Service Unavailable", b"too many connections\n"))
            self.transport.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        if self.refused:
            return
        if self._deadline is None and not self._handling:
            hub = self.site.hub
            self._started = self.site.reactor.seconds()
            first_line = min(hub.read_timeout, hub.handshake_timeout)
            self._deadline = self.call_later(first_line, self._too_slow)
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        requests = len(self.requests)
        super().lineReceived(line)
        deadline = self._deadline
        if len(self.requests) > requests and deadline is not None and deadline.active():
            hub = self.site.hub
            target = _request_target(line)
            upgrade = target == WEBSOCKET_PATH or target[1:] in self.site.mounts
            limit = hub.handshake_timeout if upgrade else hub.read_timeout
            deadline.reset(max(0.0, self._started + limit - self.site.reactor.seconds()))

    def allContentReceived(self) -> None:
        self._cancel_deadline()
        self._handling = True
        super().allContentReceived()

    def requestDone(self, request: http.Request) -> None:
        self._handling = False  # before the next pipelined request is read
        super().requestDone(request)

    def _too_slow(self) -> None:
        self._deadline = None
        transport = self.transport
        if transport is None or transport.disconnecting:
            return
        self.refused = True
        self._log.info("socket.mq: closing {peer}: request not received in time", peer=str(transport.getPeer()))
        transport.write(_raw_response(b"408 Request Timeout", b"the request did not arrive in time\n"))
        transport.loseConnection()

    def _cancel_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        self.cancel_timer(deadline)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._deadline = None
        self.release_connection()  # the deadline too; nothing attached to the Broker yet
        super().connectionLost(reason)


class SocketMQRequest(server.Request):
    """Refuses a body larger than MAX_BODY as soon as it is announced or has arrived that far
    (413 and close), without storing more than MAX_BODY bytes of it."""

    channel: SocketMQChannel
    max_body = limits.MAX_BODY
    too_large = False
    _received = 0

    def gotLength(self, length: int | None) -> None:
        super().gotLength(min(length, self.max_body) if length is not None else None)
        if length is not None and length > self.max_body:
            self._refuse()

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large:
            return
        self._received += len(data)
        if self._received > self.max_body:
            self._refuse()
            return
        super().handleContentChunk(data)

    def _refuse(self) -> None:
        self.too_large = True
        body = f"the request body is larger than {self.max_body} bytes\n".encode()
        self.channel.transport.write(_raw_response(b"413 Payload Too Large", body))
        self.channel.transport.loseConnection()

    def process(self) -> None:
        logged_in = getattr(self.channel, "logged_in", None)
        if logged_in is not None:
            logged_in()  # a whole request arrived (anonymous requests may be allowed)
        if not self.too_large:
            super().process()


class SocketMQSite(server.Site):
    """One listener's HTTP + WebSocket site."""

    protocol = SocketMQChannel  # type: ignore[assignment]  # the HTTP/1.1 channel itself, not Twisted's HTTP/1-or-2 wrapper
    requestFactory = SocketMQRequest
    displayTracebacks = False
    noisy = False

    def __init__(self, hub: Hub, root: IResource, timeout: float = limits.HTTP_IDLE_TIMEOUT,
                 mounts: WebSocketMounts | None = None) -> None:
        super().__init__(root, timeout=timeout, reactor=hub.reactor)
        self.hub = hub
        self.mounts = mounts if mounts is not None else WebSocketMounts()

    def log(self, request: http.Request) -> None:
        """No access log: nothing is logged per request on the hot path."""


def build_site(hub: Hub, demo: bool = True, mounts: WebSocketMounts | None = None) -> SocketMQSite:
    """The Site serving ``hub`` (brokerd and the embedded Server both use this), with the
    hub's settings' keepalive, and the WebSockets of ``mounts`` (brokerd.frontend.WebSocketMounts; read per request)."""
    websocket = SocketMQWebSocketFactory(hub, ping_interval=hub.settings.ping_interval,
                                         pong_timeout=hub.settings.pong_timeout)
    mounts = mounts if mounts is not None else WebSocketMounts()
    return SocketMQSite(hub, RootResource(SocketMQResource(hub, websocket, demo=demo), mounts), mounts=mounts)


def server_key_path(settings: Settings) -> Path:
    """``--socketmq-key`` when given, else ``DATA_DIR/socketmq/server-key.asc``."""
    if settings.socketmq_key is not None:
        return Path(settings.socketmq_key)
    return Path(settings.data_dir) / "socketmq" / "server-key.asc"

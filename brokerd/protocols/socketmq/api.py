"""The socket.mq Python API: a Server to embed (brokerless) and a Client (for both modes).

Brokerless: a Twisted program serves its own application on its own port::

    def on_request(request):                 # request.request_id, .body, .client_id
        request.respond(200, b"pong")

    server = yield listen(8081, "pinger", SecurityOptions(), on_request)
    server.publish("pinger/status", b"up")   # to the subscribers of that event

Brokered: the application connects to brokerd and serves ``<application>`` there with the
same callback; brokerd forwards POSTs for it and relays the replies::

    client = Client("http://broker:8080", key=my_key)
    yield client.connect()
    yield client.serve("pinger", on_request)

Every method that talks to the network returns a Deferred.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from io import BytesIO
from pathlib import Path
from typing import Any, Callable, cast
from urllib.parse import quote, urlsplit

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import endpoints
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLClientConnectionCreator,
    IPushProducer,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.internet.protocol import Protocol
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IPolicyForHTTPS, IResponse
from zope.interface import implementer

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import BROKER
from brokerd.core.publication import Multicast
from brokerd.errors import BrokerError
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.nodelay import no_delay
from brokerd.protocols.socketmq import limits
from brokerd.protocols.socketmq.codec import (
    FrameError,
    InvalidMessage,
    decode_server,
    encode,
    is_application_name,
    is_event_name,
)
from brokerd.protocols.socketmq.events import (
    Auth,
    ClientMessage,
    Dropped,
    Event,
    Hello,
    Publish,
    Register,
    Request,
    Respond,
    Result,
    Subscribe,
    Unregister,
    Unsubscribe,
)
from brokerd.protocols.socketmq.hub import Hub, LocalApplication
from brokerd.protocols.socketmq.incoming import IncomingRequest
from brokerd.protocols.socketmq.pgp import (
    CONTENT_TYPE,
    SECURITY_METHOD,
    Certificate,
    Identity,
    PGPError,
    SecretKey,
    check_server_proof,
    client_proof,
    new_nonce,
    parse_cert,
)
from brokerd.protocols.socketmq.policy import ANYONE, Policy, Rule
from brokerd.protocols.socketmq.server import SocketMQSite, build_site
from brokerd.store.base import log_unless_outage

__all__ = [
    "CONTENT_TYPE",
    "Client",
    "ClientConnection",
    "IncomingRequest",
    "Reply",
    "SecurityOptions",
    "Server",
    "SocketMQError",
    "Subscription",
    "listen",
]


def _reactor(reactor: IBrokerReactor | None) -> IBrokerReactor:
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        return cast(IBrokerReactor, default_reactor)  # the global reactor has every facet
    return reactor


class SocketMQError(BrokerError):
    """The server answered a WebSocket request with a status other than 200."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"{status} {reason}".strip())
        self.status = status
        self.reason = reason


# ====================================================================== server (brokerless)


@dataclass
class SecurityOptions:
    """The draft's SecurityOptions.  ``key`` is the server's key pair (an armored secret key or
    a SecretKey; generated when security is enabled and none is given); ``key_ring`` holds the
    armored public keys of the clients allowed to connect."""

    security_enabled: bool = False
    security_method: str = SECURITY_METHOD
    security_required: bool = False
    key: SecretKey | str | bytes | None = None
    key_ring: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.security_method != SECURITY_METHOD:
            raise ValueError("only OpenPGP is supported by socket.mq 1.0")
        if self.security_required and not self.security_enabled:
            raise ValueError("security_required needs security_enabled")
        if isinstance(self.key, (str, bytes)):
            self.key = SecretKey.from_armored(self.key)
        if self.security_enabled and self.key is None:
            self.key = SecretKey.generate("socket.mq server")

    @property
    def public_key(self) -> str | None:
        """The server's armored public key (what GET /socket.mq/public-key serves)."""
        return self.key.armored_public() if isinstance(self.key, SecretKey) else None

    def policy(self) -> Policy:
        level = "required" if self.security_required else "enabled" if self.security_enabled else "disabled"
        rules = (Rule((ANYONE,), {"request": ("*",), "subscribe": ("*",), "publish": ("*",)}),)
        ring = "".join(self.key_ring).encode("ascii", "replace")
        return Policy(level, ring, rules, "SecurityOptions")


class Subscription:
    """What the subscribe callback gets: accept() or reject(code), now or later."""

    def __init__(self, event: str, client_id: str | None) -> None:
        self.event = event
        self.client_id = client_id
        self.decided: Deferred = Deferred()

    def accept(self) -> None:
        if not self.decided.called:
            self.decided.callback(200)

    def reject(self, code: int = 403) -> None:
        if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
            raise ValueError("reject() takes an HTTP error status (400-599)")
        if not self.decided.called:
            self.decided.callback(code)


class Server:
    """A socket.mq server embedded in a Twisted program, serving one application.

    It has its own Broker, so its events reach its own WebSocket subscribers only.
    """

    _log = Logger()

    def __init__(
        self,
        application_name: str,
        on_request: Callable[[IncomingRequest], Any],
        security: SecurityOptions | None = None,
        on_subscribe: Callable[[Subscription], Any] | None = None,
        reactor: IBrokerReactor | None = None,
        settings: Settings | None = None,
    ) -> None:
        """``settings``: brokerd.config.Settings whose socket.mq limits, timeouts and keepalive
        apply (None: the defaults)."""
        if not is_application_name(application_name):
            raise ValueError(f"not a valid application name: {application_name!r}")
        self.application_name = application_name
        self.security = security or SecurityOptions()
        self.reactor = _reactor(reactor)
        self.broker = Broker()
        hook = self._subscribe_hook if on_subscribe is not None else None
        self._on_subscribe = on_subscribe
        key = self.security.key if isinstance(self.security.key, SecretKey) else None
        self.hub = Hub(self.broker, self.reactor, settings, None, self.security.policy(), key, hook)
        self.hub.register(application_name, LocalApplication(on_request))
        self.site: SocketMQSite = build_site(self.hub, demo=False)
        self._ports: list[Any] = []

    def _subscribe_hook(self, event: str, client_id: str | None) -> Deferred:
        subscription = Subscription(event, client_id)
        on_subscribe = self._on_subscribe
        assert on_subscribe is not None  # the hub has this hook only when there is one
        on_subscribe(subscription)
        return subscription.decided

    def listen(self, port: int | str, interface: str = "") -> Deferred:
        """Listen on TCP ``port`` (or any Twisted server endpoint string); fires with self."""
        if isinstance(port, int):
            endpoint = endpoints.TCP4ServerEndpoint(self.reactor, port, interface=interface)
        else:
            endpoint = endpoints.serverFromString(self.reactor, port)
        d = endpoint.listen(self.site)

        def listening(listening_port: IListeningPort) -> Server:
            self._ports.append(listening_port)
            return self

        return d.addCallback(listening)

    @property
    def port(self) -> int:
        """The TCP port of the first listener (useful after listening on port 0)."""
        return self._ports[0].getHost().port

    @property
    def public_key(self) -> str | None:
        return self.security.public_key

    def publish(self, event: str, data: bytes | str, binary: bool = False) -> int:
        """Push ``event`` to its subscribers; returns how many got it."""
        if not is_event_name(event):
            raise ValueError(f"not a valid event name: {event!r}")
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        message = Message(MULTICAST, event.encode("utf-8"), payload, "socketmq", self.application_name.encode(), binary,
                          principal=BROKER)
        publication = Multicast([message])
        delivered = self.broker.route(publication)
        if publication.kept is not None:
            publication.kept.addErrback(log_unless_outage, self._log, "Storing a socket.mq event for durable subscribers")
        return delivered

    def close(self) -> Deferred:
        """Stop listening and close every WebSocket connection."""
        for session in self.broker.sessions():
            close = getattr(session, "dropConnection", None)
            if close is not None:
                close(abort=True)
        ports, self._ports = self._ports, []
        return gatherResults([p.stopListening() for p in ports]).addCallback(lambda _: None)


def listen(
    port: int | str,
    application_name: str,
    security_options: SecurityOptions | None,
    on_request: Callable[[IncomingRequest], Any],
    on_subscribe: Callable[[Subscription], Any] | None = None,
    reactor: IBrokerReactor | None = None,
) -> Deferred:
    """The draft's ``listen(port, applicationName, securityOptions)``; fires with the Server."""
    server = Server(application_name, on_request, security_options, on_subscribe, reactor)
    return server.listen(port)


# ====================================================================== client


@dataclass(frozen=True)
class Reply:
    """The answer to a request: HTTP status, body (decrypted when the reply was secure), the
    response headers, and the verified server identity for a secure reply."""

    status: int
    body: bytes
    headers: Headers
    signer: Identity | None = None


@implementer(IPolicyForHTTPS)
class _FixedTLS:
    def __init__(self, creator: IOpenSSLClientConnectionCreator) -> None:
        self._creator = creator

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        return self._creator


class Client:
    """A socket.mq client: request-reply over HTTP, publish-subscribe (and serving an
    application on a broker) over one WebSocket.

    ``url`` is ``http://host:port`` or ``https://host:port``.  With ``key`` (this client's
    OpenPGP key pair) requests are encrypted and signed and the WebSocket authenticates with
    OpenPGP.  ``server_key`` is the server's armored public key; when None it is fetched from
    /socket.mq/public-key on first use and, with ``known_servers`` (a JSON file), pinned: a
    changed key is refused afterwards.  ``tls`` is the client TLS options for https (see
    brokerd.auth.tls.client_context).
    """

    _log = Logger()

    def __init__(
        self,
        url: str,
        key: SecretKey | str | None = None,
        server_key: str | None = None,
        known_servers: Path | None = None,
        tls: IOpenSSLClientConnectionCreator | None = None,
        reactor: IBrokerReactor | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http://host:port or https://host:port, not {url!r}")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.secure_transport = parts.scheme == "https"
        self.key = SecretKey.from_armored(key) if isinstance(key, str) else key
        self.server_cert = parse_cert(server_key) if server_key is not None else None
        self.known_servers = known_servers
        self.tls = tls
        self.reactor = _reactor(reactor)
        self._pool = HTTPConnectionPool(self.reactor, persistent=False)
        self._agent = Agent(
            self.reactor,
            contextFactory=_FixedTLS(tls) if tls is not None else _default_tls(),
            pool=self._pool,
        )
        self.connection: ClientConnection | None = None

    # ------------------------------------------------------------------ keys

    def fetch_public_key(self) -> Deferred:
        """GET /socket.mq/public-key; fires with the armored key (str)."""
        d = self._agent.request(b"GET", (self.url + "/socket.mq/public-key").encode())

        def got(response: IResponse) -> Deferred:
            if response.code != 200:
                raise SocketMQError(response.code, "no public key")
            return read_body(response).addCallback(lambda body: body.decode("ascii", "replace"))

        return d.addCallback(got)

    def _server_cert(self) -> Deferred:
        if self.server_cert is not None:
            return succeed(self.server_cert)

        def got(armored: str) -> Certificate:
            cert = parse_cert(armored)
            self._pin(cert)
            self.server_cert = cert
            return cert

        return self.fetch_public_key().addCallback(got)

    def _pin(self, cert: Certificate) -> None:
        """Trust on first use: remember the key per host:port; refuse a changed one."""
        if self.known_servers is None:
            return
        try:
            known = json.loads(self.known_servers.read_text())
        except FileNotFoundError:
            known = {}
        except ValueError:
            raise PGPError(f"{self.known_servers}: not a known-servers file") from None
        name = f"{self.host}:{self.port}"
        pinned = known.get(name)
        if pinned is None:
            known[name] = cert.fingerprint
            self.known_servers.write_text(json.dumps(known, indent=1))
        elif pinned != cert.fingerprint:
            raise PGPError(f"the public key of {name} changed (pinned {pinned}); refusing it")

    # ------------------------------------------------------------------ request-reply

    def request(
        self,
        application: str,
        request_id: str,
        body: bytes | str = b"",
        secure: bool | None = None,
        content_type: str | None = None,
        interface_version: str | None = None,
    ) -> Deferred:
        """POST /socket.mq/<application>/<request-id>; fires with a Reply.  ``secure``
        (default: whether this client has a key) encrypts and signs with OpenPGP."""
        return Deferred.fromCoroutine(
            self._request(application, request_id, body, secure, content_type, interface_version)
        )

    async def _request(
        self,
        application: str,
        request_id: str,
        body: bytes | str,
        secure: bool | None,
        content_type: str | None,
        interface_version: str | None,
    ) -> Reply:
        payload = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        secure = self.key is not None if secure is None else secure
        headers = Headers({b"Socket-MQ-Version": [str(limits.PROTOCOL_VERSION).encode()]})
        if content_type:
            headers.addRawHeader(b"Content-Type", content_type.encode("latin-1"))
        if interface_version:
            headers.addRawHeader(b"Interface-Version", interface_version.encode("latin-1"))
        server_cert = None
        if secure:
            if self.key is None:
                raise PGPError("a secure request needs this client's key")
            server_cert = await self._server_cert()
            payload = self.key.seal(payload, server_cert)
            headers.addRawHeader(b"Security-Method", SECURITY_METHOD.encode())
        url = f"{self.url}/socket.mq/{quote(application, safe='')}/{quote(request_id, safe='')}"
        response = await self._agent.request(b"POST", url.encode("ascii"), headers, FileBodyProducer(BytesIO(payload)))
        data = await read_body(response)
        signer = None
        if response.headers.hasHeader(b"Security-Method"):
            if self.key is None or server_cert is None:
                raise PGPError("a secure reply to a plain request")
            data, signer = self.key.open(data, [server_cert])
        elif secure and 200 <= response.code < 300:
            raise PGPError("the server answered a secure request without securing the reply")
        return Reply(response.code, data, response.headers, signer)

    # ------------------------------------------------------------------ WebSocket

    def connect(self, authenticate: bool | None = None) -> Deferred:
        """Open the WebSocket (authenticating with OpenPGP when this client has a key, or
        when ``authenticate``); fires with the ClientConnection once ready."""
        return Deferred.fromCoroutine(self._connect(authenticate))

    async def _connect(self, authenticate: bool | None) -> ClientConnection:
        scheme = "wss" if self.secure_transport else "ws"
        factory = _ClientFactory(url=f"{scheme}://{self.host}:{self.port}/socket.mq/ws", protocols=[limits.SUBPROTOCOL])
        factory.setProtocolOptions(maxMessagePayloadSize=limits.MAX_WS_MESSAGE, maxFramePayloadSize=limits.MAX_WS_MESSAGE)
        if self.secure_transport:
            creator = self.tls if self.tls is not None else _default_tls().creatorForNetloc(self.host.encode(), self.port)
            endpoint: IStreamClientEndpoint = endpoints.SSL4ClientEndpoint(self.reactor, self.host, self.port, creator)
        else:
            endpoint = endpoints.TCP4ClientEndpoint(self.reactor, self.host, self.port)
        connection = cast(ClientConnection, await endpoint.connect(factory))  # what _ClientFactory builds
        hello = await connection.ready
        self.connection = connection
        if authenticate if authenticate is not None else self.key is not None:
            if self.key is None:
                raise PGPError("OpenPGP authentication needs this client's key")
            server_cert = await self._server_cert()
            if hello.server is not None and hello.server != server_cert.fingerprint:
                raise PGPError("the server's hello names another key than the one we trust")
            nonce = new_nonce()
            proof = client_proof(self.key, server_cert, hello.nonce, nonce)
            result = await connection.call(Auth(None, SECURITY_METHOD, proof=proof))
            check_server_proof(self.key, result.proof or "", server_cert, nonce)
            connection.identity = result.identity
        return connection

    def close(self) -> Deferred:
        """Close the WebSocket (if open) and the HTTP connection pool."""
        connection, self.connection = self.connection, None
        ds = [self._pool.closeCachedConnections()]
        if connection is not None:
            ds.append(connection.close())
        return gatherResults(ds).addCallback(lambda _: None)

    def _require_connection(self) -> ClientConnection:
        if self.connection is None:
            raise SocketMQError(0, "not connected: call connect() first")
        return self.connection

    def subscribe(self, event: str, callback: Callable[[Event], Any]) -> Deferred:
        return self._require_connection().subscribe(event, callback)

    def unsubscribe(self, event: str) -> Deferred:
        return self._require_connection().unsubscribe(event)

    def publish(self, event: str, data: bytes | str, binary: bool | None = None) -> Deferred:
        return self._require_connection().publish(event, data, binary)

    def serve(self, application: str, on_request: Callable[[IncomingRequest], Any]) -> Deferred:
        return self._require_connection().serve(application, on_request)

    def login(self, method: str, identity: str, secret: str | None = None) -> Deferred:
        """Authenticate the WebSocket with brokerd's ``open`` or ``secret`` login."""
        return self._require_connection().call(Auth(None, method, identity=identity, secret=secret))


class _BoundedBody(Protocol):
    """Collects a response body of at most ``limit`` bytes (a larger one fails the call)."""

    def __init__(self, done: Deferred, limit: int) -> None:
        self.done = done
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            if not self.done.called:
                self.done.errback(SocketMQError(413, f"reply larger than {self.limit} bytes"))
            cast(IPushProducer, self.transport).stopProducing()  # a response body's transport produces it
            return
        self.parts.append(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self.done.called:
            return
        if reason is None or reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self.parts))
        else:
            self.done.errback(reason)


def read_body(response: IResponse, limit: int = limits.MAX_WS_MESSAGE) -> Deferred:
    """The body of a twisted.web.client response, bounded to ``limit`` bytes."""
    done: Deferred = Deferred()
    response.deliverBody(_BoundedBody(done, limit))
    return done


def _default_tls() -> IPolicyForHTTPS:
    from twisted.web.client import BrowserLikePolicyForHTTPS

    return BrowserLikePolicyForHTTPS()


class ClientConnection(WebSocketClientProtocol):
    """The client side of one socket.mq WebSocket."""

    _log = Logger()

    def __init__(self) -> None:
        super().__init__()
        self.ready: Deferred = Deferred()
        self.closed: Deferred = Deferred()
        self.identity: str | None = None
        self.dropped = 0
        self._ids = 0
        self._calls: dict[int, Deferred] = {}
        self._subscriptions: dict[str, Callable[[Event], Any]] = {}
        self._applications: dict[str, Callable[[IncomingRequest], Any]] = {}
        self.on_event: Callable[[Event], Any] | None = None
        """Called for events of no subscription callback (e.g. after unsubscribe races)."""
        self.on_error: Callable[[Result], Any] | None = None
        """Called with failed results of messages sent without an id (e.g. a late respond)."""

    def connectionMade(self) -> None:
        # Autobahn's own tcpNoDelay option is read before it is copied from the factory
        # (an AttributeError it swallows), so the WebSocket client would keep Nagle on.
        no_delay(self.transport)
        super().connectionMade()

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        try:
            message = decode_server(payload, isBinary)
        except (FrameError, InvalidMessage) as exc:
            self._log.warn("socket.mq: bad message from the server: {error}", error=str(exc))
            # sendClose takes application codes only (1000, 3000-4999): a protocol code such
            # as 1007 goes in the close frame itself, as the server side does.
            code = 1007 if isinstance(exc, FrameError) else 1008
            self.sendCloseFrame(code, str(exc).encode("utf-8")[:120])
            return
        match message:
            case Event():
                callback = self._subscriptions.get(message.event) or self.on_event
                if callback is not None:
                    callback(message)
            case Result():
                d = self._calls.pop(message.id, None) if isinstance(message.id, int) else None
                if d is not None:
                    if message.status == 200:
                        d.callback(message)
                    else:
                        d.errback(SocketMQError(message.status, message.reason))
                elif message.status != 200:
                    if self.on_error is not None:
                        self.on_error(message)
                    else:
                        self._log.warn("socket.mq: {status} {reason}", status=message.status, reason=message.reason)
            case Hello():
                if not self.ready.called:
                    self.ready.callback(message)
            case Request():
                self._serve(message)
            case Dropped():
                self.dropped += message.count

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        error = SocketMQError(code or 1006, reason or "connection closed")
        calls, self._calls = self._calls, {}
        for d in calls.values():
            d.errback(error)
        if not self.ready.called:
            self.ready.errback(error)
        if not self.closed.called:
            self.closed.callback((code, reason))

    def call(self, message: ClientMessage) -> Deferred:
        """Send a request with a fresh id; fires with its Result (SocketMQError unless 200)."""
        self._ids += 1
        message = replace(message, id=self._ids)
        d: Deferred = Deferred()
        self._calls[self._ids] = d
        self.sendMessage(*encode(message))
        return d

    def subscribe(self, event: str, callback: Callable[[Event], Any]) -> Deferred:
        self._subscriptions[event] = callback

        def failed(failure: Failure) -> Failure:
            self._subscriptions.pop(event, None)
            return failure

        return self.call(Subscribe(None, event)).addErrback(failed)

    def unsubscribe(self, event: str) -> Deferred:
        self._subscriptions.pop(event, None)
        return self.call(Unsubscribe(None, event))

    def publish(self, event: str, data: bytes | str, binary: bool | None = None) -> Deferred:
        if isinstance(data, str):
            payload, is_binary = data.encode("utf-8"), False if binary is None else binary
        else:
            payload, is_binary = bytes(data), True if binary is None else binary
        return self.call(Publish(None, event, payload, is_binary))

    def serve(self, application: str, on_request: Callable[[IncomingRequest], Any]) -> Deferred:
        """Register as the server of ``application`` on the broker (brokered mode)."""
        self._applications[application] = on_request
        return self.call(Register(None, application))

    def unserve(self, application: str) -> Deferred:
        self._applications.pop(application, None)
        return self.call(Unregister(None, application))

    def _serve(self, forwarded: Request) -> None:
        on_request = self._applications.get(forwarded.application)
        incoming = IncomingRequest(
            forwarded.application,
            forwarded.request_id,
            forwarded.data,
            forwarded.client,
            forwarded.version,
            forwarded.content_type,
        )

        def answered(answer: tuple[int, bytes, str | None]) -> None:
            status, body, content_type = answer
            if self.state == self.STATE_OPEN:
                self.sendMessage(*encode(Respond(None, forwarded.request, status, body, True, content_type)))

        incoming.answered.addCallback(answered)
        if on_request is None:
            incoming.respond(404, b"not served here")
            return
        try:
            on_request(incoming)
        except Exception:
            self._log.failure("socket.mq request callback failed")
            incoming.respond(500, b"the application failed")

    def close(self) -> Deferred:
        """Fires with None once the connection is closed; ``closed`` keeps its own result
        (the close code and reason) for whoever else waits on it."""
        if self.state == self.STATE_OPEN:
            self.sendClose(1000)
        elif self.state == self.STATE_CLOSED:
            return succeed(None)
        done: Deferred = Deferred()

        def passed_on(result: object) -> object:
            done.callback(None)
            return result

        self.closed.addBoth(passed_on)
        return done


class _ClientFactory(WebSocketClientFactory):
    protocol = ClientConnection


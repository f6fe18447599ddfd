"""What every socket.mq connection of one server shares: the Broker, the security setup, the
applications that answer requests, and the requests waiting for them.

The same Hub runs in both ways of using socket.mq: inside brokerd (many applications, each a
WebSocket session that registered for it) and embedded in a program (one local application
whose callback answers; see :mod:`brokerd.protocols.socketmq.api`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.auth.hosts import OwnNames
from brokerd.auth.workers import WorkQueue
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.events.log import NULL_EVENT_LOG, IEventRecorder, peer_text
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.socketmq.incoming import IncomingRequest
from brokerd.protocols.socketmq.origin import OriginPolicy
from brokerd.protocols.socketmq.pgp import Keyring, SecretKey
from brokerd.protocols.socketmq.policy import Policy
from brokerd.protocols.socketmq.remote import RemoteApplications

OK = 200
BAD_GATEWAY = 502
UNAVAILABLE = 503
GATEWAY_TIMEOUT = 504
TEXT = "text/plain; charset=utf-8"
REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    496: "No Cert",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


PROTOCOL = "socketmq"
"""The protocol name sessions carry and the event log records."""


class Application(Protocol):
    """Whatever serves an application name: a local callback or a registered session."""

    def handle(self, request: IncomingRequest) -> None: ...


class LocalApplication:
    """An application served by a callback in this process (the embedded Server API)."""

    _log = Logger()

    def __init__(self, on_request: Callable[[IncomingRequest], Any]) -> None:
        self._on_request = on_request

    def handle(self, request: IncomingRequest) -> None:
        d = maybeDeferred(self._on_request, request)

        def failed(failure: Failure) -> None:
            self._log.failure("socket.mq request callback failed", failure)
            request.respond(500, b"the application failed\n", TEXT)

        d.addErrback(failed)


SubscribeHook = Callable[[str, "str | None"], Deferred]
"""(event, client id) -> Deferred firing with an HTTP-style status: 200 accepts."""


class Hub:
    """Shared state of one socket.mq server (one per brokerd, one per embedded Server)."""

    _log = Logger()

    def __init__(
        self,
        broker: Broker,
        reactor: IBrokerReactor,
        settings: Settings | None = None,
        portal: Portal | None = None,
        policy: Policy | None = None,
        key: SecretKey | None = None,
        subscribe_hook: SubscribeHook | None = None,
        events: IEventRecorder = NULL_EVENT_LOG,
        work_queue: WorkQueue | None = None,
    ) -> None:
        self.broker = broker
        self.work_queue = work_queue if work_queue is not None else WorkQueue(reactor)
        """Where OpenPGP work runs: bounded, so a flood is refused (Busy), not queued."""
        self.events = events
        """The event log's IEventRecorder: auth failures, logins by authentication and
        slow-consumer drops (routing and sessions go through the Broker)."""
        self.reactor = reactor
        self.settings = settings = settings if settings is not None else Settings()
        """Where every limit and timeout below comes from (an embedded Server: the defaults)."""
        self.portal = portal
        self.policy = policy or Policy()
        self.key = key if self.policy.enabled else None
        self.keyring = Keyring.from_armored(self.policy.keyring_data)
        self.subscribe_hook = subscribe_hook
        self.applications: dict[str, Application] = {}
        self.request_timeout = settings.socketmq_request_timeout
        """Seconds a registered application has to answer a forwarded request; then 504."""
        self.max_output_buffer = settings.max_output_buffer
        self.deflate = settings.socketmq_deflate
        """Accept permessage-deflate offers (``--socketmq-deflate``; off by default)."""
        self.max_frames = settings.socketmq_max_frames
        """Frames one incoming WebSocket message may have; more close it with 1009."""
        self.read_timeout = settings.socketmq_request_read_timeout
        """Seconds from an HTTP request's first byte until its headers and body arrived; then 408."""
        self.handshake_timeout = settings.socketmq_handshake_timeout
        """Seconds the WebSocket opening handshake may take from the upgrade request's first
        byte; also the bound on any request line."""
        own = OwnNames.of(settings.listeners.get("socketmq", []), settings.server_names)
        self.origins = OriginPolicy.from_setting(settings.socketmq_origins, own)
        """The browser origins that may use this server (docs/socketmq.md, Browsers)."""
        self.stats = {"requests": 0, "timeouts": 0}
        self.remote: RemoteApplications | None = None
        """Applications of the other nodes of a cluster (None on a single node)."""
        engine = getattr(broker, "engine", None)
        if engine is not None and engine.shared:
            self.remote = RemoteApplications(self, engine)

    # ------------------------------------------------------------------ security

    @property
    def security(self) -> str:
        return self.policy.security if self.key is not None else "disabled"

    def auth_failure(self, address: object, identity: str | None, scheme: str | None, reason: str) -> None:
        """A refused authentication or a request the policy refused (401, 403, 496) from the
        peer at ``address``."""
        self.events.auth_failure(PROTOCOL, identity, source=peer_text(address), scheme=scheme, reason=reason)

    def run_crypto(self, function: Callable[..., object], *args: object) -> Deferred:
        """Run OpenPGP work off the reactor thread (in the reactor's thread pool); fails
        with brokerd.errors.Busy when the work queue is full."""
        return self.work_queue.run(function, *args)

    def add_client_key(self, armored: bytes | str) -> None:
        """Allow one more client key (embedders add keys at run time)."""
        for cert in Keyring.from_armored(armored).certs():
            self.keyring.add(cert)

    # ------------------------------------------------------------------ applications

    def register(self, name: str, application: Application) -> bool:
        """Serve ``name`` with ``application``; False when someone else already does (on
        this node, or on another node of the cluster)."""
        current = self.applications.get(name)
        if current is not None and current is not application:
            return False
        if current is None:
            if self.remote is not None:
                if self.remote.served_elsewhere(name) is not None:
                    return False
                self.remote.claim(name)
            self.applications[name] = application
        return True

    def unregister(self, name: str, application: Application) -> bool:
        if self.applications.get(name) is not application:
            return False
        del self.applications[name]
        if self.remote is not None:
            self.remote.release(name)
        return True

    def dispatch(self, request: IncomingRequest, here_only: bool = False) -> Deferred:
        """Hand ``request`` to its application (on this node, or in a cluster on the node
        that serves it unless ``here_only``); the Deferred fires with (status, body,
        content_type): 404 when nobody serves the application, 504 after the timeout."""
        self.stats["requests"] += 1
        application = self.applications.get(request.application)
        if application is None and self.remote is not None and not here_only:
            application = self.remote.served_elsewhere(request.application)
        if application is None:
            request.respond(404, f"no application {request.application} is registered\n", TEXT)
            return request.answered
        timer = self.reactor.callLater(self.request_timeout, self._timed_out, request)
        request.on_done(lambda: timer.cancel() if timer.active() else None)
        application.handle(request)
        return request.answered

    def _timed_out(self, request: IncomingRequest) -> None:
        self.stats["timeouts"] += 1
        request.respond(GATEWAY_TIMEOUT, b"the application did not answer in time\n", TEXT)

    # ------------------------------------------------------------------ subscriptions

    def may_subscribe(self, event: str, client_id: str | None) -> Deferred:
        """The embedder's subscribe decision (200 when there is no hook)."""
        if self.subscribe_hook is None:
            return succeed(OK)
        d = maybeDeferred(self.subscribe_hook, event, client_id)
        return d.addTimeout(self.request_timeout, self.reactor, onTimeoutCancel=lambda *_: GATEWAY_TIMEOUT)

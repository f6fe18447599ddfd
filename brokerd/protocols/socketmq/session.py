"""One socket.mq WebSocket connection: publish-subscribe, authentication, and (in brokered
mode) serving an application whose requests the broker forwards here.

The protocol object is also the session's "mind" (ISubscriber): the Broker writes rendered
frames straight to it.  Client messages are dispatched through one table by message class.

Fan-out: the core renders each event once (wire.py, Autobahn's ``prepareMessage``) and calls
``send`` of every recipient with it.  ``send`` hands the prepared messages to Autobahn's public
``sendPreparedMessage``, which compresses per connection when permessage-deflate was negotiated
(``--socketmq-deflate``).  On an Autobahn release whose ``sendPreparedMessage`` was checked
(CHECKED_AUTOBAHN; tests/protocols/socketmq/test_fanout.py fails on any other) a connection
without compression writes the prepared bytes to its transport itself instead: the same bytes,
without ``sendData``'s per-call debug-log arguments and statistics: sendPreparedMessage costs
about 3.7 times the server CPU per delivered event (docs/performance-history.md).

Flow control follows the SSMP front end: the session is the streaming producer of its own
transport.  When more than ``max_output_buffer`` bytes wait for a slow reader, Twisted pauses
it: events for that reader are dropped and counted, its own messages are no longer read, and
once the buffer drains it gets one ``dropped`` message with the count.  A reader that stays
congested for SLOW_CONSUMER_TIMEOUT seconds is disconnected.

Event log (docs/events.md): the core logs the session's login (at WebSocket open, as
``anonymous`` or its certificate's name), logout, subscriptions and publishes.  This module adds
a ``login`` with the scheme when the client authenticates later (the session takes that name),
an ``auth_failure`` for every refused authentication (401) and every message the policy refused
(496: authenticate first; 403: this client may not), and per congestion episode one
``dropped``/``slow_consumer`` record with the count (``dropped``), when it ends.

Access: the policy file (brokerd.protocols.socketmq.policy) and the core's access policy (the
UAL file) must both allow a subscribe or publish; a refusal by either is the same 496/403.
A shared-secret or open login proves no identity, so its policy names are ``secret:<name>``
and ``open:<name>``, never the bare name a certificate or key would give.
"""
from __future__ import annotations

from collections.abc import Hashable
from itertools import count
from typing import Any, Callable, cast

import autobahn
from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateOfferAccept
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.cred.credentials import ICredentials
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IAddress, IPushProducer, ISSLTransport
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.auth.credentials import OpenLogin, SharedSecret
from brokerd.auth.realm import IIdentity
from brokerd.auth.tls import peer_names
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, PLAIN, Details, Message, property_problem
from brokerd.core.principal import NOBODY, OPENPGP as OPENPGP_REALM, Principal, certificate_principal
from brokerd.core.publication import Multicast
from brokerd.errors import AlreadySubscribed, Busy, Forbidden, NotSubscribed, SubscriptionLimit
from brokerd.events.log import transport_source
from brokerd.events.schema import LOGIN
from brokerd.interfaces import IBrokerReactor, ISubscriber
from brokerd.protocols.dispatch import command_table
from brokerd.protocols.flow import record_drops
from brokerd.protocols.lifecycle import ConnectionLifecycle
from brokerd.protocols.socketmq import limits
from brokerd.protocols.socketmq.codec import (
    FrameError,
    InvalidMessage,
    decode_client,
    encode,
    frame,
)
from brokerd.protocols.socketmq.events import (
    Auth,
    Dropped,
    Hello,
    MessageId,
    Publish,
    Register,
    Request,
    Respond,
    Result,
    Subscribe,
    Unregister,
    Unsubscribe,
)
from brokerd.protocols.socketmq.fragments import FragmentBudget
from brokerd.protocols.socketmq.hub import PROTOCOL, REASONS, TEXT, Hub
from brokerd.protocols.socketmq.incoming import IncomingRequest
from brokerd.protocols.socketmq.keepalive import KeepAlive
from brokerd.protocols.socketmq.pgp import (
    Identity,
    PGPError,
    check_client_proof,
    new_nonce,
    server_proof,
)
from brokerd.protocols.socketmq.wire import SOCKETMQ_WIRE
from brokerd.protocols.websocket import ClockedServerFactory, ClockedServerProtocol
from brokerd.store.base import is_outage

SLOW_CONSUMER_TIMEOUT = 30.0
"""Seconds a WebSocket reader may stay congested before it is disconnected."""
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CERT = "cert"
"""The scheme of a session named by its verified TLS client certificate."""
OPENPGP = "OpenPGP"
_ANONYMOUS = b"anonymous"
CHECKED_AUTOBAHN = ((26, 10),)
"""(major, minor) of the Autobahn releases whose sendPreparedMessage the fast path was checked
against: without compression it writes ``payloadHybi`` through ``sendData``, which writes it to
the transport when nothing is queued (socket.mq never queues: no ``sync``, no ``chopsize``)."""


def autobahn_release() -> tuple[int, int]:
    """The installed Autobahn's (major, minor)."""
    major, minor = autobahn.__version__.split(".")[:2]
    return (int(major), int(minor))


FAST_FANOUT = autobahn_release() in CHECKED_AUTOBAHN
"""Whether sessions without compression may write prepared frames to their transport."""
_tokens = count(1)


def _result(id: MessageId, status: int, reason: str = "", **extra: Any) -> bytes:
    return frame(*encode(Result(id, status, reason or REASONS.get(status, ""), **extra)))


@implementer(ISubscriber, IPushProducer)
class SocketMQSession(ConnectionLifecycle, FragmentBudget, ClockedServerProtocol):  # type: ignore[misc]  # Autobahn's own bases disagree on peer and _transport_details
    """One WebSocket connection; also its session as the Broker sees it."""

    _log = Logger()
    protocol = "socketmq"
    wire_format = SOCKETMQ_WIRE
    name = _ANONYMOUS
    address = None
    principal: Principal = NOBODY
    factory: SocketMQWebSocketFactory
    http_channel: Any = None
    """The HTTP channel this session took the connection over from: the transport reports
    the end of the connection to this session only, so the session passes it on (the
    channel's own bookkeeping, and whatever counts connections around it, end with it)."""
    heard = False
    """Set by every message, ping and pong from the client (keepalive.py reads it)."""
    last_heard = 0.0
    pinged_at: float | None = None

    def __init__(self) -> None:
        super().__init__()
        self.hub: Hub = None  # type: ignore[assignment]  # the factory's, from onOpen on; _cleanup checks for None before
        self.names: tuple[str, ...] | None = None
        """Who the client is (None until it authenticates): the names policy rules match."""
        self.client_id: str | None = None
        self.scheme: str | None = None
        """How the client authenticated (cert, OpenPGP, open, secret); None until it does."""
        self.nonce = new_nonce()
        self.closed = False
        self.dropped = 0
        self._unreported = 0
        self._busy = False
        self._queue: list[tuple[bytes, bool]] = []
        self._congested_timer: DelayedCall | None = None
        self.applications: set[str] = set()
        self.pending: dict[str, IncomingRequest] = {}
        self.send: Callable[[bytes], None] = self._discard
        self._write: Callable[[bytes], None] = self._discard
        self._open = False
        """True from onOpen until the first close frame (nothing may follow one)."""
        self._compressing = False
        """Counted in the wire format's ``compressing`` (permessage-deflate negotiated)."""
        self._congested = False

    # ------------------------------------------------------------------ opening

    def onConnect(self, request: ConnectionRequest) -> str:
        hub, origin = self.factory.hub, request.headers.get("origin")
        if not hub.origins.allows(origin, request.headers.get("host"), ISSLTransport.providedBy(self.transport)):
            hub.auth_failure(self.transport.getPeer(), None, None, f"origin not allowed: {origin[:200]}")
            raise ConnectionDeny(403, "pages of this origin may not use this server")
        if limits.SUBPROTOCOL not in request.protocols:
            raise ConnectionDeny(400, f"offer the WebSocket subprotocol {limits.SUBPROTOCOL}")
        return limits.SUBPROTOCOL

    def onOpen(self) -> None:
        hub = self.hub = self.factory.hub
        transport = self.transport
        self._open = True
        if FAST_FANOUT and self._perMessageCompress is None:
            self._write = transport.write
        else:
            self._write = self._send_prepared
        if self._perMessageCompress is not None:
            self._compressing = True
            self.wire_format.compressing += 1  # no pre-rendered frames from other nodes now
        self.send = self._write
        # The lifecycle's steps 2-4 (brokerd.protocols.lifecycle); step 1, the admission, was
        # the HTTP channel's, handed over (SocketMQWebSocketFactory.buildProtocol).
        self.prepare_transport(hub.max_output_buffer)
        transport.unregisterProducer()  # the HTTP channel's, from before the upgrade
        self.register_producer()
        names = peer_names(transport)
        if names:
            self._authenticated(names, names[0], CERT, certificate_principal(names))
        hub.broker.attach(self)
        self.factory.keepalive.watch(self)
        fingerprint = hub.key.fingerprint if hub.key is not None else None
        hello = Hello(limits.PROTOCOL_VERSION, hub.security, self.nonce, fingerprint)
        transport.write(frame(*encode(hello)))

    def _authenticated(self, names: tuple[str, ...], client_id: str, scheme: str, principal: Principal) -> None:
        self.names = names
        self.principal = principal
        self.client_id = client_id
        self.scheme = scheme
        self.name = client_id.encode("utf-8", "replace")

    def _logged_in(self, names: tuple[str, ...], client_id: str, scheme: str, principal: Principal) -> None:
        """An ``auth`` message succeeded: the session takes the name, and that is logged."""
        self._authenticated(names, client_id, scheme, principal)
        source = transport_source(self.transport)
        self.hub.events.record(LOGIN, PROTOCOL, session=self.name, source=source, scheme=scheme, outcome="ok")

    def _refused(self, identity: str | None, scheme: str | None, reason: str) -> None:
        """Log an auth failure (or a policy refusal) of this connection."""
        transport = self.transport
        self.hub.auth_failure(transport.getPeer() if transport is not None else None, identity, scheme, reason)

    # ------------------------------------------------------------------ closing

    def sendCloseFrame(self, code: int | None = None, reasonUtf8: bytes | None = None, isReply: bool = False) -> None:
        self._stop_sending()  # nothing may follow a close frame
        super().sendCloseFrame(code, reasonUtf8, isReply)

    def dropConnection(self, abort: bool = False) -> None:
        self._stop_sending()
        super().dropConnection(abort)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop_sending()
        self.factory.keepalive.forget(self)
        if self._compressing:
            self._compressing = False
            self.wire_format.compressing -= 1
        if not self.closed:
            self.closed = True
            self._cleanup()
        super().connectionLost(reason)
        channel, self.http_channel = self.http_channel, None
        if channel is not None:
            channel.connectionLost(reason)

    def lifecycle_broker(self) -> Broker:
        return self.factory.hub.broker

    def lifecycle_clock(self) -> IBrokerReactor:
        return self.factory.hub.reactor

    def _cleanup(self) -> None:
        self._congested_timer = None
        self.release_connection()  # the slow-consumer timer too
        hub = self.hub
        if hub is None:
            return
        for name in tuple(self.applications):
            hub.unregister(name, self)
        self.applications.clear()
        pending, self.pending = self.pending, {}
        for request in pending.values():
            request.respond(502, b"the application went away\n", TEXT)
        if self._unreported:
            record_drops(hub.events, PROTOCOL, self.name, self._unreported)
            self._unreported = 0
        hub.broker.detach(self)

    def _close(self, code: int, reason: str) -> None:
        """Start the closing handshake with any RFC 6455 code (Autobahn's sendClose only
        takes 1000 and 3000-4999, but 1007 and 1008 are what the peer deserves here)."""
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(code, reason.encode("utf-8")[:120])

    # ------------------------------------------------------------------ output

    def _stop_sending(self) -> None:
        self._open = False
        self.send = self._discard

    def _send_prepared(self, data: bytes) -> None:
        """``send`` through Autobahn's public API: each event of the core's rendering (a
        PreparedFrames; bytes of another origin are complete uncompressed frames)."""
        if self.state != self.STATE_OPEN:
            return  # Autobahn's sendMessage raises once closing; the core's loop must go on
        prepared = getattr(data, "prepared", None)
        if prepared is None:
            self.sendData(data)
            return
        for message in prepared:
            self.sendPreparedMessage(message)

    def _discard(self, data: bytes) -> None:
        """``send`` of a session that is not open."""

    def _drop(self, data: bytes) -> None:
        """``send`` while congested: count instead of writing."""
        self.dropped += 1
        self._unreported += 1
        self.hub.broker.stats.slow_consumer_drops += 1

    def _reply(self, data: bytes) -> None:
        """Answers to the client's own requests: never dropped (its reads are paused while
        congested, so these cannot pile up), never after a close frame."""
        if self._open:
            self.transport.write(data)

    def pauseProducing(self) -> None:
        if self.closed or not self._open or self._congested:
            return
        self._congested = True
        self.send = self._drop
        self.transport.pauseProducing()
        self._congested_timer = self.call_later(SLOW_CONSUMER_TIMEOUT, self._too_slow)

    def resumeProducing(self) -> None:
        if self.closed or not self._congested:
            return
        self._congested = False
        self.cancel_timer(self._congested_timer)
        self._congested_timer = None
        self.send = self._write
        if self._unreported:
            self.transport.write(frame(*encode(Dropped(self._unreported))))
            record_drops(self.hub.events, PROTOCOL, self.name, self._unreported)
            self._unreported = 0
        if not self._busy:
            self.transport.resumeProducing()

    def stopProducing(self) -> None:
        self._stop_sending()

    def _too_slow(self) -> None:
        self._congested_timer = None
        self._log.info("socket.mq: disconnecting {peer}, congested for {seconds} s", peer=self.peer, seconds=SLOW_CONSUMER_TIMEOUT)
        self.dropConnection(abort=True)

    # ------------------------------------------------------------------ ISubscriber

    def replaced(self) -> None:
        """Sessions have no address, so the core never replaces one; close if it does."""
        self._close(CLOSE_GOING_AWAY, "replaced")

    # ------------------------------------------------------------------ input

    def onPing(self, payload: bytes) -> None:
        self.heard = True
        super().onPing(payload)  # the pong (RFC 6455 section 5.5.2)

    def onPong(self, payload: bytes) -> None:
        self.heard = True

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.heard = True
        if self.closed or not self._open:
            return
        if self._busy:
            self._queue.append((payload, isBinary))
            return
        self._handle(payload, isBinary)

    def _handle(self, payload: bytes, binary: bool) -> None:
        try:
            message = decode_client(payload, binary)
        except FrameError as exc:
            self._close(exc.close_code, str(exc))
            return
        except InvalidMessage as exc:
            self._reply(frame(exc.reply, False))
            return
        if self.names is None and self.hub.policy.required and type(message) is not Auth:
            self._refused(None, None, "authentication required")
            self._reply(_result(message.id, 496, "this server requires authentication"))
            return
        _DISPATCH[type(message)](self, message)

    def _wait(self) -> None:
        """Hold further messages until an asynchronous step (authentication) is done."""
        self._busy = True
        self.transport.pauseProducing()

    def _done_waiting(self) -> None:
        self._busy = False
        if self.closed:
            return
        if not self._congested:
            self.transport.resumeProducing()
        while self._queue and not self._busy and not self.closed:
            payload, binary = self._queue.pop(0)
            self._handle(payload, binary)

    def _deny(self, id: MessageId, what: str) -> None:
        """Not allowed by the policy: 496 for a plain connection (authenticate and retry),
        403 for an authenticated one."""
        if self.names is None:
            self._refused(None, None, f"not allowed without authentication: {what}")
            self._reply(_result(id, 496, f"{what} needs an authenticated client"))
        else:
            self._refused(self.client_id, self.scheme, f"not allowed: {what}")
            self._reply(_result(id, 403, f"{self.client_id} may not {what}"))

    def _ok(self, id: MessageId) -> None:
        if id is not None:
            self._reply(_result(id, 200))

    # ------------------------------------------------------------------ auth

    def do_AUTH(self, message: Auth) -> None:
        if self.names is not None:
            self._reply(_result(message.id, 409, f"already authenticated as {self.client_id}"))
            return
        if message.method == "OpenPGP":
            self._auth_openpgp(message)
        else:
            self._auth_portal(message)

    def _auth_openpgp(self, message: Auth) -> None:
        hub = self.hub
        key = hub.key
        if key is None:
            self._reply(_result(message.id, 501, "OpenPGP is not enabled on this server"))
            return

        proof = message.proof
        assert proof is not None  # the codec requires one for OpenPGP

        def check() -> tuple[Identity, str]:
            identity, client_nonce = check_client_proof(key, proof, hub.keyring, self.nonce)
            return identity, server_proof(key, identity.cert, client_nonce)

        def succeeded(result: tuple[Identity, str]) -> None:
            identity, proof = result
            fingerprint = "fpr:" + identity.fingerprint
            self._logged_in((identity.user_id, fingerprint), identity.user_id, OPENPGP,
                            Principal(fingerprint, OPENPGP_REALM))
            self._reply(_result(message.id, 200, identity=identity.user_id, proof=proof))

        def failed(failure: Failure) -> None:
            if failure.check(Busy):
                self._reply(_result(message.id, 503, "busy: too much OpenPGP work is waiting; try again later"))
                return
            failure.trap(PGPError)
            self._refused(None, OPENPGP, failure.getErrorMessage())
            self._reply(_result(message.id, 401, f"OpenPGP authentication failed: {failure.getErrorMessage()}"))

        self._wait()
        d = hub.run_crypto(check)
        d.addCallbacks(succeeded, failed)
        d.addErrback(lambda failure: self._log.failure("socket.mq OpenPGP authentication", failure))
        d.addBoth(lambda _: self._done_waiting())

    def _auth_portal(self, message: Auth) -> None:
        portal = self.hub.portal
        identifier = (message.identity or "").encode("utf-8")
        if portal is None or not identifier:
            self._refused(message.identity or None, message.method, "login is not available")
            self._reply(_result(message.id, 401, "login is not available"))
            return
        if message.method == "secret":
            credentials: ICredentials = SharedSecret(identifier, (message.secret or "").encode("utf-8"))
        else:
            credentials = OpenLogin(identifier)

        def succeeded(result: Any) -> None:
            _interface, identity, _logout = result
            name = identity.name.decode("utf-8", "replace")
            self._logged_in((str(identity.principal),), name, message.method, identity.principal)
            self._reply(_result(message.id, 200, identity=name))

        def failed(failure: Failure) -> None:
            failure.trap(UnauthorizedLogin, UnhandledCredentials, NotImplementedError)
            if failure.check(UnhandledCredentials):
                reason = "scheme not enabled"
            else:
                reason = failure.getErrorMessage() or "refused"
            self._refused(message.identity, message.method, reason)
            self._reply(_result(message.id, 401, f"{message.method} login refused"))

        self._wait()
        d = portal.login(credentials, self, IIdentity)
        d.addCallbacks(succeeded, failed)
        d.addErrback(lambda failure: self._log.failure("socket.mq login", failure))
        d.addBoth(lambda _: self._done_waiting())

    # ------------------------------------------------------------------ publish-subscribe

    def do_SUBSCRIBE(self, message: Subscribe) -> None:
        hub = self.hub
        if not hub.policy.allows("subscribe", self.names, message.event):
            self._deny(message.id, f"subscribe to {message.event}")
            return

        def decided(status: object) -> None:
            if self.closed:
                return
            if status != 200:
                code = status if isinstance(status, int) and 400 <= status <= 599 else 403
                self._reply(_result(message.id, code, f"subscription to {message.event} rejected"))
                return
            try:
                hub.broker.subscribe(self, message.event.encode("utf-8"))
            except AlreadySubscribed:
                self._reply(_result(message.id, 409, f"already subscribed to {message.event}"))
            except SubscriptionLimit:
                self._reply(_result(message.id, 413, "too many subscriptions"))
            except Forbidden:
                self._deny(message.id, f"subscribe to {message.event}")
            else:
                self._reply(_result(message.id, 200))

        def failed(failure: Failure) -> None:
            self._log.failure("socket.mq subscribe callback failed", failure)
            if not self.closed:
                self._reply(_result(message.id, 500, "the subscribe callback failed"))

        d = hub.may_subscribe(message.event, self.client_id)
        d.addCallbacks(decided, failed)

    def do_UNSUBSCRIBE(self, message: Unsubscribe) -> None:
        try:
            self.hub.broker.unsubscribe(self, message.event.encode("utf-8"))
        except NotSubscribed:
            self._reply(_result(message.id, 404, f"not subscribed to {message.event}"))
        else:
            self._ok(message.id)

    def do_PUBLISH(self, message: Publish) -> None:
        hub = self.hub
        if not hub.policy.allows("publish", self.names, message.event):
            self._deny(message.id, f"publish to {message.event}")
            return
        topic = message.event.encode("utf-8")
        if not hub.broker.may_publish(self.principal, topic):
            self._deny(message.id, f"publish to {message.event}")
            return
        details = PLAIN
        if (message.content_type is not None or message.response_topic is not None
                or message.correlation is not None or message.user_properties):
            details = Details(content_type=message.content_type, response_topic=message.response_topic,
                              correlation=message.correlation, user_properties=message.user_properties)
            settings = hub.settings
            problem = property_problem(details, settings.max_user_properties, settings.max_property_bytes)
            if problem is not None:
                self._reply(_result(message.id, 413, problem))
                return
        published = Message(MULTICAST, topic, message.data, "socketmq", self.name, message.binary,
                            details=details, principal=self.principal)
        publication = Multicast([published], self)
        hub.broker.route(publication)
        kept = publication.kept
        if kept is None:
            self._ok(message.id)
            return
        # The result says "accepted" only once the message is stored for durable subscribers.
        request = message.id

        def failed(failure: Failure) -> None:
            if not is_outage(failure):  # the store logs its outage once
                self._log.failure("Storing a socket.mq message for durable subscribers", failure)
            if request is not None:
                self._reply(_result(request, 500, "the message could not be stored"))

        kept.addCallbacks(lambda _: self._ok(request), failed)

    # ------------------------------------------------------------------ serving (brokered mode)

    def do_REGISTER(self, message: Register) -> None:
        hub = self.hub
        name = message.application
        if not hub.policy.allows("serve", self.names, name):
            self._deny(message.id, f"serve {name}")
            return
        if name not in self.applications and len(self.applications) >= limits.MAX_REGISTRATIONS:
            self._reply(_result(message.id, 413, "too many applications on one connection"))
            return
        if not hub.register(name, self):
            self._reply(_result(message.id, 409, f"{name} is already served by another client"))
            return
        self.applications.add(name)
        self._ok(message.id)

    def do_UNREGISTER(self, message: Unregister) -> None:
        if message.application not in self.applications:
            self._reply(_result(message.id, 404, f"not serving {message.application}"))
            return
        self.applications.discard(message.application)
        self.hub.unregister(message.application, self)
        self._ok(message.id)

    def handle(self, request: IncomingRequest) -> None:
        """Forward a POST for one of our applications (the Hub's Application interface)."""
        if self._congested or not self._open:
            request.respond(503, b"the application is not reading (congested or closing)\n", TEXT)
            return
        if len(self.pending) >= limits.MAX_PENDING_PER_APPLICATION:
            request.respond(503, b"the application has too many unanswered requests\n", TEXT)
            return
        token = str(next(_tokens))
        self.pending[token] = request
        request.on_done(lambda: self.pending.pop(token, None))
        forwarded = Request(
            token,
            request.application,
            request.request_id,
            request.body,
            request.client_id,
            request.version,
            request.content_type,
        )
        self.transport.write(frame(*encode(forwarded)))

    def do_RESPOND(self, message: Respond) -> None:
        request = self.pending.get(message.request)
        if request is None:
            self._reply(_result(message.id, 404, "no such request (answered, timed out or unknown)"))
            return
        request.respond(message.status, message.data, message.content_type)
        self._ok(message.id)


# The codec's message classes and their message types (brokerd.protocols.dispatch): one
# ``do_<TYPE>`` each, the JSON ``type`` in capitals as MQTT's packet names are written.
_TYPES: dict[Hashable, str] = {
    Auth: "AUTH", Subscribe: "SUBSCRIBE", Unsubscribe: "UNSUBSCRIBE", Publish: "PUBLISH", Register: "REGISTER",
    Unregister: "UNREGISTER", Respond: "RESPOND",
}
_DISPATCH: dict[type, Callable[[SocketMQSession, Any], None]] = command_table(SocketMQSession, _TYPES)


class SocketMQWebSocketFactory(ClockedServerFactory):
    """Builds sessions for one listener; ``pending_channel`` is set by the resource while it
    upgrades a connection, so the session inherits the channel's connection count (its
    admission) and tells the channel when the connection ends."""

    protocol = SocketMQSession  # type: ignore[assignment]  # Autobahn's factories are not generic over their protocol as Twisted's Factory[P] is

    def __init__(self, hub: Hub, ping_interval: float, pong_timeout: float) -> None:
        super().__init__(hub.reactor)
        self.hub = hub
        self.pending_channel: Any = None
        self.keepalive = KeepAlive(hub.reactor, ping_interval, pong_timeout)
        # Every timer is the hub's clock's, none Autobahn's (brokerd.protocols.websocket):
        # the pings are keepalive.py's, the close handshake's timeout ClockedServerProtocol's,
        # and the opening handshake's the HTTP channel's deadline (server.SocketMQChannel).
        self.setProtocolOptions(
            maxMessagePayloadSize=limits.MAX_WS_MESSAGE,
            maxFramePayloadSize=limits.MAX_WS_MESSAGE,
            failByDrop=False,
            perMessageCompressionAccept=self._accept_compression,
        )

    def _accept_compression(self, offers: list[Any]) -> PerMessageDeflateOfferAccept | None:
        """With ``--socketmq-deflate``, accept the client's first permessage-deflate offer with
        the parameters it asked for (RFC 7692); without it, none: frames go out uncompressed."""
        if self.hub.deflate:
            for offer in offers:
                if isinstance(offer, PerMessageDeflateOffer):
                    return PerMessageDeflateOfferAccept(offer)
        return None

    def buildProtocol(self, addr: IAddress) -> SocketMQSession:  # type: ignore[override]  # as for protocol
        session = cast(SocketMQSession, super().buildProtocol(addr))
        channel, self.pending_channel = self.pending_channel, None
        if channel is not None:
            take = getattr(channel, "take_admission", None)
            session.adopt_admission(take() if take is not None else None)
            session.http_channel = channel
        return session

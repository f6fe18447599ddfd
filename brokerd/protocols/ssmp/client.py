"""A Twisted SSMP 1.1 client, for brokerd's own tools and for any Twisted program.

Three layers, each usable on its own:

- :class:`SSMPClientProtocol`: one connection.  Bytes go through the sans-IO
  :class:`~brokerd.protocols.ssmp.codec.SSMPClientParser`; SSMP answers requests strictly in
  order, so every request gets a Deferred in one FIFO and each response fires the oldest.
  Server events reach :meth:`SSMPClientProtocol.eventReceived`.  The protocol does what the
  spec asks of a client by itself: it answers ``000 . PING`` with ``PONG``, PINGs a quiet
  server and gives up on one that does not answer, and closes the connection on anything that
  breaks the grammar (including events with verbs it does not know).
- :class:`SSMPClientFactory`: builds those protocols with shared settings and callbacks.
- :class:`SSMPClient`: a service that keeps one logged-in connection alive over any client
  endpoint (reconnecting with backoff through ClientService), logs in again and restores its
  subscriptions after every reconnect.

Delivery is at most once, as in the spec: a request whose connection drops before its answer
fails with the connection's reason and is not sent again.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from twisted.application.internet import ClientService, backoffPolicy
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, fail, gatherResults, succeed
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IAddress, IDelayedCall, IProtocol, IProtocolFactory, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.errors import BrokerError
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols import endpoints
from brokerd.protocols.closing import ClosedNotifier, abort_connection
from brokerd.protocols.nodelay import no_delay
from brokerd.protocols.ssmp.codec import (
    SSMPClientParser,
    encode_request,
    is_id,
    payload_content,
    wire_payload,
)
from brokerd.protocols.ssmp.events import Event, Response

OK = b"200"
CONFLICT = b"409"
PRESENCE = b"PRESENCE"
_PING_REQUEST = b"PING\n"
_PONG_REQUEST = b"PONG\n"

MessageHandler = Callable[[bytes, bytes, bytes | None, bytes, bool], object]
"""``(sender, verb, target, content, binary)`` for UCAST, MCAST and BCAST events."""
PresenceHandler = Callable[[bytes, bytes, bytes, bool], object]
"""``(sender, verb, topic, presence)`` for SUBSCRIBE and UNSUBSCRIBE events."""

# Event verbs a client understands, and the method that handles each.  Anything else makes the
# connection unusable: the spec says a client MUST close on an event verb it does not know.
_EVENT_HANDLERS = {
    b"PING": "event_PING",
    b"PONG": "event_PONG",
    b"SUBSCRIBE": "eventReceived",
    b"UNSUBSCRIBE": "eventReceived",
    b"UCAST": "eventReceived",
    b"MCAST": "eventReceived",
    b"BCAST": "eventReceived",
}
_PRESENCE_VERBS = (b"SUBSCRIBE", b"UNSUBSCRIBE")


class SSMPError(BrokerError):
    """The server answered a request with something other than ``200``.

    ``code`` is the three-digit code as bytes (``b"401"``); ``payload`` the wire payload that
    came with it, if any (a ``401`` lists the schemes the server accepts).
    """

    def __init__(self, code: bytes, payload: bytes | None = None) -> None:
        self.code = code
        self.payload = payload
        super().__init__(code, payload)

    @property
    def content(self) -> bytes | None:
        """The payload without its binary length bytes."""
        if self.payload is None:
            return None
        return payload_content(self.payload)[0]

    def __str__(self) -> str:
        code = self.code.decode("ascii", "replace")
        content = self.content
        if content is None:
            return f"SSMP {code}"
        return f"SSMP {code} {content.decode('utf-8', 'replace')}"


def require_id(what: str, value: bytes) -> bytes:
    """``value`` if it is an SSMP identifier (1-64 ID characters), else ValueError.  Checked
    before sending, because a malformed request would make the server answer 400 and close the
    whole connection."""
    if not isinstance(value, bytes) or not is_id(value):
        raise ValueError(f"{what} must be 1 to 64 SSMP ID characters, not {value!r}")
    return value


class SSMPClientProtocol(ClosedNotifier, Protocol):
    """One SSMP connection seen from the client side.

    ``reactor`` provides the time for the keepalive (a ``Clock`` in tests; the global reactor
    when None).  After ``keepalive`` seconds without a server event the client sends PING and
    closes the connection if no PONG comes within ``pong_timeout`` seconds; ``keepalive=None``
    turns that off.
    """

    _log = Logger()
    factory: SSMPClientFactory | None = None

    def __init__(
        self, reactor: IReactorTime | None = None, keepalive: float | None = 30.0, pong_timeout: float = 30.0
    ) -> None:
        self._reactor: Any = reactor  # None until connectionMade puts the global reactor here: loose, so no use must narrow it
        self.keepalive = keepalive
        self.pong_timeout = pong_timeout
        self.identifier: bytes | None = None
        """The identifier this connection logged in with, once the server said 200."""
        self._parser = SSMPClientParser()
        self._pending: deque[tuple[bytes, Deferred]] = deque()
        self._pings: deque[tuple[float, Deferred]] = deque()
        self._usable = False
        self._reading = True
        self._lost: BaseException | None = None
        self._lost_waiters: list[Deferred] = []
        self._last_event = 0.0
        self._idle_call: IDelayedCall | None = None
        self._pong_call: IDelayedCall | None = None

    @property
    def is_open(self) -> bool:
        """True while requests can be sent: connected, and neither closing nor closed."""
        return self._usable

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        no_delay(self.transport)
        if self._reactor is None:
            from twisted.internet import reactor

            self._reactor = reactor
        self._usable = True
        self._last_event = self._reactor.seconds()
        self._schedule_idle_check(self.keepalive)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Fail every unanswered request with ``reason``: it may or may not have reached the
        server, and SSMP never says which."""
        self._usable = False
        self._reading = False
        self._cancel_timers()
        self._lost = reason.value
        pending, self._pending = self._pending, deque()
        for verb, d in pending:
            if verb == b"CLOSE":
                d.callback(None)
            else:
                d.errback(reason)
        pings, self._pings = self._pings, deque()
        for _sent, d in pings:
            d.errback(reason)
        self._notify_closed()

    def _abort(self) -> None:
        """Stop reading and drop the connection now, without waiting for buffered output."""
        self._usable = False
        self._reading = False
        self._cancel_timers()
        abort_connection(self.transport)

    def _violation(self, why: str, **fields: object) -> None:
        self._log.warn("SSMP server broke the protocol, closing: " + why, **fields)
        self._abort()

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if not self._reading:
            return
        messages, error = self._parser.feed(data)
        for message in messages:
            if not self._reading:
                return
            if isinstance(message, Event):
                self._event_received(message)
            else:
                self._response_received(message)
        if error is not None and self._reading:
            self._violation("{error}", error=error)

    def _response_received(self, response: Response) -> None:
        if not self._pending:
            self._violation("response {code!r} to no request", code=response.code)
            return
        _verb, d = self._pending.popleft()
        if response.code == OK:
            d.callback(None)
        else:
            d.errback(SSMPError(response.code, response.payload))

    def _event_received(self, event: Event) -> None:
        self._last_event = self._reactor.seconds()
        handler = _EVENT_HANDLERS.get(event.verb)
        if handler is None:
            self._violation("event with the unknown verb {verb!r}", verb=event.verb)
            return
        try:
            getattr(self, handler)(event)
        except Exception:
            self._log.failure("Handling SSMP event {event!r}", event=event)

    def event_PING(self, event: Event) -> None:
        """The server checks that we are alive: the spec says we MUST answer PONG."""
        self._made().write(_PONG_REQUEST)

    def event_PONG(self, event: Event) -> None:
        """Answers our oldest PING; an unexpected PONG is harmless and ignored."""
        if self._pings:
            sent, d = self._pings.popleft()
            d.callback(self._reactor.seconds() - sent)

    def eventReceived(self, event: Event) -> None:
        """A forwarded SUBSCRIBE, UNSUBSCRIBE, UCAST, MCAST or BCAST (payload in wire form).

        Override it to see the events themselves; by default messages go to
        :meth:`on_message` and presence changes to :meth:`on_presence`.
        """
        if event.verb in _PRESENCE_VERBS:
            presence = event.option == PRESENCE
            assert event.target is not None  # the codec reads no SUBSCRIBE or UNSUBSCRIBE event without a topic
            self.on_presence(event.sender, event.verb, event.target, presence)
            return
        assert event.payload is not None  # nor a message without its payload
        content, binary = payload_content(event.payload)
        self.on_message(event.sender, event.verb, event.target, content, binary)

    def on_message(
        self, sender: bytes, verb: bytes, target: bytes | None, content: bytes, binary: bool
    ) -> None:
        """A message: ``verb`` is UCAST (``target`` is us), MCAST (``target`` is the topic) or
        BCAST (no target).  Override it, or give the factory an ``on_message`` callable."""
        handler = getattr(self.factory, "on_message", None)
        if handler is not None:
            handler(sender, verb, target, content, binary)

    def on_presence(self, sender: bytes, verb: bytes, topic: bytes, presence: bool) -> None:
        """``sender`` joined (SUBSCRIBE) or left (UNSUBSCRIBE) ``topic``; ``presence`` says
        whether it watches presence itself.  Override it, or give the factory an
        ``on_presence`` callable."""
        handler = getattr(self.factory, "on_presence", None)
        if handler is not None:
            handler(sender, verb, topic, presence)

    # ------------------------------------------------------------------ requests

    def _request(self, verb: bytes, *args: bytes) -> Deferred:
        if not self._usable:
            return fail(ConnectionClosed("the SSMP connection is not open"))
        d: Deferred = Deferred()
        self._pending.append((verb, d))
        self._made().write(encode_request(verb, *args))
        return d

    def login(
        self, identifier: bytes, scheme: bytes = b"open", credential: bytes | None = None
    ) -> Deferred:
        """Send ``LOGIN``; the Deferred fires with this protocol on 200, else fails with
        SSMPError (after which the server closes the connection).  ``credential`` is sent as
        given; the spec asks clients not to send one with ``open``."""
        args = [require_id("identifier", identifier), require_id("scheme", scheme)]
        if credential is not None:
            args.append(wire_payload(credential))
        d = self._request(b"LOGIN", *args)
        d.addCallback(self._logged_in, identifier)
        return d

    def _logged_in(self, _result: None, identifier: bytes) -> SSMPClientProtocol:
        self.identifier = identifier
        return self

    def subscribe(self, topic: bytes, presence: bool = False) -> Deferred:
        """``SUBSCRIBE topic [PRESENCE]``: with ``presence`` the server also reports who joins
        and leaves the topic (starting with everyone already there)."""
        args = (require_id("topic", topic), PRESENCE) if presence else (require_id("topic", topic),)
        return self._request(b"SUBSCRIBE", *args)

    def unsubscribe(self, topic: bytes) -> Deferred:
        return self._request(b"UNSUBSCRIBE", require_id("topic", topic))

    def ucast(self, to: bytes, payload: bytes, binary: bool = False) -> Deferred:
        """Send ``payload`` to the peer logged in as ``to`` (SSMPError 404 if there is none)."""
        return self._request(b"UCAST", require_id("recipient", to), wire_payload(payload, binary))

    def mcast(self, topic: bytes, payload: bytes, binary: bool = False) -> Deferred:
        """Send ``payload`` to the subscribers of ``topic`` (200 even when there are none)."""
        return self._request(b"MCAST", require_id("topic", topic), wire_payload(payload, binary))

    def bcast(self, payload: bytes, binary: bool = False) -> Deferred:
        """Send ``payload`` to every peer sharing a topic with us."""
        return self._request(b"BCAST", wire_payload(payload, binary))

    def ping(self) -> Deferred:
        """Send ``PING``; the Deferred fires with the round trip in seconds when the PONG event
        arrives.  (A PING before LOGIN makes the server close the connection.)"""
        if not self._usable:
            return fail(ConnectionClosed("the SSMP connection is not open"))
        d: Deferred = Deferred()
        self._pings.append((self._reactor.seconds(), d))
        self._made().write(_PING_REQUEST)
        return d

    def close(self) -> Deferred:
        """Send ``CLOSE``; the Deferred fires once the server said 200 or the connection is
        gone.  No further request can be sent on this connection."""
        d = self._request(b"CLOSE")
        self._usable = False
        d.addCallback(self._closed_by_request)
        return d

    def _closed_by_request(self, _result: None) -> None:
        if self.transport is not None and self._lost is None:
            self.transport.loseConnection()

    # ------------------------------------------------------------------ keepalive

    def _schedule_idle_check(self, delay: float | None) -> None:
        if self.keepalive and self._reading:
            self._idle_call = self._reactor.callLater(delay, self._idle_check)

    def _idle_check(self) -> None:
        """PING once the server has been quiet for ``keepalive`` seconds.  One timer that
        re-arms itself, rather than one reset per event, keeps busy connections cheap."""
        self._idle_call = None
        quiet = self._reactor.seconds() - self._last_event
        if quiet < self.keepalive:
            self._schedule_idle_check(self.keepalive - quiet)
            return
        if self.identifier is None or not self._usable:
            # Not logged in yet (a PING before LOGIN gets the connection closed), or closing.
            self._schedule_idle_check(self.keepalive)
            return
        d = self.ping()
        self._pong_call = self._reactor.callLater(self.pong_timeout, self._pong_missed)
        d.addCallbacks(self._keepalive_answered, lambda _failure: None)

    def _keepalive_answered(self, _round_trip: float) -> None:
        if self._pong_call is not None and self._pong_call.active():
            self._pong_call.cancel()
        self._pong_call = None
        self._schedule_idle_check(self.keepalive)

    def _pong_missed(self) -> None:
        self._pong_call = None
        self._log.warn(
            "No PONG from the SSMP server within {timeout} s; closing the connection",
            timeout=self.pong_timeout,
        )
        self._abort()

    def _cancel_timers(self) -> None:
        for call in (self._idle_call, self._pong_call):
            if call is not None and call.active():
                call.cancel()
        self._idle_call = self._pong_call = None


class SSMPClientFactory(ClientFactory):
    """Builds :class:`SSMPClientProtocol` instances that share one clock, one keepalive
    setting and one pair of event callbacks (used unless a subclass overrides them)."""

    protocol = SSMPClientProtocol  # type: ignore[assignment]  # Twisted's Factory[P] wants P.factory set, a client protocol may have none

    def __init__(
        self,
        reactor: IReactorTime | None = None,
        keepalive: float | None = 30.0,
        pong_timeout: float = 30.0,
        on_message: MessageHandler | None = None,
        on_presence: PresenceHandler | None = None,
    ) -> None:
        self.reactor = reactor
        self.keepalive = keepalive
        self.pong_timeout = pong_timeout
        self.on_message = on_message
        self.on_presence = on_presence

    def buildProtocol(self, addr: IAddress) -> SSMPClientProtocol:  # type: ignore[override]  # as for protocol
        protocol = self.protocol(
            reactor=self.reactor, keepalive=self.keepalive, pong_timeout=self.pong_timeout
        )
        protocol.factory = self
        return protocol


@implementer(IStreamClientEndpoint)
class _WatchedEndpoint:
    """Tells :class:`SSMPClient` about failed connection attempts, which ClientService keeps to
    itself, so ``whenConnected(failAfterFailures)`` can count them with refused logins."""

    def __init__(self, endpoint: IStreamClientEndpoint, on_failure: Callable[[Failure], None]):
        self._endpoint = endpoint
        self._on_failure = on_failure

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred:
        d = self._endpoint.connect(protocolFactory)
        d.addErrback(self._failed)
        return d

    def _failed(self, failure: Failure) -> Failure:
        self._on_failure(failure)
        return failure


class SSMPClient(Service):
    """A logged-in SSMP connection that comes back by itself.

    Connects through ``endpoint`` (any client endpoint; see :func:`client_endpoint`), logs in
    as ``identifier`` and, after every reconnect, logs in again and re-subscribes to every
    topic subscribed through this object.  Reconnects back off by ``retry_policy`` (Twisted's
    ``backoffPolicy()`` by default); refused logins count as failed attempts, so a broker that
    keeps saying 401 is not hammered.

    The request methods wait for a logged-in connection and then behave like the protocol's.
    Start it with ``startService()`` (or give it a service parent); ``stopService()`` sends
    CLOSE and stops reconnecting.
    """

    _log = Logger()

    def __init__(
        self,
        endpoint: IStreamClientEndpoint,
        identifier: bytes,
        scheme: bytes = b"open",
        credential: bytes | None = None,
        *,
        reactor: IReactorTime | None = None,
        on_message: MessageHandler | None = None,
        on_presence: PresenceHandler | None = None,
        keepalive: float | None = 30.0,
        pong_timeout: float = 30.0,
        retry_policy: Callable[[int], float] | None = None,
    ) -> None:
        self.identifier = require_id("identifier", identifier)
        self.scheme = require_id("scheme", scheme)
        if credential is not None:
            wire_payload(credential)
        self.credential = credential
        self._reactor = reactor
        self.factory = SSMPClientFactory(reactor, keepalive, pong_timeout, on_message, on_presence)
        self._policy = retry_policy if retry_policy is not None else backoffPolicy()
        self._refusals = 0
        self._subscriptions: dict[bytes, bool] = {}
        self._protocol: SSMPClientProtocol | None = None
        self._waiters: list[list[Any]] = []
        self._stopped = False
        self._service = ClientService(
            _WatchedEndpoint(endpoint, self._attempt_failed_later),
            self.factory,
            retryPolicy=self._retry_delay,
            clock=reactor,
            prepareConnection=self._prepare,
        )

    @property
    def protocol(self) -> SSMPClientProtocol | None:
        """The logged-in connection, or None between connections."""
        return self._protocol

    @property
    def subscriptions(self) -> dict[bytes, bool]:
        """Topics restored after a reconnect, with their presence flag."""
        return dict(self._subscriptions)

    # ------------------------------------------------------------------ service

    def startService(self) -> None:
        super().startService()
        self._stopped = False
        self._service.startService()

    def stopService(self) -> Deferred:
        """Say CLOSE on the current connection (the clean goodbye), stop reconnecting, and
        fail whatever still waits for a connection with CancelledError."""
        super().stopService()
        self._stopped = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.is_open:
            protocol.close()
        waiters, self._waiters = self._waiters, []
        for d, _remaining in waiters:
            d.errback(CancelledError("the SSMP client was stopped"))
        return self._service.stopService()

    def whenConnected(self, failAfterFailures: int | None = None) -> Deferred:
        """A Deferred firing with the logged-in :class:`SSMPClientProtocol`, now or after the
        next successful login.  With ``failAfterFailures=N`` it fails with the reason of the
        N-th failed attempt in a row (connection refused, SSMPError for a refused login...)."""
        if self._protocol is not None and self._protocol.is_open:
            return succeed(self._protocol)
        if self._stopped:
            return fail(CancelledError("the SSMP client was stopped"))
        d: Deferred = Deferred(canceller=self._forget_waiter)
        self._waiters.append([d, failAfterFailures])
        return d

    def _forget_waiter(self, d: Deferred) -> None:
        self._waiters = [waiter for waiter in self._waiters if waiter[0] is not d]

    def _retry_delay(self, attempt: int) -> float:
        return self._policy(attempt + self._refusals)

    # ------------------------------------------------------------------ each connection

    def _prepare(self, connection: IProtocol) -> Deferred:
        """Log in and restore the subscriptions.

        The result always succeeds: ClientService cannot cope with a connection that closes
        while being prepared, or after a failed preparation (automat's NoTransition), so a
        failure closes the connection, which the service sees as an ordinary disconnect and
        answers with a reconnect after backoff.  Our own waiters hear of the outcome one
        reactor turn later, once ClientService has settled, because they may well stop it.
        """
        protocol = cast(SSMPClientProtocol, connection)  # what self.factory built
        d = protocol.login(self.identifier, self.scheme, self.credential)
        d.addCallback(self._resubscribe)
        d.addCallbacks(self._ready, self._not_ready, errbackArgs=(protocol,))
        return d

    def _resubscribe(self, protocol: SSMPClientProtocol) -> Deferred:
        subscribing = [
            protocol.subscribe(topic, presence).addErrback(self._resubscribe_refused, topic)
            for topic, presence in self._subscriptions.items()
        ]
        d = gatherResults(subscribing, consumeErrors=True)
        d.addCallback(lambda _results: protocol)
        return d

    def _resubscribe_refused(self, failure: Failure, topic: bytes) -> None:
        """One topic the server will not give back is logged and forgotten (409, already
        subscribed, is fine); it does not cost the whole connection."""
        failure.trap(SSMPError)
        error = failure.value
        assert isinstance(error, SSMPError)  # trap() passed only an SSMPError on
        if error.code != CONFLICT:
            self._subscriptions.pop(topic, None)
            self._log.warn(
                "Re-subscribing to {topic!r} refused: {error}", topic=topic, error=failure.value
            )

    def _ready(self, protocol: SSMPClientProtocol) -> None:
        self._refusals = 0
        self._protocol = protocol
        protocol.when_closed().addCallback(self._connection_lost, protocol)
        self._later(self._wake_waiters, protocol)

    def _wake_waiters(self, protocol: SSMPClientProtocol) -> None:
        if self._protocol is not protocol or not protocol.is_open:
            return  # lost again already: the waiters wait for the next connection
        waiters, self._waiters = self._waiters, []
        for d, _remaining in waiters:
            d.callback(protocol)

    def _not_ready(self, failure: Failure, protocol: SSMPClientProtocol) -> None:
        error = failure.value
        if isinstance(error, SSMPError):
            self._refusals += 1
            self._log.error(
                "SSMP login as {identifier!r} refused: {error}",
                identifier=self.identifier,
                error=error,
            )
        else:
            self._log.info("SSMP connection lost while logging in: {error}", error=error)
        if protocol.transport is not None:
            protocol.transport.loseConnection()
        self._attempt_failed_later(failure)

    def _attempt_failed_later(self, failure: Failure) -> None:
        self._later(self._attempt_failed, failure)

    def _later(self, function: Callable[..., object], *args: object) -> None:
        reactor = self._reactor
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        reactor.callLater(0, function, *args)

    def _attempt_failed(self, failure: Failure) -> None:
        """Count one failed attempt against every waiter; fail those out of patience.  The
        list is replaced before any Deferred fires: their callbacks may call back into us."""
        still_waiting, giving_up = [], []
        for d, remaining in self._waiters:
            if remaining is None or remaining > 1:
                still_waiting.append([d, None if remaining is None else remaining - 1])
            else:
                giving_up.append(d)
        self._waiters = still_waiting
        for d in giving_up:
            d.errback(failure)

    def _connection_lost(self, _reason: BaseException, protocol: SSMPClientProtocol) -> None:
        if self._protocol is protocol:
            self._protocol = None

    # ------------------------------------------------------------------ requests

    def _when_ready(self, method: str, *args: object) -> Deferred:
        d = self.whenConnected()
        d.addCallback(lambda protocol: getattr(protocol, method)(*args))
        return d

    def subscribe(self, topic: bytes, presence: bool = False) -> Deferred:
        """Subscribe now and again after every reconnect (once the server said 200)."""
        require_id("topic", topic)
        d = self._when_ready("subscribe", topic, presence)
        d.addCallback(self._subscribed, topic, presence)
        return d

    def _subscribed(self, _result: None, topic: bytes, presence: bool) -> None:
        self._subscriptions[topic] = presence

    def unsubscribe(self, topic: bytes) -> Deferred:
        """Unsubscribe, and stop restoring ``topic`` after reconnects."""
        require_id("topic", topic)
        self._subscriptions.pop(topic, None)
        return self._when_ready("unsubscribe", topic)

    def ucast(self, to: bytes, payload: bytes, binary: bool = False) -> Deferred:
        require_id("recipient", to)
        wire_payload(payload, binary)
        return self._when_ready("ucast", to, payload, binary)

    def mcast(self, topic: bytes, payload: bytes, binary: bool = False) -> Deferred:
        require_id("topic", topic)
        wire_payload(payload, binary)
        return self._when_ready("mcast", topic, payload, binary)

    def bcast(self, payload: bytes, binary: bool = False) -> Deferred:
        wire_payload(payload, binary)
        return self._when_ready("bcast", payload, binary)

    def ping(self) -> Deferred:
        return self._when_ready("ping")


def client_endpoint(
    reactor: IBrokerReactor | None,
    description: str,
    *,
    tls: bool = False,
    hostname: str | None = None,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> IStreamClientEndpoint:
    """The endpoint for a Twisted client endpoint string (``tcp:HOST:PORT``, ``unix:PATH``...),
    wrapped in TLS when ``tls`` is set.  TLS verifies the server as ``hostname`` (by default
    the host of a ``tcp:`` description) against ``ca`` (the system's trust store when None) and
    presents the client certificate ``cert`` (its key in ``key``, or in the same file).

    Raises ValueError for a description Twisted cannot parse and
    :class:`~brokerd.errors.ConfigurationError` for unreadable certificate files.
    """
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        reactor = cast(IBrokerReactor, default_reactor)  # the global reactor has every facet
    return endpoints.client_endpoint(
        reactor,
        description,
        tls=tls,
        hostname=hostname or None,  # an empty name, too, means "the host of the description"
        ca=ca,
        cert=cert,
        key=key,
        default_host=endpoints.endpoint_host,
    )


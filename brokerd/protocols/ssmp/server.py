"""The SSMP 1.1 server: one SSMPServerProtocol per connection, one factory per listener.

The protocol object is also the session's "mind" (ISubscriber): the Broker writes rendered
events straight to it.  Requests are dispatched through one table per connection state
(before login, named, anonymous), so what a state allows is visible in one place.

Flow control: each connection registers itself as a streaming producer of its own transport.
When more than ``max_output_buffer`` bytes wait for a slow reader, Twisted pauses us: from then
on messages for that reader are dropped and counted, and its own requests are no longer read
(so its responses cannot pile up either) until the buffer drains.  Each such episode is one
``dropped`` record (reason ``slow_consumer``, with the count) in the event log, written when it
ends (brokerd.protocols.flow).

Access policy (docs/ssmp.md): a SUBSCRIBE, MCAST or UCAST the core's policy does not allow is
answered ``405``; a BCAST reaches only the topics its sender may publish to.  SSMP addresses
are SSMP's own: ``UCAST smqp:<account>:<channel>`` is the one way to reach another protocol's
session, and SSMP identifiers may not begin with another protocol's name and a colon.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.cred.credentials import ICredentials, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.internet.defer import Deferred
from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.auth.credentials import ClientCertificate, OpenLogin, SharedSecret
from brokerd.auth.identity import Identity
from brokerd.auth.realm import IIdentity, enabled_schemes
from brokerd.auth.tls import peer_names
from brokerd.config import Settings
from brokerd.core.access import SYSTEM_MARK, Perm
from brokerd.core.broker import Broker
from brokerd.core.message import BROADCAST, MULTICAST, PLAIN, UNICAST, Message
from brokerd.core.principal import NOBODY, Principal
from brokerd.core.publication import Broadcast, Multicast, Unicast
from brokerd.errors import AlreadySubscribed, Forbidden, NotSubscribed, SubscriptionLimit
from brokerd.events.log import NULL_EVENT_LOG, transport_source
from brokerd.interfaces import ISubscriber
from brokerd.protocols.dispatch import command_table
from brokerd.protocols.flow import DropWhenCongested, begin_read, end_read
from brokerd.protocols.lifecycle import LivenessSweep
from brokerd.protocols.ssmp.codec import (
    _KNOWN_IDS,  # is_id's memory of valid ids: looked up inline, as the codec's parser does, on the hot path
    ANONYMOUS,
    MAX_EVENT_LINE,
    MAX_PAYLOAD,
    SSMPParser,
    SSMPProtocolError,
    parse_cast,
    parse_request,
)
from brokerd.protocols.ssmp.events import Request
from brokerd.protocols.ssmp.wire import SSMP_WIRE
from brokerd.store.base import is_outage

OK = b"200\n"
BAD_REQUEST = b"400\n"
NOT_FOUND = b"404\n"
NOT_ALLOWED = b"405\n"
CONFLICT = b"409\n"
TOO_MANY = b"413\n"
NOT_IMPLEMENTED = b"501\n"
NOT_STORED = b"500\n"
"""The answer to an MCAST whose message could not be stored for the topic's durable subscribers."""
MAX_UNCOMMITTED = 4
"""Reads whose replies may wait for a commit before this connection's requests are no longer
read (until the oldest commit is done)."""
PING_EVENT = b"000 . PING\n"
PONG_EVENT = b"000 . PONG\n"
RESERVED_PREFIXES = (b"smqp:", b"mcchat:", b"socketmq:", b"mqtt:")
"""Identifiers SSMP logins may not take: they name other protocols' sessions and senders
(``UCAST smqp:alice:c1``; a message from MCCHAT shows as ``mcchat:<name>``)."""
FOREIGN_NAMESPACES = {b"smqp:": "smqp"}
"""UCAST targets that address another protocol's sessions, and that protocol."""
FOREIGN_PREFIXES = tuple(FOREIGN_NAMESPACES)
_MCAST = b"MCAST"
_UCAST = b"UCAST"


def _content(payload: bytes) -> tuple[bytes, bool]:
    """Payload content without the binary length bytes, and whether it was binary."""
    if payload[0] > 3:
        return payload, False
    return payload[2:], True


@implementer(ISubscriber, IPushProducer)
class SSMPServerProtocol(DropWhenCongested, Protocol):
    """One SSMP connection; also its session as the Broker sees it."""

    _log = Logger()
    protocol = "ssmp"
    wire_format = SSMP_WIRE
    name = b""
    address: bytes | None = None
    principal: Principal = NOBODY
    factory: SSMPServerFactory
    # Defaults that most connections never change live on the class, not in each instance:
    # CPython keeps an instance's attributes in a compact table shared by the class's
    # instances only up to 30 names (3.11); past that every connection pays for a dict of its
    # own, 1.3 KB more per idle connection (docs/performance-history.md, "Scaling shape").
    closed = False
    dropped = 0
    """Messages dropped because this connection's reader was too slow."""
    pinged_at: float | None = None
    """When the liveness sweep PINGed this connection (older than ``last_heard``: answered)."""
    _login_timer: DelayedCall | None = None
    _close_when_answered = False
    _commit_paused = False
    _pending_error: SSMPProtocolError | None = None
    _waiting: deque[list] | None = None
    """Replies that wait for a commit, in order: ``[committed, parts]`` each (see
    :meth:`_hold`); made by the first reply that waits."""

    def __init__(self) -> None:
        self._parser = SSMPParser()
        self._dispatch = _BEFORE_LOGIN
        self._fallback = SSMPServerProtocol._not_logged_in
        self._replies: list[bytes] = []
        """Responses to the requests of the current read, written as one."""
        self._run: list[Message] = []
        """Consecutive MCASTs to one topic from the current read, published as one batch."""
        self._ucasts: list[Message] = []
        """Consecutive UCASTs to one SSMP peer from the current read (never to this
        connection itself), sent as one run (a Unicast run, Router.route); their replies are added when
        it is sent.  At most one of ``_run`` and ``_ucasts`` holds messages."""
        self._ucast_limit = 1
        """The most UCASTs in one run: as many of the longest event line as fit in the output
        limit, so that a run, written as one, stays within what a read may hold for a peer."""
        self._corking: bool | None = None
        """This read's hold on deliveries to other connections (flow.begin_read): None until
        the read first needs it, then whether it began the hold (see :meth:`_handle`)."""
        self._pending: list[bytes] = []
        """Request lines read while a login is checked, handled after it."""
        self._waiting_for_login = False
        self._login_request: Request | None = None
        self.heard = True
        """Set on every read; the liveness sweep turns it into ``last_heard``."""
        self.last_heard = 0.0

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        settings = self.factory.settings
        if not self.open_connection(settings.max_output_buffer):
            self.closed = True  # SSMP refuses a connection over a limit by closing it
            self._dispatch = _CLOSED
            self.transport.loseConnection()
            return
        self.start_flow_control(settings.max_output_buffer)
        self._ucast_limit = max(1, settings.max_output_buffer // MAX_EVENT_LINE)
        self.register_producer()
        self._login_timer = self.call_later(settings.login_timeout, self._login_timed_out)

    def connectionLost(self, reason=None) -> None:
        self.closed = True
        if self._waiting:
            self._waiting.clear()
        self._close_when_answered = False
        self._dispatch = _CLOSED
        self._login_timer = None
        if self.release_connection():
            self.report_drops()
            self.factory.liveness.forget(self)
            self.factory.broker.detach(self)

    def _close(self, reply: bytes | None = None) -> None:
        """Answer ``reply`` (if any) and close; nothing else is read from this connection.
        Replies that wait for a commit are written first, then the connection closes."""
        if self.closed:
            return
        if self._ucasts:
            self._publish_ucasts()  # their replies come before ``reply``
        if reply is not None:
            self._replies.append(reply)
        self._flush()
        self.closed = True
        self._dispatch = _CLOSED
        if self._waiting:
            self._close_when_answered = True
            return
        self.close_transport()

    def _login_timed_out(self) -> None:
        self._login_timer = None
        self._close()

    # ------------------------------------------------------------------ ISubscriber

    def replaced(self) -> None:
        """A newer connection logged in with our identifier (SSMP: close the older one)."""
        self._close()

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard = True
        lines, error = self._parser.lines(data)
        if self._waiting_for_login:
            self._pending.extend(lines)
            self._pending_error = self._pending_error or error
            return
        self._handle(lines, error)

    def _handle(self, lines: list[bytes], error: SSMPProtocolError | None) -> None:
        """Handle the requests of one read; what they deliver to other connections is written
        when they are done, one write per connection (brokerd.protocols.flow.begin_read).

        The hold begins only when a read does more than publish one MCAST run (a second
        run, an UCAST, any other request), before its first delivery: a read that is one
        run (the common case of a pipelining publisher) already makes one write per
        subscriber, and holding it would cost each subscriber a hold and a release per read
        for nothing."""
        outer, self._corking = self._corking, None
        try:
            self._handle_lines(lines, error)
        finally:
            if self._corking:
                end_read()
            self._corking = outer

    def _handle_lines(self, lines: list[bytes], error: SSMPProtocolError | None) -> None:
        """Parse and dispatch the request ``lines`` of one read in order, then answer ``error``
        (400 and close); a line that does not parse is answered the same way, after the
        lines before it.  The replies and the runs of this read are written when it is done.

        MCAST and UCAST, the requests that matter for throughput, are parsed and handled
        inline once logged in, without a Request: the common line (an id seen before, a text
        payload) is checked here as the codec's parser checks it, any other goes through
        :func:`parse_cast`.  An MCAST joins the current run (consecutive MCASTs to one topic,
        published as one batch); an UCAST joins the current UCAST run (consecutive UCASTs to
        one peer, a Unicast run), except one to this connection itself or to another
        protocol's session, which goes to the broker at once.
        """
        run = self._run
        ucasts = self._ucasts
        replies = self._replies
        access = self.factory.broker.access
        guarded = access.policy is not None
        known = _KNOWN_IDS
        name, principal = self.name, self.principal  # read again after a request that may log in
        self.hold_writes(replies)
        index = 0
        for line in lines:
            index += 1
            if self.closed:
                return
            verb, sp, rest = line.partition(b" ")
            if (verb == _UCAST or verb == _MCAST) and self._dispatch is not _BEFORE_LOGIN:
                target, separated, payload = rest.partition(b" ")
                if not (separated and target in known and payload and payload[0] > 3 and len(payload) <= MAX_PAYLOAD):
                    try:
                        parse_cast(verb, rest, bool(sp))
                    except SSMPProtocolError as exc:
                        error = self._parser.fail(exc)
                        break
                if verb == _UCAST:
                    if ucasts:
                        if ucasts[0].target == target and len(ucasts) < self._ucast_limit:
                            # _ucast_message, inlined: a call costs about 60 ns here.
                            if payload[0] > 3:
                                ucasts.append(Message(UNICAST, target, payload, "ssmp", name, False, None, PLAIN,
                                                      principal))
                            else:
                                ucasts.append(Message(UNICAST, target, payload[2:], "ssmp", name, True, None, PLAIN,
                                                      principal))
                            continue
                        if self._corking is None:
                            self._corking = begin_read()
                        self._publish_ucasts()
                        ucasts = self._ucasts
                    elif run:
                        if self._corking is None:
                            self._corking = begin_read()
                        self._publish_run()
                        run = self._run
                    if target == self.address or target.startswith(FOREIGN_PREFIXES):
                        # To itself (its event and the reply leave in order: event, then 200)
                        # or to another protocol's session: one at a time.
                        if self._corking is None:
                            self._corking = begin_read()
                        replies.append(self._unicast(target, payload))
                    else:
                        ucasts.append(self._ucast_message(target, payload))
                    continue
                if (guarded or target[0] == SYSTEM_MARK) and not access.allows(self.principal, target, Perm.PUBLISH):
                    replies.append(NOT_ALLOWED)
                    continue
                if ucasts:
                    if self._corking is None:
                        self._corking = begin_read()
                    self._publish_ucasts()
                    ucasts = self._ucasts
                elif run and run[0].target != target:
                    if self._corking is None:
                        self._corking = begin_read()
                    self._publish_run()
                    run = self._run
                # All arguments positional: a keyword argument costs about 100 ns per call here.
                if payload[0] > 3:
                    run.append(Message(MULTICAST, target, payload, "ssmp", name, False, None, PLAIN, principal))
                else:
                    run.append(Message(MULTICAST, target, payload[2:], "ssmp", name, True, None, PLAIN, principal))
                replies.append(OK)
                continue
            try:
                request = parse_request(line)
            except SSMPProtocolError as exc:
                error = self._parser.fail(exc)
                break
            if self._corking is None:
                self._corking = begin_read()
            if run:
                self._publish_run()
                run = self._run
            elif ucasts:
                self._publish_ucasts()
                ucasts = self._ucasts
            handler = self._dispatch.get(verb)
            if handler is None:
                handler = self._fallback
            handler(self, request)
            if self._waiting_for_login:
                self._pending.extend(lines[index:])
                self._pending_error = error
                break
            name, principal = self.name, self.principal
        if error is not None and not self._waiting_for_login:
            self._close(error.reply)
        else:
            self._flush()

    def _flush(self) -> None:
        """Publish the pending MCAST run and write the pending replies (with what this
        connection was sent meanwhile, in order; behind those that wait for a commit, if any)."""
        if self._run:
            self._publish_run()
        elif self._ucasts:
            self._publish_ucasts()
        held = self.release_writes()
        replies = self._replies
        if held and held is not replies:
            # Held for this connection during another one's read, which closes us (a newer
            # login with our identifier): delivered before anything we answer now.
            replies[:0] = held
        if replies and not self.closed:
            if self._waiting:
                self._waiting.append([True, list(replies)])
            else:
                self.write_now(replies[0] if len(replies) == 1 else b"".join(replies))
            replies.clear()

    def _publish_run(self) -> None:
        run, self._run = self._run, []
        broker = self.factory.broker
        publication = Multicast(run, self)
        broker.route(publication)
        if publication.kept is not None:  # kept for durable subscribers: the answers wait for it
            self._hold(publication.kept, len(run))

    def _publish_ucasts(self) -> None:
        """Send the pending UCAST run to its peer and add its replies (one per UCAST)."""
        ucasts, self._ucasts = self._ucasts, []
        broker = self.factory.broker
        try:
            found = broker.route(Unicast(ucasts[0].target or b"", "ssmp", ucasts))  # an UCAST has its target
        except Forbidden:
            reply = NOT_ALLOWED
        else:
            reply = OK if found else NOT_FOUND
        if len(ucasts) == 1:
            self._replies.append(reply)
        else:
            self._replies.extend([reply] * len(ucasts))

    # ------------------------------------------------------------------ durable topics

    def _hold(self, kept: Deferred, count: int) -> None:
        """The run just published goes to durable subscribers too: its ``200`` (the last
        ``count`` replies), and every reply after it, wait until ``kept`` fired (the messages
        are committed), so that a ``200`` always means "stored" and replies stay in order.
        A run that could not be stored is answered ``500``."""
        replies = self._replies
        held = list(replies)
        entry = [False, held]
        replies.clear()
        if self._waiting is None:
            self._waiting = deque()
        self._waiting.append(entry)
        if len(self._waiting) >= MAX_UNCOMMITTED and not self._commit_paused:
            self._commit_paused = True
            self.transport.pauseProducing()

        def committed(_: object) -> None:
            entry[0] = True
            self._answer_committed()

        def failed(failure: Failure) -> None:
            if not is_outage(failure):  # the store logs its outage once
                self._log.failure("Storing an SSMP message for durable subscribers", failure)
            held[len(held) - count:] = [NOT_STORED] * count
            committed(None)

        kept.addCallbacks(committed, failed)

    def _answer_committed(self) -> None:
        waiting = self._waiting
        assert waiting is not None  # made by _hold, whose commit this answers
        parts: list[bytes] = []
        while waiting and waiting[0][0]:
            parts += waiting.popleft()[1]
        if parts:
            self.write_now(b"".join(parts))
        if waiting:
            return
        if self._close_when_answered:
            self._close_when_answered = False
            self.close_transport()
        elif self._commit_paused:
            self._commit_paused = False
            if not self.closed and self.send != self._drop:
                self.transport.resumeProducing()

    def resumeProducing(self) -> None:
        """The reader caught up: read again, unless replies wait for commits."""
        super().resumeProducing()
        if self._commit_paused:
            self.transport.pauseProducing()

    # ------------------------------------------------------------------ login

    def do_LOGIN(self, request: Request) -> None:
        factory = self.factory
        identifier = request.target
        assert identifier is not None  # the codec reads no LOGIN without one
        self._login_request = request
        if identifier == ANONYMOUS:
            if factory.settings.anonymous:
                self._logged_in(ANONYMOUS, NOBODY, anonymous=True)
            else:
                self._refuse_login("anonymous login is not enabled")
            return
        if identifier.startswith(RESERVED_PREFIXES):
            self._refuse_login("identifier reserved for another protocol's sessions")
            return
        credentials = self._credentials(request)
        if credentials is None:
            self._refuse_login("unsupported scheme or missing credential")
            return
        self._waiting_for_login = True
        self.transport.pauseProducing()
        d = factory.portal.login(credentials, self, IIdentity)
        d.addCallbacks(self._login_succeeded, self._login_failed)
        d.addErrback(self._login_broke, identifier)

    def _credentials(self, request: Request) -> ICredentials | None:
        scheme, identifier = request.option, request.target
        assert identifier is not None  # a LOGIN's
        if scheme == b"open":
            return OpenLogin(identifier)
        if scheme == b"secret":
            if request.payload is None:
                return None
            return SharedSecret(identifier, _content(request.payload)[0])
        if scheme == b"cert":
            return ClientCertificate(identifier, peer_names(self.transport))
        if scheme == b"password":
            if request.payload is None:
                return None
            return UsernamePassword(identifier, _content(request.payload)[0])
        return None

    def _login_succeeded(self, result: tuple[object, Identity, Callable[[], None]]) -> None:
        _interface, identity, _logout = result
        self._finish_login()
        if not self.closed:
            self._logged_in(identity.name, identity.principal, anonymous=False)
            self._continue_after_login()
            self._flush()

    def _login_failed(self, failure: Failure) -> None:
        failure.trap(UnauthorizedLogin, UnhandledCredentials)
        self._finish_login()
        if failure.check(UnhandledCredentials):
            self._refuse_login("scheme not enabled")
        else:
            self._refuse_login(failure.getErrorMessage() or "refused")

    def _login_broke(self, failure: Failure, identifier: bytes) -> None:
        """A checker failed in an unexpected way: log it, and refuse the login."""
        self._log.failure("SSMP login of {identifier!r} failed", failure, identifier=identifier)
        self._waiting_for_login = False
        self._refuse_login("checker error")

    def _finish_login(self) -> None:
        self._waiting_for_login = False
        if not self.closed:
            self.transport.resumeProducing()

    def _continue_after_login(self) -> None:
        pending, self._pending = self._pending, []
        error, self._pending_error = self._pending_error, None
        self._handle(pending, error)

    def _refuse_login(self, reason: str) -> None:
        request = self._login_request
        assert request is not None  # set by do_LOGIN, the only way here
        self.factory.events.auth_failure(
            "ssmp", request.target, source=transport_source(self.transport), scheme=request.option, reason=reason
        )
        self._close(self.factory.unauthorized_reply)

    def _logged_in(self, identifier: bytes, principal: Principal, anonymous: bool) -> None:
        self.cancel_timer(self._login_timer)
        self._login_timer = None
        self.name = identifier
        self.principal = principal
        self.address = None if anonymous else identifier
        self._dispatch = _ANONYMOUS if anonymous else _NAMED
        self._fallback = SSMPServerProtocol._not_implemented
        self.factory.liveness.watch(self)
        self.logged_in()
        self.factory.broker.attach(self)
        self._replies.append(OK)

    def _not_logged_in(self, request: Request) -> None:
        self._close(BAD_REQUEST)

    def _already_logged_in(self, request: Request) -> None:
        self._replies.append(NOT_ALLOWED)

    def _not_allowed(self, request: Request) -> None:
        self._replies.append(NOT_ALLOWED)

    def _not_implemented(self, request: Request) -> None:
        self._replies.append(NOT_IMPLEMENTED)

    # ------------------------------------------------------------------ requests

    def do_CLOSE(self, request: Request) -> None:
        self._close(OK)

    def do_PING(self, request: Request) -> None:
        self._replies.append(PONG_EVENT)

    def do_PONG(self, request: Request) -> None:
        """Liveness only: ``heard`` was already set; the spec forbids any reply."""

    def do_SUBSCRIBE(self, request: Request) -> None:
        assert request.target is not None  # the codec reads no SUBSCRIBE without a topic
        try:
            self.factory.broker.subscribe(self, request.target, request.option is not None)
        except AlreadySubscribed:
            self._replies.append(CONFLICT)
        except SubscriptionLimit:
            self._replies.append(TOO_MANY)
        except Forbidden:
            self._replies.append(NOT_ALLOWED)
        else:
            self._replies.append(OK)

    def do_UNSUBSCRIBE(self, request: Request) -> None:
        assert request.target is not None  # as SUBSCRIBE's
        try:
            self.factory.broker.unsubscribe(self, request.target)
        except NotSubscribed:
            self._replies.append(NOT_FOUND)
        else:
            self._replies.append(OK)

    def _ucast_message(self, target: bytes, payload: bytes) -> Message:
        """The Message of an UCAST to ``target`` with wire payload ``payload``."""
        # All arguments positional: a keyword argument costs about 100 ns per call here.
        if payload[0] > 3:
            return Message(UNICAST, target, payload, "ssmp", self.name, False, None, PLAIN, self.principal)
        return Message(UNICAST, target, payload[2:], "ssmp", self.name, True, None, PLAIN, self.principal)

    def _unicast(self, target: bytes, payload: bytes) -> bytes:
        """An UCAST sent on its own (to this connection itself, or to another protocol's
        session): the reply.  The target is an SSMP session, or another protocol's in its
        documented form (``smqp:<account>:<channel>``)."""
        namespace = "ssmp"
        for prefix, protocol in FOREIGN_NAMESPACES.items():
            if target.startswith(prefix):
                namespace = protocol
        try:
            found = self.factory.broker.route(Unicast(target, namespace, [self._ucast_message(target, payload)]))
        except Forbidden:
            return NOT_ALLOWED
        return OK if found else NOT_FOUND

    def do_BCAST(self, request: Request) -> None:
        assert request.payload is not None  # the codec reads no BCAST without one
        content, binary = _content(request.payload)
        message = Message(BROADCAST, None, content, "ssmp", self.name, binary, principal=self.principal)
        self.factory.broker.route(Broadcast(message, self))
        self._replies.append(OK)


P = SSMPServerProtocol
# One table per connection state (brokerd.protocols.dispatch).
_BEFORE_LOGIN = command_table(P, [b"LOGIN"])
_NAMED = {
    b"LOGIN": P._already_logged_in,
    # MCAST and UCAST are parsed and handled inline by _handle_lines once logged in.
    **command_table(P, [b"CLOSE", b"PING", b"PONG", b"SUBSCRIBE", b"UNSUBSCRIBE", b"BCAST"]),
}
_ANONYMOUS = dict(_NAMED)
_ANONYMOUS.update({b"SUBSCRIBE": P._not_allowed, b"UNSUBSCRIBE": P._not_allowed, b"BCAST": P._not_allowed})
_CLOSED: dict = {}
# A verb missing from the table goes to the connection's fallback: 400 and close before login
# (LOGIN must come first), 501 after it (forward compatibility).
del P


class SSMPServerFactory(Factory[SSMPServerProtocol]):
    """One per SSMP listener; all of them share the Broker, the portal and the settings."""

    protocol = SSMPServerProtocol
    _log = Logger()

    def __init__(self, broker: Broker, portal, settings: Settings, clock, events=NULL_EVENT_LOG) -> None:
        self.broker = broker
        self.portal = portal
        self.settings = settings
        self.clock = clock
        self.events = events
        """The event log's IEventRecorder (auth failures, slow-consumer drops; routing goes
        through the Broker)."""
        tick = min(settings.ping_interval, settings.pong_timeout) / 4
        self.liveness = LivenessSweep(clock, tick, self._silent)
        """Logged-in connections, PINGed when silent (brokerd.protocols.lifecycle)."""
        self.live: dict[SSMPServerProtocol, None] = self.liveness.live
        schemes = " ".join(enabled_schemes(portal)).encode("ascii")
        self.unauthorized_reply = b"401 " + schemes + b"\n" if schemes else b"401\n"

    def startFactory(self) -> None:
        self.liveness.start()

    def stopFactory(self) -> None:
        self.liveness.stop()

    def _silent(self, connection: SSMPServerProtocol, now: float) -> None:
        """PING a connection silent for ``ping_interval``; close one that stays silent for
        ``pong_timeout`` after the PING (docs/ssmp.md)."""
        pinged = connection.pinged_at
        if pinged is None or pinged < connection.last_heard:
            if now - connection.last_heard >= self.settings.ping_interval:
                connection.pinged_at = now
                connection.transport.write(PING_EVENT)
        elif now - pinged >= self.settings.pong_timeout:
            connection._close()


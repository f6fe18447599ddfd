"""CONNECTTO (draft section 4.1.1): the server's connection to a client's notification listener.

After logging in, a client may listen on a port and send ``CONNECTTO account:channel
[address:]port``.  The server connects there; the client greets it (``SMQP/1.0 Ready.``),
the server answers with the SUID it gave at login, the client replies ``200 OK``, and only
then does the server answer the CONNECTTO with ``200 OK``.  From then on the session's
notifications (NOTIFY MESSAGE, RECEIPT, TOPIC, ...) go over that connection, and the
client's ``310 ACK`` / ``312`` / ``416`` for them may come back on either connection.  When the
notification connection closes, notifications go over the command connection again (an
unacknowledged one is sent again after the retry timeout, as always).

A server that connects wherever a client says is a request-forgery tool (it would knock on
any host and port the server can reach), so CONNECTTO connects only to the IP address the
command connection comes from, on any port, and only when that address is a public one,
unless the operator's allow-list (``--smqp-connectto-allow``) names the address: IP
addresses or CIDR networks, optionally with ``:port`` (``[v6]:port`` for IPv6), or host
names (matched as written, then resolved).  A client on the broker's own host, or in a
private, link-local or otherwise non-global network, would otherwise scan the ports the
broker's host and its neighbours listen on: those addresses need the allow-list even when
they are the client's own.  Anything else is refused with ``403`` before any connection is
tried.

Nor does a failure tell the client why: a refused port, a silent one, a closed connection and
a wrong greeting all get the same ``451`` line, at the same moment (the login timeout after
the CONNECTTO), so neither the text nor the timing says whether something listens there.
The reason goes to the broker's log.

Reply codes of CONNECTTO: ``200`` connected and greeted; ``400`` account:channel is not this
session's login; ``403`` the address is not allowed; ``451`` the connection or its greeting
failed (:data:`FAILED`).
"""
from __future__ import annotations

import ipaddress
import typing
from collections import deque
from dataclasses import dataclass
from typing import Any, cast

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IAddress, IProtocol, IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.config import Settings
from brokerd.errors import ConfigurationError
from brokerd.interfaces import IBrokerReactor
from brokerd.twistedio import limit_output_buffer
from brokerd.protocols.nodelay import no_delay
from brokerd.protocols.smqp.codec import SMQPParser, encode_reply
from brokerd.protocols.smqp.events import ClientReply, Command, Rejected
from brokerd.protocols.smqp.outbox import Outbox
from brokerd.protocols.smqp.refusal import Refused

MAX_GREETING_LINE = 1024
"""Bytes of one line of the client's greeting or reply (the connection fails beyond)."""
MAX_PENDING_REPLIES = 16
"""Client replies read from the notification connection and not yet answered; reading
pauses beyond."""

_T = typing.TypeVar("_T")

FAILED = "Local error: notification connection failed"
"""The one 451 text of a CONNECTTO whose connection or greeting failed, whatever the reason."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class AllowEntry:
    """One entry of ``--smqp-connectto-allow``: a network or a host name, any port or one."""

    network: Network | None
    host: str | None
    port: int | None

    def admits(self, address: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            try:
                return ipaddress.ip_address(address) in self.network
            except ValueError:
                return False
        return address.lower() == self.host


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError("expected [IPv6]:port")
        return host, int(rest[1:]) if rest else None
    if entry.count(":") == 1:
        host, _colon, port = entry.partition(":")
        return host, int(port)
    return entry, None


def parse_allow_list(value: str | list[str] | None) -> tuple[AllowEntry, ...]:
    """``--smqp-connectto-allow``: entries separated by commas or blanks (or a TOML list).
    Raises ConfigurationError naming the first bad entry."""
    if not value:
        return ()
    items = value.replace(",", " ").split() if isinstance(value, str) else [str(v) for v in value]
    entries = []
    for item in items:
        try:
            host, port = _split_port(item)
            if port is not None and not 0 < port < 65536:
                raise ValueError("port out of range")
            try:
                network: Network | None = ipaddress.ip_network(host, strict=False)
                name = None
            except ValueError:
                if "/" in host or not host or not all(c.isalnum() or c in "-." for c in host):
                    raise ValueError("not an address, a network or a host name") from None
                network, name = None, host.lower()
        except ValueError as exc:
            raise ConfigurationError(f"smqp-connectto-allow: {item!r}: {exc}") from None
        entries.append(AllowEntry(network, name, port))
    return tuple(entries)


def public(address: str) -> bool:
    """Whether ``address`` is a global unicast IP address: not loopback, link-local,
    private, shared, reserved, unspecified or multicast (an IPv4-mapped IPv6 address is
    judged by its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def permitted(peer: str | None, address: str, port: int, allow: tuple[AllowEntry, ...]) -> bool:
    """Whether CONNECTTO may connect to ``address:port``: an address the allow-list admits,
    or the client's own address (any port) when it is :func:`public`."""
    if any(entry.admits(address, port) for entry in allow):
        return True
    if peer is not None and public(address):
        try:
            return ipaddress.ip_address(address) == ipaddress.ip_address(peer)
        except ValueError:
            return False
    return False


_log = Logger()


class NotifyingFrontEnd(typing.Protocol):
    """The SMQP front end as CONNECTTO uses it (brokerd.protocols.smqp.factory, which
    imports this module): its settings, the server's SUID the greeting sends, the allow-list
    and the reactor that connects and times out."""

    @property
    def settings(self) -> Settings: ...

    @property
    def suid(self) -> str: ...

    @property
    def connectto_allow(self) -> tuple[AllowEntry, ...]: ...

    @property
    def clock(self) -> IBrokerReactor: ...


class NotifiedSession(typing.Protocol):
    """The SMQP session that asked for a notification connection (its whole contract,
    brokerd.protocols.smqp.session, imports this module): its login, its command
    connection, its outbox, and what it does when the notification connection is lost."""

    @property
    def factory(self) -> NotifyingFrontEnd: ...

    @property
    def account(self) -> str | None: ...

    @property
    def channel(self) -> str | None: ...

    @property
    def outbox(self) -> Outbox | None: ...

    @property
    def transport(self) -> Any: ...

    def notifications_lost(self, connection: NotificationConnection) -> None: ...


class ConnectionFailed(Exception):
    """Why a notification connection failed: for the log, never for the client."""


@implementer(IPushProducer)
class NotificationConnection(Protocol):
    """The server's side of a client's notification listener: the greeting exchange, then
    NOTIFYs out and the client's acknowledgements in."""

    _log = Logger()
    transport: Any
    """The TCP connection to the client's listener, also a producer (paused while its
    replies wait): no single Twisted interface describes both."""

    def __init__(self, session: NotifiedSession) -> None:
        self.session = session
        self.ready: Deferred[NotificationConnection] = Deferred()
        """Fires with this connection once greeted; fails with Refused."""
        self._stage = "greeting"
        self._buffer = b""
        self._parser = SMQPParser(max_body=MAX_GREETING_LINE)
        self._pending: deque[Command | ClientReply | Rejected] = deque()
        self._busy = False
        self.paused = False
        self.closed = False

    # ------------------------------------------------------------------ greeting

    def connectionMade(self) -> None:
        no_delay(self.transport)
        limit_output_buffer(self.transport, self.session.factory.settings.max_output_buffer)
        self.transport.registerProducer(self, True)

    def dataReceived(self, data: bytes) -> None:
        if self.closed:
            return
        if self._stage != "open":
            self._buffer += data
            while self._stage != "open" and b"\n" in self._buffer:
                line, _nl, self._buffer = self._buffer.partition(b"\n")
                self._handshake(line.rstrip(b"\r").decode("utf-8", "replace"))
                if self.closed:
                    return
            if self._stage != "open":
                if len(self._buffer) > MAX_GREETING_LINE:
                    self._fail("the client's greeting line is too long")
                return
            data, self._buffer = self._buffer, b""
            if not data:
                return
        self._pending.extend(self._parser.feed(data))
        self._next()

    def _handshake(self, line: str) -> None:
        words = line.split()
        if self._stage == "greeting":
            if len(words) < 2 or not words[0].upper().startswith("SMQP/") or words[1].lower() != "ready.":
                self._fail(f"the client greeted with {line[:80]!r}, not SMQP/1.0 Ready.")
                return
            self._stage = "suid"
            self.transport.write(self.session.factory.suid.encode("utf-8") + b"\r\n")
            return
        if not words or words[0] != "200":
            self._fail(f"the client answered the SUID with {line[:80]!r}, not 200")
            return
        self._stage = "open"
        self.ready.callback(self)

    def _fail(self, reason: str) -> None:
        self.closed = True
        self.transport.loseConnection()
        if not self.ready.called:
            self.ready.errback(ConnectionFailed(reason))

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed = True
        self._pending.clear()
        if not self.ready.called:
            text = reason.getErrorMessage() if reason is not None else "closed"
            self.ready.errback(ConnectionFailed(f"closed: {text}"))
            return
        self.session.notifications_lost(self)

    # ------------------------------------------------------------------ open

    def write(self, parts: list[bytes]) -> None:
        if not self.closed:
            self.transport.writeSequence(parts)

    def can_write(self) -> bool:
        return not self.closed and not self.paused

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.loseConnection()

    def _next(self) -> None:
        """Answer the client's replies one at a time, in order."""
        while self._pending and not self._busy and not self.closed:
            event = self._pending.popleft()
            d = self._answer(event)
            if d is not None:
                self._busy = True
                d.addErrback(self._answer_failed)
                d.addBoth(self._answered)
        if not self.closed:
            if len(self._pending) > MAX_PENDING_REPLIES:
                self.transport.pauseProducing()
            else:
                self.transport.resumeProducing()

    def _answered(self, _result: object) -> None:
        self._busy = False
        self._next()

    def _answer_failed(self, failure: Failure) -> None:
        self._log.failure("SMQP acknowledgement on a notification connection", failure)
        self.write([encode_reply(451, "Local error in processing")])

    def _answer(self, event: Command | ClientReply | Rejected) -> Deferred | None:
        if not isinstance(event, ClientReply):
            if isinstance(event, Command):
                self.write([encode_reply(503, "Bad sequence: commands go on the command connection")])
            else:
                self.write([encode_reply(event.code, event.text)])
            return None
        outbox = self.session.outbox
        if event.code not in (310, 312, 416):
            self.write([encode_reply(400, f"Bad request: {event.code} is not an acknowledgement (310, 312 or 416)")])
            return None
        if outbox is None:  # the session has no outbox any more
            self.write([encode_reply(503, "Bad sequence: no notification to acknowledge")])
            return None
        try:
            if event.code == 416:
                d = outbox.refuse()
                reply = encode_reply(200, "OK")
            else:
                d = outbox.acknowledge(wait=event.code == 312)
                reply = encode_reply(310, "ACK")
        except Exception:  # NoNotification, above all
            self.write([encode_reply(503, "Bad sequence: no notification to acknowledge")])
            return None

        def done(_result: object) -> None:
            self.write([reply])
            if outbox is not None and not outbox.closed:
                outbox.pump()

        return d.addCallback(done)

    # ------------------------------------------------------------------ IPushProducer

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        outbox = self.session.outbox
        if outbox is not None and not self.closed:
            outbox.pump()

    def stopProducing(self) -> None:
        self.paused = True


class _Connector(Factory):
    def __init__(self, session: NotifiedSession) -> None:
        self.session = session

    def buildProtocol(self, addr: IAddress | None) -> NotificationConnection:
        connection = NotificationConnection(self.session)
        connection.factory = self
        return connection


def connect_notifications(session: NotifiedSession, command: Command) -> Deferred[NotificationConnection]:
    """CONNECTTO for ``session``: check, connect, greet; Deferred[NotificationConnection]
    (fails with Refused)."""
    account, channel, address, port_text = command.args
    factory = session.factory
    if account.lower() != session.account or channel != session.channel:
        raise Refused(400, f"Bad request: logged in as {session.account}:{session.channel}, "
                                  f"not {account}:{channel}")
    peer = getattr(session.transport.getPeer(), "host", None)
    host = address.strip("[]") or peer
    port = int(port_text)
    if host is None or not permitted(peer, host, port, factory.connectto_allow):
        raise Refused(403, f"Forbidden: CONNECTTO connects only to this connection's public address "
                                  f"or addresses the server's allow-list names, not {host}:{port}")
    clock = factory.clock
    timeout = factory.settings.login_timeout
    deadline = clock.seconds() + timeout
    endpoint = HostnameEndpoint(clock, host, port, timeout=timeout)
    d = endpoint.connect(_Connector(session))

    def connected(built: IProtocol) -> Deferred[NotificationConnection]:
        connection = cast(NotificationConnection, built)  # what the _Connector built
        timer = clock.callLater(max(0.0, deadline - clock.seconds()), connection._fail,
                                f"no greeting within {timeout:g} s")

        def settled(result: _T) -> _T:
            if timer.active():
                timer.cancel()
            return result

        return connection.ready.addBoth(settled)

    def failed(failure: Failure) -> Deferred[NotificationConnection]:
        """One answer, at the deadline, whatever went wrong (the module docstring says why)."""
        failure.trap(Exception)
        _log.info("SMQP CONNECTTO {host}:{port} for {account}:{channel} failed: {reason}", host=host, port=port,
                  account=session.account, channel=session.channel, reason=failure.getErrorMessage())
        answer: Deferred[NotificationConnection] = Deferred()
        clock.callLater(max(0.0, deadline - clock.seconds()), answer.errback, Refused(451, FAILED))
        return answer

    return d.addCallback(connected).addErrback(failed)

"""A Twisted SMQP client, for brokerd's own tools and for any Twisted program.

:class:`SMQPClientProtocol` is one connection: bytes go through the sans-IO
:class:`~brokerd.protocols.smqp.codec.SMQPClientParser`; the server answers commands in
order, so every command gets a Deferred in one FIFO and each reply fires the oldest.  A
reply of 400 and above fails the Deferred with :class:`SMQPError`.  Notifications go to
:meth:`SMQPClientProtocol.notifyReceived` (by default the factory's ``on_notify``).

:func:`connect` opens a connection over any client endpoint (see :func:`client_endpoint`
for TLS) and fires once the server's greeting said ``Ready``.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IProtocol, IStreamClientEndpoint
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.errors import BrokerError
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols import endpoints
from brokerd.protocols.closing import ClosedNotifier, abort_connection
from brokerd.protocols.nodelay import no_delay
from brokerd.protocols.smqp.codec import (
    SMQPClientParser,
    SMQPProtocolError,
    encode_command,
    encode_contact,
    encode_publish,
    format_datetime,
    format_keywords,
    parse_keywords,
    parse_timeout,
)
from brokerd.protocols.smqp.events import Body, Greeting, Notify, Reply, Section

NotifyHandler = Callable[[Notify], object]


class SMQPError(BrokerError):
    """The server refused a command: ``code`` (int) and the reply's ``lines``."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.code = reply.code
        self.lines = reply.lines
        super().__init__(f"{reply.code} {' | '.join(reply.lines)}")


@dataclass(frozen=True)
class LoginInfo:
    """What a successful login reply says (the draft's login attributes)."""

    topic: str
    timeout: str | None
    time: str | None
    suid: str | None


class SMQPClientProtocol(ClosedNotifier, Protocol):
    _log = Logger()
    factory: SMQPClientFactory | None = None

    def __init__(self) -> None:
        self._parser = SMQPClientParser()
        self._pending: deque[Deferred] = deque()
        self.greeting: Deferred = Deferred()
        """Fires with this protocol once the server's greeting says Ready (SMQPError-like
        ConnectionClosed otherwise)."""
        self.server: Greeting | None = None
        self.account: str | None = None
        self.channel: str | None = None
        self.login_info: LoginInfo | None = None
        self.notify_window = 1
        """Notifications the server may have outstanding to this session (see
        :meth:`set_notify_window`); 1 is the draft's exchange."""
        self.closing_reply: Reply | None = None
        """The 421 the server said before closing on its own (an operator's close, a newer
        login of the account and channel, a login timeout): why the connection ended."""
        self._open = False
        self._lost: BaseException | None = None
        self._lost_waiters: list[Deferred] = []

    @property
    def is_open(self) -> bool:
        return self._open

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        no_delay(self.transport)
        self._open = True

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._open = False
        self._lost = reason.value if reason is not None else ConnectionClosed()
        if not self.greeting.called:
            self.greeting.errback(reason if reason is not None else ConnectionClosed())
        pending, self._pending = self._pending, deque()
        for d in pending:
            d.errback(reason)
        self._notify_closed()

    def dataReceived(self, data: bytes) -> None:
        try:
            events = self._parser.feed(data)
        except SMQPProtocolError as exc:
            self._log.warn("SMQP server broke the protocol, closing: {error}", error=exc)
            self._open = False
            abort_connection(self.transport)
            return
        for event in events:
            if isinstance(event, Greeting):
                self._greeted(event)
            elif isinstance(event, Reply):
                self._replied(event)
            else:
                try:
                    self.notifyReceived(event)
                except Exception:
                    self._log.failure("Handling {notify!r}", notify=event)

    def _greeted(self, greeting: Greeting) -> None:
        self.server = greeting
        if greeting.status.lower() == "ready":
            self.greeting.callback(self)
        else:
            self.greeting.errback(ConnectionClosed(f"server not available: {greeting.status}"))
            self._made().loseConnection()

    def _replied(self, reply: Reply) -> None:
        if not self._pending:
            if reply.code == 421:
                self.closing_reply = reply  # the server closes on its own, and says why
                return
            self._log.warn("Unexpected SMQP reply {code}: {text}", code=reply.code, text=reply.text)
            return
        d = self._pending.popleft()
        if reply.code >= 400:
            d.errback(SMQPError(reply))
        else:
            d.callback(reply)

    def notifyReceived(self, notify: Notify) -> None:
        """A NOTIFY from the server; override it or give the factory ``on_notify``."""
        handler = getattr(self.factory, "on_notify", None)
        if handler is not None:
            handler(notify)

    # ------------------------------------------------------------------ commands

    def send_raw(self, data: bytes) -> Deferred:
        """Send one already-encoded command (and its body); Deferred[Reply]."""
        if not self._open:
            return fail(ConnectionClosed("the SMQP connection is not open"))
        d: Deferred = Deferred()
        self._pending.append(d)
        self._made().write(data)
        return d

    def command(self, *words: str) -> Deferred:
        """``words`` joined by spaces; Deferred[Reply], SMQPError for 4xx/5xx."""
        return self.send_raw(encode_command(*words))

    def _values(self, d: Deferred) -> Deferred:
        return d.addCallback(lambda reply: list(reply.values))

    def login(self, account: str, channel: str, password: str = "") -> Deferred:
        """``LOGIN account:channel CLEAR/1.0`` then ``PASS account password``;
        Deferred[LoginInfo]."""
        d = self.command("LOGIN", f"{account}:{channel}", "CLEAR/1.0")
        d.addCallback(_not_redirected)
        words = ("PASS", account, password) if password else ("PASS", account)
        d.addCallback(lambda _: self.send_raw(encode_command(*words)))
        return d.addCallback(self._logged_in, account, channel)

    def login_cert(self, account: str, channel: str) -> Deferred:
        """``LOGIN account:channel CERT/1.0``: SMQPS, the TLS client certificate names the
        account."""
        d = self.command("LOGIN", f"{account}:{channel}", "CERT/1.0")
        d.addCallback(_not_redirected)
        return d.addCallback(self._logged_in, account, channel)

    def _logged_in(self, reply: Reply, account: str, channel: str) -> LoginInfo:
        attributes = reply.attributes()
        self.account, self.channel = account, channel
        self.login_info = LoginInfo(attributes.get("topic", ""), attributes.get("timeout"),
                                    attributes.get("time"), attributes.get("suid"))
        return self.login_info

    def noop(self) -> Deferred:
        return self.command("NOOP")

    def quit(self) -> Deferred:
        """``QUIT``; fires with the 200 reply (the server then closes)."""
        d = self.command("QUIT")
        self._open = False
        return d

    def create_topic(self, topic: str, keywords: Iterable[str] | None = None,
                     link: str | None = None) -> Deferred:
        words = ["CREATE", "TOPIC", topic]
        if keywords is not None:
            words.append(format_keywords(keywords))
        if link is not None:
            words += [">", link]
        return self.command(*words)

    def remove_topic(self, topic: str) -> Deferred:
        """Deferred[int]: the messages still pending in the removed topics."""
        d = self.command("REMOVE", "TOPIC", topic)
        return d.addCallback(lambda reply: int(reply.values[0].split()[0]) if reply.values else 0)

    def rename_topic(self, topic: str, new_topic: str) -> Deferred:
        return self.command("SET", "TOPIC", "NAME", topic, new_topic)

    def set_keywords(self, topic: str, keywords: Iterable[str]) -> Deferred:
        return self.command("SET", "TOPIC", "KEYWORDS", topic, format_keywords(keywords))

    def get_keywords(self, topic: str) -> Deferred:
        d = self.command("GET", "TOPIC", "KEYWORDS", topic)
        return d.addCallback(lambda reply: parse_keywords(reply.values[0]) if reply.values else ())

    def set_delivery(self, topic: str, mode: str) -> Deferred:
        return self.command("SET", "TOPIC", "DELIVERY", topic, mode)

    def get_delivery(self, topic: str) -> Deferred:
        d = self.command("GET", "TOPIC", "DELIVERY", topic)
        return d.addCallback(lambda reply: reply.values[0] if reply.values else "")

    def set_timeout(self, topic: str, timeout: float | str | None) -> Deferred:
        """SET TOPIC TIMEOUT (brokerd's extension): ``timeout`` in seconds, None for
        INFINITE, or ``"DEFAULT"`` to drop the topic's own value (it inherits again)."""
        if timeout is None:
            value = "INFINITE"
        elif isinstance(timeout, str):
            value = timeout
        else:
            value = str(int(timeout))
        return self.command("SET", "TOPIC", "TIMEOUT", topic, value)

    def get_timeout(self, topic: str) -> Deferred:
        """Deferred[tuple[float | None, str]]: GET TOPIC TIMEOUT: the timeout (seconds; None
        for INFINITE) of a message without Timeout in the topic, and where it comes from
        (the path of the topic that sets it, or ``SERVER`` for the server default)."""
        d = self.command("GET", "TOPIC", "TIMEOUT", topic)

        def values(reply: Reply) -> tuple[float | None, str]:
            try:
                return parse_timeout(reply.values[0]), reply.attributes()["from"]
            except (IndexError, KeyError, ValueError):
                raise SMQPProtocolError(f"GET TOPIC TIMEOUT: unexpected reply {reply.lines!r}") from None

        return d.addCallback(values)

    def list_topics(self, topic: str) -> Deferred:
        """Deferred[list[str]]: one line per child (``/a/b`` or ``/a/v > /target``)."""
        return self._values(self.command("LIST", "TOPIC", topic))

    def find_topics(self, topic: str, keywords: Iterable[str] | None = None,
                    depth: int | None = None) -> Deferred:
        """Deferred[list[str]]: ``/path (KEYWORDS)`` lines."""
        words = ["FIND", "TOPIC", topic]
        if keywords is not None:
            words.append(format_keywords(keywords))
        if depth is not None:
            words.append(str(depth))
        return self._values(self.command(*words))

    def count(self, resource: str, topic: str) -> Deferred:
        """``COUNT TOPIC|MESSAGE|SUBSCRIBERS topic``; Deferred[int]."""
        d = self.command("COUNT", resource.upper(), topic)
        return d.addCallback(lambda reply: int(reply.values[0]))

    def set_password(self, old: str, new: str) -> Deferred:
        """SET LOGIN PASSWORD CLEAR/1.0, then the old and the new password."""
        account = self.account or ""
        d = self.command("SET", "LOGIN", "PASSWORD", "CLEAR/1.0")

        def send(_: object, words: tuple[str, ...]) -> Deferred:
            return self.send_raw(encode_command(*words))

        for password in (old, new):
            d.addCallback(send, ("PASSWORD", account, password) if password else ("PASSWORD", account))
        return d

    def set_contact(self, mime: str, data: bytes) -> Deferred:
        return self.send_raw(encode_contact(mime, data))

    def get_contact(self, mime: str = "text/x-vcard", account: str | None = None) -> Deferred:
        """Deferred[bytes]: the contact lines joined with CRLF."""
        words = ["GET", "LOGIN", "CONTACT", mime] + ([account] if account else [])
        d = self.command(*words)
        return d.addCallback(lambda reply: "\r\n".join(reply.values).encode("utf-8"))

    def publish(self, target: str, cmuid: str, sections: Iterable[tuple[str, bytes]] = (),
                headers: Iterable[tuple[str, str]] = (), mode: str = "NEW",
                created: float | None = None) -> Deferred:
        """PUBLISH MESSAGE [mode] target cmuid with a Created attribute (now, or
        ``created``), ``headers`` and one data section per ``(content type, data)``;
        Deferred[Reply] (``reply.values``: the CMUID and the SMUID)."""
        import time

        attributes = (("Created", format_datetime(time.time() if created is None else created)),
                      *tuple(headers))
        body = Body(attributes, tuple(Section((("Content-Type", kind),), data) for kind, data in sections))
        return self.send_raw(encode_publish(target, cmuid, body, mode))

    def subscribe(self, topic: str, *options: str) -> Deferred:
        """SUBSCRIBE MESSAGE [options...] topic; Deferred[list[str]]: the topics it covers."""
        return self._values(self.command("SUBSCRIBE", "MESSAGE", *options, topic))

    def unsubscribe(self, topic: str, resource: str = "MESSAGE") -> Deferred:
        return self._values(self.command("UNSUBSCRIBE", resource, topic))

    def acknowledge(self, code: str = "310 ACK") -> Deferred:
        """The first phase of a delivery (``310 ACK``, ``312 wait``, ``416 ...``):
        Deferred[Reply], the server's ``310 ACK`` for 310 and 312."""
        return self.send_raw(code.encode("utf-8") + b"\r\n")

    def set_notify_window(self, size: int) -> Deferred:
        """``SET NOTIFY WINDOW size``, brokerd's extension (docs/smqp.md): up to ``size``
        NOTIFY MESSAGEs outstanding, answered in the order they came.  Deferred[int]: the
        window in force afterwards, ``size`` when granted; when refused (a server without
        the extension answers 400, brokerd over its ``--smqp-max-notify-window`` 510) the
        window stays what it was, 1 by default: the draft's one at a time."""
        d = self.command("SET", "NOTIFY", "WINDOW", str(size))

        def granted(_reply: Reply) -> int:
            self.notify_window = size
            return size

        def refused(failure: Failure) -> int:
            failure.trap(SMQPError)
            self._log.info("SMQP server refused a notification window of {size}: {reason}",
                           size=size, reason=failure.getErrorMessage())
            return self.notify_window

        return d.addCallbacks(granted, refused)

    def get_channel(self) -> Deferred:
        d = self.command("GET", "LOGIN", "CHANNEL")
        return d.addCallback(lambda reply: reply.values[0] if reply.values else "")


def _not_redirected(reply: Reply) -> Reply:
    """A ``311`` answer to LOGIN (the server sends the client elsewhere, the target in
    ``lines[-1]``) fails the login with SMQPError: the server closes the connection."""
    if reply.code == 311:
        raise SMQPError(reply)
    return reply


class SMQPClientFactory(ClientFactory):
    protocol = SMQPClientProtocol  # type: ignore[assignment]  # Twisted's Factory[P] wants P.factory set, a client protocol may have none

    def __init__(self, on_notify: NotifyHandler | None = None) -> None:
        self.on_notify = on_notify


def connect(endpoint: IStreamClientEndpoint, on_notify: NotifyHandler | None = None) -> Deferred:
    """Connect and wait for the greeting; Deferred[SMQPClientProtocol]."""
    def greeted(protocol: IProtocol) -> Deferred:
        return cast(SMQPClientProtocol, protocol).greeting  # what the factory built

    return endpoint.connect(SMQPClientFactory(on_notify)).addCallback(greeted)


def client_endpoint(reactor: IBrokerReactor | None, description: str, *, tls: bool = False, hostname: str | None = None,
                    ca: Path | None = None, cert: Path | None = None,
                    key: Path | None = None) -> IStreamClientEndpoint:
    """The endpoint for a Twisted client endpoint string, wrapped in TLS (SMQPS) when
    ``tls``: the server is verified as ``hostname`` (default: the host of a ``tcp:``
    description) against ``ca``, and ``cert``/``key`` are presented for CERT login.
    ValueError for an unusable description."""
    return endpoints.client_endpoint(reactor, description, tls=tls, hostname=hostname, ca=ca,
                                     cert=cert, key=key, default_host=endpoints.endpoint_host)

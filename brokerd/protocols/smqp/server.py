"""The SMQP server: one SMQPServerProtocol per connection, one factory per broker.

The protocol object is the session's "mind" (ISubscriber) once logged in; it is named
``account:channel`` and reachable at the core address ``smqp:account:channel``.  A newer
login of the same account and channel replaces the older connection (the core's rule).

Commands run one at a time, in order: a command that waits (a password check, a store write)
holds the ones behind it, so replies always come back in the order of the commands, and a
client may pipeline.  Replies of the commands handled in one read are written together.

Reading stops while more than :data:`MAX_PIPELINE` commands wait, and while the connection's
output buffer holds more than ``max_output_buffer`` bytes (the client does not read its
replies): memory per connection stays bounded either way.

See docs/smqp.md for the commands, the reply codes and the permission model.

Event log (docs/events.md): the core logs sessions and the messages it routes; every refused
login (unknown account, wrong password, unsupported method, a certificate that does not name
the account, too many logins) is an ``auth_failure`` logged here, and the message outcomes are
logged by the message service (brokerd.protocols.smqp.delivery).
"""
from __future__ import annotations

import itertools
import math
import secrets
import socket
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IHandshakeListener, IPushProducer, ISSLTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd import __version__
from brokerd.auth.accounts import GUEST, AccountsChecker, UnknownAccount, run_inline, thread_runner
from brokerd.auth.checkers import ClientCertificateChecker
from brokerd.auth.credentials import ClientCertificate
from brokerd.auth.realm import BrokerRealm, IIdentity
from brokerd.auth.tls import peer_names
from brokerd.auth.ual import (
    DEFAULT_GUEST_PERMISSIONS,
    AccessList,
    Perm,
    format_permissions,
    parse_permissions,
    read_access_list,
)
from brokerd.config import Runtime, Settings
from brokerd.errors import ConfigurationError
from brokerd.events.log import NULL_EVENT_LOG, transport_source
from brokerd.interfaces import ISubscriber
from brokerd.protocols.flow import limit_output_buffer
from brokerd.protocols.nodelay import no_delay
from brokerd.protocols.smqp.codec import (
    SMQPParser,
    encode_greeting,
    encode_notify,
    encode_reply,
    format_datetime,
    format_keywords,
    format_timeout,
)
from brokerd.protocols.smqp.delivery import TRASH_RETENTION, MessageService
from brokerd.protocols.smqp.events import ClientReply, Command, Rejected, TopicRef
from brokerd.protocols.smqp.messaging import MessagingCommands, Overlap, Refused
from brokerd.protocols.smqp.outbox import MAX_ATTEMPTS, RETRY_TIMEOUT
from brokerd.protocols.smqp.subscriptions import MESSAGE, Subscription
from brokerd.protocols.smqp.topictree import ACCOUNTS, Found, Node, TopicError, TopicTree
from brokerd.protocols.smqp.wire import SMQPWireFormat
from brokerd.store.records import Contact, TopicRecord, trash_owner
from brokerd.store.sqlite import FILENAME, SQLiteStore

SERVER_IDENT = f"brokerd SMQP Server/{__version__}"
MAX_PIPELINE = 64
"""Commands parsed but not yet answered before the connection stops reading."""
MAX_LOGIN_FAILURES = 3
"""Refused LOGIN/PASSWORD attempts on one connection before it is closed."""
MAX_LOGINS_PER_ACCOUNT = 64
"""Concurrent connections of one account (403 beyond)."""
MAX_FIND_RESULTS = 1000
"""Topics one FIND TOPIC may return (510 beyond)."""
DEFAULT_MESSAGE_TIMEOUT = 86400.0
"""The server's default message timeout (the login reply's Timeout attribute)."""
UAL_RELOAD_INTERVAL = 5.0
"""Seconds between checks of the UAL file for changes."""
UAL_FILENAME = "smqp.ual"
"""The UAL file looked for in --data-dir when no UAL file is configured."""

CLEAR = "CLEAR"
CERT = "CERT"
"""The login method of SMQPS: the verified TLS client certificate names the account."""

OK = 200

_PERM_NAMES = {Perm.PUBLISH: "publish", Perm.SUBSCRIBE: "subscribe", Perm.ADMINISTER: "administer",
               Perm.CREATE: "create/rename/remove", Perm.REPLY: "reply"}
_BEFORE_LOGIN = {"LOGIN", "PASSWORD", "NOOP", "QUIT"}


class _Slot:
    """The reply of one command: written once it and every earlier one are ready."""

    __slots__ = ("data", "ready", "after")

    def __init__(self, ready: bool = True) -> None:
        self.data: list[bytes] = []
        self.ready = ready
        self.after: list[Callable[[], None]] = []


@implementer(ISubscriber, IPushProducer, IHandshakeListener)
class SMQPServerProtocol(MessagingCommands, Protocol):
    """One SMQP connection; once logged in also its session as the Broker sees it."""

    _log = Logger()
    protocol = "smqp"
    name = b""
    address: bytes | None = None
    factory: SMQPServerFactory

    def __init__(self) -> None:
        self._parser = SMQPParser()
        self._queue: deque[Command | ClientReply | Rejected] = deque()
        self._slots: deque[_Slot] = deque()
        self._slot: _Slot | None = None
        self._busy = False
        self._running = False
        self._admitted = False
        self._greeted = False
        self._login_timer: Any = None
        self._paused_reading = False
        self._paused_output = False
        self._failures = 0
        self._pending_login: tuple[str, str] | None = None
        self._password_change: str | None = None
        self.account: str | None = None
        self.channel: str | None = None
        self.closed = False
        self.outbox: Any = None
        self.server_bye = True
        """NOTIFY SERVER BYE at shutdown (every client is subscribed by default)."""
        self.server_timeout = False

    @property
    def wire_format(self) -> SMQPWireFormat:  # type: ignore[override]
        return self.factory.wire

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        factory = self.factory
        if not factory.broker.admit():
            self.transport.write(encode_greeting(SERVER_IDENT, ready=False))
            self.closed = True
            self.transport.loseConnection()
            return
        self._admitted = True
        no_delay(self.transport)
        limit_output_buffer(self.transport, factory.settings.max_output_buffer)
        self.transport.registerProducer(self, True)
        self._login_timer = factory.clock.callLater(
            factory.settings.login_timeout, self._login_timed_out)
        if not ISSLTransport.providedBy(self.transport):
            self._ready_to_greet()

    def handshakeCompleted(self) -> None:
        """SMQPS: greet once TLS is up (TLS buffers earlier writes and pauses us meanwhile)."""
        self._ready_to_greet()

    def _ready_to_greet(self) -> None:
        factory = self.factory
        if self.closed:
            return
        if factory.started.called:
            self._greet(factory.start_error)
        else:
            self.transport.pauseProducing()
            factory.started.addBoth(self._greet_later)

    def _greet_later(self, result: Any) -> Any:
        if not self.closed:
            self.transport.resumeProducing()
            self._greet(self.factory.start_error)
        return result

    def _greet(self, error: Failure | None) -> None:
        if error is not None:
            self.transport.write(encode_greeting(SERVER_IDENT, ready=False))
            self._close()
            return
        self._greeted = True
        self.transport.write(encode_greeting(SERVER_IDENT))

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed = True
        self._queue.clear()
        self._cancel_login_timer()
        if self.outbox is not None:
            self.factory.service.detach(self.outbox)
        if self._admitted:
            self._admitted = False
            self.factory.broker.release()
            self.factory.logged_out(self)
            self.factory.broker.detach(self)

    def _cancel_login_timer(self) -> None:
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        self._login_timer = None

    def _close(self, code: int | None = None, text: str = "") -> None:
        """Reply ``code text`` (if given), write what is pending, and close."""
        if self.closed:
            return
        if code is not None:
            self._slot = None
            self._reply(code, text)
        self._flush(closing=True)
        self.closed = True
        self._queue.clear()
        self.transport.loseConnection()

    def _login_timed_out(self) -> None:
        """No login in time (counted from the connection, TLS handshake included)."""
        self._login_timer = None
        if self.account is None:
            if not self._greeted:
                self._close()
                return
            self._close(421, f"Login timeout: no login within {self.factory.settings.login_timeout:g} s")

    # ------------------------------------------------------------------ ISubscriber

    def replaced(self) -> None:
        """A newer login of this account and channel took over."""
        self._close(421, f"Replaced by a newer login of {self.account}:{self.channel}")

    def send(self, data: bytes) -> None:
        """A message from the core (another protocol's UCAST to this session): queued with
        the notifications that need no acknowledgement."""
        if self.outbox is not None:
            self.outbox.offer_volatile(data)

    def write_notify(self, parts: list[bytes]) -> None:
        if not self.closed:
            self.transport.writeSequence(parts)

    def can_notify(self) -> bool:
        return not self.closed and not self._paused_output

    # ------------------------------------------------------------------ flow control

    def pauseProducing(self) -> None:
        """Our output buffer is full: stop reading until the client reads its replies."""
        if self.closed:
            return
        self._paused_output = True
        self._regulate()

    def resumeProducing(self) -> None:
        if self.closed:
            return
        self._paused_output = False
        self._regulate()
        if self.outbox is not None:
            self.outbox.pump()

    def stopProducing(self) -> None:
        """The transport is going away; connectionLost follows."""
        self._paused_output = True

    def _regulate(self) -> None:
        """Read while the output drains and few commands wait; pause otherwise."""
        if self.closed:
            return
        waiting = len(self._queue) + len(self._slots)
        wanted = self._paused_output or waiting > MAX_PIPELINE
        if wanted and not self._paused_reading:
            self._paused_reading = True
            self.transport.pauseProducing()
        elif not wanted and self._paused_reading and waiting <= MAX_PIPELINE // 2:
            self._paused_reading = False
            self.transport.resumeProducing()

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if self.closed or not self._greeted:
            return
        self._queue.extend(self._parser.feed(data))
        self._run()

    def _run(self) -> None:
        """Handle queued commands in order until one has to wait."""
        if self._running:
            return
        self._running = True
        try:
            while self._queue and not self._busy and not self.closed:
                slot = self._slot = _Slot()
                self._slots.append(slot)
                result = self._handle(self._queue.popleft())
                if isinstance(result, Overlap):
                    slot.ready = False
                    self._slot = None
                    result.d.addCallbacks(self._overlap_done, self._overlap_failed,
                                          callbackArgs=(slot,), errbackArgs=(slot,))
                elif isinstance(result, Deferred):
                    slot.ready = False
                    self._busy = True
                    result.addErrback(self._failed)
                    result.addBoth(self._resume, slot)
                else:
                    self._slot = None
        finally:
            self._running = False
        self._flush()
        self._regulate()

    def _resume(self, _result: Any, slot: _Slot) -> None:
        self._busy = False
        slot.ready = True
        self._slot = None
        if not self._running:
            self._run()

    def _overlap_done(self, data: bytes, slot: _Slot) -> None:
        if data:
            slot.data.append(data)
        slot.ready = True
        if not self._running:
            self._flush()
            self._regulate()

    def _overlap_failed(self, failure: Failure, slot: _Slot) -> None:
        error = failure.value
        if isinstance(error, (Refused, TopicError)):
            slot.data.append(encode_reply(error.code, error.text))
        else:
            self._log.failure("SMQP publish failed", failure)
            slot.data.append(encode_reply(451, "Local error: the message was not stored"))
        self._overlap_done(b"", slot)

    def _handle(self, event: Command | ClientReply | Rejected) -> Deferred | None:
        try:
            if isinstance(event, Rejected):
                self._reply(event.code, event.text)
                return None
            if isinstance(event, ClientReply):
                if self.outbox is None:
                    raise Refused(503, "Bad sequence: no notification to acknowledge")
                return self.client_reply(event)
            if event.name != "PASSWORD":
                self._password_change = None
            if self.account is None and event.name not in _BEFORE_LOGIN:
                raise Refused(403, "Forbidden: log in first")
            handler = getattr(self, "do_" + event.name.replace(" ", "_"), None)
            if handler is None:
                raise Refused(502, f"Not implemented: {event.name}")
            return handler(event)  # type: ignore[no-any-return]
        except Refused as exc:
            self._reply(exc.code, exc.text)
        except TopicError as exc:
            self._reply(exc.code, exc.text)
        except Exception:
            self._log.failure("SMQP command {name}", name=getattr(event, "name", event))
            self._reply(451, "Local error in processing")
        return None

    def _failed(self, failure: Failure) -> None:
        error = failure.value
        if isinstance(error, (Refused, TopicError)):
            self._reply(error.code, error.text)
        else:
            self._log.failure("SMQP command failed", failure)
            self._reply(451, "Local error in processing")

    # ------------------------------------------------------------------ output

    def _reply(self, code: int, *lines: str) -> None:
        self._reply_raw(encode_reply(code, *lines))

    def _reply_raw(self, data: bytes) -> None:
        """Bytes of the current command's reply (or, outside a command, a reply of its own)."""
        if self.closed:
            return
        slot = self._slot
        if slot is None:
            slot = _Slot()
            self._slots.append(slot)
        slot.data.append(data)

    def _after_reply(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the current reply has been written (the server's 310
        before the next NOTIFY)."""
        slot = self._slot
        if slot is None:
            callback()
        else:
            slot.after.append(callback)

    def _flush(self, closing: bool = False) -> None:
        """Write the replies that are ready, in command order (all of them when closing)."""
        slots = self._slots
        out: list[bytes] = []
        after: list[Callable[[], None]] = []
        while slots and (slots[0].ready or closing):
            slot = slots.popleft()
            out.extend(slot.data)
            after.extend(slot.after)
        if out and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        for callback in after:
            callback()

    # ------------------------------------------------------------------ login

    def _methods(self) -> list[str]:
        methods = [f"{CLEAR}/1.0"]
        if peer_names(self.transport):
            methods.append(f"{CERT}/1.0")
        return methods

    def do_LOGIN(self, command: Command) -> Deferred | None:
        if self.account is not None:
            raise Refused(503, "Bad sequence: already logged in")
        account, channel, method, _version = command.args
        self._pending_login = None
        if method == CLEAR:
            d = self.factory.checker.exists(account)
            d.addCallback(self._login_account_checked, account, channel)
            return d
        names = peer_names(self.transport) if method == CERT else ()
        if method == CERT and names:
            d = self.factory.portal.login(ClientCertificate(account.encode("utf-8"), names), self, IIdentity)
            d.addCallbacks(self._logged_in, self._login_refused, callbackArgs=(channel, CERT),
                           errbackArgs=(account, CERT, "Unauthorized: the client certificate does not name " + account))
            return d
        reason = "no client certificate" if method == CERT else "unsupported method"
        self._auth_failure(account, method, reason)
        self._reply(405, "Not allowed", "Methods: " + ", ".join(self._methods()))
        return None

    def _auth_failure(self, account: str, method: str, reason: str) -> None:
        self.factory.events.auth_failure("smqp", account, source=transport_source(self.transport), scheme=method,
                                         reason=reason)

    def _login_account_checked(self, exists: bool, account: str, channel: str) -> None:
        if not exists:
            self._auth_failure(account, CLEAR, "unknown account")
            self._login_failure(404, f"Not found: no account {account}")
            return
        self._pending_login = (account.lower(), channel)
        self._reply(OK, "OK")

    def do_PASSWORD(self, command: Command) -> Deferred | None:
        account, password = command.args
        if self._password_change is not None:
            return self._change_password(account, password)
        if self.account is not None:
            raise Refused(503, "Bad sequence: already logged in")
        if self._pending_login is None:
            raise Refused(503, "Bad sequence: PASSWORD without LOGIN")
        expected, channel = self._pending_login
        if account.lower() != expected:
            raise Refused(400, f"Bad request: LOGIN named {expected}, PASSWORD names {account}")
        self._pending_login = None
        credentials = UsernamePassword(account.encode("utf-8"), password.encode("utf-8"))
        d = self.factory.portal.login(credentials, self, IIdentity)
        d.addCallbacks(self._logged_in, self._login_refused, callbackArgs=(channel, CLEAR),
                       errbackArgs=(account, CLEAR))
        return d

    def _login_refused(self, failure: Failure, account: str, method: str,
                       text: str = "Unauthorized: password not correct") -> None:
        failure.trap(UnauthorizedLogin, NotImplementedError)
        if isinstance(failure.value, UnknownAccount):
            self._auth_failure(account, method, "unknown account")
            self._login_failure(404, "Not found: no such account")
        else:
            self._auth_failure(account, method, "wrong password" if method == CLEAR else "certificate refused")
            self._login_failure(401, text)

    def _login_failure(self, code: int, text: str) -> None:
        self._failures += 1
        if self._failures >= MAX_LOGIN_FAILURES:
            self._reply(code, text)
            self._close(421, f"Too many failed logins ({MAX_LOGIN_FAILURES}); closing")
        else:
            self._reply(code, text)

    def _logged_in(self, result: tuple, channel: str, method: str) -> Deferred | None:
        _interface, identity, _logout = result
        account = identity.name.decode("utf-8").lower()
        if self.closed:
            return None
        factory = self.factory
        if len(factory.sessions.get(account, ())) >= MAX_LOGINS_PER_ACCOUNT:
            self._auth_failure(account, method, "too many concurrent logins")
            raise Refused(403, f"Forbidden: too many concurrent logins ({MAX_LOGINS_PER_ACCOUNT})")
        records = factory.tree.ensure_account(account, factory.clock.seconds())
        d = factory.store.put_topics(records) if records else succeed(None)
        d.addErrback(self._log.failure, "Storing the login topic of {account}", account=account)
        d.addCallback(lambda _: self._session_started(account, channel))
        return d

    def _session_started(self, account: str, channel: str) -> None:
        if self.closed:
            return
        factory = self.factory
        self._cancel_login_timer()
        self.account, self.channel = account, channel
        self.name = f"{account}:{channel}".encode("utf-8")
        self.address = b"smqp:" + self.name
        factory.logged_in(self)
        factory.broker.attach(self)
        self.outbox = factory.service.attach(self)
        self._after_reply(self.outbox.pump)
        now = factory.clock.seconds()
        self._reply(
            OK, "OK",
            f"Topic: {factory.tree.login_topic(account, channel)}",
            f"Timeout: {format_timeout(factory.message_timeout)}",
            f"Time: {format_datetime(now)}",
            f"Suid: {factory.suid}",
        )

    # ------------------------------------------------------------------ SET LOGIN, GET LOGIN

    def do_SET_LOGIN_PASSWORD(self, command: Command) -> None:
        method = command.args[0]
        if method != CLEAR:
            self._reply(405, "Not allowed", f"Methods: {CLEAR}/1.0")
            return
        if self.account == GUEST:
            raise Refused(403, "Forbidden: the guest password cannot be changed")
        self._password_change = "old"
        self._reply(OK, "OK")

    def _change_password(self, account: str, password: str) -> Deferred:
        stage, self._password_change = self._password_change, None
        if account.lower() != self.account:
            raise Refused(400, f"Bad request: logged in as {self.account}, not {account}")
        checker = self.factory.checker
        if stage == "old":
            d = checker.requestAvatarId(UsernamePassword(account.encode("utf-8"), password.encode("utf-8")))

            def confirmed(_avatar: bytes) -> None:
                self._password_change = "new"
                self._reply(OK, "OK")

            def wrong(failure: Failure) -> None:
                failure.trap(UnauthorizedLogin)
                self._auth_failure(account, CLEAR, "wrong password (SET LOGIN PASSWORD)")
                self._reply(401, "Unauthorized: password not correct")

            return d.addCallbacks(confirmed, wrong)
        d = checker.set_password(account, password)

        def changed(_result: None) -> None:
            self._reply(OK, "OK")

        def failed(failure: Failure) -> None:
            if failure.check(UnknownAccount):
                self._reply(404, "Not found: this account has no password in the accounts file")
                return
            self._log.failure("Changing the password of {account}", failure, account=account)
            self._reply(451, "Local error: the password could not be changed")

        return d.addCallbacks(changed, failed)

    def do_SET_LOGIN_CONTACT(self, command: Command) -> Deferred:
        if self.account == GUEST:
            raise Refused(403, "Forbidden: the guest account has no contact")
        contact = Contact(command.args[0], command.data or b"")
        d = self.factory.store.set_contact(self.account, contact)
        return d.addCallback(lambda _: self._reply(OK, "OK"))

    def do_GET_LOGIN_CONTACT(self, command: Command) -> Deferred:
        mime = command.args[0]
        account = command.args[1].lower() if len(command.args) > 1 else self.account
        if account != self.account and self.account == GUEST:
            raise Refused(403, "Forbidden: the guest account cannot read contacts")

        def found(contact: Contact | None) -> None:
            if contact is None:
                raise Refused(404, f"Not found: no contact for {account}")
            if contact.mime.lower() != mime.lower():
                raise Refused(400, f"Bad request: the contact is available as {contact.mime} only")
            lines = contact.data.decode("utf-8", "replace").split("\r\n")
            self._reply(OK, "OK", *lines)

        return self.factory.store.get_contact(account).addCallback(found)

    def do_GET_LOGIN_CHANNEL(self, command: Command) -> None:
        self._reply(OK, "OK", self.channel or "")

    def do_NOOP(self, command: Command) -> None:
        self._reply(OK, "OK")

    def do_QUIT(self, command: Command) -> None:
        """Subscriptions stay: they belong to account:channel, not to the connection."""
        self._close(OK, "OK")

    def do_CONNECTTO(self, command: Command) -> None:
        raise Refused(502, "Not implemented: notifications come on this connection")

    # ------------------------------------------------------------------ topics: helpers

    def _permissions(self, node: Node) -> Perm:
        return self.factory.ual.permissions(self.account, node.path)  # type: ignore[arg-type]

    def _resolve(self, ref: TopicRef, *, follow: bool = True, need: Perm = Perm.NONE,
                 trash: bool = False) -> Found:
        """The topic ``ref`` names, if this login may see it (404 otherwise: a topic the
        login has no permission on is not revealed) and has ``need`` on it (403)."""
        found = self.factory.tree.lookup(ref, follow)
        if found.trash and not trash:
            raise Refused(403, "Forbidden: Trash is a system topic")
        perms = self._permissions(found.node)
        if not perms:
            raise TopicError(404, f"Not found: {ref}")
        if need and need not in perms:
            raise Refused(403, f"Forbidden: no {_PERM_NAMES.get(need, format_permissions(need))} "
                               f"permission on {found.node.display}")
        return found

    def _visible(self, nodes: Any) -> list[Node]:
        return [node for node in nodes if self._permissions(node)]

    def _listing(self, node: Node, keywords: bool = False) -> str:
        line = node.display
        if keywords and node.keywords:
            line += " " + format_keywords(node.keywords)
        if node.link is not None:
            target = self.factory.tree.get(node.link)
            line += " > " + (target.display if target is not None else "/" + node.link)
        return line

    def _persist(self, d: Deferred, undo: Callable[[], None],
                 then: Callable[[], None] | None = None) -> Deferred:
        """Answer 200 once the store has the change (and run ``then``: notices); undo it in
        memory if the store fails."""
        def stored(_result: Any) -> None:
            self._reply(OK, "OK")
            if then is not None:
                then()

        def failed(failure: Failure) -> None:
            undo()
            self._log.failure("Storing a topic change", failure)
            self._reply(451, "Local error: the change could not be stored")

        return d.addCallbacks(stored, failed)

    # ------------------------------------------------------------------ topic commands

    def do_CREATE_TOPIC(self, command: Command) -> Deferred:
        ref = command.topic
        if not ref.leaves:  # type: ignore[union-attr]
            raise Refused(409, "Conflict: / exists")
        parent = self._resolve(TopicRef(ref.leaves[:-1]), need=Perm.CREATE).node  # type: ignore[union-attr]
        if command.args:
            raise Refused(405, f"Not allowed: links to other servers ({command.args[0]}) are not supported")
        link = None
        if command.other is not None:
            try:
                link = self._resolve(command.other, follow=False).node
            except TopicError as exc:
                raise TopicError(404, f"Not found: destination topic {command.other}") from exc
        tree = self.factory.tree
        node = tree.create(parent, ref.leaves[-1], keywords=command.keywords or (), link=link,  # type: ignore[union-attr]
                           owner=self.account or "", now=self.factory.clock.seconds())
        service = self.factory.service

        def created() -> None:
            if node.link is None and service.index.matching(MESSAGE, node.key):
                service.bridge([node.key])
            service.topic_notice(parent.key, "ADD", node.display)

        return self._persist(self.factory.store.put_topics([node.record()]),
                             lambda: tree.remove(node), created)

    def do_REMOVE_TOPIC(self, command: Command) -> Deferred:
        """Remove the topic, its subtree and the virtual topics linking into it, with every
        subscription to them (any subscriber, any kind, wildcards based on them) in the same
        transaction.  Their messages are still delivered and expire as usual."""
        found = self._resolve(command.topic, follow=False, need=Perm.CREATE)  # type: ignore[arg-type]
        tree = self.factory.tree
        store = self.factory.store
        service = self.factory.service
        removed = tree.remove(found.node)
        keys = [node.key for node in removed]
        paths = [(node.key, node.display) for node in removed]
        dropped: list[Subscription] = service.index.based_on(keys)
        entries = [(sub.record.subscriber, sub.record.kind, sub.record.topic) for sub in dropped]
        pending: list[int] = []
        d = store.count_messages(keys)
        d.addCallback(pending.append)
        d.addCallback(lambda _: store.delete_topics(keys, entries))

        def done(_result: Any) -> None:
            self._reply(OK, "OK", f"{pending[0]} messages pending")
            service.topics_removed(paths, dropped)

        def failed(failure: Failure) -> None:
            tree.restore(removed)
            self._log.failure("Removing topics", failure)
            self._reply(451, "Local error: the change could not be stored")

        return d.addCallbacks(done, failed)

    def do_SET_TOPIC_NAME(self, command: Command) -> Deferred:
        source = self._resolve(command.topic, follow=False, need=Perm.CREATE).node  # type: ignore[arg-type]
        new = command.other
        if not new.leaves:  # type: ignore[union-attr]
            raise Refused(409, "Conflict: / exists")
        parent = self._resolve(TopicRef(new.leaves[:-1]), need=Perm.CREATE).node  # type: ignore[union-attr]
        tree = self.factory.tree
        old_parent, old_name = source.parent, source.name
        old_key = source.key
        changed = tree.rename(source, parent, new.leaves[-1])  # type: ignore[union-attr]
        renames = [(old, node.record()) for old, node in changed]
        service = self.factory.service
        return self._persist(self.factory.store.rename_topics(renames),
                             lambda: tree.rename(source, old_parent, old_name),  # type: ignore[arg-type]
                             lambda: service.topic_notice(old_key, "RENAME", source.display))

    def do_SET_TOPIC_KEYWORDS(self, command: Command) -> Deferred:
        node = self._resolve(command.topic, follow=False, need=Perm.ADMINISTER).node  # type: ignore[arg-type]
        self._changeable(node)
        old, node.keywords = node.keywords, command.keywords or ()

        def undo() -> None:
            node.keywords = old

        return self._persist(self.factory.store.put_topics([node.record()]), undo,
                             lambda: self.factory.service.topic_notice(node.key, "KEYWORDS",
                                                                      format_keywords(node.keywords)))

    def do_SET_TOPIC_DELIVERY(self, command: Command) -> Deferred:
        node = self._resolve(command.topic, need=Perm.ADMINISTER).node  # type: ignore[arg-type]
        self._changeable(node)
        old, node.delivery = node.delivery, command.mode or "ALL"

        def undo() -> None:
            node.delivery = old

        return self._persist(self.factory.store.put_topics([node.record()]), undo,
                             lambda: self.factory.service.set_delivery(node.key, node.delivery))

    def do_SET_TOPIC_TIMEOUT(self, command: Command) -> Deferred:
        """Our extension: the default timeout of messages published to the topic (and,
        unless they set their own, to the topics below it) without a Timeout attribute.
        Like DELIVERY it acts on the target of a virtual topic and needs administer."""
        node = self._resolve(command.topic, need=Perm.ADMINISTER).node  # type: ignore[arg-type]
        self._changeable(node)
        old = node.timeout
        if command.mode == "INFINITE":
            node.timeout = math.inf
        elif command.mode == "DEFAULT":
            node.timeout = None
        else:
            node.timeout = command.timeout

        def undo() -> None:
            node.timeout = old

        return self._persist(self.factory.store.put_topics([node.record()]), undo)

    def do_GET_TOPIC_TIMEOUT(self, command: Command) -> None:
        """``200-OK``, the timeout a message without Timeout gets in the topic, and where
        it comes from: ``From: /path`` (the topic or the ancestor that sets it) or ``From:
        SERVER`` (the server default)."""
        node = self._resolve(command.topic).node  # type: ignore[arg-type]
        factory = self.factory
        source = factory.tree.timeout_source(node.key)
        origin = "SERVER" if source is None else source.display
        self._reply(OK, "OK", format_timeout(factory.message_timeout_for(node.key)), f"From: {origin}")

    def _changeable(self, node: Node) -> None:
        if node.key == "" or node.transient or (node.system and node.key == ACCOUNTS):
            raise Refused(403, f"Forbidden: {node.display or '/'} is managed by the server")

    def do_GET_TOPIC_KEYWORDS(self, command: Command) -> None:
        node = self._resolve(command.topic, follow=False).node  # type: ignore[arg-type]
        self._reply(OK, "OK", format_keywords(node.keywords))

    def do_GET_TOPIC_DELIVERY(self, command: Command) -> None:
        node = self._resolve(command.topic).node  # type: ignore[arg-type]
        self._reply(OK, "OK", node.delivery)

    def do_LIST_TOPIC(self, command: Command) -> None:
        node = self._resolve(command.topic).node  # type: ignore[arg-type]
        lines = [self._listing(child) for child in self._visible(self.factory.tree.children(node))]
        self._reply(OK, "OK", *lines)

    def do_FIND_TOPIC(self, command: Command) -> None:
        ref = command.topic
        tree = self.factory.tree
        wanted = [k.lower() for k in command.keywords or ()]
        if ref.wildcard is None and not wanted:  # type: ignore[union-attr]
            node = self._resolve(ref, follow=False).node  # type: ignore[arg-type]
            self._reply(OK, "OK", self._listing(node, keywords=True))
            return
        base = self._resolve(TopicRef(ref.leaves)).node  # type: ignore[union-attr]
        layers = max(1, command.depth or 0)
        found = []
        for node in tree.matching(base, ref.wildcard, layers):  # type: ignore[union-attr]
            if wanted and not all(any(w in k.lower() for k in node.keywords) for w in wanted):
                continue
            if not self._permissions(node):
                continue
            found.append(node)
            if len(found) > MAX_FIND_RESULTS:
                raise Refused(510, f"Maximum quantities exceeded: more than {MAX_FIND_RESULTS} topics")
        self._reply(OK, "OK", *(self._listing(node, keywords=True) for node in found))

    def _selected(self, ref: TopicRef) -> tuple[Found, list[Node]]:
        """A COUNT target: the topic (wildcard: its parent) and, for a wildcard, every
        visible topic it selects below."""
        if ref.wildcard is None:
            return self._resolve(ref, trash=True), []
        base = self._resolve(TopicRef(ref.leaves))
        return base, self._visible(self.factory.tree.matching(base.node, ref.wildcard, None))

    def do_COUNT_TOPIC(self, command: Command) -> None:
        found, selected = self._selected(command.topic)  # type: ignore[arg-type]
        if command.topic.wildcard is None:  # type: ignore[union-attr]
            if found.trash:
                raise Refused(403, "Forbidden: Trash has no child topics")
            selected = self._visible(self.factory.tree.children(found.node))
        self._reply(OK, "OK", str(len(selected)))

    def do_COUNT_MESSAGE(self, command: Command) -> Deferred:
        found, selected = self._selected(command.topic)  # type: ignore[arg-type]
        keys = [node.key for node in selected] if command.topic.wildcard else [found.key]  # type: ignore[union-attr]
        return self.factory.store.count_messages(keys).addCallback(
            lambda count: self._reply(OK, "OK", str(count)))

    def do_COUNT_SUBSCRIBERS(self, command: Command) -> None:
        """Answered from the subscription index, which mirrors the store's subscriptions."""
        found, selected = self._selected(command.topic)  # type: ignore[arg-type]
        keys = [node.key for node in selected] if command.topic.wildcard else [found.key]  # type: ignore[union-attr]
        self._reply(OK, "OK", str(len(self.factory.service.index.exact_subscribers(keys))))


class SMQPServerFactory(Factory):
    """The SMQP front end: the topic tree, the UAL, the accounts checker and the store,
    shared by every SMQP connection (and every SMQP listener)."""

    protocol = SMQPServerProtocol
    _log = Logger()

    def __init__(
        self,
        broker: Any,
        settings: Settings,
        clock: Any,
        store: Any,
        checker: AccountsChecker,
        *,
        portal: Portal | None = None,
        ual: AccessList | None = None,
        ual_file: Path | None = None,
        domain: str | None = None,
        message_timeout: float | None = DEFAULT_MESSAGE_TIMEOUT,
        retry_timeout: float = RETRY_TIMEOUT,
        max_attempts: int = MAX_ATTEMPTS,
        trash_retention: float = TRASH_RETENTION,
        run: Callable[..., Deferred] = run_inline,
        events: Any = NULL_EVENT_LOG,
    ) -> None:
        self.broker = broker
        self.events = events
        """The event log's IEventRecorder (auth failures here, outcomes in the service)."""
        self.settings = settings
        self.clock = clock
        self.store = store
        self.checker = checker
        self.portal = portal or Portal(BrokerRealm(), [checker, ClientCertificateChecker()])
        self.ual = ual or AccessList()
        self.ual_file = ual_file
        self.domain = domain or socket.gethostname() or "localhost"
        self.message_timeout = message_timeout
        self._run_in_thread = run
        self.tree = TopicTree()
        self.suid = ""
        self.wire = SMQPWireFormat("", self.domain, clock.seconds)
        self.service = MessageService(store, clock, broker, self.wire, self.display, events)
        self.service.default_timeout = message_timeout
        self.service.timeout_for = self.message_timeout_for
        self.service.retry_timeout = retry_timeout
        self.service.max_attempts = max_attempts
        self.service.trash_retention = trash_retention
        self.domains = {self.domain.lower(), "localhost"}
        """Domains that name this server in ``user@domain`` (the SUID's domain joins them)."""
        self.volatile_numbers = itertools.count(1)
        self.sessions: dict[str, set[SMQPServerProtocol]] = {}
        self.start_error: Failure | None = None
        self.started: Deferred = Deferred()
        self._ual_stamp: tuple[int, int, int] | None = _stamp(ual_file) if ual_file else None
        self._ual_loop: LoopingCall | None = None
        self._factory_started = False

    # ------------------------------------------------------------------ start-up

    def start(self) -> Deferred:
        """Load the tree and the SUID from the store; connections are greeted once done
        (``SMQP/1.0 Not Available.`` if it failed)."""
        d = self.store.load_topics()
        d.addCallback(self._topics_loaded)
        d.addCallback(lambda _: self.store.get_meta("suid"))
        d.addCallback(self._suid_loaded)
        d.addCallback(lambda _: self.service.start())
        d.addCallbacks(self._ready, self._start_failed)
        return self.started

    def _topics_loaded(self, records: list[TopicRecord]) -> Deferred:
        self.tree, skipped = TopicTree.from_records(records)
        for record in skipped:
            self._log.warn("SMQP topic {key!r} has no parent in the store; ignored", key=record.key)
        return self.store.put_topics(self.tree.ensure_account(GUEST, self.clock.seconds()))

    def _suid_loaded(self, suid: str | None) -> Deferred | None:
        if suid is None:
            suid = f"{self.domain}/{secrets.token_hex(4)}"
            self.suid = suid
            return self.store.set_meta("suid", suid)
        self.suid = suid
        return None

    def _ready(self, _result: Any) -> None:
        self.wire.server_id = self.suid
        self.service.suid = self.suid
        self.domains.add(self.suid.partition("/")[0].lower())
        service = self.service
        for node in self.tree.descendants_all(self.tree.root):
            if node.delivery == "NONE":
                service.none_topics.add(node.key)
            if node.link is None and service.index.matching(MESSAGE, node.key):
                service.bridge([node.key])
        if self._factory_started:
            service.start_sweeps()
        self.started.callback(None)

    def message_timeout_for(self, key: str) -> float | None:
        """The timeout (seconds; None: INFINITE) of a message kept in queue ``key`` that
        has no Timeout attribute: the topic's own (SET TOPIC TIMEOUT), else its nearest
        ancestor's, else the server default (``--smqp-message-timeout``)."""
        source = self.tree.timeout_source(key)
        if source is None:
            return self.message_timeout
        return None if source.timeout == math.inf else source.timeout

    def display(self, key: str) -> str:
        """The path of a topic key as notifications show it (the names as created)."""
        owner = trash_owner(key)
        base = key if owner is None else owner
        node = self.tree.get(base)
        path = node.display if node is not None and base else "/" + base
        return path if owner is None else path.rstrip("/") + "/Trash"

    def _start_failed(self, failure: Failure) -> None:
        self._log.failure("The SMQP front end could not start", failure)
        self.start_error = failure
        self.started.callback(None)

    # ------------------------------------------------------------------ sessions

    def logged_in(self, session: SMQPServerProtocol) -> None:
        self.sessions.setdefault(session.account, set()).add(session)  # type: ignore[arg-type]

    def logged_out(self, session: SMQPServerProtocol) -> None:
        if session.account is None:
            return
        sessions = self.sessions.get(session.account)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self.sessions[session.account]

    # ------------------------------------------------------------------ factory life

    def startFactory(self) -> None:
        self._factory_started = True
        if self.started.called and self.start_error is None:
            self.service.start_sweeps()
        if self.ual_file is not None and self._ual_loop is None:
            self._ual_loop = LoopingCall(self.reload_ual)
            self._ual_loop.clock = self.clock
            self._ual_loop.start(UAL_RELOAD_INTERVAL, now=False)

    def stopFactory(self) -> None:
        """Tell every session the server goes away (NOTIFY SERVER BYE, which every client is
        subscribed to) before the connections drop."""
        if self._ual_loop is not None and self._ual_loop.running:
            self._ual_loop.stop()
        self._ual_loop = None
        self._factory_started = False
        self.service.stop_sweeps()
        bye = encode_notify("SERVER", "BYE", "00:00:00")
        for sessions in list(self.sessions.values()):
            for session in list(sessions):
                if not session.closed and session.server_bye:
                    session.transport.write(bye)

    def reload_ual(self) -> Deferred:
        """Read the UAL file again if it changed (in a thread).  Never fails: a bad file is
        logged and the old list stays, and the watching LoopingCall keeps running."""
        path = self.ual_file
        defaults = {"account_default": self.ual.account_default, "guest_default": self.ual.guest_default}
        d = self._run_in_thread(_stamp, path)

        def check(stamp: tuple[int, int, int] | None) -> Any:
            if stamp is None or stamp == self._ual_stamp:
                return None
            self._ual_stamp = stamp
            loaded = self._run_in_thread(lambda: read_access_list(path, **defaults))  # type: ignore[arg-type]
            return loaded.addCallback(self._ual_loaded)

        def failed(failure: Failure) -> None:
            if failure.check(ConfigurationError, OSError):
                self._log.error("UAL file not reloaded, the old one stays: {error}", error=failure.value)
            else:
                self._log.failure("Reloading the UAL file {path}", failure, path=str(path))

        return d.addCallback(check).addErrback(failed)

    def _ual_loaded(self, ual: AccessList) -> None:
        self.ual = ual
        self._log.info("UAL file {path} reloaded ({n} entries)", path=str(self.ual_file), n=len(ual.entries))


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    try:
        st = Path(path).stat()  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def build_factory(runtime: Runtime) -> SMQPServerFactory:
    """The SMQP front end's entry point for brokerd.tap.

    Uses ``runtime.resources["store"]`` (opening ``DATA_DIR/smqp.sqlite3`` and putting it
    there when absent), checks logins against ``settings.accounts_file`` and reads the UAL
    from ``settings.ual_file`` (or ``DATA_DIR/smqp.ual`` when that exists).  Files that are
    unreadable or malformed raise ConfigurationError now, not at the first login.  The
    delivery constants (retry timeout, attempts, Trash retention) come from the settings.
    """
    settings = runtime.settings
    reactor = runtime.reactor
    run = thread_runner(reactor)
    checker = AccountsChecker(settings.accounts_file, guest=getattr(settings, "smqp_guest", True),
                              run=run)
    checker.load()
    try:
        guest = parse_permissions(getattr(settings, "smqp_guest_permissions", None)
                                  or format_permissions(DEFAULT_GUEST_PERMISSIONS))
    except ValueError as exc:
        raise ConfigurationError(f"--smqp-guest-permissions: {exc}") from None
    ual_file = getattr(settings, "ual_file", None)
    if ual_file is None and (Path(settings.data_dir) / UAL_FILENAME).exists():
        ual_file = Path(settings.data_dir) / UAL_FILENAME
    ual = read_access_list(ual_file, guest_default=guest) if ual_file else AccessList(guest_default=guest)
    store = runtime.resources.get("store")
    if store is None:
        store = SQLiteStore(Path(settings.data_dir) / FILENAME, reactor)
        runtime.resources["store"] = store
        opened = store.open()
    else:
        opened = succeed(None)
    factory = SMQPServerFactory(
        runtime.broker, settings, reactor, store, checker, ual=ual, ual_file=ual_file,
        domain=getattr(settings, "smqp_domain", None),
        message_timeout=getattr(settings, "smqp_message_timeout", DEFAULT_MESSAGE_TIMEOUT),
        retry_timeout=settings.smqp_retry_timeout, max_attempts=settings.smqp_max_attempts,
        trash_retention=settings.smqp_trash_retention,
        run=run, events=runtime.resources.get("event_log", NULL_EVENT_LOG),
    )
    opened.addCallbacks(lambda _: factory.start(), factory._start_failed)
    return factory

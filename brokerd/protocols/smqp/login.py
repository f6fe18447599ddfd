"""The SMQP login commands of a session (mixed into SMQPServerProtocol): LOGIN and PASSWORD
(method ``CLEAR``, or ``CERT`` over SMQPS: the verified client certificate names the account),
SET/GET LOGIN PASSWORD, CONTACT and CHANNEL, NOOP, QUIT, and CONNECTTO (the notification
connection, brokerd.protocols.smqp.connectto).

A login attaches the session to the core (address ``smqp:account:channel``) and to the
durable service (its outbox); every refused attempt is an ``auth_failure`` in the event log.
"""
from __future__ import annotations

from typing import cast

from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.auth.accounts import GUEST, UnknownAccount
from brokerd.auth.credentials import ClientCertificate
from brokerd.auth.realm import IIdentity
from brokerd.auth.tls import peer_names
from brokerd.core.principal import Principal
from brokerd.events.log import transport_source
from brokerd.interfaces import ISubscriber
from brokerd.protocols.smqp.codec import format_datetime, format_timeout
from brokerd.protocols.smqp.connectto import NotificationConnection, connect_notifications
from brokerd.protocols.smqp.events import Command
from brokerd.protocols.smqp.refusal import Refused
from brokerd.protocols.smqp.session import SessionBase
from brokerd.store.records import Contact

MAX_LOGIN_FAILURES = 3
"""Refused LOGIN/PASSWORD attempts on one connection before it is closed."""
MAX_LOGINS_PER_ACCOUNT = 64
"""Concurrent connections of one account (403 beyond)."""
CLEAR = "CLEAR"
CERT = "CERT"
"""The login method of SMQPS: the verified TLS client certificate names the account."""
OK = 200


class LoginCommands(SessionBase):
    """Mixin of SMQPServerProtocol: LOGIN, PASSWORD, the login's settings, NOOP, QUIT and
    CONNECTTO (the session it needs: brokerd.protocols.smqp.session)."""

    _log = Logger()

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
        if self.redirect_only or self.factory.draining:
            target = self.factory.next_redirect()
            if target is not None:
                self._log.info("SMQP login of {account} redirected to {target}", account=account, target=target)
                self._reply(311, "Redirect request", target)
                self._close()
                return None
            if self.redirect_only:  # over the limit and no target is live: never admitted
                self._reply(421, "Service closing: no server with room")
                self._close()
                return None
        if method == CLEAR:
            d = self.factory.checker.exists(account)
            d.addCallback(self._login_account_checked, account, channel)
            return d
        names = peer_names(self.transport) if method == CERT else ()
        if method == CERT and names:
            d = self.factory.checker.exists(account)
            d.addCallback(self._certificate_account_checked, account, channel, names)
            return d
        reason = "no client certificate" if method == CERT else "unsupported method"
        self._auth_failure(account, method, reason)
        self._reply(405, "Not allowed", "Methods: " + ", ".join(self._methods()))
        return None

    def _auth_failure(self, account: str, method: str, reason: str) -> None:
        self.factory.events.auth_failure("smqp", account, source=transport_source(self.transport), scheme=method,
                                         reason=reason)

    def _certificate_account_checked(self, exists: bool, account: str, channel: str,
                                     names: tuple[str, ...]) -> Deferred | None:
        """A certificate logs in as a listed account only (the accounts file names who may
        use SMQP; the CA only vouches for names)."""
        if not exists:
            self._auth_failure(account, CERT, "unknown account")
            self._login_failure(404, f"Not found: no account {account}")
            return None
        certificate = ClientCertificate(account.encode("utf-8"), names)
        d = self.factory.portal.login(certificate, self, IIdentity)  # type: ignore[arg-type]  # zope interfaces
        d.addCallbacks(self._logged_in, self._login_refused, callbackArgs=(channel, CERT),
                       errbackArgs=(account, CERT, "Unauthorized: the client certificate does not name " + account))
        return d

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
        d = self.factory.portal.login(credentials, self, IIdentity)  # type: ignore[arg-type]  # zope interfaces
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
        d = factory.durable.put_topics(records) if records else succeed(None)
        d.addErrback(lambda failure: self._log.failure("Storing the login topic of {account}", failure, account=account))
        d.addCallback(lambda _: self._session_started(account, channel, identity.principal))
        return d

    def _session_started(self, account: str, channel: str, principal: Principal) -> None:
        if self.closed:
            return
        factory = self.factory
        self._cancel_login_timer()
        self.account, self.channel = account, channel
        self.principal = principal
        self.name = f"{account}:{channel}".encode("utf-8")
        self.address = b"smqp:" + self.name
        self.logged_in()
        factory.logged_in(self)
        factory.broker.attach(cast(ISubscriber, self))  # the whole session, SMQPServerProtocol, is the ISubscriber
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

    def do_CONNECTTO(self, command: Command) -> Deferred:
        """The notification connection of section 4.1.1 (brokerd.protocols.smqp.connectto)."""
        d = connect_notifications(self, command)
        d.addCallback(self._notifications_connected, command)
        return d

    def _notifications_connected(self, connection: NotificationConnection, command: Command) -> None:
        if self.closed:
            connection.close()
            return
        old, self.notifier = self.notifier, connection
        if old is not None:
            old.close()
        _account, _channel, address, port = command.args
        self._log.info("SMQP notifications of {name} go to {address}:{port}",
                       name=f"{self.account}:{self.channel}", address=address or "(client)", port=port)
        self._reply(OK, "OK")
        if self.outbox is not None:
            self._after_reply(self.outbox.pump)

    def notifications_lost(self, connection: NotificationConnection) -> None:
        """The notification connection closed: notifications use the command connection."""
        if self.notifier is connection:
            self.notifier = None
            if self.outbox is not None and not self.closed:
                self.outbox.pump()


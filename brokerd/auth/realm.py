"""The realm: turns an authenticated avatar id into the identity a session carries.

Front ends attach themselves (the "mind") to the Broker once the login succeeded.  The
checker that succeeded decides the principal (its avatar id is an Identity); the accounts
checker answers with the account name, which the realm makes an ACCOUNT (or GUEST) principal.

Every login of every protocol passes here, so this is where the broker's own names are kept
for the broker: a session named, or proving, a name :func:`~brokerd.core.principal.reserved_name`
calls reserved (``sys:brokerd``) is refused like a wrong password, and each protocol answers
it as it answers a refused login.
"""
from __future__ import annotations

import math

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import IRealm, Portal
from zope.interface import implementer

from brokerd.auth.accounts import GUEST as GUEST_ACCOUNT
from brokerd.auth.checkers import (
    ClientCertificateChecker,
    OpenLoginChecker,
    SharedSecretChecker,
)
from brokerd.auth.credentials import IClientCertificate, IOpenLogin, ISharedSecret
from brokerd.auth.identity import IIdentity, Identity
from brokerd.auth.throttle import LoginThrottle, ThrottledPortal
from brokerd.core.broker import Broker
from brokerd.core.principal import ACCOUNT, GUEST, Principal, reserved_name

__all__ = ["BrokerRealm", "IIdentity", "Identity", "build_portal", "enabled_schemes"]


@implementer(IRealm)
class BrokerRealm:
    """Makes the Identity of a successful login; refuses it when ``broker`` keeps its
    principal out (``brokerd-ctl close ID --for SECONDS``, brokerd.core.keepout), which every
    protocol then answers as the refused login it is."""

    def __init__(self, broker: Broker | None = None) -> None:
        self.broker = broker

    def requestAvatar(self, avatarId, mind, *interfaces):
        if IIdentity not in interfaces:
            raise NotImplementedError("brokerd's realm only hands out IIdentity")
        if isinstance(avatarId, Identity):
            if reserved_name(avatarId.name) or reserved_name(avatarId.principal.name):
                raise UnauthorizedLogin("a name reserved for the broker")
            identity = avatarId
        else:
            name = avatarId.decode("utf-8")  # the accounts checker: a lower-case account name
            if reserved_name(name):
                raise UnauthorizedLogin("a name reserved for the broker")
            realm = GUEST if name == GUEST_ACCOUNT else ACCOUNT
            identity = Identity(avatarId, Principal(name, realm))
        left = None if self.broker is None else self.broker.kept_out.refuses(identity.principal)
        if left is not None:
            raise UnauthorizedLogin(f"kept out by the operator for {math.ceil(left)} s more")
        return IIdentity, identity, lambda: None


SCHEME_NAMES = {IOpenLogin: "open", ISharedSecret: "secret", IClientCertificate: "cert", IUsernamePassword: "password"}
"""Credentials interface -> the scheme name protocols show to clients."""


def build_portal(
    *,
    open_login: bool = False,
    secret: bytes | None = None,
    client_certificates: bool = False,
    extra_checkers: tuple[ICredentialsChecker, ...] = (),
    broker: Broker | None = None,
    throttle: LoginThrottle | None = None,
) -> Portal:
    """One Portal for every front end, with a checker for each enabled scheme; password and
    secret logins back off after failures when a ``throttle`` is given."""
    checkers: list[ICredentialsChecker] = []
    if open_login:
        checkers.append(OpenLoginChecker())
    if secret is not None:
        checkers.append(SharedSecretChecker(secret))
    if client_certificates:
        checkers.append(ClientCertificateChecker())
    checkers.extend(extra_checkers)
    return ThrottledPortal(BrokerRealm(broker), checkers, throttle)


def enabled_schemes(portal: Portal) -> list[str]:
    """Names of the schemes the portal has checkers for, in a stable order."""
    available = set(portal.listCredentialsInterfaces())
    return [name for iface, name in SCHEME_NAMES.items() if iface in available]


def accounts_portal(broker: Broker | None, accounts: ICredentialsChecker, throttle: LoginThrottle | None = None) -> Portal:
    """Logins against the accounts file alone, and verified client certificates: what SMQP's
    LOGIN answers to (``accounts`` decides whether the guest account is admitted,
    ``--smqp-guest``); throttled as every front end's password logins are."""
    return ThrottledPortal(BrokerRealm(broker), [accounts, ClientCertificateChecker()], throttle)

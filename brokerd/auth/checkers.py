"""twisted.cred checkers, one per login scheme.  Each answers with the avatar id, an
:class:`~brokerd.auth.identity.Identity` (the identifier the session will be known by, and the
principal the scheme proved: the checker that succeeded decides the realm), or fails with
UnauthorizedLogin."""
from __future__ import annotations

import hmac

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.error import UnauthorizedLogin
from twisted.internet import defer
from zope.interface import implementer

from brokerd.auth.credentials import IClientCertificate, IOpenLogin, ISharedSecret
from brokerd.auth.identity import Identity
from brokerd.core.principal import OPEN, SECRET, Principal, certificate_principal

_ID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.:@/_-+=~")


@implementer(ICredentialsChecker)
class OpenLoginChecker:
    """Accepts every identifier: for debugging only (``--open-login``)."""

    credentialInterfaces = (IOpenLogin,)

    def requestAvatarId(self, credentials):
        identifier = credentials.identifier
        return defer.succeed(Identity(identifier, _claimed(identifier, OPEN)))


@implementer(ICredentialsChecker)
class SharedSecretChecker:
    """Accepts a credential equal to the configured secret, compared in constant time."""

    credentialInterfaces = (ISharedSecret,)

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def requestAvatarId(self, credentials):
        if hmac.compare_digest(credentials.secret, self._secret):
            identifier = credentials.identifier
            return defer.succeed(Identity(identifier, _claimed(identifier, SECRET)))
        return defer.fail(UnauthorizedLogin("wrong secret"))


def _claimed(identifier: bytes, realm: str) -> Principal:
    """The principal of a login that proves no name: the claimed one, in ``realm``."""
    return Principal(identifier.decode("utf-8", "replace"), realm)


def certificate_allows(identifier: bytes, names: tuple[str, ...]) -> bool:
    """True if ``identifier`` is one of the certificate's ``names``, or one of them followed
    by ``/`` and one or more ID characters (several connections with one certificate)."""
    try:
        text = identifier.decode("ascii")
    except UnicodeDecodeError:
        return False
    for name in names:
        if text == name:
            return True
        prefix = name + "/"
        if text.startswith(prefix) and len(text) > len(prefix):
            if all(c in _ID_CHARS for c in identifier[len(prefix):]):
                return True
    return False


@implementer(ICredentialsChecker)
class ClientCertificateChecker:
    """Accepts identifiers the verified client certificate names; never without a certificate."""

    credentialInterfaces = (IClientCertificate,)

    def requestAvatarId(self, credentials):
        names = credentials.names
        if names and certificate_allows(credentials.identifier, names):
            return defer.succeed(Identity(credentials.identifier, certificate_principal(names)))
        return defer.fail(UnauthorizedLogin("identifier not in the client certificate"))

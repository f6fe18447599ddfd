"""twisted.cred checkers, one per login scheme.  Each answers with the avatar id (the
identifier the session will be known by) or fails with UnauthorizedLogin."""
from __future__ import annotations

import hmac

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.error import UnauthorizedLogin
from twisted.internet import defer
from zope.interface import implementer

from brokerd.auth.credentials import IClientCertificate, IOpenLogin, ISharedSecret

_ID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.:@/_-+=~")


@implementer(ICredentialsChecker)
class OpenLoginChecker:
    """Accepts every identifier: for debugging only (``--open-login``)."""

    credentialInterfaces = (IOpenLogin,)

    def requestAvatarId(self, credentials):
        return defer.succeed(credentials.identifier)


@implementer(ICredentialsChecker)
class SharedSecretChecker:
    """Accepts a credential equal to the configured secret, compared in constant time."""

    credentialInterfaces = (ISharedSecret,)

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def requestAvatarId(self, credentials):
        if hmac.compare_digest(credentials.secret, self._secret):
            return defer.succeed(credentials.identifier)
        return defer.fail(UnauthorizedLogin("wrong secret"))


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
        if credentials.names and certificate_allows(credentials.identifier, credentials.names):
            return defer.succeed(credentials.identifier)
        return defer.fail(UnauthorizedLogin("identifier not in the client certificate"))

"""The credentials brokerd's front ends present to the twisted.cred portal.

Each login scheme is one credentials interface, so the portal's list of checkers *is* the list
of schemes a server supports (SSMP's 401 reply names them).
"""
from __future__ import annotations

from dataclasses import dataclass

from twisted.cred.credentials import ICredentials
from zope.interface import Attribute, implementer


class IOpenLogin(ICredentials):
    """Unauthenticated login (SSMP ``open``): any identifier, no proof."""

    identifier = Attribute("bytes")


class ISharedSecret(ICredentials):
    """Login with the server's pre-shared secret (SSMP ``secret``)."""

    identifier = Attribute("bytes")
    secret = Attribute("bytes: the credential the client sent")


class IClientCertificate(ICredentials):
    """Login backed by a TLS client certificate the handshake verified (SSMP ``cert``)."""

    identifier = Attribute("bytes: the identifier the client asked for")
    names = Attribute("tuple of str: the certificate's CN and SANs; empty without a certificate")


@implementer(IOpenLogin)
@dataclass(frozen=True)
class OpenLogin:
    identifier: bytes


@implementer(ISharedSecret)
@dataclass(frozen=True)
class SharedSecret:
    identifier: bytes
    secret: bytes


@implementer(IClientCertificate)
@dataclass(frozen=True)
class ClientCertificate:
    identifier: bytes
    names: tuple[str, ...]

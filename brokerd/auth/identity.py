"""The avatar brokerd's realm hands out: the name a session asked for, and its principal.

They differ: an SSMP login ``alice/laptop`` with alice's certificate is the session
``alice/laptop`` of the principal certificate ``alice``; an SSMP ``secret`` login as ``alice``
is the session ``alice`` of a principal that only knows the secret.
"""
from __future__ import annotations

from dataclasses import dataclass

from zope.interface import Interface, implementer

from brokerd.core.principal import Principal


class IIdentity(Interface):
    """An authenticated identity (the avatar brokerd's realm hands out)."""


@implementer(IIdentity)
@dataclass(frozen=True)
class Identity:
    name: bytes
    """The identifier the session asked for (its name and, where it has one, its address)."""
    principal: Principal

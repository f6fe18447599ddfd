"""Who a session is: the identity its login proved, and the realm that proved it.

A login scheme proves different things (docs/architecture.md has the table): a password or
a client certificate proves "is alice", a shared secret only "knows the secret", an open or
anonymous login nothing.  The access policy therefore sees the realm next to the name, and
only the *proven* realms can be named by an access-list entry.

Principals are small frozen values: the core caches permission decisions per
(principal, topic), so two sessions of one principal share their decisions.
"""
from __future__ import annotations

from dataclasses import dataclass

ACCOUNT = "account"
"""An account that gave its password (the accounts file)."""
CERTIFICATE = "certificate"
"""A TLS client certificate the server's CA verified; named by the certificate's first name."""
SECRET = "secret"
"""Knows the SSMP shared secret; the name is whatever the client claimed."""
OPEN = "open"
"""SSMP/socket.mq ``open`` login: a claimed name, nothing proven."""
ANONYMOUS = "anonymous"
"""No login at all: SSMP ``.``, MCCHAT without a certificate, a plain socket.mq connection."""
GUEST = "guest"
"""The guest account (no password)."""
OPENPGP = "openpgp"
"""A socket.mq client that proved it holds a key of the server's key ring; named ``fpr:<fpr>``."""
SERVICE = "service"
"""The broker's own publishers (statistics topics, MCCHAT announcements, socket.mq
applications, what a server link relays) and embedding programs that say so: trusted,
never checked."""

PROVEN = frozenset({ACCOUNT, CERTIFICATE})
"""Realms whose name is an identity an access list may name (the others match ``*`` only)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """``name`` as the realm knows it (str), and the ``realm`` (one of the constants above)."""

    name: str
    realm: str

    @property
    def proven(self) -> bool:
        return self.realm in PROVEN

    def __str__(self) -> str:
        return f"{self.realm}:{self.name}"


GUEST_ACCOUNT = "guest"
"""The account name of the guest (brokerd.auth.accounts.GUEST is this name)."""


def account_principal(account: str) -> Principal:
    """The principal an account name stands for when only the name is known (the owner of a
    durable subscription whose session is offline): the guest, or the proven account of that
    name (an access list treats an account and a certificate of one name alike)."""
    return Principal(GUEST_ACCOUNT, GUEST) if account == GUEST_ACCOUNT else Principal(account, ACCOUNT)


NOBODY = Principal("", ANONYMOUS)
"""The principal of a session that has not logged in (or never does)."""
BROKER = Principal("broker", SERVICE)
"""The principal of the broker's own sessions and messages, and of what an embedding program
publishes as trusted internal code (docs/embedding.md)."""


SYSTEM_PROTOCOL = "sys"
"""The protocol name of the broker's own messages (the statistics topics): other protocols
show their sender as ``sys:brokerd``."""
_RESERVED_HEADS = ("sys:", "sys/", "sys@")


def reserved_name(name: str | bytes) -> bool:
    """Whether ``name`` would read as the broker's own sender in some protocol: ``sys``, or
    ``sys`` followed by ``:``, ``/`` or ``@`` (``sys:brokerd``, ``sys/x``, ``sys@domain``), in
    any case.  No login of any protocol may take such a name, and no MCCHAT message may carry
    it as its username (docs/architecture.md, Reserved names)."""
    text = name.decode("latin-1") if isinstance(name, bytes) else name
    lowered = text.lower()
    return lowered == SYSTEM_PROTOCOL or lowered[:4] in _RESERVED_HEADS


def certificate_principal(names: tuple[str, ...]) -> Principal:
    """The one principal a verified certificate names in every protocol: its first name (the
    subject CN, else the first subjectAltName); NOBODY without a certificate."""
    return Principal(names[0], CERTIFICATE) if names else NOBODY

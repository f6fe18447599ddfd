"""Backoff after failed password logins, per source address and per account.

scrypt makes one guess cost tens of milliseconds, but nothing stopped a client from making
guess after guess.  Every login that proves a password (an account's, or SSMP's shared
secret) goes through a :class:`ThrottledPortal`, whatever the protocol: after
``--login-backoff-after`` consecutive failures from one address, or for one account, the next
check of that address or account waits ``--login-backoff`` seconds, doubled with each further
failure up to ``--login-backoff-max``.  The wait is a ``callLater``: the reactor serves
everyone else meanwhile, and the connection waits (its protocol has stopped reading).  Each
check that starts while a key is backing off moves the key's next start on by its wait, so
parallel connections are checked one after the other, not together.

An attacker must not be able to lock a real user out:

- no wait is longer than ``--login-backoff-max``: an attempt that would have to wait longer
  (the queue of waiting checks is full) is refused at once, unchecked and uncounted, so a
  client that waits and tries again is checked;
- an address the account logged in from successfully (the last ``--login-backoff-entries``
  such pairs are remembered) skips the account's backoff: guesses from elsewhere do not slow
  the owner down where they usually log in; their own address's backoff still applies;
- a success clears the address's failures; an account's failures are forgotten once it has
  gone ``--login-backoff-max`` seconds past its wait without a new one.

The tables are bounded (``--login-backoff-entries`` addresses, as many accounts, as many
trusted pairs); the least recently used entry goes first.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import ICredentials, IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import IRealm, Portal
from twisted.internet.defer import Deferred, fail, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from zope.interface import Interface

from brokerd.auth.credentials import ISharedSecret
from brokerd.config import Settings


_R = TypeVar("_R")
"""What a callback passes on unchanged."""


class TooManyFailures(UnauthorizedLogin):
    """Refused unchecked: the address or account has more checks waiting than
    ``--login-backoff-max`` seconds hold.  Answered as any refused login."""


@dataclass
class _Failures:
    count: int = 0
    next_start: float = 0.0
    """When the next check of this key may start (the clock's seconds)."""
    last: float = 0.0
    """When the last failure was counted."""


class _Table:
    """A bounded map of keys to their failures, least recently used first out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> _Failures | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def get_or_add(self, key: Hashable) -> _Failures:
        entry = self.get(key)
        if entry is None:
            entry = self._entries[key] = _Failures()
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return entry

    def remove(self, key: Hashable) -> None:
        self._entries.pop(key, None)


class LoginThrottle:
    """The failure tables and the backoff they call for (see the module's docstring).

    ``clock`` has ``seconds()`` and ``callLater`` (the reactor)."""

    def __init__(self, clock: IReactorTime, *, after: int = Settings.login_backoff_after,
                 backoff: float = Settings.login_backoff, maximum: float = Settings.login_backoff_max,
                 entries: int = Settings.login_backoff_entries) -> None:
        self.clock = clock
        self.after = after
        self.backoff = backoff
        self.maximum = maximum
        self.addresses = _Table(entries)
        self.accounts = _Table(entries)
        self._trusted: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._trusted_size = entries
        self.waiting = 0
        """Checks waiting for their backoff to end now."""
        self.delayed = 0
        """Checks that waited, since the start."""
        self.refused = 0
        """Attempts refused unchecked because the wait would have been too long."""

    @classmethod
    def from_settings(cls, settings: Settings, clock: IReactorTime) -> LoginThrottle:
        return cls(clock, after=settings.login_backoff_after, backoff=settings.login_backoff,
                   maximum=settings.login_backoff_max, entries=settings.login_backoff_entries)

    def _keys(self, address: str | None, account: str | None) -> list[tuple[_Table, Hashable]]:
        keys: list[tuple[_Table, Hashable]] = []
        if address is not None:
            keys.append((self.addresses, address))
        if account is not None and (address, account) not in self._trusted:
            keys.append((self.accounts, account))
        return keys

    def _delay(self, failures: int) -> float:
        """The wait a key with ``failures`` consecutive failures calls for (0 below ``after``)."""
        if failures < self.after:
            return 0.0
        return min(self.backoff * 2 ** min(failures - self.after, 64), self.maximum)

    def _current(self, table: _Table, key: Hashable, now: float) -> _Failures | None:
        entry = table.get(key)
        if entry is not None and now >= max(entry.next_start, entry.last) + self.maximum:
            table.remove(key)  # quiet for long enough: forgotten
            return None
        return entry

    def admit(self, address: str | None, account: str | None) -> Deferred:
        """A Deferred that fires when a check for ``account`` from ``address`` may start
        (at once, or after a ``callLater``), or fails with TooManyFailures."""
        now = self.clock.seconds()
        entries = [entry for table, key in self._keys(address, account)
                   if (entry := self._current(table, key, now)) is not None and entry.count >= self.after]
        start = max([now, *(entry.next_start for entry in entries)])
        wait = start - now
        if wait > self.maximum:
            self.refused += 1
            return fail(TooManyFailures("too many failed logins: try again later"))
        for entry in entries:  # the next check waits for this one's turn to pass
            entry.next_start = start + self._delay(entry.count)
        if wait <= 0:
            return succeed(None)
        self.waiting += 1
        self.delayed += 1
        d = deferLater(self.clock, wait, lambda: None)
        d.addBoth(self._waited)
        return d

    def _waited(self, result: _R) -> _R:
        self.waiting -= 1
        return result

    def failed(self, address: str | None, account: str | None) -> None:
        """Count a refused check (a wrong password or secret, an unknown account)."""
        now = self.clock.seconds()
        for table, key in self._keys(address, account):
            entry = self._current(table, key, now) or table.get_or_add(key)
            entry.count += 1
            entry.last = now
            entry.next_start = max(entry.next_start, now + self._delay(entry.count))

    def succeeded(self, address: str | None, account: str | None) -> None:
        """A check passed: the address starts afresh, and may skip the account's backoff."""
        if address is None:
            return
        self.addresses.remove(address)
        if account is not None:
            self._trusted[(address, account)] = None
            self._trusted.move_to_end((address, account))
            while len(self._trusted) > self._trusted_size:
                self._trusted.popitem(last=False)


def peer_host(mind: object) -> str | None:
    """The IP address a login comes from (the mind is the front end's protocol), or None
    (a UNIX socket, no transport)."""
    transport = getattr(mind, "transport", None)
    get_peer = getattr(transport, "getPeer", None)
    if get_peer is None:
        return None
    host = getattr(get_peer(), "host", None)
    return host if isinstance(host, str) else None


def _account(credentials: ICredentials) -> str | None:
    """The account a password login names (lower case, as accounts are kept), or None."""
    if not IUsernamePassword.providedBy(credentials):
        return None
    name = credentials.username  # bytes by IUsernamePassword; a str from some checkers' callers
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    return text.lower()


class ThrottledPortal(Portal):
    """A Portal whose password and shared-secret logins go through a :class:`LoginThrottle`
    (other schemes prove nothing that can be guessed and pass straight through).  Only the
    checker's verdict counts: a realm's refusal (a principal kept out) is no guess."""

    def __init__(self, realm: IRealm, checkers: Iterable[ICredentialsChecker] = (), throttle: LoginThrottle | None = None) -> None:
        super().__init__(realm, checkers)
        self.throttle = throttle

    def login(self, credentials: ICredentials, mind: object, *interfaces: type[Interface]) -> Deferred:
        throttle = self.throttle
        checker = next((c for i, c in self.checkers.items() if i.providedBy(credentials)), None)
        guessable = IUsernamePassword.providedBy(credentials) or ISharedSecret.providedBy(credentials)
        if throttle is None or checker is None or not guessable:
            return super().login(credentials, mind, *interfaces)
        address, account = peer_host(mind), _account(credentials)

        def passed(avatar_id: _R) -> _R:
            throttle.succeeded(address, account)
            return avatar_id

        def refused(failure: Failure) -> Failure:
            if failure.check(UnauthorizedLogin) and not failure.check(TooManyFailures):
                throttle.failed(address, account)
            return failure

        d = throttle.admit(address, account)
        d.addCallback(lambda _: maybeDeferred(checker.requestAvatarId, credentials))
        d.addCallbacks(passed, refused)
        return d.addCallback(self.realm.requestAvatar, mind, *interfaces)

"""The accounts file (``--accounts``) and the twisted.cred checker that logs SMQP (and HTTP
basic) clients in against it.

One account a line, ``name:scrypt$n=16384,r=8,p=1$<salt>$<hash>`` (salt and hash in
unpadded base64); ``#`` starts a comment line; blank lines are ignored.  Passwords are never
stored: only a salted scrypt hash, slow on purpose (about 16 MiB and tens of milliseconds per
check), so a stolen file does not give the passwords away cheaply.  A blank password is a
password like any other (the SMQP ``guest`` account has one).

Account names are SMQP topic names (each account owns the login topic
``/accounts/<name>``): 1 to 32 letters, digits or ``_``, a letter first.  They are
case-insensitive and kept in lower case.

The file is written by ``python -m brokerd.cli.accounts``, by SMQP's SET LOGIN PASSWORD and
by the admin API (brokerd.admin.manage) through :func:`update_accounts`: under a lock
(``FILE.lock``), to a temporary file that then replaces the old one with its owner's
permissions (group and others get none; a new file: 0600).  The broker notices a changed file at the next login.

Password checks hash with scrypt, so :class:`AccountsChecker` runs them (and every read of the
file) in a thread, never on the reactor.
"""
from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, cast

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, maybeDeferred
from zope.interface import implementer

from brokerd.core.principal import GUEST_ACCOUNT
from brokerd.errors import ConfigurationError
from brokerd.interfaces import IBrokerReactor

GUEST = GUEST_ACCOUNT
"""The draft's guest account: logs in with a blank password."""
MAX_NAME = 32
MAX_PASSWORD = 1024
"""Characters in a password (a bound on what one login can make scrypt chew on)."""

SCRYPT_N = 1 << 14
SCRYPT_R = 8
SCRYPT_P = 1
_MAX_N = 1 << 20
_SALT_BYTES = 16
_HASH_BYTES = 32
_SCHEME = "scrypt"


def is_account_name(name: str) -> bool:
    """1 to 32 characters: a letter first, then letters, digits or ``_`` (an SMQP topic
    name, since every account has the login topic ``/accounts/<name>``)."""
    if not 0 < len(name) <= MAX_NAME or not name[0].isalpha():
        return False
    return all(c.isalnum() or c == "_" for c in name)


def normalize_name(name: str) -> str:
    """The account name as stored and compared: lower case.  ValueError if invalid."""
    if not is_account_name(name):
        raise ValueError(
            f"bad account name {name!r}: 1 to {MAX_NAME} letters, digits or '_', a letter first"
        )
    return name.lower()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@dataclass(frozen=True)
class PasswordHash:
    """A salted scrypt hash of one password, with the parameters it was made with."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def create(
        cls, password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P
    ) -> PasswordHash:
        salt = secrets.token_bytes(_SALT_BYTES)
        return cls(n, r, p, salt, _scrypt(password, salt, n, r, p, _HASH_BYTES))

    def verify(self, password: str) -> bool:
        """True if ``password`` hashes to this digest (compared in constant time)."""
        if len(password) > MAX_PASSWORD:
            return False
        candidate = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(candidate, self.digest)

    def encode(self) -> str:
        return f"{_SCHEME}$n={self.n},r={self.r},p={self.p}${_b64(self.salt)}${_b64(self.digest)}"

    @classmethod
    def decode(cls, text: str) -> PasswordHash:
        """Parse :meth:`encode`'s form; ValueError for anything else."""
        parts = text.split("$")
        if len(parts) != 4 or parts[0] != _SCHEME:
            raise ValueError("not an scrypt password hash")
        try:
            params = dict(item.split("=", 1) for item in parts[1].split(","))
            n, r, p = int(params["n"]), int(params["r"]), int(params["p"])
            salt, digest = _unb64(parts[2]), _unb64(parts[3])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"malformed scrypt parameters: {exc}") from None
        if n < 2 or n > _MAX_N or n & (n - 1) or not 0 < r <= 16 or not 0 < p <= 4 or n * r > 1 << 22:
            raise ValueError("scrypt parameters out of range")
        if len(salt) < 8 or len(digest) < 16:
            raise ValueError("scrypt salt or digest too short")
        return cls(n, r, p, salt, digest)


def dummy_hash(accounts: dict[str, PasswordHash]) -> PasswordHash:
    """A hash no password matches, with the scrypt parameters of the file's accounts (the
    defaults for an empty file): checking a password against it costs what checking one
    against a listed account does, so an unknown name is refused no faster than a known one."""
    sample = next(iter(accounts.values()), None)
    if sample is None:
        return _dummy(SCRYPT_N, SCRYPT_R, SCRYPT_P, _SALT_BYTES, _HASH_BYTES)
    return _dummy(sample.n, sample.r, sample.p, len(sample.salt), len(sample.digest))


@functools.lru_cache(maxsize=8)
def _dummy(n: int, r: int, p: int, salt_bytes: int, digest_bytes: int) -> PasswordHash:
    return PasswordHash(n, r, p, secrets.token_bytes(salt_bytes), secrets.token_bytes(digest_bytes))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, size: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=size,
        maxmem=256 * r * (n + p) + (16 << 20)
    )


# ---------------------------------------------------------------------------- the file

def parse_accounts(text: str, source: str = "accounts file") -> dict[str, PasswordHash]:
    """The accounts in the file's text; ConfigurationError naming the line for a bad one."""
    accounts: dict[str, PasswordHash] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, colon, encoded = line.partition(":")
        try:
            if not colon:
                raise ValueError("expected name:hash")
            key = normalize_name(name)
            if key in accounts:
                raise ValueError(f"account {key!r} listed twice")
            accounts[key] = PasswordHash.decode(encoded)
        except ValueError as exc:
            raise ConfigurationError(f"{source}, line {number}: {exc}") from None
    return accounts


def format_accounts(accounts: dict[str, PasswordHash]) -> str:
    lines = ["# brokerd accounts: name:scrypt hash (managed by python -m brokerd.cli.accounts)"]
    lines += [f"{name}:{accounts[name].encode()}" for name in sorted(accounts)]
    return "\n".join(lines) + "\n"


def read_accounts(path: Path) -> dict[str, PasswordHash]:
    """Read and parse the file; ConfigurationError when it is unreadable or malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(f"--accounts {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--accounts {path}: cannot read: {exc}") from None
    return parse_accounts(text, f"--accounts {path}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = Path(str(path) + ".lock")
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def check_password(password: str) -> None:
    """ValueError when ``password`` cannot be stored: too long, or with a line end."""
    if len(password) > MAX_PASSWORD:
        raise ValueError(f"a password has at most {MAX_PASSWORD} characters")
    if "\n" in password or "\r" in password:
        raise ValueError("a password cannot hold a line end")


def write_accounts(path: Path, accounts: dict[str, PasswordHash]) -> None:
    """Replace the file atomically (a reader sees the old or the new file, never half), with
    the owner's permissions the old file had and none for group or others (the broker refuses
    to start with password hashes others can read); a new file is 0600."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode) & stat.S_IRWXU
    except FileNotFoundError:
        mode = 0o600
    replace_file(path, format_accounts(accounts), mode)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``FILE.lock`` (the lock every writer of ``path`` takes)."""
    with _locked(Path(path)):
        yield


def replace_file(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to a temporary file beside ``path`` with ``mode``, then rename it over
    ``path``: a reader sees the old or the new file, never half of one."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), mode)
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def update_accounts(
    path: Path, change: Callable[[dict[str, PasswordHash]], None], create: bool = False
) -> None:
    """Read the file (a missing one counts as empty when ``create``), let ``change`` edit
    the accounts, and write the result; all under the file's lock."""
    path = Path(path)
    with _locked(path):
        if create and not path.exists():
            accounts: dict[str, PasswordHash] = {}
        else:
            accounts = read_accounts(path)
        change(accounts)
        write_accounts(path, accounts)


# ---------------------------------------------------------------------------- twisted.cred

class UnknownAccount(UnauthorizedLogin):
    """No account of that name (SMQP answers 404, not 401)."""


Runner = Callable[..., Deferred]
"""Runs ``f(*args)`` somewhere other than the reactor thread; returns a Deferred."""


def thread_runner(reactor: IBrokerReactor) -> Runner:
    """A Runner that calls ``f(*args)`` in ``reactor``'s thread pool (file reads and scrypt
    stay off the reactor thread)."""
    from twisted.internet.threads import deferToThreadPool

    def run(f: Callable[..., object], *args: object) -> Deferred:
        return deferToThreadPool(reactor, reactor.getThreadPool(), f, *args)

    return run


def run_inline(f: Callable[..., object], *args: object) -> Deferred:
    """A :data:`Runner` that runs on the calling thread (for tests and command-line tools)."""
    return maybeDeferred(f, *args)


class AccountsFile:
    """The accounts file as last read, read again whenever it changed on disk (size, time,
    inode), in the thread that asks.  One per broker: every checker over the file shares it
    (:meth:`AccountsChecker.with_guest`), so the file is read once for all of them.

    Several pool threads may ask at once, so the cached stamp and accounts change together
    under a lock (else a slower reader could leave the old accounts cached under the new
    file's stamp, and a changed password go unnoticed).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._accounts: dict[str, PasswordHash] = {}

    def current(self) -> dict[str, PasswordHash]:
        """The accounts, read again if the file changed (runs in a thread)."""
        if self.path is None:
            return {}
        with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._stamp, self._accounts = None, {}
                return self._accounts
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                self._accounts = read_accounts(self.path)
                self._stamp = stamp
            return self._accounts

    def forget(self) -> None:
        """Read the file again at the next question (it was just written)."""
        with self._lock:
            self._stamp = None


@implementer(ICredentialsChecker)
class AccountsChecker:
    """Checks ``IUsernamePassword`` credentials against the accounts file.

    The avatar id is the account name in lower case (bytes).  An unknown account fails with
    :class:`UnknownAccount`, a wrong password with ``UnauthorizedLogin``.  ``guest`` with a
    blank password is accepted even when the file does not list it, unless ``guest`` is
    False; a ``guest`` line in the file sets its password.  ``path`` None: no accounts but
    the guest.

    The file is an :class:`AccountsFile`, read again whenever it changed on disk, in the
    thread that checks the password; checkers made by :meth:`with_guest` share it.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, path: Path | None, *, guest: bool = True, run: Runner | None = None,
                 reactor: IBrokerReactor | None = None, file: AccountsFile | None = None) -> None:
        self.file = file if file is not None else AccountsFile(path)
        self.path = self.file.path
        self.guest = guest
        if run is None:
            if reactor is None:
                from twisted.internet import reactor as default_reactor

                reactor = cast(IBrokerReactor, default_reactor)  # the global reactor has every facet
            run = thread_runner(reactor)
        self._run = run

    def with_guest(self, guest: bool, run: Runner | None = None) -> AccountsChecker:
        """A checker of the same file (read once for both) that admits the guest account or
        not: SSMP's ``password`` scheme never does, SMQP's LOGIN as ``--smqp-guest`` says.
        It checks passwords with ``run`` (else this checker's)."""
        return AccountsChecker(self.path, guest=guest, run=run if run is not None else self._run, file=self.file)

    def _current(self) -> dict[str, PasswordHash]:
        return self.file.current()

    def load(self) -> dict[str, PasswordHash]:
        """Read the file now (blocking; for start-up checks): ConfigurationError if bad."""
        return dict(self._current())

    def requestAvatarId(self, credentials: IUsernamePassword) -> Deferred:
        username: bytes | str = credentials.username  # bytes by the interface; a str from some callers
        password: bytes | str = credentials.password
        if isinstance(username, bytes):
            username = username.decode("utf-8", "replace")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        return self._run(self._check, username, password)

    def _check(self, username: str, password: str) -> bytes:
        accounts = self._current()
        name = username.lower()
        stored = accounts.get(name) if is_account_name(username) else None
        if stored is None:
            if name == GUEST and self.guest:
                if password == "":
                    return name.encode("utf-8")
                raise UnauthorizedLogin("the guest password is blank")
            dummy_hash(accounts).verify(password)  # a known name's work: the time tells no names
            raise UnknownAccount(f"no account {username!r}")
        if not stored.verify(password):
            raise UnauthorizedLogin("wrong password")
        return name.encode("utf-8")

    def exists(self, username: str) -> Deferred:
        """Deferred[bool]: is there an account of that name (the guest counts)?"""
        return self._run(self._exists, username)

    def _exists(self, username: str) -> bool:
        if not is_account_name(username):
            return False
        name = username.lower()
        return name in self._current() or (name == GUEST and self.guest)

    def set_password(self, username: str, password: str) -> Deferred:
        """Replace the password of a listed account; fails with UnknownAccount for another
        name, ConfigurationError (or OSError) when the file cannot be written."""
        return self._run(self._set_password, username, password)

    def _set_password(self, username: str, password: str) -> None:
        if self.path is None or not is_account_name(username):
            raise UnknownAccount(f"no account {username!r}")
        if len(password) > MAX_PASSWORD:
            raise ValueError(f"a password has at most {MAX_PASSWORD} characters")
        name = username.lower()
        new_hash = PasswordHash.create(password)

        def change(accounts: dict[str, PasswordHash]) -> None:
            if name not in accounts:
                raise UnknownAccount(f"no account {name!r}")
            accounts[name] = new_hash

        update_accounts(self.path, change)
        self.file.forget()

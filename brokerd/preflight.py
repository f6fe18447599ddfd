"""What must hold before the broker reports itself started: a writable data directory (the
SMQP store, the event log, the broker id, the socket.mq key), a lock that keeps a second broker
out of it, and listening ports nobody else holds; and what deserves a warning: a listener
beyond loopback where a client needs no credentials.

These checks run in ``makeService``, which twistd calls before it daemonizes: a problem found
here is one line on the operator's terminal and a non-zero exit, in daemon mode too (after the
fork, twistd's start-up report would be all the terminal sees).
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from twisted.application.service import Service

from brokerd.admin.exposure import binds_loopback
from brokerd.auth.accounts import GUEST, read_accounts
from brokerd.auth.tls import split_escaped
from brokerd.config import Settings
from brokerd.errors import ConfigurationError
from brokerd.events.schema import EVENTS_DIR
from brokerd.protocols.socketmq.policy import load_policy
from brokerd.store.sqlite import FILENAME as SMQP_STORE_FILE

LOCK_FILE = "brokerd.lock"
"""The file in DATA_DIR a running broker holds an exclusive ``flock`` on."""
BROKER_ID_FILE = "broker-id"


def data_dir_problems(settings: Settings, listeners: dict[str, list[str]], create: bool) -> list[str]:
    """One line per file or directory under --data-dir the broker needs and cannot use.

    With ``create`` the data directory and ``events/`` are made when missing (start-up);
    without (``--check-config``), a missing directory only needs a writable parent.
    """
    data_dir = Path(settings.data_dir)
    option = f"--data-dir {data_dir}"
    problem = _directory_problem(data_dir, create)
    if problem:
        return [f"{option}: {problem}"]
    problems = []
    wanted = []
    if settings.event_log:
        wanted.append((data_dir / EVENTS_DIR, "the event log"))
    if "socketmq" in listeners and settings.socketmq_key is None:
        wanted.append((data_dir / "socketmq", "the socket.mq server key"))
    for directory, purpose in wanted:
        problem = _directory_problem(directory, create)
        if problem:
            problems.append(f"{option}: {directory} ({purpose}): {problem}")
    files = [(data_dir / BROKER_ID_FILE, "the broker id")]
    if "smqp" in listeners and settings.store is None:
        files.append((data_dir / SMQP_STORE_FILE, "the SMQP store"))
    for path, purpose in files:
        problem = _file_problem(path)
        if problem:
            problems.append(f"{option}: {path} ({purpose}): {problem}")
    return problems


def _directory_problem(directory: Path, create: bool) -> str | None:
    """Why ``directory`` cannot hold the broker's files, or None.  Writing is tried for real
    (a probe file made and removed): permission bits say nothing for root, a read-only mount
    or a full disk."""
    if not directory.exists():
        if not create:
            parent = next((p for p in directory.parents if p.exists()), Path("."))
            return None if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK) else \
                f"cannot be created ({parent} is not a writable directory)"
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot be created: {exc.strerror}"
    if not directory.is_dir():
        return "not a directory"
    probe = directory / f".brokerd-write-check-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"not writable: {exc.strerror}"
    return None


def _file_problem(path: Path) -> str | None:
    """Why an existing ``path`` cannot be read and written, or None (a missing one is made in
    a directory already found writable)."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_dir():
        return "is a directory"
    try:
        with open(path, "r+b"):
            pass
    except OSError as exc:
        return f"cannot be read and written: {exc.strerror}"
    return None


def listen_problems(listeners: dict[str, list[str]], admin: str | None) -> list[str]:
    """One line per TCP listener whose port cannot be bound now (taken, privileged), tried with
    a socket bound and closed at once, the way the listener will bind it, and per ``unix:``
    listener whose directory cannot take its socket file."""
    problems = []
    named = [(protocol, description) for protocol, descriptions in listeners.items() for description in descriptions]
    if admin is not None:
        named.append(("admin", admin))
    for option, description in named:
        socket_file = _unix_path(description)
        if socket_file is not None:
            problem = "no such directory" if not socket_file.parent.is_dir() else \
                _directory_problem(socket_file.parent, create=False)
            if problem:
                problems.append(f"--{option} {description}: cannot listen: {socket_file.parent}: {problem}")
            continue
        address = _tcp_address(description)
        if address is None:
            continue
        try:
            family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Twisted's ports do
                probe.bind(address)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            problems.append(f"--{option} {description}: cannot listen: {_show(address)}: {reason}")
    return problems


def _unix_path(description: str) -> Path | None:
    """The socket file of a ``unix:`` endpoint, else None."""
    fields = split_escaped(description)
    if fields[0].lower() != "unix" or len(fields) < 2:
        return None
    options = dict(field.split("=", 1) for field in fields[1:] if "=" in field)
    positional = [field for field in fields[1:] if "=" not in field]
    path = options.get("address", positional[0] if positional else "")
    return Path(path) if path else None


def _tcp_address(description: str) -> tuple[str, int] | None:
    """(interface, port) of a ``tcp:``/``tcp6:``/``tls:``/``ssl:`` endpoint with a fixed port;
    None for any other (port 0, unix sockets, onion services: bound for real or not at all)."""
    fields = split_escaped(description)
    kind = fields[0].lower()
    if kind not in ("tcp", "tcp6", "tls", "ssl"):
        return None
    positional = [field for field in fields[1:] if "=" not in field]
    options = dict(field.split("=", 1) for field in fields[1:] if "=" in field)
    port_text = options.get("port", positional[0] if positional else "")
    interface = options.get("interface", positional[1] if kind.startswith("tcp") and len(positional) > 1 else "")
    if not port_text.isdigit() or int(port_text) == 0:
        return None
    if not interface:
        interface = "::" if kind == "tcp6" else "0.0.0.0"
    return interface, int(port_text)


def _show(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def exposure_warnings(settings: Settings, listeners: dict[str, list[str]]) -> list[str]:
    """One line per listener the network reaches (not bound to loopback) on which a client
    without credentials gets in: MCCHAT (no login at all), MQTT's anonymous login, socket.mq
    with a policy that lets plain clients act or with open login, SSMP's open and anonymous
    logins, SMQP's password-less guest.  The broker logs them at start and ``--check-config``
    prints them, so an operator sees the same lines before and after a restart."""
    lines = []
    for protocol, descriptions in listeners.items():
        reason = _unauthenticated_access(protocol, settings)
        if reason is None:
            continue
        for description in descriptions:
            if not binds_loopback(description):
                lines.append(f"--{protocol} {description} is reachable from the network and {reason} "
                             f"(bind it to loopback, tcp:PORT:interface=127.0.0.1, or require a login)")
    return lines


_GUEST_RIGHTS = (("s", "subscribe"), ("p", "publish"), ("c", "create topics"), ("a", "administer"), ("r", "reply"))
"""The words for the letters of SMQP's guest permissions."""


def _unauthenticated_access(protocol: str, settings: Settings) -> str | None:
    """What a client without credentials may do on ``protocol``'s listeners, or None when
    nothing: the end of a warning line."""
    if protocol == "mcchat":
        return "MCCHAT has no login: anyone may subscribe and publish as the access list's * entries allow"
    if protocol == "mqtt" and settings.mqtt_anonymous:
        return "allows anonymous login (a CONNECT without a username); --no-mqtt-anonymous refuses it"
    if protocol == "ssmp":
        schemes = [name for name, on in (("open", settings.open_login), ("anonymous", settings.anonymous)) if on]
        if schemes:
            return f"allows {' and '.join(schemes)} login: anyone can log in without credentials"
    if protocol == "smqp" and _passwordless_guest(settings):
        letters = settings.smqp_guest_permissions or "s"
        words = [word for letter, word in _GUEST_RIGHTS if letter in letters] or ["log in"]
        rights = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)
        return f"its guest (no password) may {rights}; --no-smqp-guest refuses it"
    if protocol == "socketmq":
        return _socketmq_access(settings)
    return None


def _passwordless_guest(settings: Settings) -> bool:
    """SMQP's built-in guest logs in with a blank password: on, and no ``guest`` line of the
    accounts file gives it a password of its own."""
    if not settings.smqp_guest:
        return False
    if settings.accounts_file is None:
        return True
    try:
        return GUEST not in read_accounts(settings.accounts_file)
    except ConfigurationError:
        return True  # an unreadable file is a problem of its own; the guest is built in


def _socketmq_access(settings: Settings) -> str | None:
    """Why a plain (unauthenticated) socket.mq client gets in, or None: open login, or a
    policy rule for ``*`` or ``@anonymous`` (no --socketmq-policy allows everything)."""
    if settings.open_login:
        return "allows open login: anyone can log in without credentials"
    try:
        policy = load_policy(settings.socketmq_policy)
    except ConfigurationError:
        return None  # reported as a problem of its own
    actions = sorted({action for rule in policy.rules if rule.matches_client(None)
                      for action, patterns in rule.actions.items() if patterns})
    if not actions:
        return None
    where = "without --socketmq-policy" if settings.socketmq_policy is None else f"by {settings.socketmq_policy}"
    return f"lets clients without authentication {', '.join(actions)} ({where})"


class DataDirLock(Service):
    """An exclusive ``flock`` on DATA_DIR/brokerd.lock for as long as this broker runs.

    A second broker on the same data directory (its store, its broker id, its event log)
    refuses to start.  The kernel drops the lock with the last descriptor of the file, so a
    broker killed with SIGKILL leaves nothing to clean up; the lock survives twistd's fork into
    a daemon because the child inherits the descriptor.  The file holds the holder's pid, for
    the message a second broker prints.
    """


    def __init__(self, data_dir: Path) -> None:
        self.setName("data-dir-lock")  # Twisted's Service declares ``name = None`` untyped
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock now, or raise ConfigurationError naming the broker that holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigurationError(f"--data-dir {self.path.parent}: cannot open {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConfigurationError(f"--data-dir {self.path.parent}: cannot lock {self.path}: {exc.strerror}") from None
            who = f"another broker (pid {holder})" if holder.isdigit() else "another broker"
            raise ConfigurationError(
                f"--data-dir {self.path.parent} is in use by {who}: give each broker its own --data-dir") from None
        self._fd = fd
        self.record_pid()

    def record_pid(self) -> None:
        """Write this process's pid into the lock file (again after twistd's fork)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode("ascii"), 0)

    def startService(self) -> None:
        super().startService()
        self.record_pid()  # twistd's daemon is a grandchild of the process that took the lock

    def stopService(self):
        super().stopService()
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

"""The UAL file as the core's access policy, for every protocol.

:class:`UALPolicy` answers the core's question (brokerd.interfaces.IAccessPolicy): what may
this principal do on this core topic?  It maps both onto the User Access Lists of
brokerd.auth.ual:

* the topic: core ``a/b`` is the UAL's ``/a/b`` (DESIGN.md's mapping), compared in lower case
  as SMQP compares topics, so ``Private/x`` from SSMP falls under ``/private``;
* the principal: an SMQP account or a client certificate is the account of that name (a
  named entry, ``@accounts`` and ``*`` apply); the SMQP guest is ``guest``; every login that
  proves no account name (SSMP ``secret``/``open``/anonymous, MCCHAT without a certificate,
  socket.mq without one, an OpenPGP key) matches ``*`` entries only and has the guest's
  defaults.

:class:`AccessListFile` owns the file: read at start-up, watched for changes every
:data:`UAL_RELOAD_INTERVAL` seconds (off the reactor thread), each good version installed in
the Broker at once (live subscriptions it no longer allows are revoked there, and SMQP's
durable ones stop at their next delivery).  A broken file is logged and the last good one
stays.  A broker with no UAL file has no policy: everything is allowed (SMQP keeps its guest
defaults for its own commands).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.auth.accounts import GUEST as GUEST_ACCOUNT
from brokerd.auth.accounts import run_inline, thread_runner
from brokerd.auth.ual import (
    DEFAULT_GUEST_PERMISSIONS,
    AccessList,
    format_permissions,
    parse_permissions,
    read_access_list,
)
from brokerd.config import Settings
from brokerd.core.access import Perm
from brokerd.core.broker import Broker
from brokerd.core.principal import GUEST, PROVEN, Principal
from brokerd.errors import ConfigurationError
from brokerd.interfaces import IAccessPolicy
from brokerd.interfaces import IBrokerReactor

UAL_RELOAD_INTERVAL = 5.0
"""Seconds between checks of the UAL file for changes."""
UAL_FILENAME = "smqp.ual"
"""The UAL file looked for in --data-dir when no UAL file is configured."""


def ual_path(topic: bytes) -> tuple[str, ...]:
    """A core topic as UAL leaves: ``b"News/Sec"`` -> ``("news", "sec")`` (empty leaves
    dropped, so ``a//b`` and ``/a/b`` fall under ``/a/b`` too)."""
    text = topic.decode("utf-8", "replace").lower()
    return tuple(leaf for leaf in text.split("/") if leaf)


def ual_account(principal: Principal) -> str | None:
    """The UAL login a principal is matched as; None for one that proved no account name."""
    if principal.realm in PROVEN:
        return principal.name.lower()
    if principal.realm == GUEST:
        return GUEST_ACCOUNT
    return None


@implementer(IAccessPolicy)
class UALPolicy:
    """An AccessList seen through the core's names (see the module docstring)."""

    def __init__(self, access_list: AccessList) -> None:
        self.access_list = access_list

    def permissions(self, principal: Principal, topic: bytes) -> Perm:
        return self.access_list.permissions(ual_account(principal), ual_path(topic))


class AccessListFile(Service):
    """The current AccessList, and the file it comes from (None: no file, no core policy).

    ``run`` calls a blocking function off the reactor thread (brokerd.auth.accounts'
    Runners); ``clock`` drives the watch.  Each version read is installed in ``broker``.
    """

    _log = Logger()

    def __init__(self, path: Path | None, current: AccessList, broker: Broker, clock: IReactorTime,
                 run: Callable[..., Deferred] = run_inline) -> None:
        self.path = path
        self.current = current
        self.broker = broker
        self.clock = clock
        self._run = run
        self._stamp = _stamp(path) if path is not None else None
        self._loop: LoopingCall | None = None
        self._install()

    def _install(self) -> None:
        if self.path is not None:
            self.broker.set_policy(UALPolicy(self.current))

    def startService(self) -> None:
        super().startService()
        self.watch()

    def stopService(self) -> None:
        super().stopService()
        self.unwatch()

    def watch(self) -> None:
        """Check the file every UAL_RELOAD_INTERVAL seconds (nothing to do without one)."""
        if self.path is not None and self._loop is None:
            self._loop = LoopingCall(self.reload)
            self._loop.clock = self.clock
            self._loop.start(UAL_RELOAD_INTERVAL, now=False)

    def unwatch(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def reload(self) -> Deferred:
        """Read the file again if it changed (in a thread) and install it.  Never fails: a bad
        file is logged and the old list stays, and the watching LoopingCall keeps running."""
        path = self.path
        d = self._run(_stamp, path)

        def check(stamp: tuple[int, int, int] | None) -> Deferred[None] | None:
            if stamp is None or stamp == self._stamp:
                return None
            self._stamp = stamp
            return self._read()

        def failed(failure: Failure) -> None:
            if failure.check(ConfigurationError, OSError):
                self._log.error("UAL file not reloaded, the old one stays: {error}", error=failure.value)
            else:
                self._log.failure("Reloading the UAL file {path}", failure, path=str(path))

        return d.addCallback(check).addErrback(failed)

    def reload_now(self) -> Deferred:
        """Read the file again whether or not it changed (the admin API's reload) and install
        it.  Unlike :meth:`reload` this fails, with ConfigurationError, on a bad file (the old
        list stays); without a file there is nothing to do."""
        if self.path is None:
            return succeed(None)
        d = self._run(_stamp, self.path)

        def remember(stamp: tuple[int, int, int] | None) -> Deferred:
            self._stamp = stamp
            return self._read()

        return d.addCallback(remember)

    def _read(self) -> Deferred:
        """Read the file in a thread, with the current list's defaults, and install it."""
        path = self.path
        if path is None:
            return succeed(None)  # no file to read
        account_default, guest_default = self.current.account_default, self.current.guest_default
        loaded = self._run(lambda: read_access_list(path, account_default=account_default, guest_default=guest_default))
        return loaded.addCallback(self._loaded)

    def _loaded(self, access_list: AccessList) -> None:
        self.current = access_list
        self._install()
        self._log.info("UAL file {path} reloaded ({n} entries)", path=str(self.path), n=len(access_list.entries))


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def access_list_for(settings: Settings, broker: Broker, reactor: IBrokerReactor,
                    run: Callable[..., Deferred] | None = None) -> AccessListFile:
    """The broker's AccessListFile (brokerd.compose makes the one every front end shares) from the
    settings: ``ual_file`` (or ``DATA_DIR/smqp.ual`` when that exists) and
    ``smqp_guest_permissions``.  An unreadable or malformed file raises ConfigurationError now,
    not at the first login."""
    try:
        guest = parse_permissions(settings.smqp_guest_permissions or format_permissions(DEFAULT_GUEST_PERMISSIONS))
    except ValueError as exc:
        raise ConfigurationError(f"--smqp-guest-permissions: {exc}") from None
    path = settings.ual_file
    if path is None and (Path(settings.data_dir) / UAL_FILENAME).exists():
        path = Path(settings.data_dir) / UAL_FILENAME
    current = read_access_list(path, guest_default=guest) if path else AccessList(guest_default=guest)
    return AccessListFile(path, current, broker, reactor, run if run is not None else thread_runner(reactor))

"""The Tor that publishes brokerd's onion services: a running one reached on its control
port (``--tor-control``), or one brokerd launches (``--tor-config`` gives its options).

One Tor serves every onion listener of a broker: it is reached (or launched) when the first
onion listener starts, and a launched Tor stops with the broker.  A launched Tor runs with
``DATA_DIR/tor`` as its data directory (a restart reuses what it learnt of the network) and
the options of ``--tor-config``, a torrc (without it: Tor's defaults, the public network).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypedDict

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectError
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.config import Settings
from brokerd.errors import ConfigurationError
from brokerd.interfaces import IBrokerReactor

_log = Logger()

_OPTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TorControlConnection(Protocol):
    """What brokerd asks of txtorcon's control connection (a TorControlProtocol): commands,
    the events that tell when an onion service's descriptor is uploaded, and quitting."""

    def queue_command(self, command: str) -> Deferred[str]: ...

    def add_event_listener(self, event: str, listener: Callable[[str], None]) -> Deferred[object]: ...

    def remove_event_listener(self, event: str, listener: Callable[[str], None]) -> Deferred[object]: ...

    def quit(self) -> Deferred[object]: ...


class ReachedTor(Protocol):
    """What brokerd asks of txtorcon's ``Tor`` (reached or launched): its control connection,
    and, for a launched one, to stop it."""

    @property
    def protocol(self) -> TorControlConnection: ...

    def quit(self) -> Deferred[object]: ...


class OnionStatus(TypedDict):
    """An onion service as the admin API and ``brokerd-ctl status`` show it."""

    address: str
    port: int
    tls: bool


class PublishedService(Protocol):
    """A published onion service as the TorControl keeps it (an onion listener's port)."""

    def status(self) -> OnionStatus: ...


def torrc_options(path: Path) -> dict[str, list[str]]:
    """The options of a torrc: option -> its values, in order (a repeated option such as
    ``DirAuthority`` has several).  ConfigurationError for an unreadable file or a line
    that is not ``Option value``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(f"--tor-config {path}: {exc.strerror}") from None
    options: dict[str, list[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if not _OPTION_NAME.fullmatch(name) or not value.strip():
            raise ConfigurationError(f"--tor-config {path}, line {number}: expected 'Option value'")
        options.setdefault(name, []).append(value.strip())
    return options


def check_tor_settings(settings: Settings) -> None:
    """--tor-control and --tor-config exclude each other; each must be usable."""
    if settings.tor_control is not None and settings.tor_config is not None:
        raise ConfigurationError("--tor-control and --tor-config exclude each other: use a running tor, "
                                 "or launch one with these options")
    if settings.tor_config is not None:
        torrc_options(settings.tor_config)
    if settings.onion_client_auth is not None:
        from brokerd.protocols.onion.keys import authorized_clients

        authorized_clients(settings.onion_client_auth)


class TorControl(Service):
    """The broker's Tor: :meth:`tor` gives the txtorcon ``Tor`` (reached or launched once)."""

    def __init__(self, settings: Settings, reactor: IBrokerReactor) -> None:
        self.settings = settings
        self.reactor = reactor
        self._tor: ReachedTor | None = None
        self._waiting: list[Deferred[ReachedTor]] = []
        self._launched = False
        self.published: list[PublishedService] = []
        """The onion listeners' ports (brokerd.protocols.onion.listener.OnionPort), as published."""

    def status(self) -> list[OnionStatus]:
        """The published onion services, for the admin API and ``brokerd-ctl status``."""
        return [port.status() for port in self.published]

    def tor(self) -> Deferred[ReachedTor]:
        """Deferred[txtorcon.Tor], within --tor-timeout seconds."""
        if self._tor is not None:
            return succeed(self._tor)
        d: Deferred[ReachedTor] = Deferred()
        self._waiting.append(d)
        if len(self._waiting) == 1:
            self._reach().addCallbacks(self._reached, self._failed)
        return d

    def _reach(self) -> Deferred[ReachedTor]:
        import txtorcon

        timeout = self.settings.tor_timeout
        if self.settings.tor_control is not None:
            from twisted.internet.endpoints import clientFromString

            _log.info("Tor: connecting to the control port {endpoint}", endpoint=self.settings.tor_control)
            d = txtorcon.connect(self.reactor, clientFromString(self.reactor, self.settings.tor_control))
            return d.addTimeout(timeout, self.reactor)
        data_directory = Path(self.settings.data_dir) / "tor"
        config = txtorcon.TorConfig()
        options = torrc_options(self.settings.tor_config) if self.settings.tor_config is not None else {}
        # txtorcon learns that tor is ready from its stdout: tor logs there too, whatever else.
        log = next((name for name in options if name.lower() == "log"), "Log")
        options[log] = [*options.get(log, []), "notice stdout"]
        for name, values in options.items():
            setattr(config, name, values if len(values) > 1 else values[0])
        # No SOCKS port unless the torrc asks for one: this tor publishes services.
        socks = None if any(name.lower() == "socksport" for name in options) else 0
        _log.info("Tor: launching tor (data directory {directory}, options from {torrc})",
                  directory=str(data_directory), torrc=str(self.settings.tor_config or "Tor's defaults"))
        self._launched = True
        socket_path = data_directory.resolve() / "control.socket"
        d = txtorcon.launch(self.reactor, data_directory=str(data_directory), socks_port=socks, timeout=timeout,
                            kill_on_stderr=False, _tor_config=config, control_port=f"unix:{socket_path}",
                            connection_creator=lambda: Deferred.fromCoroutine(
                                self._connect_when_ready(socket_path, timeout)))
        return d.addTimeout(timeout, self.reactor)

    async def _connect_when_ready(self, socket_path: Path, timeout: float) -> TorControlConnection:
        """The control connection to the launched tor.  txtorcon tries once, when tor says
        it opens the control socket, which may be an instant before it exists: tried again
        every 0.1 s, within ``timeout``."""
        from twisted.internet.endpoints import UNIXClientEndpoint
        from txtorcon import TorProtocolFactory

        deadline = self.reactor.seconds() + timeout
        while True:
            try:
                protocol: TorControlConnection = await UNIXClientEndpoint(self.reactor, str(socket_path)).connect(
                    TorProtocolFactory())
            except ConnectError:
                if self.reactor.seconds() > deadline:
                    raise
                await deferLater(self.reactor, 0.1, lambda: None)
            else:
                return protocol

    def _reached(self, tor: ReachedTor) -> None:
        self._tor = tor
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(tor)

    def _failed(self, failure: Failure) -> None:
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.errback(failure)

    def stopService(self) -> Deferred[object] | None:
        super().stopService()
        self.published.clear()
        tor, self._tor = self._tor, None
        if tor is None:
            return None
        d = tor.quit() if self._launched else tor.protocol.quit()
        return d.addErrback(lambda failure: _log.warn("Tor: {reason}", reason=failure.getErrorMessage()))

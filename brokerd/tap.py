"""``twistd brokerd``: the command line, and makeService() for embedding the broker.

makeService builds one Broker, one Portal and one listener service per endpoint, under one
MultiService, the shape of twisted/words/tap.py.  The shared pieces go to every front end in
one typed :class:`~brokerd.frontend.Services`; the front ends are
:class:`~brokerd.frontend.IFrontEnd` plugins (brokerd.frontends), each building its own factory,
so this module never needs to know what a protocol does.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python import usage

from brokerd import __version__
from brokerd.admin.logs import choose as choose_log_observer
from brokerd.admin.logs import wants_own_observer
from brokerd.admin.service import Operations, admin_endpoint, check_operations_settings
from brokerd.auth.tls import ServerTLS, listen_endpoint
from brokerd.compose import build_runtime, check_cluster_settings, configured_listeners
from brokerd.config import (
    DEFAULT_INTERFACE,
    DEFAULT_PORTS,
    PROTOCOLS,
    Settings,
    secret_file_problems,
    setting_fields,
    settings_from,
)
from brokerd.errors import ConfigurationError
from brokerd.frontend import FrontEndPlugin, build_front_end
from brokerd.frontends import BY_NAME as FRONT_ENDS
from brokerd.interfaces import IBrokerReactor
from brokerd.optiontable import flags, former_options, negative_flags, parameters, repeatable_help
from brokerd.preflight import DataDirLock, data_dir_problems, exposure_warnings, listen_problems
from brokerd.protocols.mqtt.bridgeservice import build_bridges, check_bridges
from brokerd.protocols.onion.control import TorControl, check_tor_settings
from brokerd.protocols.onion.listener import onion_listen_endpoint
from brokerd.runtime import Runtime
from brokerd.settingspec import kind
from brokerd.store.choice import check_database, check_store_url

_log = Logger()


NEGATIVE_FLAGS = negative_flags()
"""Flags that turn off a setting that is on by default: flag -> the setting's option name."""
FORMER_OPTIONS = former_options()
"""Former option names -> the options now: taken (brokerd.config warns), not in --help."""


class Options(usage.Options):
    """The command-line contract of DESIGN.md (every listener option is repeatable)."""

    synopsis = "[options]"
    longdesc = (
        "Run brokerd: SSMP, MCCHAT, SMQP and socket.mq on one broker core. With no listener "
        "option every available protocol listens on its default port on 127.0.0.1 (this host "
        "only); with any, only those given."
    )
    optFlags = flags()
    optParameters = parameters()
    """Both made from Settings (brokerd.optiontable): a setting is added there, in one place."""

    def __init__(self) -> None:
        super().__init__()
        self["listeners"] = {}
        self["smqp-links"] = []
        self["mqtt-bridges"] = []
        self.warnings: list[str] = []
        """Warning lines of the options themselves (a former option name given): logged at
        start with the broker's own, printed by --check-config."""

    def _listener(self, protocol: str, endpoint: str) -> None:
        self["listeners"].setdefault(protocol, []).append(endpoint)

    # The opt_ methods' --help lines come from Settings too (_help_from_settings, below).
    def opt_ssmp(self, endpoint: str) -> None:
        self._listener("ssmp", endpoint)

    def opt_mcchat(self, endpoint: str) -> None:
        self._listener("mcchat", endpoint)

    def opt_smqp(self, endpoint: str) -> None:
        self._listener("smqp", endpoint)

    def opt_socketmq(self, endpoint: str) -> None:
        self._listener("socketmq", endpoint)

    def opt_mqtt(self, endpoint: str) -> None:
        self._listener("mqtt", endpoint)

    def opt_smqp_link(self, link: str) -> None:
        self["smqp-links"].append(link)

    def opt_mqtt_bridge(self, bridge: str) -> None:
        self["mqtt-bridges"].append(bridge)

    def opt_version(self) -> None:
        print(f"brokerd {__version__}")
        sys.exit(0)

    def getUsage(self, width: int | None = None) -> str:
        """--help without the former option names: they still work, but an operator reading the
        list should meet only the names to use (docs/operations.md names the former ones)."""
        every = self.longOpt
        self.longOpt = [option for option in every if option.rstrip("=") not in FORMER_OPTIONS]
        try:
            return super().getUsage(width)
        finally:
            self.longOpt = every

    def parseOptions(self, options=None) -> None:
        """An option brokerd does not know, or one without its value, is one line and exit 1
        (twistd would print its whole help text first)."""
        try:
            super().parseOptions(options)
        except usage.UsageError as exc:
            raise StartupError(f"brokerd: {exc} (--help lists the options)") from None

    def postOptions(self) -> None:
        values: dict[str, Any] = {key: self[key] for key, *_ in self.optParameters if key != "config"}
        # An unset flag is 0: only flags given on the command line may override the file.
        values.update({key: True for key, *_ in self.optFlags
                       if self[key] and key not in NEGATIVE_FLAGS and key != "check-config"})
        for flag, setting in NEGATIVE_FLAGS.items():
            if self[flag]:
                values[setting] = False
        values.update(self["listeners"])
        if self["smqp-links"]:
            values["smqp-link"] = self["smqp-links"]
        if self["mqtt-bridges"]:
            values["mqtt-bridge"] = self["mqtt-bridges"]
        checking = bool(self["check-config"])
        problems: list[str] = []
        try:
            self.settings = settings_from(values, self["config"], problems, self.warnings)
        except ConfigurationError as exc:  # the config file itself cannot be read
            problems.append(str(exc))
        else:
            problems += startup_problems(self.settings, starting=not checking)
        if checking:
            if not problems:
                self.warnings += exposure_warnings(self.settings, configured_listeners(self.settings))
            report_check(problems, self.warnings)
        if problems:
            # One line and a non-zero exit: a UsageError would make twistd print its whole
            # help text first.
            raise StartupError(f"brokerd: {problems[0]}")
        twistd = getattr(self, "parent", None)
        if twistd is None:
            return
        if twistd.get("logger") is not None or twistd.get("syslog"):
            if wants_own_observer(self.settings):
                raise StartupError("brokerd: --log-level/--log-format replace twistd's --logger; give one or the other")
            return  # the operator's own observer
        twistd["logger"] = choose_log_observer(self.settings, twistd)  # escapes what clients sent


def _help_from_settings(options: type[usage.Options]) -> None:
    """The --help lines of the options that are ``opt_`` methods (the listeners, repeatable
    settings), from Settings as the others are."""
    for name in (*PROTOCOLS, *(name for name, spec in setting_fields().items() if kind(spec) == "repeatable")):
        getattr(options, f"opt_{name.replace('-', '_')}").__doc__ = repeatable_help(name)


_help_from_settings(Options)


def report_check(problems: list[str], warnings: list[str]) -> None:
    """``--check-config``: one line per problem on stderr and exit 1, or one line and exit 0,
    after the warnings the broker would log at start (one line each on stderr)."""
    for problem in problems:
        print(f"brokerd: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    for warning in warnings:
        print(f"brokerd: warning: {warning}", file=sys.stderr)
    print("brokerd: configuration OK")
    sys.exit(0)


class StartupError(SystemExit):
    """The broker cannot start (unusable settings, a port that cannot be bound).

    A SystemExit carrying one line, so twistd prints that line and exits with status 1 instead
    of a traceback; an embedding program may catch it like any exception.
    """


class ListenFailed(StartupError):
    """A listener could not be started."""


class ListenerService(StreamServerEndpointService):
    """Listens on one endpoint; a failure to bind is one clear line and a non-zero exit."""

    def __init__(self, option: str, description: str, endpoint, factory, reactor, listening_factory=None) -> None:
        super().__init__(endpoint, factory)
        self.option = option
        self.description = description
        self._reactor = reactor
        self.listening_factory = listening_factory or factory
        """What the endpoint listens with: ``factory`` (the front end's), or a wrapper around it."""
        for quiet in {factory, self.listening_factory}:  # no "Starting factory <... at 0x...>" lines:
            quiet.noisy = False  # the listening line below says what an operator needs

    def privilegedStartService(self) -> None:
        self.running_port = None
        failures: list = []
        starting = [True]

        def failed(failure) -> None:
            # At once (a port in use): one line and exit status 1.  Later (an onion
            # service Tor could not publish): a critical line, and the broker stops.
            if starting[0]:
                failures.append(failure)
            else:
                self._failed_later(failure)

        d: Deferred = self.endpoint.listen(self.listening_factory)
        d.addCallbacks(self._listening, failed)
        starting[0] = False
        self._waitingForPort = d
        if failures:
            raise ListenFailed(self._failure_line(failures[0]))

    def startService(self) -> None:
        self.running = True
        if getattr(self, "_waitingForPort", None) is None:
            self.privilegedStartService()

    def _listening(self, port):
        self.running_port = port
        _log.info("{role} listening on {address} (--{option} {endpoint})", role=ROLES.get(self.option, self.option),
                  address=_address_text(port.getHost()), option=self.option, endpoint=self.description)
        return port

    def _failure_line(self, failure) -> str:
        reason = failure.getErrorMessage() or failure.type.__name__
        return f"brokerd: --{self.option} {self.description}: cannot listen: {reason}"

    def _failed_later(self, failure) -> None:
        _log.critical("{line}", line=self._failure_line(failure))
        if self._reactor.running:
            self._reactor.stop()

    def stopService(self):
        self.running = False
        d = self._waitingForPort
        self._waitingForPort = None
        if d is None:
            return None
        d.addCallback(lambda port: port.stopListening() if port is not None else None)
        return d


ROLES = {**{name: front_end.title for name, front_end in FRONT_ENDS.items()}, "admin": "admin"}
"""How the start-up log names each listener's role."""


def _address_text(address: object) -> str:
    """host:port of a listening port (``[host]:port`` for IPv6), or a unix socket's path."""
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if host is not None and port is not None:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    name = getattr(address, "name", None)
    if name is not None:
        return f"unix:{name.decode() if isinstance(name, bytes) else name}"
    return str(address)


def _listen_endpoint(reactor, description: str, tls: ServerTLS | None, option: str, tor: TorControl | None = None):
    """The server endpoint of one listener; ``tor`` publishes ``onion:`` ones (docs/tor.md)."""
    if description.startswith("onion:"):  # never Twisted's own onion: parser, which launches a default tor
        if tor is None:
            raise ConfigurationError(f"--{option} {description}: onion listeners are published by the broker's tor")
        return onion_listen_endpoint(reactor, description, option, tor, tls)
    if description.startswith("tls:"):
        if tls is None:
            raise ConfigurationError(f"--{option} {description}: a tls: listener needs --tls-cert and --tls-key")
        try:
            return listen_endpoint(reactor, tls, description)
        except ConfigurationError as exc:
            raise ConfigurationError(f"--{option} {exc}") from None
    try:
        return endpoints.serverFromString(reactor, description)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigurationError(f"--{option} {description}: not a valid endpoint ({exc})") from None


def check_settings(settings: Settings) -> None:
    """Raise ConfigurationError for the first of :func:`startup_problems`."""
    problems = startup_problems(settings)
    if problems:
        raise ConfigurationError(problems[0])


def startup_problems(settings: Settings, starting: bool = True) -> list[str]:
    """Every check of the settings before start-up, one line per problem: the one place a
    new start-up check goes (add it to :data:`STARTUP_CHECKS`).  Run while the options are
    parsed, before twistd daemonizes, so a problem is one line on the terminal.  Without
    ``starting`` (``--check-config``) the data directory is checked without being created and
    every listener's endpoint string is parsed too."""
    problems = secret_file_problems(settings)
    for check in STARTUP_CHECKS:
        try:
            check(settings)
        except ConfigurationError as exc:
            problems.append(str(exc))
    if not starting:  # when starting, makeService reads these files and binds these endpoints
        try:
            _check_readable_files(settings)
        except ConfigurationError as exc:
            problems.append(str(exc))
        listeners = configured_listeners(settings)
        problems += data_dir_problems(settings, listeners, create=False)
        problems += _endpoint_problems(settings, listeners)
    return list(dict.fromkeys(problems))  # a file two checks read is one problem, said once


def _check_tls_files(settings: Settings) -> None:
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigurationError("--tls-cert and --tls-key go together")
    if settings.tls_ca and not settings.tls_cert:
        raise ConfigurationError("--tls-ca needs --tls-cert and --tls-key")
    if settings.tls_cert is not None and settings.tls_key is not None:
        ServerTLS.from_files(settings.tls_cert, settings.tls_key, settings.tls_ca)


def _check_readable_files(settings: Settings) -> None:
    for option, path in (("--accounts", settings.accounts_file), ("--ual", settings.ual_file)):
        if path is not None:
            try:
                Path(path).read_bytes()
            except OSError as exc:
                raise ConfigurationError(f"{option} {path}: {exc.strerror}") from None


def _check_store(settings: Settings) -> None:
    if settings.store is not None:
        check_database(settings.store, check_store_url(settings.store, settings.store_password_file))


def _check_front_ends(settings: Settings) -> None:
    for protocol in settings.listeners:
        front_end_named(protocol)


def front_end_named(protocol: str) -> FrontEndPlugin:
    """The front end that serves the listener option ``--<protocol>``."""
    found = FRONT_ENDS.get(protocol)
    if found is None:
        raise ConfigurationError(f"--{protocol}: the {protocol} front end is not available yet")
    return found


def _check_cluster(settings: Settings) -> None:
    if settings.cluster is not None:
        check_cluster_settings(settings)


def _endpoint_problems(settings: Settings, listeners: dict[str, list[str]]) -> list[str]:
    from twisted.internet import reactor as default_reactor

    reactor = cast(IBrokerReactor, default_reactor)  # the global reactor has every facet

    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        try:
            tls = ServerTLS.from_files(settings.tls_cert, settings.tls_key, settings.tls_ca)
        except ConfigurationError:
            return []  # already one of the problems
    named = [(protocol, d) for protocol, descriptions in listeners.items() for d in descriptions]
    if settings.admin is not None:
        named.append(("admin", settings.admin))
    problems = []
    tor = TorControl(settings, reactor)  # never started: the onion endpoints are only parsed
    for option, description in named:
        try:
            _listen_endpoint(reactor, description, tls, option, tor)
        except ConfigurationError as exc:
            problems.append(str(exc))
    return problems


STARTUP_CHECKS = (
    lambda settings: settings.secret(),
    _check_tls_files,
    check_operations_settings,
    _check_store,
    _check_front_ends,
    check_bridges,
    _check_cluster,
    check_tor_settings,
)
"""The start-up checks of :func:`startup_problems`, in order: each raises ConfigurationError
with one line."""


def makeService(options, reactor=None) -> BrokerService:
    """Build the broker service from ``options`` (an Options, or a Settings).

    Embedders call it with their own reactor and start the returned service (or add it to
    their application).  Unusable settings raise StartupError; starting the service raises
    ListenFailed (a StartupError) when a port cannot be bound.  Both carry one line.
    """
    try:
        return build_service(options, reactor)
    except ConfigurationError as exc:
        raise StartupError(f"brokerd: {exc}") from None


def build_service(options, reactor=None) -> BrokerService:
    """makeService without the translation of ConfigurationError into StartupError."""
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        reactor = default_reactor
    settings = options if isinstance(options, Settings) else options.settings
    warnings = [] if isinstance(options, Settings) else options.warnings
    listeners = configured_listeners(settings)
    lock = claim_data_dir(settings, listeners)
    try:
        return _build_service(settings, reactor, listeners, lock, warnings)
    except BaseException:
        lock.release()
        raise


def claim_data_dir(settings: Settings, listeners: dict[str, list[str]]) -> DataDirLock:
    """Check every file and directory the broker writes, lock the data directory, and try
    every fixed TCP port, before anything starts (and before twistd daemonizes)."""
    problems = data_dir_problems(settings, listeners, create=True)
    if problems:
        raise ConfigurationError(problems[0])
    lock = DataDirLock(settings.data_dir)
    lock.acquire()
    problems = listen_problems(listeners, settings.admin)
    if problems:
        lock.release()
        raise ConfigurationError(problems[0])
    return lock


class BrokerService(MultiService):
    """The whole broker as one service (what makeService returns): ``runtime`` is the running
    broker's typed pieces, ``operations`` its figures and admin listener."""

    def __init__(self, runtime: Runtime, operations: Operations) -> None:
        super().__init__()
        self.runtime = runtime
        self.operations = operations


def _build_service(settings: Settings, reactor, listeners: dict[str, list[str]], lock: DataDirLock,
                   warnings: list[str]) -> BrokerService:
    runtime, operations = build_runtime(settings, reactor)
    services = runtime.services
    top = BrokerService(runtime, operations)
    lock.setServiceParent(top)  # first in, last out: held until everything else stopped
    if runtime.event_log_service is not None:
        runtime.event_log_service.setServiceParent(top)  # first in, last out: it sees the listeners' last events
    services.disk.setServiceParent(top)
    services.broker.setServiceParent(top)
    services.access_list.setServiceParent(top)  # watches the UAL file
    if not settings.listeners:
        _log.info("No listener option: every listener binds {interface} only (this host); to listen beyond it, "
                  "give listener options naming an interface, e.g. --ssmp tcp:{port}:interface=0.0.0.0",
                  interface=DEFAULT_INTERFACE, port=DEFAULT_PORTS["ssmp"])
    for line in [*warnings, *exposure_warnings(settings, listeners)]:
        _log.warn("{line}", line=line)
    described = [d for descriptions in listeners.values() for d in descriptions] + [settings.admin or ""]
    if any(d.startswith("onion:") for d in described):
        runtime.tor = TorControl(settings, reactor)
        runtime.tor.setServiceParent(top)  # before the listeners: it stops after their services are removed
    for protocol, descriptions in listeners.items():
        factory = runtime.front_ends[protocol] = build_front_end(front_end_named(protocol), services)
        for description in descriptions:
            endpoint = _listen_endpoint(reactor, description, runtime.tls, protocol, runtime.tor)
            counted = operations.counted(protocol, factory)
            service = ListenerService(protocol, description, endpoint, factory, reactor, counted)
            service.setServiceParent(top)
    if settings.admin is not None:
        endpoint = _listen_endpoint(reactor, admin_endpoint(settings), runtime.tls, "admin", runtime.tor)
        ListenerService("admin", settings.admin, endpoint, operations.admin_site(), reactor).setServiceParent(top)
    runtime.bridges = build_bridges(services)  # the MQTT bridges to other brokers, if any
    if runtime.bridges is not None:
        runtime.bridges.setServiceParent(top)
    for beside in operations.services():
        beside.setServiceParent(top)
    return top

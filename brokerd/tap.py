"""``twistd brokerd``: the command line, and makeService() for embedding the broker.

makeService builds one Broker, one Portal and one listener service per endpoint, under one
MultiService, the shape of twisted/words/tap.py.  The shared pieces go to every front end in
one typed :class:`~brokerd.frontend.Services`; the front ends are
:class:`~brokerd.frontend.IFrontEnd` plugins (brokerd.frontends), each building its own factory,
so this module never needs to know what a protocol does.
"""
from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python import usage

from brokerd import __version__
from brokerd.admin.logs import choose as choose_log_observer
from brokerd.admin.logs import wants_own_observer
from brokerd.admin.oplog import OperatorLog
from brokerd.admin.service import Operations, admin_endpoint, check_operations_settings
from brokerd.auth.policy import access_list_for
from brokerd.auth.accounts import AccountsChecker, thread_runner
from brokerd.auth.realm import accounts_portal, build_portal
from brokerd.auth.throttle import LoginThrottle
from brokerd.auth.tls import ServerTLS, listen_endpoint
from brokerd.auth.workers import WorkQueue
from brokerd.config import (
    DEFAULT_INTERFACE,
    DEFAULT_PORTS,
    PROTOCOLS,
    Settings,
    check_secret_files,
    default_listener,
    read_first_line,
    secret_file_problems,
    setting_fields,
    settings_from,
    value_problems,
)
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService, attach_durable
from brokerd.core.retained import RetainedMessages
from brokerd.core.retainedquota import RetainQuotas
from brokerd.errors import INSTALL_CLUSTER, ConfigurationError
from brokerd.core.sampling import DeliverySampler
from brokerd.events.log import NULL_EVENT_LOG, EventLog
from brokerd.frontend import FrontEndPlugin, Services, build_front_end
from brokerd.frontends import BY_NAME as FRONT_ENDS
from brokerd.optiontable import flags, negative_flags, parameters, repeatable_help
from brokerd.preflight import DataDirLock, data_dir_problems, exposure_warnings, listen_problems
from brokerd.protocols.flow import after_read
from brokerd.protocols.mqtt.bridgeservice import build_bridges, check_bridges
from brokerd.protocols.onion.control import TorControl, check_tor_settings
from brokerd.protocols.onion.listener import onion_listen_endpoint
from brokerd.runtime import Runtime
from brokerd.settingspec import kind
from brokerd.store.choice import check_database, check_store_url, store_for
from brokerd.store.sqlite import FILENAME as SQLITE_FILENAME
from brokerd.store.sqlite import SQLiteStore
from brokerd.store.disk import DiskSpace

_log = Logger()


NEGATIVE_FLAGS = negative_flags()
"""Flags that turn off a setting that is on by default: flag -> the setting's option name."""


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
            self.settings = settings_from(values, self["config"], problems)
        except ConfigurationError as exc:  # the config file itself cannot be read
            problems.append(str(exc))
        else:
            problems += startup_problems(self.settings, starting=not checking)
        if checking:
            report_check(problems, [] if problems else exposure_warnings(self.settings, _listeners(self.settings)))
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


def _address_text(address: Any) -> str:
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
        listeners = _listeners(settings)
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
    from twisted.internet import reactor

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


def check_cluster_settings(settings: Settings) -> None:
    """--cluster needs a parsable Redis URL, txredisapi, and, when SMQP listens, durable state
    every node shares (a PostgreSQL store): SQLite is one node's file."""
    from brokerd.cluster.address import parse

    parse(settings.cluster)  # type: ignore[arg-type]
    cluster_secrets(settings)
    if settings.cluster_password_file is not None:
        read_first_line(settings.cluster_password_file, "--cluster-password-file")
    if settings.cluster_node_timeout <= settings.cluster_heartbeat:
        raise ConfigurationError("--cluster-node-timeout must be longer than --cluster-heartbeat")
    if "smqp" in _listeners(settings) and not str(settings.store or "").startswith("postgresql:"):
        raise ConfigurationError(
            "--cluster with an SMQP listener needs --store postgresql://... (durable state shared by every node)")
    try:
        import txredisapi  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigurationError(f"--cluster needs txredisapi: {INSTALL_CLUSTER}") from None


def node_name(settings: Settings) -> str:
    """--node-name, else the host name and the port of the first TCP listener."""
    if settings.node_name:
        return settings.node_name
    port = ""
    for descriptions in _listeners(settings).values():
        for description in descriptions:
            fields = description.split(":")
            if len(fields) > 1 and fields[1].isdigit():
                port = fields[1]
                break
        if port:
            break
    return f"{socket.gethostname()}:{port}" if port else socket.gethostname()


def cluster_secrets(settings: Settings) -> list[bytes]:
    """The lines of --cluster-secret-file (required with --cluster; see brokerd.cluster.seal)."""
    from brokerd.cluster.seal import read_secret_file

    if settings.cluster_secret_file is None:
        raise ConfigurationError(
            "--cluster needs --cluster-secret-file FILE: the secret every node shares (docs/cluster.md)")
    return read_secret_file(settings.cluster_secret_file)


def cluster_engine(settings: Settings, reactor):
    """The Redis engine --cluster asks for (imported only then)."""
    from brokerd.cluster.address import parse
    from brokerd.cluster.redis_engine import RedisEngine

    password = None
    if settings.cluster_password_file is not None:
        password = read_first_line(settings.cluster_password_file, "--cluster-password-file").decode("utf-8")
    return RedisEngine(parse(settings.cluster), reactor, node_name(settings),  # type: ignore[arg-type]
                       secrets=cluster_secrets(settings), secret_file=settings.cluster_secret_file,
                       password=password, tls_ca=settings.cluster_tls_ca, max_backlog=settings.cluster_max_backlog,
                       heartbeat=settings.cluster_heartbeat, node_timeout=settings.cluster_node_timeout,
                       clock_skew=settings.cluster_clock_skew, max_control=settings.cluster_max_control,
                       max_shared_pending=settings.cluster_max_shared_pending)


def account_checkers(settings: Settings, accounts: AccountsChecker, reactor: Any) -> tuple[AccountsChecker, ...]:
    """With ``--accounts``: SSMP's ``password`` scheme checks the accounts file, the one
    SMQP logs in against and read once for both (no guest: a guest login has nothing to
    prove), in the reactor's thread pool as before (SSMP answers no Busy)."""
    if settings.accounts_file is None:
        return ()
    return (accounts.with_guest(False, run=thread_runner(reactor)),)


def build_runtime(settings: Settings, reactor) -> tuple[Runtime, Operations]:
    """The shared pieces of one broker, as its front ends get them (:class:`Services`): the
    Broker, the Portal, TLS, the event log, the store and its durable service, the access list;
    and the operations side over them (the operator log is the front ends' event log)."""
    check_secret_files(settings)  # also for embedders, who call makeService with Settings
    for problem in value_problems(settings):  # embedders' values; the options' were checked as read
        raise ConfigurationError(problem)
    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        tls = ServerTLS.from_files(settings.tls_cert, settings.tls_key, settings.tls_ca)
    disk = DiskSpace(settings.data_dir, settings.disk_free_limit, reactor)
    event_log = _event_log(settings, reactor, disk)
    broker = _broker(settings)
    throttle = LoginThrottle.from_settings(settings, reactor)  # one backoff per address, every front end
    work_queue = WorkQueue(reactor, settings.max_auth_queue)
    accounts = AccountsChecker(settings.accounts_file, guest=settings.smqp_guest, run=work_queue.run)
    portal = build_portal(
        open_login=settings.open_login,
        secret=settings.secret(),
        client_certificates=tls is not None and tls.verifies_clients,
        extra_checkers=account_checkers(settings, accounts, reactor),
        broker=broker,
        throttle=throttle,
    )
    if settings.cluster is not None:
        _join_cluster(settings, broker, reactor)
    operator_log = OperatorLog(event_log if event_log is not None else NULL_EVENT_LOG)
    broker.observer = operator_log
    if event_log is not None:
        broker.sampler = DeliverySampler(broker, operator_log, reactor,
                                         interval=settings.event_log_sample, after_read=after_read)
    store = _node_store(settings, reactor)
    if store is None and settings.cluster is not None:
        _log.warn("Cluster: this node has no --store, so it keeps nothing for durable subscribers; give every node "
                  "the cluster's --store postgresql://... (docs/cluster.md)")
    services = Services(
        settings=settings, reactor=reactor, broker=broker, portal=portal, event_log=operator_log,
        accounts=accounts, accounts_portal=accounts_portal(broker, accounts, throttle),
        login_throttle=throttle, work_queue=work_queue,
        access_list=access_list_for(settings, broker, reactor),  # the UAL file, if any, is the core's policy
        disk=disk, tls=tls, store=store,
        durable=_open_store(settings, broker, store, operator_log, disk, reactor) if store is not None else None,
    )
    runtime = Runtime(services, event_log_service=event_log)
    return runtime, Operations(runtime, operator_log)


def _event_log(settings: Settings, reactor, disk: DiskSpace) -> EventLog | None:
    """The event log's writer with ``--event-log`` (paused below ``--disk-free-limit``)."""
    if not settings.event_log:
        return None
    return EventLog(
        settings.data_dir,
        reactor=reactor,
        include_payloads=settings.event_log_payloads,
        flush_interval=settings.event_log_flush,
        max_bytes=settings.event_log_max_bytes,
        max_age=settings.event_log_max_age,
        paused=lambda: disk.low,
    )


def _broker(settings: Settings) -> Broker:
    broker = Broker(
        max_subscriptions=settings.max_subscriptions,
        max_connections=settings.max_connections,
        max_listener_connections=settings.max_listener_connections,
        max_connections_per_address=settings.max_connections_per_address,
        max_unauthenticated=settings.max_unauthenticated,
    )
    broker.retained = RetainedMessages(
        settings.mqtt_max_retained, settings.mqtt_max_retained_bytes,
        RetainQuotas(settings.mqtt_max_retained_per_principal, settings.mqtt_max_retained_bytes_per_principal),
    )
    return broker


def _join_cluster(settings: Settings, broker: Broker, reactor) -> None:
    check_cluster_settings(settings)  # also for embedders, who call makeService with Settings
    engine = cluster_engine(settings, reactor)
    broker.use_engine(engine)
    _log.info("Cluster: node {node} joins through {address}", node=engine.node_name, address=str(engine.address))
    if not engine.address.loopback and not engine.address.tls and engine.password is None:
        _log.warn("Cluster: Redis at {address} is not on this machine and is used without a password or TLS: "
                  "anyone who reaches it can deny service to the cluster (docs/cluster.md, threat model)",
                  address=str(engine.address))


def _open_store(settings: Settings, broker: Broker, store, events, disk: DiskSpace, reactor) -> DurableService:
    """Open the node's store and build the core's durable service over it."""
    opened = store.open()
    durable = attach_durable(broker, store, opened, reactor, events, settings)
    durable.full = lambda: disk.low  # the core keeps nothing new below --disk-free-limit
    if settings.store is not None:
        opened.addErrback(_store_unusable, store, reactor)
    else:  # the SQLite file of a durable front end, which reports a failure to open it
        opened.addErrback(lambda _failure: None)
    return durable


DURABLE_FRONT_ENDS = ("smqp", "mqtt")
"""Front ends whose subscribers are durable: a node running one keeps a store even without
--store (the SQLite file in DATA_DIR)."""


def _node_store(settings: Settings, reactor) -> Any:
    """The node's store, not yet opened: the --store database, else the SQLite file in
    DATA_DIR when a front end with durable subscribers listens or an MQTT bridge keeps
    messages for another broker, else None (nothing on this
    node outlives a connection).  Whichever front ends run, the core's durable service is
    built over it (docs/architecture.md, "Durable delivery")."""
    if settings.store is not None:
        return store_for(settings.store, settings.store_password_file, reactor)
    if settings.mqtt_bridge or any(protocol in DURABLE_FRONT_ENDS for protocol in _listeners(settings)):
        return SQLiteStore(Path(settings.data_dir) / SQLITE_FILENAME, reactor)
    return None


def _store_unusable(failure, store, reactor) -> None:
    """The --store database could not be opened.  While the server cannot be reached the
    store keeps trying (stored publishes and SMQP wait for it); a database brokerd cannot
    use (a newer schema, no right to create the tables) is one critical line and the
    broker stops."""
    _log.critical("brokerd: --store {url}: {reason}", url=store.url, reason=failure.getErrorMessage())
    if reactor.running:
        reactor.stop()


def _listeners(settings: Settings) -> dict[str, list[str]]:
    if settings.listeners:
        return settings.listeners
    return {
        protocol: [default_listener(protocol)]
        for protocol in PROTOCOLS
        if protocol in FRONT_ENDS
    }


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
    listeners = _listeners(settings)
    lock = claim_data_dir(settings, listeners)
    try:
        return _build_service(settings, reactor, listeners, lock)
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


def _build_service(settings: Settings, reactor, listeners: dict[str, list[str]], lock: DataDirLock) -> BrokerService:
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
    for line in exposure_warnings(settings, listeners):
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

"""The shared pieces of one broker, built once from its Settings: the :class:`Services` every
front end is built over (the Broker and its cluster engine, the Portal and the accounts file,
the event log, the node's store and the core's durable service over it, the access list, the
work queue) and the operations side over them.

brokerd.tap calls :func:`build_runtime` from makeService; this module holds what it takes to
compose those pieces, so that tap.py keeps the command line, the listeners and the service.
"""
from __future__ import annotations

import socket
from pathlib import Path

from twisted.logger import Logger

from brokerd.admin.oplog import OperatorLog
from brokerd.admin.service import Operations
from brokerd.auth.accounts import AccountsChecker, thread_runner
from brokerd.auth.policy import access_list_for
from brokerd.auth.realm import accounts_portal, build_portal
from brokerd.auth.throttle import LoginThrottle
from brokerd.auth.tls import ServerTLS
from brokerd.auth.workers import WorkQueue
from brokerd.config import (
    PROTOCOLS,
    Settings,
    check_secret_files,
    default_listener,
    read_first_line,
    value_problems,
)
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService, attach_durable
from brokerd.core.retained import RetainedMessages
from brokerd.core.retainedquota import RetainQuotas
from brokerd.core.sampling import DeliverySampler
from brokerd.errors import INSTALL_CLUSTER, ConfigurationError
from brokerd.events.log import NULL_EVENT_LOG, EventLog
from brokerd.frontend import Services
from brokerd.frontends import BY_NAME as FRONT_ENDS
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.flow import after_read
from brokerd.runtime import Runtime
from brokerd.store.base import IStore
from brokerd.store.choice import store_for
from brokerd.store.disk import DiskSpace
from brokerd.store.sqlite import FILENAME as SQLITE_FILENAME
from brokerd.store.sqlite import SQLiteStore

_log = Logger()


def check_cluster_settings(settings: Settings) -> None:
    """--cluster needs a parsable Redis URL, txredisapi, and, when SMQP listens, durable state
    every node shares (a PostgreSQL store): SQLite is one node's file."""
    from brokerd.cluster.address import parse

    assert settings.cluster is not None  # called only when --cluster is given
    parse(settings.cluster)
    cluster_secrets(settings)
    if settings.cluster_password_file is not None:
        read_first_line(settings.cluster_password_file, "--cluster-password-file")
    if settings.cluster_node_timeout <= settings.cluster_heartbeat:
        raise ConfigurationError("--cluster-node-timeout must be longer than --cluster-heartbeat")
    if "smqp" in configured_listeners(settings) and not str(settings.store or "").startswith("postgresql:"):
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
    for descriptions in configured_listeners(settings).values():
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
    assert settings.cluster is not None  # called only when --cluster is given
    return RedisEngine(parse(settings.cluster), reactor, node_name(settings),
                       secrets=cluster_secrets(settings), secret_file=settings.cluster_secret_file,
                       password=password, tls_ca=settings.cluster_tls_ca, max_backlog=settings.cluster_max_backlog,
                       heartbeat=settings.cluster_heartbeat, node_timeout=settings.cluster_node_timeout,
                       clock_skew=settings.cluster_clock_skew, max_control=settings.cluster_max_control,
                       max_shared_pending=settings.cluster_max_shared_pending)


def account_checkers(settings: Settings, accounts: AccountsChecker,
                     reactor: IBrokerReactor) -> tuple[AccountsChecker, ...]:
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


def _node_store(settings: Settings, reactor: IBrokerReactor) -> IStore | None:
    """The node's store, not yet opened: the --store database, else the SQLite file in
    DATA_DIR when a front end with durable subscribers listens or an MQTT bridge keeps
    messages for another broker, else None (nothing on this
    node outlives a connection).  Whichever front ends run, the core's durable service is
    built over it (docs/architecture.md, "Durable delivery")."""
    if settings.store is not None:
        return store_for(settings.store, settings.store_password_file, reactor)
    if settings.mqtt_bridge or any(protocol in DURABLE_FRONT_ENDS for protocol in configured_listeners(settings)):
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


def configured_listeners(settings: Settings) -> dict[str, list[str]]:
    """Each listener option's endpoints: the given ones, else every front end on its default
    port on this host only."""
    if settings.listeners:
        return settings.listeners
    return {
        protocol: [default_listener(protocol)]
        for protocol in PROTOCOLS
        if protocol in FRONT_ENDS
    }

"""The figures an operator watches, read at the moment they are asked for.

One :class:`Figures` per broker gathers them from where they already are: the Broker's plain
counters, the operator log's, the connection counts, the event log's, the store's, the
process.  ``/metrics``, the JSON API and the ``$SYS`` topics all show these same numbers, so
they never disagree.  Nothing here runs per message.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any, cast

from twisted.internet.defer import Deferred, succeed

from brokerd import __version__
from brokerd.admin.connections import ConnectionCounts
from brokerd.admin.oplog import OperatorLog, WallClock
from brokerd.cluster.redis_engine import RedisEngine
from brokerd.core.broker import Broker
from brokerd.protocols.mqtt.bridge import BridgeStatus
from brokerd.protocols.mqtt.quotas import QuotaFigures
from brokerd.protocols.onion.control import OnionStatus
from brokerd.protocols.smqp.links import LinkStatus
from brokerd.runtime import Runtime

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_memory() -> int:
    """Bytes of the process's resident set (Linux: /proc; elsewhere the peak)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def open_files() -> int | None:
    """File descriptors the process has open (None where /proc or /dev/fd cannot tell)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(directory)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return None


def fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Figures:
    """Reads every figure of one running broker; :meth:`snapshot` is synchronous and cheap,
    :meth:`queues` asks the store (a Deferred)."""

    def __init__(self, runtime: Runtime, operator_log: OperatorLog, connections: ConnectionCounts,
                 clock: WallClock = time) -> None:
        self.runtime = runtime
        self.operator_log = operator_log
        self.connections = connections
        self._clock = clock
        self.started = clock.time()

    def uptime(self) -> float:
        """Seconds since the broker started, as ``snapshot()["uptime_seconds"]`` gives them."""
        return round(self._clock.time() - self.started, 3)

    @property
    def broker(self) -> Broker:
        return self.runtime.broker

    def queues(self) -> Deferred[dict[str, Any] | None]:
        """Deferred[dict | None]: the SMQP store's queue figures (see SQLiteStore.queue_figures);
        None when no store is open.  Never fails: a store error is None too."""
        ask = getattr(self.runtime.store, "queue_figures", None)
        if ask is None:
            return succeed(None)
        d = ask(self.runtime.settings.metrics_top_queues)
        d.addErrback(lambda _failure: None)
        return d

    def snapshot(self) -> dict[str, Any]:
        """Every synchronous figure, as plain JSON-able data."""
        broker = self.broker
        stats = broker.stats
        oplog = self.operator_log
        sessions: dict[str, int] = {}
        subscriptions = 0
        slow = 0
        for session in broker.sessions():
            sessions[session.protocol] = sessions.get(session.protocol, 0) + 1
            subscriptions += len(broker.subscriptions(session))
            if getattr(session, "episode_drops", 0):
                slow += 1
        delivered: dict[str, int] = {}
        routed: dict[str, dict[str, int]] = {}
        for sender, by_format in list(stats.routed_by.items()):
            for fmt, count in list(by_format.items()):
                receiver = fmt.protocol
                delivered[receiver] = delivered.get(receiver, 0) + count
                into = routed.setdefault(sender, {})
                into[receiver] = into.get(receiver, 0) + count
        dropped = dict(oplog.drops)
        dropped["slow_consumer"] = stats.slow_consumer_drops
        dropped["unrenderable"] = stats.unrenderable
        quota = getattr(broker.durable, "pending_quota", None)
        if quota is not None:
            dropped["stored_queue_full"] = quota.dropped
        return {
            "version": __version__,
            "uptime_seconds": self.uptime(),
            "connections": {
                "open": stats.connections,
                "refused": stats.refused_connections,
                "by_protocol": dict(self.connections.open),
                "made": dict(self.connections.made),
            },
            "sessions": sessions,
            "logins": dict(oplog.logins),
            "auth_failures": dict(oplog.auth_failures),
            "messages": {
                "accepted": stats.published,
                "delivered": stats.delivered,
                "accepted_by_protocol": dict(stats.accepted_by),
                "delivered_by_protocol": delivered,
                "routed": routed,
            },
            "dropped": dropped,
            "slow_consumers": slow,
            "slow_consumer_episodes": oplog.slow_consumer_episodes,
            "topics": len(broker.topics),
            "subscriptions": subscriptions,
            "retained": {"messages": len(broker.retained), "bytes": broker.retained.bytes,
                         "refused": dict(broker.retained.quotas.refused)},
            "event_log": self._event_log(),
            "thread_pools": self._thread_pools(),
            "store": self._store(),
            "smqp_links": self._smqp_links(),
            "mqtt_bridges": self._mqtt_bridges(),
            "cluster": self._cluster(),
            "mqtt": self._mqtt(),
            "onion_services": self._onion_services(),
            "process": {"resident_memory_bytes": resident_memory(), "open_fds": open_files(),
                        "max_fds": fd_limit()},
        }

    def _event_log(self) -> dict[str, Any] | None:
        stats = getattr(self.operator_log.events, "stats", None)
        if stats is None:
            return None
        figures = stats()
        figures["backlog"] = figures.get("buffered", 0) + figures.get("encoded", 0)
        return figures

    def _smqp_links(self) -> list[LinkStatus]:
        """Each SMQP server link's state and counts (brokerd.protocols.smqp.links)."""
        links = self.runtime.smqp_links
        return links.status() if links is not None else []

    def _mqtt_bridges(self) -> dict[str, BridgeStatus]:
        """Each MQTT bridge's state and counts by name (brokerd.protocols.mqtt.bridge): a
        dictionary, so the ~sys topics name each bridge (``~sys/brokerd/mqtt_bridges/<name>/state``)."""
        bridges = self.runtime.bridges
        return bridges.status() if bridges is not None else {}

    def _onion_services(self) -> list[OnionStatus]:
        """The onion listeners' addresses (brokerd.protocols.onion), as Tor published them."""
        tor = self.runtime.tor
        return tor.status() if tor is not None else []

    def _cluster(self) -> dict[str, Any] | None:
        """The cluster engine's figures; None for a single node."""
        engine = self.broker.engine
        if not engine.shared:
            return None
        engine = cast(RedisEngine, engine)  # the one shared engine: its figures are beyond IEngine
        figures: dict[str, Any] = dict(engine.stats.as_dict())
        figures["node"] = engine.node_name
        figures["nodes"] = 1 + len(engine.directory.nodes)
        figures["rejected"] = dict(engine.sealer.rejected)
        figures["shared"] = dict(engine.sharing.stats, pending=engine.sharing.pending)
        return figures

    def _mqtt(self) -> QuotaFigures | None:
        """The MQTT front end's persistent sessions and quota refusals; None without it."""
        sessions = self.runtime.mqtt_sessions
        return sessions.quotas.figures() if sessions is not None else None

    def _store(self) -> dict[str, Any] | None:
        latency = getattr(self.runtime.store, "commit_latency", None)
        if latency is None:
            return None
        return {
            "commits": latency.count,
            "commit_seconds_sum": latency.total,
            "commit_seconds_buckets": [[bound, count] for bound, count in latency.cumulative()],
        }

    def _thread_pools(self) -> dict[str, int]:
        pools: dict[str, int] = {}
        get_pool = getattr(self.runtime.reactor, "getThreadPool", None)
        if get_pool is not None:
            pool = get_pool()
            pools["reactor"] = pool.q.qsize()
        store = self.runtime.store
        if store is not None and hasattr(store, "backlog"):
            pools["store"] = store.backlog
        return pools

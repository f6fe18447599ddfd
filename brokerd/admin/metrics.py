"""``GET /metrics``: the broker's figures in the Prometheus exposition format.

A custom collector turns one :meth:`Figures.snapshot` into metric families at scrape time,
so the broker keeps plain integers on its hot path and nothing is counted twice.  Every name
starts with ``brokerd_``; per-protocol figures carry ``protocol="ssmp"`` etc. (docs/admin.md
lists them all).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


_Family = TypeVar("_Family", CounterMetricFamily, GaugeMetricFamily)


def _by(family: _Family, values: dict[str, Any]) -> _Family:
    for label, value in sorted(values.items()):
        if value is not None:
            family.add_metric([label], value)
    return family


def _counter(name: str, documentation: str, values: dict[str, Any], label: str) -> Metric:
    return _by(CounterMetricFamily(name, documentation, labels=[label]), values)


def _gauge(name: str, documentation: str, values: dict[str, Any], label: str) -> Metric:
    return _by(GaugeMetricFamily(name, documentation, labels=[label]), values)


OTHER_QUEUES = "(others)"
"""The label of the queues :func:`trash_by_queue` does not name (no Trash key has brackets)."""


def trash_by_queue(queues: dict[str, Any]) -> dict[str, int]:
    """The store's fullest Trash queues by key, and the messages of all the others under
    :data:`OTHER_QUEUES` (only when there are others): one series per queue a user made
    would let users grow /metrics without bound."""
    named = dict(queues["trash"])
    total = queues.get("trash_total")
    if total is not None and queues.get("trash_queues", len(named)) > len(named):
        named[OTHER_QUEUES] = int(total) - sum(int(n) for n in named.values())
    return named


def families(snapshot: dict[str, Any], queues: dict[str, Any] | None) -> Iterator[Metric]:
    """The metric families of one snapshot (and the store's queue figures, if any)."""
    info = GaugeMetricFamily("brokerd_info", "The running brokerd (always 1).", labels=["version"])
    info.add_metric([snapshot["version"]], 1)
    yield info
    yield GaugeMetricFamily("brokerd_uptime_seconds", "Seconds since the broker started.",
                            value=snapshot["uptime_seconds"])

    connections = snapshot["connections"]
    yield _gauge("brokerd_connections", "Open connections, by listener protocol.",
                 connections["by_protocol"], "protocol")
    yield _counter("brokerd_connections_total", "Connections accepted by a listener, by protocol.",
                   connections["made"], "protocol")
    yield CounterMetricFamily("brokerd_connections_refused_total",
                              "Connections refused at --max-connections.", value=connections["refused"])
    yield _gauge("brokerd_sessions", "Logged-in sessions, by protocol.", snapshot["sessions"], "protocol")
    yield _counter("brokerd_logins_total", "Logins accepted, by protocol.", snapshot["logins"], "protocol")
    yield _counter("brokerd_auth_failures_total", "Logins refused, by protocol.",
                   snapshot["auth_failures"], "protocol")

    messages = snapshot["messages"]
    yield _counter("brokerd_messages_accepted_total", "Messages accepted, by the sender's protocol.",
                   messages["accepted_by_protocol"], "protocol")
    yield _counter("brokerd_messages_delivered_total", "Deliveries, by the recipient's protocol.",
                   messages["delivered_by_protocol"], "protocol")
    routed = CounterMetricFamily("brokerd_messages_routed_total",
                                 "Deliveries by sending protocol and receiving protocol.",
                                 labels=["protocol", "receiver"])
    for sender, receivers in sorted(messages["routed"].items()):
        for receiver, count in sorted(receivers.items()):
            routed.add_metric([sender, receiver], count)
    yield routed
    yield _counter("brokerd_messages_dropped_total", "Messages not delivered, by reason.",
                   snapshot["dropped"], "reason")
    yield GaugeMetricFamily("brokerd_slow_consumers",
                            "Sessions whose messages are being dropped right now (output over --max-output-buffer).",
                            value=snapshot["slow_consumers"])
    yield CounterMetricFamily("brokerd_slow_consumer_episodes_total",
                              "Congestion episodes that ended (each logged as one dropped event).",
                              value=snapshot["slow_consumer_episodes"])
    yield GaugeMetricFamily("brokerd_topics", "Topics with at least one subscriber.", value=snapshot["topics"])
    yield GaugeMetricFamily("brokerd_subscriptions", "Subscriptions of all sessions.",
                            value=snapshot["subscriptions"])
    retained = snapshot["retained"]
    yield GaugeMetricFamily("brokerd_retained_messages", "Topics with a retained message.",
                            value=retained["messages"])
    yield GaugeMetricFamily("brokerd_retained_bytes", "Bytes of retained messages, topic names included.",
                            value=retained["bytes"])
    yield _counter("brokerd_retained_refused_total",
                   "Retains refused, by reason: full (a broker-wide bound), quota (the publisher's), topic.",
                   retained["refused"], "reason")

    if queues is not None:
        yield GaugeMetricFamily("brokerd_smqp_pending_messages",
                                "SMQP deliveries stored and not sent yet.", value=queues["pending"])
        yield GaugeMetricFamily("brokerd_smqp_unacknowledged_messages",
                                "SMQP deliveries sent and not acknowledged (310 ACK) yet.",
                                value=queues["unacknowledged"])
        yield _gauge("brokerd_smqp_trash_messages",
                     "Messages in an SMQP Trash, by Trash queue: the fullest (--metrics-top-queues), "
                     "the others summed as queue=\"(others)\".",
                     trash_by_queue(queues), "queue")
        yield GaugeMetricFamily("brokerd_smqp_trash_queues", "SMQP Trash queues holding messages.",
                                value=queues.get("trash_queues", len(queues["trash"])))

    links = snapshot.get("smqp_links") or []
    if links:
        def by_domain(figure: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
            return {link["domain"]: figure(link) for link in links}

        yield _gauge("brokerd_smqp_link_up", "1 while an SMQP server link is logged in, by domain.",
                     by_domain(lambda link: int(link["state"] == "up")), "domain")
        yield _counter("brokerd_smqp_link_messages_total",
                       "Messages an SMQP server link received (stored, or dropped as seen, looped or local-only), by domain.",
                       by_domain(lambda link: link["received"]), "domain")
        yield _counter("brokerd_smqp_link_logins_total", "Logins of an SMQP server link (1 + reconnections), by domain.",
                       by_domain(lambda link: link["connects"]), "domain")
        yield _counter("brokerd_smqp_link_refused_total",
                       "Subscriptions the other server refused to an SMQP link, by domain.",
                       by_domain(lambda link: link["refused"]), "domain")
        yield _counter("brokerd_smqp_link_sent_total",
                       "Messages an SMQP server link published on the other server, by domain.",
                       by_domain(lambda link: link.get("sent", 0)), "domain")
        yield _counter("brokerd_smqp_link_undeliverable_total",
                       "Messages the other server refused to an SMQP link (dropped), by domain.",
                       by_domain(lambda link: link.get("undeliverable", 0)), "domain")

    yield from _bridge_families(snapshot.get("mqtt_bridges") or {})
    mqtt = snapshot.get("mqtt")
    if mqtt is not None:
        yield GaugeMetricFamily("brokerd_mqtt_persistent_sessions",
                                "MQTT persistent sessions on the node (stored, or in memory without a store).",
                                value=mqtt["persistent_sessions"])
        yield _counter("brokerd_mqtt_quota_refusals_total",
                       "MQTT CONNECTs and subscriptions refused (or a v5 anonymous session made to end with "
                       "its connection) by a quota of persistent sessions, by quota.",
                       mqtt["refused"], "quota")

    store = snapshot.get("store")
    if store is not None:
        yield HistogramMetricFamily(
            "brokerd_store_commit_seconds", "Seconds per store transaction (BEGIN to COMMIT).",
            buckets=[("+Inf" if bound == float("inf") else repr(bound), count)
                     for bound, count in store["commit_seconds_buckets"]],
            sum_value=store["commit_seconds_sum"],
        )

    events = snapshot.get("event_log")
    if events is not None:
        yield GaugeMetricFamily("brokerd_event_log_backlog",
                                "Event-log records buffered on the reactor thread, not handed to the writer.",
                                value=events["backlog"])
        yield GaugeMetricFamily("brokerd_event_log_queued_batches",
                                "Event-log batches waiting for the writer thread.", value=events["queued_batches"])
        yield CounterMetricFamily("brokerd_event_log_written_total", "Event-log records written.",
                                  value=events["written"])
        yield CounterMetricFamily("brokerd_event_log_write_errors_total",
                                  "Event-log records lost to write errors.", value=events["lost"])
        yield CounterMetricFamily("brokerd_event_log_overflowed_total",
                                  "Event-log records dropped because the writer could not keep up.",
                                  value=events["overflowed"])
        yield GaugeMetricFamily("brokerd_event_log_failing", "1 while event-log writes fail.",
                                value=int(events["failing"]))

    cluster = snapshot.get("cluster")
    if cluster is not None:
        yield GaugeMetricFamily("brokerd_cluster_connected",
                                "1 while this node's connections to the cluster's Redis are up.",
                                value=cluster["connected"])
        yield CounterMetricFamily("brokerd_cluster_outages_total",
                                  "Times the cluster's Redis became unreachable.", value=cluster["outages"])
        yield GaugeMetricFamily("brokerd_cluster_nodes", "Nodes this node knows alive, itself included.",
                                value=cluster["nodes"])
        yield _counter("brokerd_cluster_messages_total", "Messages sent to and received from other nodes.",
                       {"sent": cluster["messages_sent"], "received": cluster["messages_received"]}, "direction")
        yield _counter("brokerd_cluster_dropped_total", "Messages for other nodes dropped, by reason.",
                       {"unreachable": cluster["dropped_unreachable"], "backlog": cluster["dropped_backlog"]},
                       "reason")
        yield _counter("brokerd_cluster_envelopes_received_total",
                       "Runs received from other nodes: delivered from the bytes the publishing node "
                       "rendered, or decoded and rendered here.",
                       {"rendered": cluster["envelopes_received"] - cluster["envelopes_decoded"],
                        "decoded": cluster["envelopes_decoded"]}, "how")
        yield CounterMetricFamily("brokerd_cluster_bad_envelopes_total",
                                  "Damaged messages from the cluster dropped.", value=cluster["bad_envelopes"])
        yield _counter("brokerd_cluster_rejected_total",
                       "Messages read on Redis and dropped before any decoding: not sealed by a node of this "
                       "cluster, sealed for another channel, replayed, stale, or sealed before this node "
                       "subscribed, by reason.",
                       cluster["rejected"], "reason")
        yield GaugeMetricFamily("brokerd_cluster_shards",
                                "Redis servers this node routes through (a Redis Cluster's masters; 1 otherwise).",
                                value=cluster["shards"])
        yield CounterMetricFamily("brokerd_cluster_redirects_total",
                                  "Redis Cluster redirections followed (MOVED, ASK, a slot's subscriptions moved).",
                                  value=cluster["redirects"])
        shared = dict(cluster["shared"])
        yield GaugeMetricFamily("brokerd_cluster_shared_pending",
                                "Messages sent to shared groups' members on other nodes, kept until those nodes answer.",
                                value=shared.pop("pending"))
        yield _counter("brokerd_cluster_shared_messages_total",
                       "Messages of shared groups between nodes: sent to another node's member, served here for "
                       "another node, placed again after a node died or had no member left, lost (no member left "
                       "anywhere), sent unkept (past --cluster-max-shared-pending).",
                       shared, "outcome")

    yield _gauge("brokerd_thread_pool_queue", "Work waiting for a thread, by pool.",
                 snapshot["thread_pools"], "pool")
    process = snapshot["process"]
    yield GaugeMetricFamily("brokerd_process_resident_memory_bytes", "Resident memory of the process.",
                            value=process["resident_memory_bytes"])
    if process["open_fds"] is not None:
        yield GaugeMetricFamily("brokerd_process_open_fds", "Open file descriptors.", value=process["open_fds"])
    yield GaugeMetricFamily("brokerd_process_max_fds", "The file descriptor limit (ulimit -n).",
                            value=process["max_fds"])


def _bridge_families(bridges: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """The MQTT bridges' state and counts, by bridge name (brokerd.protocols.mqtt.bridge)."""
    if not bridges:
        return

    def by_bridge(figure: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        return {name: figure(status) for name, status in bridges.items()}

    yield _gauge("brokerd_mqtt_bridge_up", "1 while an MQTT bridge is connected to the other broker, by bridge.",
                 by_bridge(lambda status: int(status["state"] == "up")), "bridge")
    yield _counter("brokerd_mqtt_bridge_connections_total",
                   "Connections of an MQTT bridge accepted by the other broker (1 + reconnections), by bridge.",
                   by_bridge(lambda status: status["connects"]), "bridge")
    messages = CounterMetricFamily("brokerd_mqtt_bridge_messages_total",
                                   "Messages an MQTT bridge sent to the other broker and received from it.",
                                   labels=["bridge", "direction"])
    for name, status in sorted(bridges.items()):
        messages.add_metric([name, "sent"], status["sent"])
        messages.add_metric([name, "received"], status["received"])
    yield messages
    yield _counter("brokerd_mqtt_bridge_dropped_total",
                   "Messages an MQTT bridge dropped: QoS 0 while the other broker was away, past max-queued, "
                   "by bridge.", by_bridge(lambda status: status["dropped"] + status["queue_dropped"]), "bridge")
    yield _counter("brokerd_mqtt_bridge_refused_total",
                   "Messages and subscriptions the other broker refused to an MQTT bridge, by bridge.",
                   by_bridge(lambda status: status["refused"]), "bridge")
    yield _gauge("brokerd_mqtt_bridge_queued_messages",
                 "QoS 1 and 2 messages an MQTT bridge keeps for the other broker (stored, not acknowledged).",
                 by_bridge(lambda status: status["queued"]), "bridge")
    yield _gauge("brokerd_mqtt_bridge_queued_bytes", "Bytes of those messages.",
                 by_bridge(lambda status: status["queued_bytes"]), "bridge")


class SnapshotCollector:
    """A prometheus_client collector over one snapshot, made per scrape."""

    def __init__(self, snapshot: dict[str, Any], queues: dict[str, Any] | None) -> None:
        self.snapshot = snapshot
        self.queues = queues

    def collect(self) -> Iterator[Metric]:
        return families(self.snapshot, self.queues)


def exposition(snapshot: dict[str, Any], queues: dict[str, Any] | None) -> bytes:
    """The text a Prometheus server scrapes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, queues))
    return generate_latest(registry)

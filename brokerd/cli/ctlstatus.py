"""``brokerd-ctl status``: the few lines an operator reads first, from two readings of
``/api/status`` (the rates are the difference between them); ``--json`` prints one reading
as it is, for scripts."""
from __future__ import annotations

from typing import Any


def _counts(by_name: dict[str, Any]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(by_name.items())) or "none"


def _rate(before: int, after: int, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    return f"{max(0, after - before) / seconds:.1f}/s"


def _uptime(seconds: float) -> str:
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds_left = divmod(rest, 60)
    return (f"{days}d " if days else "") + f"{hours:02d}:{minutes:02d}:{seconds_left:02d}"


def summary(before: dict[str, Any], after: dict[str, Any], seconds: float) -> str:
    """The status summary: one line each for the broker, its connections, messages, queues,
    MQTT bridges (when it has some) and cluster."""
    connections = after["connections"]
    messages, earlier = after["messages"], before["messages"]
    lines = [
        f"brokerd {after['version']}, up {_uptime(after['uptime_seconds'])}",
        f"connections: {connections['open']} open ({_counts(connections['by_protocol'])}), "
        f"{connections['refused']} refused",
        f"sessions: {_counts(after['sessions'])}; {after['topics']} topics, "
        f"{after['subscriptions']} subscriptions",
        f"messages: {_rate(earlier['accepted'], messages['accepted'], seconds)} accepted, "
        f"{_rate(earlier['delivered'], messages['delivered'], seconds)} delivered "
        f"(totals {messages['accepted']} and {messages['delivered']}"
        + (f", over {seconds:.1f} s)" if seconds > 0 else ")"),
    ]
    dropped = {reason: count for reason, count in after["dropped"].items() if count}
    lines.append(f"dropped: {_counts(dropped)}; slow consumers now: {after['slow_consumers']}")
    queues = after.get("smqp_queues")
    if queues is None:
        lines.append("SMQP queues: no store")
    else:
        trash = sum(queues.get("trash", {}).values())
        lines.append(f"SMQP queues: {queues['pending']} pending, {queues['unacknowledged']} unacknowledged, "
                     f"{trash} in trash")
    bridges = after.get("mqtt_bridges") or {}
    if bridges:
        lines.append("MQTT bridges: " + "; ".join(
            f"{name} {b['state']} (sent {b['sent']}, received {b['received']}, queued {b['queued']}, "
            f"dropped {b['dropped'] + b['queue_dropped']})" for name, b in sorted(bridges.items())))
    cluster = after.get("cluster")
    if cluster is None:
        lines.append("cluster: single node")
    else:
        lines.append(f"cluster: node {cluster['node']}, {cluster['nodes']} nodes alive")
    onions = after.get("onion_services") or []
    if onions:
        lines.append("onion services: " + ", ".join(
            f"{onion['address']}:{onion['port']}" + (" (TLS)" if onion["tls"] else "") for onion in onions))
    return "\n".join(lines) + "\n"

"""deploy/grafana-dashboard.json asks only for what a real broker's /metrics (from its admin
listener) has: every metric and every label its expressions name.  The cluster's metrics
exist only with --cluster: tests/deploy/test_compose.py checks them on a cluster node."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.admin.support import http
from tests.deploy.dashboard import DASHBOARD, cluster_only, expressions, missing, wanted
from tests.support.broker import LineClient, start_broker

pytestmark = pytest.mark.slow


def metrics_with_traffic(ports: dict[str, int]) -> str:
    """/metrics while two sessions are logged in, after a refused login and a message
    between the two: the per-protocol series are there."""
    refused = LineClient.connect(ports["ssmp"])
    assert refused.request("LOGIN mallory secret guess").startswith(b"401")
    refused.close()
    alice, bob = LineClient.connect(ports["ssmp"]), LineClient.connect(ports["ssmp"])
    try:
        assert alice.request("LOGIN alice open").startswith(b"200")
        assert alice.request("SUBSCRIBE news").startswith(b"200")
        assert bob.request("LOGIN bob open").startswith(b"200")
        assert bob.request("MCAST news hello").startswith(b"200")
        assert alice.line() == b"000 bob MCAST news hello"
        metrics = http(ports["admin"], "GET", "/metrics")
    finally:
        alice.close()
        bob.close()
    assert metrics.status == 200
    return metrics.body.decode()


def test_every_metric_the_dashboard_queries_is_on_a_brokers_metrics(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "brokerd" and dashboard["panels"]
    queries = expressions(dashboard)
    single_node = [expression for expression in queries if not cluster_only(expression)]
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    cluster_panels = [target["expr"] for panel in dashboard["panels"]
                      if panel["type"] != "row" and panel["gridPos"]["y"] > _row_y(dashboard, "Cluster (--cluster)")
                      for target in panel["targets"]]
    assert "Cluster (--cluster)" in rows and set(queries) - set(single_node) == set(cluster_panels)
    broker = start_broker(tmp_path, "--open-login", listeners={
        protocol: "tcp:{port}:interface=127.0.0.1" for protocol in ("ssmp", "smqp", "mqtt", "mcchat", "socketmq", "admin")})
    try:
        text = metrics_with_traffic(broker.ports)
    finally:
        broker.stop()
    assert missing(single_node, text) == []
    assert len({metric for expression in single_node for metric in wanted(expression)}) >= 30
    # positive control: an unknown metric and an unknown label are found
    assert missing(["rate(brokerd_messages_lost_total[5m])", "sum by (colour) (brokerd_connections)"], text) == [
        "brokerd_messages_lost_total: no such metric (rate(brokerd_messages_lost_total[5m]))",
        "brokerd_connections: no label ['colour'] (sum by (colour) (brokerd_connections))"]


def _row_y(dashboard: dict, title: str) -> int:
    return next(panel["gridPos"]["y"] for panel in dashboard["panels"] if panel.get("title") == title)

"""What deploy/grafana-dashboard.json asks Prometheus for, and whether a broker's /metrics
has it: every ``brokerd_*`` metric an expression names, and every label it groups or
filters by (``instance`` and ``job`` are Prometheus's own, added at scrape time)."""
from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.support import DEPLOY

DASHBOARD = DEPLOY / "grafana-dashboard.json"
METRIC = re.compile(r"\bbrokerd_[a-z0-9_]+")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")
SCRAPE_LABELS = {"instance", "job"}


def expressions(dashboard: dict[str, Any] | None = None) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables'."""
    if dashboard is None:
        dashboard = json.loads(DASHBOARD.read_text())
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]
    for variable in dashboard.get("templating", {}).get("list", ()):
        query = variable.get("query")
        if isinstance(query, dict) and "query" in query:
            found.append(query["query"])
    return found


def wanted(expression: str) -> dict[str, set[str]]:
    """metric -> the labels the expression needs it to carry."""
    labels = {label.strip() for group in GROUPING.findall(expression) for label in group.split(",") if label.strip()}
    for matchers in MATCHER.findall(expression):
        labels |= {matcher.split("=")[0].strip(" !~") for matcher in matchers.split(",") if "=" in matcher}
    labels -= SCRAPE_LABELS
    return {metric: {label for label in labels if label != "le" or metric.endswith("_bucket")}
            for metric in METRIC.findall(expression)}


def exposed(metrics_text: str) -> dict[str, set[str]]:
    """sample name -> the label names its samples carry, from /metrics (a family declared
    without samples yet counts, with no labels)."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics_text):
        found.setdefault(family.name, set())
        if family.type == "counter":
            found.setdefault(family.name + "_total", set())
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def missing(expressions_: list[str], metrics_text: str) -> list[str]:
    """One line per metric or label an expression needs that /metrics does not have."""
    have = exposed(metrics_text)
    problems = []
    for expression in expressions_:
        for metric, labels in wanted(expression).items():
            if metric not in have:
                problems.append(f"{metric}: no such metric ({expression})")
            elif labels - have[metric]:
                problems.append(f"{metric}: no label {sorted(labels - have[metric])} ({expression})")
    return problems


def cluster_only(expression: str) -> bool:
    """An expression of the cluster's metrics only (they exist with --cluster only)."""
    return all(metric.startswith("brokerd_cluster_") for metric in wanted(expression))

"""The rounds and the summary of the in-process CPU benchmarks (mqtt_cpu.py, durable_cpu.py).

Every revision is measured in turn, round after round, in fresh processes, so that they share
the machine's state; the summary gives per workload each revision's best and median and the
best's change from the first revision's.
"""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path

Figures = dict[str, dict[str, list[float]]]
"""revision -> workload -> the figure of each round."""


def measure_rounds(trees: dict[str, Path], rounds: int, unit: str,
                   run: Callable[[Path], dict[str, float]]) -> Figures:
    """``run(tree)`` (workload -> figure) for every revision's tree, ``rounds`` times over,
    each round's figures printed as they come."""
    seen: Figures = {rev: {} for rev in trees}
    print(f"load average at the start: {_load()}", flush=True)
    for round_ in range(rounds):
        for rev, tree in trees.items():
            result = run(tree)
            for kind, value in result.items():
                seen[rev].setdefault(kind, []).append(value)
            print(f"round {round_ + 1} {rev}: " + ", ".join(f"({k}) {v:.0f} {unit}" for k, v in result.items()),
                  flush=True)
    print(f"load average at the end: {_load()}")
    return seen


def report(seen: Figures, unit: str) -> None:
    """One line per workload: each revision's best and median, the change of its best."""
    base = next(iter(seen))
    for kind in seen[base]:
        cells = []
        for rev in seen:
            best, median = min(seen[rev][kind]), statistics.median(seen[rev][kind])
            change = "" if rev == base else f" ({(best / min(seen[base][kind]) - 1) * 100:+.1f} %)"
            cells.append(f"{rev} best {best:.0f} {unit}, median {median:.0f} {unit}{change}")
        print(f"({kind}) " + " | ".join(cells))


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())

"""The rounds and the summary of the in-process CPU benchmarks (mqtt_cpu.py, durable_cpu.py).

Every revision is measured in turn, round after round, in fresh processes, so that they share
the machine's state; the summary gives per workload each revision's best and median and the
best's change from the first revision's.
"""
from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from ssmp_cpu import REPO, export

Figures = dict[str, dict[str, list[float]]]
"""revision -> workload -> the figure of each round."""
RunTree = Callable[[Path, list[str], int, bool], dict[str, float]]
"""``run_tree(tree, workloads, messages, counting)``: workload -> figure, of one revision."""


def main(description: str, run_tree: RunTree, workloads: str, messages: tuple[int, int],
         also: str = "", per: str = "messages") -> None:
    """The command line of such a benchmark: ``--commit`` (repeatable), ``--only``,
    ``--rounds``, ``--messages`` (``messages``: timed, counted) and ``--instructions``; then
    the rounds and the summary."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", metavar="REV", action="append", help="repeatable [the working tree]")
    parser.add_argument("--only", default=workloads, help=f"workloads [{workloads}]{also}")
    parser.add_argument("--rounds", type=int, help="rounds over all revisions [5; 1 with --instructions]")
    parser.add_argument("--messages", type=int,
                        help=f"{per} per repetition [{messages[0]}; {messages[1]} with --instructions]")
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    options = parser.parse_args()
    counting = options.instructions
    rounds = options.rounds or (1 if counting else 5)
    count = options.messages or messages[counting]
    trees = {rev: export(rev) for rev in options.commit or []} or {"working tree": REPO}
    kinds = options.only.split(",")
    unit = "instructions" if counting else "ns"
    report(measure_rounds(trees, rounds, unit, lambda tree: run_tree(tree, kinds, count, counting)), unit)


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

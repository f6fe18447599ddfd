"""``python -m tests.fuzz.campaign --seconds SECONDS --work DIR [--merge] [TARGET ...]``: fuzz
the targets one after the other (one process at a time, ``nice -n 19``), SECONDS each, and
print each one's figures (executions, libFuzzer's ``cov:`` and ``ft:``, corpus, findings) as
the table in docs/testing.md.  ``--merge`` then adds to the repository's corpus the inputs
that reach code it does not (``-set_cover_merge=1``: a small set that has every feature the
run reached, named by content hash)."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.fuzz.corpus import TARGETS, directory

REPO = Path(__file__).resolve().parents[2]
MAX_LEN = 4096
"""Bytes of one input at most: above every limit the targets set, so every limit is reached."""
OPTIONS = [f"-max_len={MAX_LEN}", "-timeout=10", "-rss_limit_mb=1024", "-print_final_stats=1"]
"""Every run: a 10 s input is a hang, 1 GB of memory a leak."""
_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)", re.M)
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
FINDINGS = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")


def command(target: str, *arguments: str) -> list[str]:
    return ["nice", "-n", "19", sys.executable, "-m", "tests.fuzz", target, *OPTIONS, *arguments]


def figures(log: str) -> dict[str, Any]:
    """The last status line's figures and the final statistics of a libFuzzer log."""
    found: dict[str, Any] = {}
    statuses = _STATUS.findall(log)
    if statuses:
        runs, cov, ft, units, size = statuses[-1]
        found.update(runs=int(runs), cov=int(cov), ft=int(ft), corpus_units=int(units), corpus_size=size)
    found.update({name: int(value) for name, value in _STAT.findall(log)})
    return found


def run(target: str, seconds: int, work: Path) -> dict[str, Any]:
    out = work / target
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = subprocess.run(
        command(target, f"-max_total_time={seconds}", f"-artifact_prefix={out}/", str(out / "corpus"),
                str(directory(target))),
        cwd=REPO, capture_output=True, text=True, errors="replace", timeout=seconds + 300,
    )
    (work / f"{target}.log").write_text(result.stderr + result.stdout)
    found = figures(result.stderr)
    found.update(target=target, seconds=round(time.monotonic() - started), exit=result.returncode,
                 findings=sorted(path.name for path in out.iterdir() if path.name.startswith(FINDINGS)))
    return found


def merge(target: str, work: Path) -> int:
    """Add to the repository's corpus what the run found that reaches new code; how many."""
    before = len(list(directory(target).iterdir()))
    subprocess.run(command(target, "-set_cover_merge=1", str(directory(target)), str(work / target / "corpus")),
                   cwd=REPO, capture_output=True, check=True, timeout=1800)
    return len(list(directory(target).iterdir())) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=360)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--merge", action="store_true")
    parser.add_argument("targets", nargs="*", default=list(TARGETS))
    options = parser.parse_args()
    options.work.mkdir(parents=True, exist_ok=True)
    print("| target | executions | exec/s | cov | ft | corpus (units/bytes) | findings | kept |", flush=True)
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for target in options.targets:
        found = run(target, options.seconds, options.work)
        if options.merge and not found["findings"]:
            found["kept"] = merge(target, options.work)
        with open(options.work / "summary.jsonl", "a") as summary:
            summary.write(json.dumps(found) + "\n")
        print(f"| {target} | {found.get('number_of_executed_units', found.get('runs'))} "
              f"| {found.get('average_exec_per_sec')} | {found.get('cov')} | {found.get('ft')} "
              f"| {found.get('corpus_units')}/{found.get('corpus_size')} | {', '.join(found['findings']) or 'none'} "
              f"| {found.get('kept', '-')} |", flush=True)


if __name__ == "__main__":
    main()

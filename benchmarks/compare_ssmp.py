"""brokerd against the minimal Twisted SSMP server (benchmarks/minimal_ssmp.py), side by side.

For each workload all servers (brokerd of each revision in ``--commits``, and the minimal
server) run at once on their own ports (idle while another is measured) and are measured
alternately: one warm-up each at N/10, then ``--runs`` rounds of each in turn.  Reported per server: deliveries/s and the server's CPU per
delivered message (utime + stime of the process over the run, from /proc: on a shared machine
this is the steadier figure), medians of the rounds; the ratio is brokerd / minimal for
throughput, minimal / brokerd for CPU (so >= 0.9 means brokerd is within 10 %).

    python benchmarks/compare_ssmp.py                    # (a), (c), (d); about 3 minutes
    python benchmarks/compare_ssmp.py --only d --runs 5
    python benchmarks/compare_ssmp.py --commits main,HEAD # two brokerd revisions and the minimal server
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_ssmp import (  # noqa: E402
    DEFAULT_BROKER_CMD,
    DEFAULT_CACHE_DIR,
    DEFAULT_PBLOAD_SRC,
    REPO,
    WORKLOADS,
    BrokerProcess,
    build_pbload,
    export_commit,
    run_pbload,
)

MINIMAL_CMD = f"{sys.executable} {REPO / 'benchmarks' / 'minimal_ssmp.py'} {{port}}"
SCALE = 5
"""N is 5x the bench README's, as run_ssmp.py does for saturation runs."""


def revisions(spec: str, work: Path) -> list[tuple[str, dict[str, str]]]:
    """(label, environment) of a brokerd for each comma-separated revision of ``spec``:
    ``.`` is the working tree, anything else is exported into ``work`` (run_ssmp.export_commit)
    and put first on PYTHONPATH."""
    brokers = []
    for index, revision in enumerate(spec.split(",")):
        env = {"PYTHONPATH": str(REPO)}
        label = "working tree"
        if revision != ".":
            into = work / f"rev{index}"
            into.mkdir()
            commit, source = export_commit(revision, into)
            env["PYTHONPATH"] = os.pathsep.join([str(source), str(REPO)])
            label = f"{revision} ({commit[:7]})"
        brokers.append((label, env))
    return brokers


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(binary: Path, server: BrokerProcess, args: list[str], timeout: float) -> dict[str, Any]:
    before = cpu_seconds(server.pid)
    run = run_pbload(binary, server.port, args, timeout)
    used = cpu_seconds(server.pid) - before
    result = run.result
    delivered = result.get("delivered", 0)
    return {
        "ok": run.returncode == 0 and delivered == result.get("expected"),
        "deliv_per_s": result.get("deliv_per_s", 0.0),
        "cpu_us_per_msg": 1e6 * used / delivered if delivered else float("inf"),
        "gen_cpu_pct": result.get("gen_cpu_pct", 0.0),
        "load": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="a,c,d", help="workloads of run_ssmp.py [a,c,d]")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=SCALE, help="N multiplier [5]")
    parser.add_argument("--commits", default=".", help="brokerd revisions, comma-separated; '.' is the working tree [.]")
    parser.add_argument("--broker-cmd", default=DEFAULT_BROKER_CMD + " --no-event-log",
                        help="brokerd's command ({port}, {data_dir}, {twistd}); the event log is off by default")
    parser.add_argument("--timeout", type=float, default=300.0)
    opts = parser.parse_args(argv)
    binary = build_pbload(DEFAULT_PBLOAD_SRC, DEFAULT_CACHE_DIR)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="brokerd-compare-") as tmp:
        work = Path(tmp)
        brokers = {f"brokerd {label}": env for label, env in revisions(opts.commits, work)}
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        print(f"machine at the start: {uptime}", flush=True)
        rows = []
        for name in opts.only.split(","):
            workload = WORKLOADS[name]
            n = max(10, int(workload.n * opts.scale))
            args = [*workload.args, "-N", str(n)]
            warm = [*workload.args, "-N", str(max(10, n // 10))]
            servers = {label: BrokerProcess(opts.broker_cmd, work, f"b{i}-{name}", env)
                       for i, (label, env) in enumerate(brokers.items())}
            servers["minimal"] = BrokerProcess(MINIMAL_CMD, work, f"minimal-{name}")
            results: dict[str, list[dict[str, Any]]] = {key: [] for key in servers}
            try:
                for server in servers.values():
                    server.__enter__()
                for server in servers.values():
                    measure(binary, server, warm, opts.timeout)
                for round_number in range(opts.runs):
                    for key, server in servers.items():
                        record = measure(binary, server, args, opts.timeout)
                        results[key].append(record)
                        failures += not record["ok"]
                        print(f"  {name} round {round_number + 1} {key}: {record['deliv_per_s'] / 1e3:.0f}k deliveries/s, "
                              f"{record['cpu_us_per_msg']:.2f} us CPU/msg, load {record['load']:.1f}"
                              f"{'' if record['ok'] else '  [LOST MESSAGES]'}", flush=True)
            finally:
                for server in servers.values():
                    server.__exit__()
            median = {key: {field: statistics.median(r[field] for r in runs)
                            for field in ("deliv_per_s", "cpu_us_per_msg", "load")}
                      for key, runs in results.items()}
            rows.append((workload.title, n, median))
        print(f"\nmedian of {opts.runs} alternating rounds after a warm-up\n")
        print("| workload | N/pub | server | deliveries/s | ratio to minimal | CPU µs/msg | "
              "CPU ratio (minimal/server) | load |")
        print("|---|---|---|---|---|---|---|---|")
        for title, n, median in rows:
            m = median["minimal"]
            for key, b in median.items():
                print(f"| {title} | {n:,} | {key} | {b['deliv_per_s'] / 1e3:.0f}k | "
                      f"{b['deliv_per_s'] / m['deliv_per_s']:.2f} | {b['cpu_us_per_msg']:.2f} | "
                      f"{m['cpu_us_per_msg'] / b['cpu_us_per_msg']:.2f} | {b['load']:.1f} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

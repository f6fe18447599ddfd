"""brokerd against the minimal Twisted SSMP server (benchmarks/minimal_ssmp.py), side by side.

For each workload both servers run at once on their own ports (idle while the other is
measured) and are measured alternately: one warm-up each at N/10, then ``--runs`` rounds of
brokerd then the minimal server.  Reported per server: deliveries/s and the server's CPU per
delivered message (utime + stime of the process over the run, from /proc: on a shared machine
this is the steadier figure), medians of the rounds; the ratio is brokerd / minimal for
throughput, minimal / brokerd for CPU (so >= 0.9 means brokerd is within 10 %).

    python benchmarks/compare_ssmp.py                    # (a), (c), (d); about 3 minutes
    python benchmarks/compare_ssmp.py --only d --runs 5
    python benchmarks/compare_ssmp.py --commit HEAD~3     # brokerd of another commit
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
    parser.add_argument("--commit", help="measure brokerd of this revision instead of the working tree")
    parser.add_argument("--broker-cmd", default=DEFAULT_BROKER_CMD + " --no-event-log",
                        help="brokerd's command ({port}, {data_dir}, {twistd}); the event log is off by default")
    parser.add_argument("--timeout", type=float, default=300.0)
    opts = parser.parse_args(argv)
    binary = build_pbload(DEFAULT_PBLOAD_SRC, DEFAULT_CACHE_DIR)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="brokerd-compare-") as tmp:
        work = Path(tmp)
        env = {"PYTHONPATH": str(REPO)}
        label = "working tree"
        if opts.commit:
            commit, source = export_commit(opts.commit, work)
            env["PYTHONPATH"] = os.pathsep.join([str(source), str(REPO)])
            label = commit[:7]
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        print(f"brokerd: {label}; machine at the start: {uptime}", flush=True)
        rows = []
        for name in opts.only.split(","):
            workload = WORKLOADS[name]
            n = max(10, int(workload.n * opts.scale))
            args = [*workload.args, "-N", str(n)]
            warm = [*workload.args, "-N", str(max(10, n // 10))]
            results: dict[str, list[dict[str, Any]]] = {"brokerd": [], "minimal": []}
            with BrokerProcess(opts.broker_cmd, work, f"brokerd-{name}", env) as brokerd, \
                    BrokerProcess(MINIMAL_CMD, work, f"minimal-{name}") as minimal:
                servers = {"brokerd": brokerd, "minimal": minimal}
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
            median = {key: {field: statistics.median(r[field] for r in runs)
                            for field in ("deliv_per_s", "cpu_us_per_msg", "load")}
                      for key, runs in results.items()}
            rows.append((workload.title, n, median))
        print(f"\nmedian of {opts.runs} alternating rounds after a warm-up\n")
        print("| workload | N/pub | brokerd deliveries/s | minimal deliveries/s | ratio | "
              "brokerd CPU µs/msg | minimal CPU µs/msg | CPU ratio (minimal/brokerd) | load |")
        print("|---|---|---|---|---|---|---|---|---|")
        for title, n, median in rows:
            b, m = median["brokerd"], median["minimal"]
            print(f"| {title} | {n:,} | {b['deliv_per_s'] / 1e3:.0f}k | {m['deliv_per_s'] / 1e3:.0f}k | "
                  f"{b['deliv_per_s'] / m['deliv_per_s']:.2f} | {b['cpu_us_per_msg']:.2f} | "
                  f"{m['cpu_us_per_msg']:.2f} | {m['cpu_us_per_msg'] / b['cpu_us_per_msg']:.2f} | {b['load']:.1f} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

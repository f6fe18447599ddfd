"""SSMP's tail under steady load: the bench README's fixed-rate (b), side by side with Redis.

One publisher sends 500 MCASTs/s for 5 s to 50 subscribers of one topic (25,000 deliveries/s);
pbload stamps each payload with its send time and takes p50 and p99 of publish-to-receipt over
every delivery.  Each brokerd revision (``--commits``, default ``HEAD``; ``.`` is the working
tree) runs as ``twistd brokerd`` in its default configuration (event log on), and redis-server
(no persistence) runs the same workload over PUBLISH/SUBSCRIBE as the reference, and so does
nats-server (PUB/SUB, Debian's ``nats-server``) when it is installed.  Every server
gets its own process; the servers alternate, round after round: one warm-up round (N/10), then
``--runs`` measured rounds; the median of the rounds' p50 and p99 is printed with the load
average before each round and the server's CPU per delivery.

    python benchmarks/ssmp_tail.py                          # HEAD, redis and nats, ~1 minute
    python benchmarks/ssmp_tail.py --commits main,. --runs 5
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ssmp import cpu_seconds, revisions  # noqa: E402
from run_ssmp import (  # noqa: E402
    DEFAULT_BROKER_CMD, DEFAULT_CACHE_DIR, DEFAULT_PBLOAD_SRC, BrokerProcess, build_pbload, free_port, loadavg,
    run_pbload,
)

WORKLOAD = ["-P", "1", "-S", "50", "--rate", "500"]
MESSAGES = 2500


class ReferenceServer:
    """A reference server (``binary``, from the machine's packages) on a free loopback port,
    started for the run and stopped after it; a subclass says how to start it and when it is
    ready."""

    binary = ""
    package = ""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.pid = 0

    def command(self, binary: str) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def __enter__(self) -> ReferenceServer:
        binary = shutil.which(self.binary)
        if binary is None:
            raise SystemExit(f"ssmp_tail: {self.binary} is not installed (apt-get install {self.package})")
        self.proc = subprocess.Popen(self.command(binary), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not self.ready():
            if time.monotonic() > deadline:
                raise SystemExit(f"ssmp_tail: {self.binary} did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class RedisProcess(ReferenceServer):
    """redis-server, no persistence: the reference."""

    binary = package = "redis-server"

    def command(self, binary: str) -> list[str]:
        return [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir)]

    def ready(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() == b"PONG"


class NatsProcess(ReferenceServer):
    """nats-server (no JetStream): the other reference."""

    binary = package = "nats-server"

    def command(self, binary: str) -> list[str]:
        return [binary, "-a", "127.0.0.1", "-p", str(self.port)]

    def ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True


def one_run(binary: Path, server: object, proto: str, messages: int, timeout: float) -> dict[str, float]:
    load = loadavg()[0]
    before = cpu_seconds(server.pid)  # type: ignore[attr-defined]
    run = run_pbload(binary, server.port, ["--proto", proto, *WORKLOAD, "-N", str(messages)], timeout)  # type: ignore[attr-defined]
    used = cpu_seconds(server.pid) - before  # type: ignore[attr-defined]
    result = run.result
    delivered = result.get("delivered", 0)
    if delivered != result.get("expected"):
        raise SystemExit(f"ssmp_tail: {proto} delivered {delivered} of {result.get('expected')}: {result}")
    return {"p50_ms": result["p50_us"] / 1000, "p99_ms": result["p99_us"] / 1000, "load": load,
            "cpu_us_per_delivery": used * 1e6 / delivered, "gen_cpu_pct": result.get("gen_cpu_pct", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", default="HEAD", help="brokerd revisions, comma-separated; . = working tree")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-redis", action="store_true", help="no redis-server")
    parser.add_argument("--no-nats", action="store_true", help="no nats-server (left out anyway when not installed)")
    parser.add_argument("--broker-cmd", default=DEFAULT_BROKER_CMD)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    binary = build_pbload(DEFAULT_PBLOAD_SRC, DEFAULT_CACHE_DIR)
    with tempfile.TemporaryDirectory(prefix="ssmp-tail-") as scratch:
        work = Path(scratch)
        servers: list[tuple[str, str, object]] = []
        for label, env in revisions(args.commits, work):
            servers.append((f"brokerd {label}", "ssmp", BrokerProcess(args.broker_cmd, work, str(len(servers)), env)))
        if not args.no_redis:
            servers.append(("redis-server", "redis", RedisProcess(work)))
        if not args.no_nats and shutil.which("nats-server") is not None:
            servers.append(("nats-server", "nats", NatsProcess(work)))
        results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in servers}
        try:
            for _, _, server in servers:
                server.__enter__()  # type: ignore[attr-defined]
            for round_number in range(args.runs + 1):
                order = servers if round_number % 2 == 0 else list(reversed(servers))
                for label, proto, server in order:
                    messages = MESSAGES // 10 if round_number == 0 else MESSAGES
                    figures = one_run(binary, server, proto, messages, args.timeout)
                    print(json.dumps({"server": label, "round": round_number, **figures}), flush=True)
                    if round_number:
                        results[label].append(figures)
        finally:
            for _, _, server in servers:
                server.__exit__()  # type: ignore[attr-defined]
    print(f"\nfixed rate (b): 1 -> 50 at 500/s, median of {args.runs} after a warm-up ({os.cpu_count()} CPUs)")
    print("| server | p50 ms | p99 ms (runs) | CPU per delivery | load at each start |")
    print("|---|---|---|---|---|")
    for label, runs in results.items():
        p99s = ", ".join(f"{run['p99_ms']:.2f}" for run in runs)
        loads = ", ".join(f"{run['load']:.1f}" for run in runs)
        print(f"| {label} | {statistics.median(r['p50_ms'] for r in runs):.2f} | "
              f"{statistics.median(r['p99_ms'] for r in runs):.2f} ({p99s}) | "
              f"{statistics.median(r['cpu_us_per_delivery'] for r in runs):.1f} us | {loads} |")


if __name__ == "__main__":
    main()

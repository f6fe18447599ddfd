"""Benchmarks of the event log and the data pipeline (a script, not a test).

    python benchmarks/pipeline_bench.py log-cost [--runs 3] [--messages 20000] [--subscribers 50] [--rate R]
        SSMP fan-out throughput (pbload, ../shared/bench/pbload.c or --pbload) and broker CPU per
        message of two brokers, without and with the event log, in ABBA order; medians of --runs
        runs each; then each broker's CPU while idle.
    python benchmarks/pipeline_bench.py report [--events 10000000] [--data-dir DIR] [--out DIR] [--engine E]
                                               [--master URL] [--conf KEY=VALUE ...] [--tree DIR]
        Generate a log of --events events (kept in --data-dir for reuse) and time
        ``brokerd-report`` on it: a first report (compacting every hour) and a second one with
        no new data (reading the Parquet only); --baseline: first one on the raw JSON;
        --engine, --master and --conf are passed to brokerd-report; --tree: the brokerd checkout
        whose pipeline is timed (another commit's worktree, for side-by-side runs; its driver and
        the executors of a cluster import brokerd from there) [this one].
    python benchmarks/pipeline_bench.py serve --port P --data-dir DIR [--event-log]
        (internal) the broker the log-cost runs use.

Both print one JSON line per result and the machine's load (other people share it).
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
import threading
import time
from pathlib import Path

from run_ssmp import DEFAULT_CACHE_DIR, DEFAULT_PBLOAD_SRC, build_pbload, free_port, loadavg, proc_schedstat

ROOT = Path(__file__).resolve().parent.parent
SETTLE_SECONDS = 2.5
"""Pause before each measured run: more than the event log's flush interval (1 s) plus its write."""
IDLE_SECONDS = 10.0
"""How long each broker's CPU is measured with no traffic, after the runs."""


def _load() -> str:
    return " ".join(map(str, loadavg()))


def serve(port: int, data_dir: str, event_log: bool) -> None:
    """Run an SSMP broker in this process exactly as ``twistd brokerd`` builds it, with the
    event log on (the default) or off (``--no-event-log``)."""
    from twisted.internet import reactor

    from brokerd.config import Settings
    from brokerd.tap import makeService

    settings = Settings(
        listeners={"ssmp": [f"tcp:{port}:interface=127.0.0.1"]},
        open_login=True,
        data_dir=Path(data_dir),
        event_log=event_log,
    )
    service = makeService(settings, reactor)
    log = service.runtime.broker.observer
    service.startService()

    def stop():
        def report(_result: object) -> None:
            if log is not None:  # after the log's last batch is written
                sys.stderr.write(json.dumps({"event_log": log.stats()}) + "\n")

        return service.stopService().addCallback(report)

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    reactor.run()


def _cpu_ns(pid: int) -> int:
    """CPU time (ns) all threads of process ``pid`` have used, the event log's writer
    included (scheduler clocks, nanosecond resolution)."""
    clocks = proc_schedstat(pid)
    if clocks is None:
        raise SystemExit(f"broker process {pid} is gone")
    return clocks[0]


def _wait_for(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"broker on port {port} did not start")


def _pbload(path: str | None) -> str:
    return path or str(build_pbload(DEFAULT_PBLOAD_SRC, DEFAULT_CACHE_DIR))


def log_cost(args: argparse.Namespace) -> None:
    """Both brokers run at once and the runs alternate (off, on, on, off, ...), so drifting
    load from other users of the machine hits both alike."""
    pbload = _pbload(args.pbload)
    modes = ("off", "on")
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    events: dict[str, object] = {}
    idle_ms_per_s: dict[str, float] = {}
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            for mode in modes:
                port = free_port()
                command = [sys.executable, __file__, "serve", "--port", str(port),
                           "--data-dir", str(Path(scratch) / mode)]
                if mode != "off":
                    command.append("--event-log")
                servers[mode] = (subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True), port)
            for mode, (_server, port) in servers.items():
                _wait_for(port)
                warm_up = _load_command(pbload, port, args.subscribers, max(1, args.messages // 10))
                subprocess.run(warm_up, check=True, capture_output=True)
            for round_ in range(args.runs):
                # ABBA order: whichever broker runs second in a round is not always the same
                order = list(servers.items()) if round_ % 2 == 0 else list(reversed(servers.items()))
                for mode, (server, port) in order:
                    # a log's writer finishes its last batch up to a flush interval after the
                    # run: wait it out, so it never runs during the next broker's measurement,
                    # and count its CPU time with the run that caused it
                    time.sleep(SETTLE_SECONDS)
                    before = _cpu_ns(server.pid)
                    command = _load_command(pbload, port, args.subscribers, args.messages, args.rate)
                    out = subprocess.run(command, check=True, capture_output=True, text=True)
                    results[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["deliv_per_s"])
                    time.sleep(SETTLE_SECONDS)
                    cpu[mode].append((_cpu_ns(server.pid) - before) / args.messages / 1000)
            for mode, (server, _port) in servers.items():  # what each costs doing nothing
                before = _cpu_ns(server.pid)
                time.sleep(IDLE_SECONDS)
                idle_ms_per_s[mode] = (_cpu_ns(server.pid) - before) / IDLE_SECONDS / 1e6
        finally:
            for mode, (server, _port) in servers.items():
                server.terminate()
                _out, err = server.communicate(timeout=30)
                for line in err.splitlines():
                    if line.startswith('{"event_log"'):
                        events[mode] = json.loads(line)["event_log"]
    off = statistics.median(results["off"])
    summary: dict[str, object] = {
        "benchmark": "event-log cost, SSMP fan-out",
        "workload": f"pbload --proto ssmp -P 1 -S {args.subscribers} -N {args.messages}"
        + (f" --rate {args.rate}" if args.rate else ""),
    }
    cpu_off = statistics.median(cpu["off"])
    for mode in modes:
        median = statistics.median(results[mode])
        summary[f"deliveries_per_s_{mode}"] = round(median)
        summary[f"runs_{mode}"] = [round(x) for x in results[mode]]
        summary[f"broker_cpu_us_per_msg_{mode}"] = round(statistics.median(cpu[mode]), 2)
        summary[f"cpu_runs_{mode}"] = [round(x, 2) for x in cpu[mode]]
        summary[f"idle_cpu_ms_per_s_{mode}"] = round(idle_ms_per_s[mode], 3)
        if mode != "off":
            summary[f"loss_pct_{mode}"] = round(100 * (off - median) / off, 1)
            summary[f"cpu_overhead_pct_{mode}"] = round(100 * (statistics.median(cpu[mode]) - cpu_off) / cpu_off, 1)
    summary["event_log"] = events
    summary["load"] = _load()
    print(json.dumps(summary))


def _load_command(pbload: str, port: int, subscribers: int, messages: int, rate: int | None = None) -> list[str]:
    command = [pbload, "--proto", "ssmp", "--port", str(port), "-P", "1", "-S", str(subscribers), "-N", str(messages)]
    return command + ["--rate", str(rate)] if rate else command


class _TreeCPU:
    """CPU time (user + system) of a process and all its descendants (the report's Python
    driver and its JVM), sampled from /proc while it runs: a figure the machine's other load
    inflates far less than wall time."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())

    def __enter__(self) -> _TreeCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while True:
            parents: dict[int, int] = {}
            times: dict[int, float] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    parents[int(entry)] = int(fields[1])
                    times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
            tree, grew = {self.pid}, True
            while grew:
                grew = False
                for pid, parent in parents.items():
                    if parent in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            for pid in tree:
                if pid in times:
                    self.seen[pid] = max(self.seen.get(pid, 0.0), times[pid])
            if self._stop.wait(self.interval):
                return


def report_bench(args: argparse.Namespace) -> None:
    from brokerd.pipeline.generate import generate

    data_dir = Path(args.data_dir)
    marker = data_dir / f".generated-{args.events}"
    if not marker.exists():
        started = time.monotonic()
        generate(data_dir, args.events, seed=1)
        marker.write_text("")
        print(json.dumps({"generated_events": args.events, "seconds": round(time.monotonic() - started, 1),
                          "bytes": sum(p.stat().st_size for p in (data_dir / "events").rglob("*.jsonl"))}))
    out = Path(args.out)
    tree = Path(args.tree).resolve() if args.tree else ROOT
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "brokerd.pipeline", "report", "--data-dir", str(data_dir), "--out", str(out),
               "--conf", f"spark.executorEnv.PYTHONPATH={tree}"]
    for setting in args.conf:
        command += ["--conf", setting]
    if args.master:
        command += ["--master", args.master]
    if args.driver_memory:
        command += ["--driver-memory", args.driver_memory]
    if args.engine:
        command += ["--engine", args.engine]
    runs = [("raw JSON, no compaction", ["--no-compact"])] if args.baseline else []
    runs += [("first report (compaction included)", []), ("second report, no new data", [])]
    shutil.rmtree(data_dir / "events-compacted", ignore_errors=True)
    for name, extra in runs:
        load_before = _load()
        started = time.monotonic()
        process = subprocess.Popen(command + extra, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        cpu = _TreeCPU(process.pid)
        with cpu:
            stderr = process.communicate()[1]
        elapsed = time.monotonic() - started
        if process.returncode:
            raise SystemExit(f"the report failed ({process.returncode}): {stderr[-2000:]}")
        result = subprocess.CompletedProcess(command, process.returncode, None, stderr)
        steps = [line for line in result.stderr.splitlines() if line.startswith("[brokerd-report")]
        print(json.dumps({
            "benchmark": "brokerd-report", "run": name, "events": args.events, "seconds": round(elapsed, 1),
            "events_per_s": round(args.events / elapsed), "cpu_seconds": round(cpu.seconds, 1),
            "master": args.master or "local[*]", "engine": args.engine or "auto", "tree": str(tree),
            "load_before": load_before, "load_after": _load(), "cpus": os.cpu_count(), "steps": steps,
        }), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--data-dir", required=True)
    s.add_argument("--event-log", action="store_true")
    c = commands.add_parser("log-cost")
    c.add_argument("--runs", type=int, default=3)
    c.add_argument("--messages", type=int, default=20_000)
    c.add_argument("--subscribers", type=int, default=50)
    c.add_argument("--pbload")
    c.add_argument("--rate", type=int, help="messages/s the publisher sends (pbload --rate); default: as fast as it can")
    r = commands.add_parser("report")
    r.add_argument("--events", type=int, default=10_000_000)
    r.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "brokerd-bench-log"))
    r.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "brokerd-bench-report"))
    r.add_argument("--master")
    r.add_argument("--driver-memory", default="6g")
    r.add_argument("--engine", choices=("auto", "spark", "arrow"), help="brokerd-report --engine [auto]")
    r.add_argument("--baseline", action="store_true", help="first a report on the raw JSON (--no-compact)")
    r.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    r.add_argument("--tree", help="the brokerd checkout to time [this one]")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.port, args.data_dir, args.event_log)
    elif args.command == "log-cost":
        log_cost(args)
    else:
        report_bench(args)


if __name__ == "__main__":
    main()

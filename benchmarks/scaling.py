#!/usr/bin/env python3
"""The scaling shape of brokerd's SSMP front end: three curves, one command.

- **fan-out**: one publisher, 10, 100, 1,000 and 10,000 subscribers on one topic;
- **pairs**: 1, 10, 100 and 1,000 concurrent publisher -> subscriber pairs, each on its own
  topic (1 -> 1 throughput as the number of connections grows);
- **idle**: resident memory per logged-in, subscribed connection at 1,000, 10,000 and 50,000
  connections (as many as the machine's limits allow; the JSON says what capped a point).

Why a curve and not one figure: where throughput bends, and why (the broker's CPU saturating,
a per-connection write cost, memory per connection, the kernel's send cost), tells an operator
what to expect past the measured loads.  The shape only means something against a floor, so
each traffic point also runs the minimal Twisted server (benchmarks/minimal_ssmp.py) in the same
run: both servers are started fresh for the point, warmed up, then measured in alternating
rounds (median of ``--runs``).  Per run it records deliveries/s, the server's CPU per delivery
(scheduler clocks over pbload's measured window: the figure that survives a loaded machine),
the kernel's share of that CPU, the server's RSS, the load average, and, when ``perf`` is
available, the server's send/receive/epoll syscalls per delivery (tracepoint counts, which cost
the server next to nothing), which is the evidence for where a curve bends.

Reuses run_ssmp.py's machinery (pbload build, broker start with raised limits, the /proc
sampler).  Stdlib only; see benchmarks/README.md and docs/performance-history.md ("Scaling shape").
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_ssmp import (  # noqa: E402
    DEFAULT_BROKER_CMD,
    DEFAULT_CACHE_DIR,
    DEFAULT_PBLOAD_SRC,
    DEFAULT_RESULTS,
    REPO,
    BrokerProcess,
    Options,
    Workload,
    build_pbload,
    loadavg,
    machine_info,
    source_state,
    BROKER_CPU,
    BROKER_SYSTEM,
    BROKER_USER,
    BROKER_WAIT,
    MACHINE_IDLE,
    Sampler,
    _share,
    summarize_profile,
    vm_status,
    wait_for_quiet,
)

MINIMAL_CMD = f"{sys.executable} {REPO / 'benchmarks' / 'minimal_ssmp.py'} {{port}}"
BROKERD_CMD = DEFAULT_BROKER_CMD + " --no-event-log"
"""The event log is off, as in compare_ssmp.py: the minimal server has none, and its cost is
measured on its own (docs/pipeline.md)."""

FANOUT_POINTS = (10, 100, 1_000, 10_000)
PAIRS_POINTS = (1, 10, 100, 1_000)
IDLE_POINTS = (1_000, 10_000, 50_000)
FANOUT_DELIVERIES = 3_000_000
"""Deliveries per fan-out run (N = this / subscribers): 1-3 s at every point..."""
FANOUT_MIN_N = 1_000
"""...but at least this many messages, so that even 10,000 subscribers see the steady state
(one read holds up to ~700 of pbload's messages) and not only the first reads of a run."""
PAIRS_MESSAGES = 1_000_000
"""Messages per pairs run, all pairs together (N per publisher = this / pairs)."""
IDLE_HOLD = 3.0
IDLE_SETTLE = 2.0
FD_MARGIN = 200
"""Descriptors a server or pbload needs besides its connections (listeners, logs, epoll)."""

PERF_EVENTS = ("sendto", "sendmsg", "write", "writev", "recvfrom", "read", "epoll_wait", "epoll_ctl")


@dataclasses.dataclass(frozen=True)
class Point:
    curve: str  # "fanout" or "pairs"
    x: int
    """Subscribers (fan-out) or pairs."""

    @property
    def name(self) -> str:
        return f"{self.curve}:{self.x}"

    def workload(self, scale: float) -> Workload:
        if self.curve == "fanout":
            n = max(int(FANOUT_MIN_N * scale), int(FANOUT_DELIVERIES * scale / self.x))
            return Workload(self.name, f"1 -> {self.x:,}", "sat", ("-P", "1", "-S", str(self.x)), n, fanout=self.x)
        n = max(10, int(PAIRS_MESSAGES * scale / self.x))
        return Workload(self.name, f"{self.x:,} pairs", "sat",
                        ("-P", str(self.x), "-S", str(self.x), "--own", "1"), n)


# ---------------------------------------------------------------------------- syscall counts

class SyscallCounter:
    """``perf stat`` on the server's syscall tracepoints, from before pbload starts until it
    prints its result (after the last delivery, before its connections close).

    Counting tracepoints costs the traced process almost nothing (no ptrace, unlike strace),
    so the run it watches is a normal run.  Absent perf, or without permission, it records
    nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.proc: subprocess.Popen | None = None
        self.counts: dict[str, int] = {}

    def start(self) -> None:
        perf = shutil.which("perf")
        if perf:
            events = ",".join(f"syscalls:sys_enter_{name}" for name in PERF_EVENTS)
            self.proc = subprocess.Popen([perf, "stat", "-x", ",", "-e", events, "-p", str(self.pid)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)  # attach before pbload connects

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            _, errors = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return
        for line in errors.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2].startswith("syscalls:sys_enter_") and fields[0].isdigit():
                self.counts[fields[2].removeprefix("syscalls:sys_enter_")] = int(fields[0])


TCP_COUNTERS = ("PruneCalled", "RcvPruned", "TCPRcvCollapsed", "TCPMemoryPressures", "TCPRcvQDrop",
                "TCPToZeroWindowAdv", "TCPWantZeroWindowAdv", "TCPBacklogCoalesce")
"""Kernel TCP counters (/proc/net/netstat, machine-wide) whose growth during a run says the
kernel did extra work for full receive queues: pruning and collapsing them, zero windows."""


def tcp_counters() -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        with open("/proc/net/netstat") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return values
    for names, numbers in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            values.update(zip(names.split()[1:], (int(v) for v in numbers.split()[1:])))
    return {key: values[key] for key in TCP_COUNTERS if key in values}


# ---------------------------------------------------------------------------- traffic points

def pbload_run(opts: Options, server: BrokerProcess, workload: Workload, n: int,
               count_syscalls: bool) -> dict[str, Any]:
    """One pbload run with run_ssmp's measurements (the server's CPU over pbload's measured
    window from the /proc sampler), plus CPU per delivery, RSS, load and syscall counts.

    Like run_ssmp.traffic_run, but the syscall count stops at pbload's result line, so that
    two runs with the same connections differ only by their traffic."""
    args = [*workload.args, "-N", str(n)]
    counter = SyscallCounter(server.pid)
    if count_syscalls:
        counter.start()
    command = [str(opts.binary), "--proto", "ssmp", "--port", str(server.port), *args]
    tcp_before = tcp_counters()
    with Sampler(server.pid) as sampler:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        timer = threading.Timer(opts.timeout, proc.kill)
        timer.start()
        try:
            line = proc.stdout.readline()
            printed = time.monotonic()
            counter.stop()
            tcp_after = tcp_counters()
            rest, errors = proc.communicate()
        finally:
            timer.cancel()
            counter.stop()
    lines = [text for text in (line + rest).splitlines() if text.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    record: dict[str, Any] = {"args": args, "returncode": proc.returncode, "pbload": result,
                              "loadavg": loadavg()}
    if errors.strip():
        record["stderr"] = errors.strip()[-2000:]
    if counter.counts:
        record["syscalls"] = counter.counts
    record["tcp_counters"] = {key: tcp_after[key] - tcp_before.get(key, 0) for key in tcp_after}
    status = vm_status(server.pid)
    record["rss_kb"], record["hwm_kb"] = status["VmRSS"], status["VmHWM"]
    elapsed = result.get("elapsed_s")
    if not elapsed:
        record["valid"] = False
        return record
    end = sampler.last_active(printed)  # as in traffic_run: the server's last busy moment
    start = end - elapsed
    server_pct = sampler.percent(start, end, BROKER_CPU)
    machine_pct = sampler.percent(start, end, MACHINE_IDLE)
    gen_pct = result.get("gen_cpu_pct", 0.0)
    delivered = result.get("delivered") or 0
    record.update(
        valid=proc.returncode == 0 and delivered == result.get("expected"),
        deliv_per_s=result["deliv_per_s"],
        p50_ms=result.get("p50_us", 0) / 1000,  # queue depth (window 1000), not service time
        gen_cpu_pct=gen_pct,
        broker_cpu_pct=round(server_pct, 1),
        broker_wait_pct=round(sampler.percent(start, end, BROKER_WAIT), 1),
        other_cpu_pct=round(machine_pct - server_pct - gen_pct, 1),
        broker_system_share=_share(sampler.percent(start, end, BROKER_SYSTEM),
                                   sampler.percent(start, end, BROKER_USER)),
    )
    if delivered:
        record["cpu_us_per_delivery"] = server_pct / 100 * elapsed * 1e6 / delivered
    return record


def add_marginal_syscalls(record: dict[str, Any], warm: dict[str, Any], fanout: int) -> None:
    """Syscalls per delivery of the traffic alone: (run - warm-up) / (its deliveries - the
    warm-up's).  Both runs open the same connections (LOGIN, SUBSCRIBE), so that cancels."""
    counts, base = record.get("syscalls"), warm.get("syscalls")
    delivered = (record["pbload"].get("delivered") or 0) - (warm["pbload"].get("delivered") or 0)
    if not counts or not base or delivered <= 0:
        return
    extra = {key: counts.get(key, 0) - base.get(key, 0) for key in counts}
    sends = sum(extra.get(k, 0) for k in ("sendto", "sendmsg", "write", "writev"))
    receives = extra.get("recvfrom", 0) + extra.get("read", 0)
    if sends > 0:
        record["deliveries_per_send"] = delivered / sends
    if receives > 0:
        record["messages_per_receive"] = delivered / fanout / receives
    if extra.get("epoll_wait", 0) > 0:
        record["deliveries_per_epoll_wait"] = delivered / extra["epoll_wait"]
    record["epoll_ctl_per_send"] = extra.get("epoll_ctl", 0) / sends if sends > 0 else None


def _brief(record: dict[str, Any]) -> str:
    if "deliv_per_s" not in record:
        return f"FAILED rc={record.get('returncode')} {record.get('stderr', '')[:300]}"
    extra = ""
    if record.get("deliveries_per_send"):
        extra = f", {record['deliveries_per_send']:.1f} deliv/send"
    return (f"{record['deliv_per_s'] / 1e3:,.0f}k deliv/s, {record.get('cpu_us_per_delivery', 0):.3f} us CPU/deliv, "
            f"server {record['broker_cpu_pct']:.0f}% (kernel {record['broker_system_share'] or 0:.0f}%), "
            f"gen {record['gen_cpu_pct']:.0f}%, other {record['other_cpu_pct']:.0f}%, RSS {record['rss_kb'] / 1024:.0f} MB"
            f"{extra}, load {record['loadavg'][0]:.1f}{'' if record.get('valid') else '  [INCOMPLETE]'}")


MEDIAN_FIELDS = ("deliv_per_s", "p50_ms", "cpu_us_per_delivery", "broker_cpu_pct", "broker_system_share", "broker_wait_pct",
                 "gen_cpu_pct", "other_cpu_pct", "rss_kb", "deliveries_per_send", "messages_per_receive",
                 "deliveries_per_epoll_wait", "epoll_ctl_per_send")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"valid": bool(runs) and all(r.get("valid") for r in runs), "runs": len(runs)}
    for key in MEDIAN_FIELDS:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    summary["load"] = statistics.median(r["loadavg"][0] for r in runs) if runs else None
    return summary


def run_point(opts: Options, point: Point, servers: dict[str, str], scale: float, runs: int,
              count_syscalls: bool) -> dict[str, Any]:
    """Both servers fresh, one warm-up each at N/10, then ``runs`` alternating rounds."""
    workload = point.workload(scale)
    out: dict[str, Any] = {"point": point.name, "curve": point.curve, "x": point.x, "n": workload.n,
                           "args": list(workload.args), "servers": {}}
    procs = {label: BrokerProcess(cmd, opts.workdir, f"{label}-{point.curve}-{point.x}")
             for label, cmd in servers.items()}
    try:
        for proc in procs.values():
            proc.__enter__()
        out["quiet_check"] = wait_for_quiet(opts)
        records: dict[str, list[dict[str, Any]]] = {label: [] for label in procs}
        warm: dict[str, dict[str, Any]] = {}
        for label, proc in procs.items():
            warm[label] = pbload_run(opts, proc, workload, max(10, workload.n // 10), count_syscalls)
            out["servers"].setdefault(label, {})["warmup"] = warm[label]
        order = list(procs)
        for round_number in range(runs):
            for label in (order if round_number % 2 == 0 else order[::-1]):
                record = pbload_run(opts, procs[label], workload, workload.n, count_syscalls)
                add_marginal_syscalls(record, warm[label], workload.fanout)
                records[label].append(record)
                opts.log(f"    {label:8s} round {round_number + 1}: {_brief(record)}")
        for label, proc in procs.items():
            out["servers"][label].update(runs=records[label], summary=summarize(records[label]),
                                         problems=proc.problems())
    finally:
        for proc in procs.values():
            proc.__exit__()
    return out


# ---------------------------------------------------------------------------- idle memory

def _meminfo_kb(key: str) -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def reachable_connections(wanted: int) -> tuple[int, str | None]:
    """How many idle connections this machine lets one server and one pbload hold, and what
    capped it (None if nothing did).  Both sides need a descriptor per connection (the hard
    RLIMIT_NOFILE: raising it needs CAP_SYS_RESOURCE), and pbload's connections all go from
    127.0.0.1 to one address and port, so the kernel's ephemeral port range bounds them too."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        low, high = (int(v) for v in handle.read().split())
    ports = high - low + 1
    limits = []
    if hard != resource.RLIM_INFINITY and wanted > hard - FD_MARGIN:
        limits.append((hard - FD_MARGIN, f"hard RLIMIT_NOFILE {hard:,} (server and pbload need one descriptor per "
                                         f"connection; raising the hard limit needs CAP_SYS_RESOURCE)"))
    if wanted > ports:
        limits.append((ports, f"ephemeral port range {low}-{high} ({ports:,} ports from one source address "
                              f"to one server address)"))
    if not limits:
        return wanted, None
    count, reason = min(limits)
    return count, reason


def idle_run(opts: Options, label: str, cmd: str, count: int) -> dict[str, Any]:
    """A fresh server, a 100-connection warm-up, then ``count`` idle connections: the server's
    VmRSS and the kernel's slab (socket structures of both ends) before and after."""
    with BrokerProcess(cmd, opts.workdir, f"idle-{label}-{count}") as server:
        record: dict[str, Any] = {"server": label, "connections": count, "nofile": server.nofile_limit()}
        warm = subprocess.run([str(opts.binary), "--proto", "ssmp", "--port", str(server.port), "--idle",
                               str(min(100, count)), "--hold", "0.5"], capture_output=True, text=True,
                              timeout=opts.timeout)
        record["warmup_returncode"] = warm.returncode
        time.sleep(1.0)  # the warm-up's disconnections
        before, slab_before = vm_status(server.pid), _meminfo_kb("Slab")
        proc = subprocess.Popen([str(opts.binary), "--proto", "ssmp", "--port", str(server.port), "--idle",
                                 str(count), "--hold", str(IDLE_HOLD)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        time.sleep(IDLE_SETTLE)
        after, slab_after = vm_status(server.pid), _meminfo_kb("Slab")
        rest, errors = proc.communicate(timeout=opts.timeout)
        final = [line for line in rest.splitlines() if line.startswith("{")]
        record.update(
            ready=ready, returncode=proc.returncode, pbload=json.loads(final[-1]) if final else {},
            rss_before_kb=before["VmRSS"], rss_after_kb=after["VmRSS"],
            bytes_per_conn=(after["VmRSS"] - before["VmRSS"]) * 1024 / count,
            slab_bytes_per_conn=(slab_after - slab_before) * 1024 / count,
            loadavg=loadavg(), problems=server.problems(),
            valid=proc.returncode == 0 and ready.startswith(f"READY ok={count} fail=0"),
        )
        if errors.strip():
            record["stderr"] = errors.strip()[-1000:]
        return record


def run_idle(opts: Options, servers: dict[str, str], wanted: int, runs: int) -> dict[str, Any]:
    count, capped_by = reachable_connections(wanted)
    out: dict[str, Any] = {"wanted": wanted, "connections": count, "capped_by": capped_by, "servers": {}}
    if capped_by:
        opts.log(f"    {wanted:,} connections cannot be reached here; measuring {count:,}: {capped_by}")
    out["quiet_check"] = wait_for_quiet(opts)  # once per size: the runs are mostly waiting
    for round_number in range(runs):
        order = list(servers) if round_number % 2 == 0 else list(servers)[::-1]
        for label in order:
            record = idle_run(opts, label, servers[label], count)
            out["servers"].setdefault(label, {"runs": []})["runs"].append(record)
            opts.log(f"    {label:8s} {record['ready']}: RSS {record['rss_before_kb'] / 1024:.1f} -> "
                     f"{record['rss_after_kb'] / 1024:.1f} MB, {record['bytes_per_conn']:,.0f} B/conn "
                     f"(kernel slab {record['slab_bytes_per_conn']:,.0f} B/conn, both ends), load "
                     f"{record['loadavg'][0]:.1f}{'' if record['valid'] else '  [INVALID]'}")
    for entry in out["servers"].values():
        values = entry["runs"]
        entry["summary"] = {
            "valid": all(r["valid"] for r in values),
            **{key: {"median": statistics.median(r[key] for r in values), "min": min(r[key] for r in values),
                     "max": max(r[key] for r in values)}
               for key in ("bytes_per_conn", "slab_bytes_per_conn", "rss_before_kb", "rss_after_kb")},
            "load": statistics.median(r["loadavg"][0] for r in values),
        }
    return out


# ---------------------------------------------------------------------------- profiling

def profile_point(opts: Options, point: Point, cmd: str, scale: float, results_dir: Path, stamp: str,
                  rate: int) -> dict[str, Any]:
    """py-spy (raw collapsed stacks, then run_ssmp's summary) on brokerd during one run."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    workload = point.workload(scale)
    raw = results_dir / f"scaling-profile-{point.curve}-{point.x}-{stamp}.txt"
    with BrokerProcess(cmd, opts.workdir, f"profile-{point.curve}-{point.x}") as broker:
        pbload_run(opts, broker, workload, max(10, workload.n // 10), count_syscalls=False)
        spy = subprocess.Popen([py_spy, "record", "-p", str(broker.pid), "--nonblocking", "--idle", "--threads",
                                "--rate", str(rate), "--format", "raw", "-o", str(raw)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.0)  # attach
        record = pbload_run(opts, broker, workload, workload.n, count_syscalls=False)
        spy.send_signal(signal.SIGINT)
        spy.communicate(timeout=60)
    summary = summarize_profile(raw.read_text()) if raw.exists() else "no profile written\n"
    summary_path = raw.with_name(raw.stem + "-summary.txt")
    summary_path.write_text(summary)
    opts.log(f"    profiled run: {_brief(record)}\n{summary}")
    return {"point": point.name, "run": record, "raw": str(raw), "summary": str(summary_path)}


# ---------------------------------------------------------------------------- report

def _k(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k"


def markdown(results: dict[str, Any]) -> str:
    out: list[str] = []
    for curve, head in (("fanout", "subscribers"), ("pairs", "pairs")):
        points = [p for p in results["points"] if p["curve"] == curve]
        if not points:
            continue
        out += [f"| {head} | server | deliveries/s | CPU µs per delivery | server on CPU + waiting for one, "
                "% of a core (kernel share %) | deliveries per send | deliveries per epoll_wait | RSS MB | "
                "gen CPU % | load |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for point in points:
            for label, entry in point["servers"].items():
                s = entry.get("summary", {})
                if "deliv_per_s" not in s:
                    out.append(f"| {point['x']:,} | {label} | failed ||||||||")
                    continue
                med = lambda key, fmt: fmt(s[key]["median"]) if key in s else "–"  # noqa: E731
                out.append(
                    f"| {point['x']:,} | {label} | {_k(s['deliv_per_s']['median'])} "
                    f"({_k(s['deliv_per_s']['min'])}–{_k(s['deliv_per_s']['max'])}) | "
                    f"{med('cpu_us_per_delivery', lambda v: f'{v:.3f}')} | "
                    f"{med('broker_cpu_pct', lambda v: f'{v:.0f}')} + {med('broker_wait_pct', lambda v: f'{v:.0f}')} "
                    f"({med('broker_system_share', lambda v: f'{v:.0f}')}) | "
                    f"{med('deliveries_per_send', lambda v: f'{v:.1f}')} | "
                    f"{med('deliveries_per_epoll_wait', lambda v: f'{v:.0f}')} | {med('rss_kb', lambda v: f'{v / 1024:.0f}')} | "
                    f"{med('gen_cpu_pct', lambda v: f'{v:.0f}')} | {s['load']:.1f} |"
                    f"{'' if s['valid'] else ' INCOMPLETE'}")
        out.append("")
    if results.get("idle"):
        out += ["| connections | server | KB per connection (RSS) | RSS before → after MB | "
                "kernel slab KB per connection (both ends) | load |", "|---|---|---|---|---|---|"]
        for point in results["idle"]:
            shown = f"{point['connections']:,}" + (f" (of {point['wanted']:,})" if point["capped_by"] else "")
            for label, entry in point["servers"].items():
                s = entry["summary"]
                out.append(
                    f"| {shown} | {label} | {s['bytes_per_conn']['median'] / 1024:.2f} "
                    f"({s['bytes_per_conn']['min'] / 1024:.2f}–{s['bytes_per_conn']['max'] / 1024:.2f}) | "
                    f"{s['rss_before_kb']['median'] / 1024:.0f} → {s['rss_after_kb']['median'] / 1024:.0f} | "
                    f"{s['slab_bytes_per_conn']['median'] / 1024:.2f} | {s['load']:.1f} |"
                    f"{'' if s['valid'] else ' INVALID'}")
        capped = [p for p in results["idle"] if p["capped_by"]]
        for point in capped:
            out.append(f"\n{point['wanted']:,} connections: measured {point['connections']:,}, capped by the "
                       f"{point['capped_by']}.")
        out.append("")
    return "\n".join(out)


def plot(results: dict[str, Any], path: Path) -> bool:
    """A PNG of the two traffic curves (deliveries/s and CPU per delivery against x, log
    scale), if matplotlib (the pipeline extra) is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    curves = [c for c in ("fanout", "pairs") if any(p["curve"] == c for p in results["points"])]
    if not curves:
        return False
    fig, axes = plt.subplots(2, len(curves), figsize=(4.2 * len(curves), 6), squeeze=False)
    for column, curve in enumerate(curves):
        points = [p for p in results["points"] if p["curve"] == curve]
        for label in points[0]["servers"]:
            xs, rate, cpu = [], [], []
            for point in points:
                s = point["servers"][label].get("summary", {})
                if "deliv_per_s" in s and "cpu_us_per_delivery" in s:
                    xs.append(point["x"])
                    rate.append(s["deliv_per_s"]["median"] / 1e6)
                    cpu.append(s["cpu_us_per_delivery"]["median"])
            axes[0][column].plot(xs, rate, marker="o", label=label)
            axes[1][column].plot(xs, cpu, marker="o", label=label)
        title = "1 -> N fan-out" if curve == "fanout" else "N concurrent 1 -> 1 pairs"
        axes[0][column].set_title(title)
        axes[0][column].set_ylabel("deliveries/s (millions)")
        axes[1][column].set_ylabel("server CPU µs per delivery")
        axes[1][column].set_xlabel("subscribers" if curve == "fanout" else "pairs")
        for row in (0, 1):
            axes[row][column].set_xscale("log")
            axes[row][column].set_ylim(bottom=0)
            axes[row][column].grid(True, alpha=0.3)
            axes[row][column].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------- main

def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v.replace("_", "").replace(",", "")) for v in text.split("+") if v.strip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="fanout,pairs,idle", help="curves: fanout,pairs,idle [all]")
    parser.add_argument("--fanout", type=_ints, default=FANOUT_POINTS, metavar="X+Y+...",
                        help="subscriber counts [10+100+1000+10000]")
    parser.add_argument("--pairs", type=_ints, default=PAIRS_POINTS, metavar="X+Y+...", help="pair counts [1+10+100+1000]")
    parser.add_argument("--idle", type=_ints, default=IDLE_POINTS, metavar="X+Y+...",
                        help="idle connection counts [1000+10000+50000]; each is capped at what the machine allows")
    parser.add_argument("--runs", type=int, help="measured rounds per point (default 3; --quick 1)")
    parser.add_argument("--scale", type=float, help="traffic per run, times the default (default 1; --quick 0.1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a tenth of the traffic, 1 round, idle 1000+2000")
    parser.add_argument("--no-minimal", action="store_true", help="brokerd alone, without the minimal server")
    parser.add_argument("--idle-minimal", action="store_true",
                        help="the idle curve for the minimal server too (off by default: at 20,000 connections "
                             "on a loaded machine each run spends half a minute opening them)")
    parser.add_argument("--broker-cmd", default=BROKERD_CMD, help="brokerd's command [%(default)s]")
    parser.add_argument("--no-syscalls", action="store_true", help="do not count the servers' syscalls with perf")
    parser.add_argument("--profile", metavar="CURVE:X,...",
                        help="after the series (or alone with --only ''), py-spy on brokerd during one run "
                             "of these points, e.g. fanout:10000,pairs:1000")
    parser.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second [250]")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="[%(default)s]")
    parser.add_argument("--quiet-limit", type=float, default=40.0,
                        help="before a point, wait until the machine is busy less than this %% of a core [40]")
    parser.add_argument("--max-wait", type=float, default=5.0, help="longest wait for a quiet machine, s [5]")
    parser.add_argument("--timeout", type=float, default=300.0, help="limit for one pbload run, s [300]")
    args = parser.parse_args(argv)
    args.curves = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in args.curves if c not in ("fanout", "pairs", "idle")]
    if unknown:
        parser.error(f"unknown curve(s) {', '.join(unknown)}")
    args.profile_points = []
    for spec in (args.profile or "").split(","):
        if spec.strip():
            curve, _, x = spec.strip().partition(":")
            if curve not in ("fanout", "pairs") or not x.isdigit():
                parser.error(f"--profile takes fanout:X or pairs:X, not {spec!r}")
            args.profile_points.append(Point(curve, int(x)))
    if args.quick and args.idle == IDLE_POINTS:
        args.idle = (1_000, 2_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (a background job ignores SIGINT) unwinds like Ctrl-C: the servers are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    binary = build_pbload(DEFAULT_PBLOAD_SRC.resolve(), DEFAULT_CACHE_DIR)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    runs = args.runs or (1 if args.quick else 3)
    scale = args.scale if args.scale is not None else (0.1 if args.quick else 1.0)
    servers = {"brokerd": args.broker_cmd}
    if not args.no_minimal:
        servers["minimal"] = MINIMAL_CMD

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="brokerd-scaling-") as workdir:
        opts = Options(binary=binary, broker_cmd=args.broker_cmd, broker_env={}, workdir=Path(workdir), runs=runs,
                       scale=scale, rate_scale=1.0, idle_connections=0, quiet_limit=args.quiet_limit,
                       noise_limit=100.0, retries=0, max_wait=args.max_wait, timeout=args.timeout, log=log)
        results: dict[str, Any] = {
            "started": _dt.datetime.now().isoformat(timespec="seconds"),
            "machine": machine_info(),
            "source": source_state(),
            "servers": servers,
            "settings": {"runs": runs, "scale": scale, "fanout_deliveries": FANOUT_DELIVERIES,
                         "pairs_messages": PAIRS_MESSAGES, "syscalls": not args.no_syscalls and bool(shutil.which("perf"))},
            "points": [], "idle": [], "profiles": [],
        }
        m = results["machine"]
        log(f"{m['cpus']} x {m['cpu_model']}, {m['python']}, load {m['loadavg_at_start']}")
        try:
            for curve in ("fanout", "pairs"):
                if curve not in args.curves:
                    continue
                for x in (args.fanout if curve == "fanout" else args.pairs):
                    point = Point(curve, x)
                    log(f"{point.name}: {point.workload(scale).title}, N={point.workload(scale).n:,}")
                    results["points"].append(run_point(opts, point, servers, scale, runs,
                                                       results["settings"]["syscalls"]))
            if "idle" in args.curves:
                for wanted in args.idle:
                    log(f"idle: {wanted:,} connections")
                    idle_servers = servers if args.idle_minimal else {"brokerd": servers["brokerd"]}
                    results["idle"].append(run_idle(opts, idle_servers, wanted, runs))
            for point in args.profile_points:
                log(f"profile {point.name}")
                results["profiles"].append(profile_point(opts, point, args.broker_cmd, scale, args.results_dir,
                                                         stamp, args.profile_rate))
        finally:
            results["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
            results["wall_s"] = round(time.monotonic() - started, 1)
            results["loadavg_at_end"] = loadavg()
            results["source_at_end"] = source_state()
            if results["source_at_end"] != results["source"]:
                log("WARNING: brokerd's sources changed during the run")
            results["markdown"] = markdown(results)
            path = args.results_dir / f"scaling-{stamp}{'-quick' if args.quick else ''}.json"
            path.write_text(json.dumps(results, indent=1) + "\n")
            log(f"raw results: {path}")
            png = path.with_suffix(".png")
            if plot(results, png):
                log(f"plot: {png}")
    print(results["markdown"])
    log(f"{results['wall_s']:.0f} s")
    invalid = [p["point"] for p in results["points"] for e in p["servers"].values()
               if not e.get("summary", {}).get("valid")]
    invalid += [f"idle:{p['connections']}" for p in results["idle"] for e in p["servers"].values()
                if not e["summary"]["valid"]]
    if invalid:
        log(f"INVALID (lost messages, errors or failed runs): {', '.join(invalid)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

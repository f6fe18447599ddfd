#!/usr/bin/env python3
"""Run the SSMP workloads of ../shared/bench/README.md against a brokerd this script starts.

Why a script and not a shell snippet: the figures only mean something with the context next to
them (warm-up, median of several runs, the generator's and the broker's CPU, how busy the rest
of the machine was), and that bookkeeping is easy to get wrong by hand.

For every workload it starts a fresh broker on a free loopback port, runs one warm-up at N/10,
then ``--runs`` measured runs, and reports median (min-max).  While pbload runs, a sampler
thread reads the broker's scheduler clocks (/proc/PID/task/*/schedstat) and the machine's idle
time (/proc/stat), so each run also reports the broker's CPU, how long it waited for a CPU, and
the CPU used by everything else ("other": the machine's busy time minus the broker and the
generator), which is how a run disturbed by other work on the machine is recognised and
repeated.

Stdlib only.  See benchmarks/README.md for the options and docs/performance-history.md for results.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PBLOAD_SRC = REPO.parent / "shared" / "bench" / "pbload.c"
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "brokerd-bench"
DEFAULT_RESULTS = REPO / "benchmarks" / "results"
DEFAULT_BROKER_CMD = (
    "{twistd} -n --pidfile= brokerd --ssmp tcp:{port}:interface=127.0.0.1 --open-login "
    "--data-dir {data_dir} --max-connections 100000 --max-listener-connections 100000 "
    "--max-connections-per-address 100000 --max-unauthenticated 100000"
)
CLK_TCK = os.sysconf("SC_CLK_TCK")
SAMPLE_INTERVAL = 0.01
"""Seconds between CPU samples while pbload runs."""
IDLE_SETTLE = 2.0
"""Seconds between pbload's READY line and the VmRSS reading (the README's ``sleep 2``)."""
IDLE_HOLD = 5.0
"""Seconds pbload holds the idle connections; enough for the settle time and the reading."""
IDLE_WARMUP = 100
"""Connections of the idle workload's warm-up.  Not N/10: memory freed by the warm-up's
connections would be reused by the measured ones and make them look cheaper."""


# ---------------------------------------------------------------------------- workloads

@dataclass(frozen=True)
class Target:
    """A requirement on one summary figure: ``metric`` ``op`` ``value``."""

    metric: str
    op: str  # ">=" or "<="
    value: float
    label: str

    def met(self, measured: float) -> bool:
        return measured >= self.value if self.op == ">=" else measured <= self.value


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    kind: str  # "sat" (closed-loop saturation), "rate" (fixed rate, latency), "idle"
    args: tuple[str, ...]
    n: int
    """-N (messages per publisher) as the bench README gives it; idle: connections."""
    fanout: int = 1
    """Deliveries per published message (subscribers per topic)."""
    targets: tuple[Target, ...] = ()


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("a", "(a) 1 -> 1, 64 B", "sat", ("-P", "1", "-S", "1"), 200_000,
                 targets=(Target("msgs_per_s", ">=", 400_000, ">= 400k msgs/s"),)),
        Workload("b", "(b) 1 -> 50 fan-out", "sat", ("-P", "1", "-S", "50"), 20_000, fanout=50,
                 targets=(Target("deliv_per_s", ">=", 1_500_000, ">= 1.5M deliveries/s"),)),
        Workload("c", "(c) 10 x 10 own topics", "sat", ("-P", "10", "-S", "10", "--own", "1"), 20_000,
                 targets=(Target("msgs_per_s", ">=", 300_000, ">= 300k msgs/s"),)),
        Workload("d", "(d) UCAST 50+50, 100 B", "sat",
                 ("-P", "50", "-S", "50", "--ucast", "1", "-B", "100"), 10_000),
        Workload("rate-a", "(a) 1 -> 1 at 5k/s", "rate",
                 ("-P", "1", "-S", "1", "--rate", "5000"), 25_000),
        Workload("rate-b", "(b) 1 -> 50 at 500/s", "rate",
                 ("-P", "1", "-S", "50", "--rate", "500"), 2_500, fanout=50,
                 targets=(Target("p99_ms", "<=", 1.5, "p99 <= 1.5 ms"),)),
        Workload("rate-c", "(c) 10 x 500/s own topics", "rate",
                 ("-P", "10", "-S", "10", "--own", "1", "--rate", "500"), 2_500),
        Workload("idle", "idle: 10,000 logged-in + subscribed", "idle", (), 10_000,
                 targets=(Target("bytes_per_conn", "<=", 10 * 1024, "<= 10 KB/conn"),)),
    )
}


# ---------------------------------------------------------------------------- /proc readings

def proc_schedstat(pid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for a CPU) of all of ``pid``'s threads (the
    reactor and, e.g., the event log's writer); None once it is gone.  Exact scheduler
    clocks, unlike utime/stime."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as handle:
                fields = handle.read().split()
        except OSError:
            continue  # a thread that just ended
        run += int(fields[0])
        wait += int(fields[1])
    return run, wait


def machine_not_busy() -> tuple[float, float]:
    """(idle + iowait + steal, steal) seconds of all CPUs together from /proc/stat.

    Machine busy time is derived from the idle time (wall time x CPUs - not busy), because the
    idle clock is exact on a tickless kernel while the busy fields are sampled at the timer
    tick, which undercounts a process that runs in short bursts (the fixed-rate workloads)."""
    with open("/proc/stat", "rb") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle, iowait, steal = fields[3], fields[4], fields[7]
    return (idle + iowait + steal) / CLK_TCK, steal / CLK_TCK


CPUS = os.cpu_count() or 1


def vm_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in kB."""
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def loadavg() -> list[float]:
    with open("/proc/loadavg") as handle:
        return [float(v) for v in handle.read().split()[:3]]


def machine_busy(seconds: float = 1.0) -> float:
    """Percent of one core the whole machine was busy over the next ``seconds``."""
    t0, (idle0, _) = time.monotonic(), machine_not_busy()
    time.sleep(seconds)
    t1, (idle1, _) = time.monotonic(), machine_not_busy()
    return 100.0 * (CPUS * (t1 - t0) - (idle1 - idle0)) / (t1 - t0)


def proc_user_system(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of ``pid`` from /proc/PID/stat: tick samples, only good for
    the split between Python and the kernel (syscalls, loopback TCP) over a busy second."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


# Sample columns: monotonic time, broker on-CPU s, broker waiting-for-CPU s, machine not-busy s,
# steal s, broker user s, broker system s.
BROKER_CPU, BROKER_WAIT, MACHINE_IDLE, STEAL, BROKER_USER, BROKER_SYSTEM = 1, 2, 3, 4, 5, 6


class Sampler:
    """Samples the broker's scheduler clocks and the machine's idle time in a thread, so the
    CPU used inside a window known only afterwards (pbload's elapsed time) can be computed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        sched = proc_schedstat(self.pid)
        idle, steal = machine_not_busy()
        user_sys = proc_user_system(self.pid)
        if sched is not None and user_sys is not None:
            self.samples.append((time.monotonic(), sched[0] / 1e9, sched[1] / 1e9, idle, steal, *user_sys))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_INTERVAL)

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _at(self, when: float, column: int) -> float:
        """Linear interpolation of ``column`` at monotonic time ``when``."""
        samples = self.samples
        if when <= samples[0][0]:
            return samples[0][column]
        for before, after in zip(samples, samples[1:]):
            if before[0] <= when <= after[0]:
                span = after[0] - before[0]
                share = (when - before[0]) / span if span else 1.0
                return before[column] + share * (after[column] - before[column])
        return samples[-1][column]

    def last_active(self, before: float, threshold: float = 0.1) -> float:
        """End of the last sample interval before ``before`` in which the broker was on a CPU
        for more than ``threshold`` of the interval (``before`` itself if none was)."""
        samples = [sample for sample in self.samples if sample[0] <= before]
        for later, earlier in zip(reversed(samples), list(reversed(samples))[1:]):
            span = later[0] - earlier[0]
            if span > 0 and later[BROKER_CPU] - earlier[BROKER_CPU] > threshold * span:
                return later[0]
        return before

    def percent(self, start: float, end: float, column: int) -> float:
        """Percent of one core that ``column`` grew by between ``start`` and ``end``; for
        MACHINE_IDLE, the machine's busy time instead (all CPUs minus idle)."""
        span = end - start
        if span <= 0:
            return 0.0
        grown = self._at(end, column) - self._at(start, column)
        if column == MACHINE_IDLE:
            grown = CPUS * span - grown
        return 100.0 * grown / span


# ---------------------------------------------------------------------------- pbload

def build_pbload(source: Path, cache_dir: Path) -> Path:
    """Compile pbload.c with gcc -O2 -pthread into ``cache_dir`` (keyed by its content)."""
    if not source.is_file():
        sys.exit(f"run_ssmp: pbload source not found: {source} (use --pbload-src)")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = cache_dir / f"pbload-{digest}"
    if binary.exists():
        return binary
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".tmp")
    command = ["gcc", "-O2", "-pthread", "-o", str(partial), str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"run_ssmp: {' '.join(command)} failed:\n{result.stderr}")
    partial.replace(binary)
    return binary


@dataclass
class PbloadRun:
    """One pbload execution: its JSON line plus when it was printed."""

    result: dict[str, Any]
    returncode: int
    started: float
    printed: float
    """When the JSON line arrived: after the last delivery and pbload's sort of the latencies
    (which takes a while for millions of deliveries), before its connections close."""
    stderr: str


def run_pbload(binary: Path, port: int, args: list[str], timeout: float) -> PbloadRun:
    command = [str(binary), "--proto", "ssmp", "--port", str(port), *args]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline()
        printed = time.monotonic()
        rest, errors = proc.communicate()
    finally:
        timer.cancel()
    lines = [text for text in (line + rest).splitlines() if text.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    return PbloadRun(result, proc.returncode, started, printed, errors.strip()[-2000:])


# ---------------------------------------------------------------------------- the broker

def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening_inode(port: int) -> str | None:
    needle = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if fields[1].endswith(needle) and fields[3] == "0A":
                        return fields[9]
        except OSError:
            continue
    return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        ppid = int(data[data.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, ()))
    return found


def listener_pid(port: int, root: int) -> int:
    """The process (``root`` or one of its descendants) that holds the listening socket, so a
    --broker-cmd that wraps the broker in a shell still measures the broker itself."""
    inode = _listening_inode(port)
    if inode is not None:
        target = f"socket:[{inode}]"
        for pid in _descendants(root):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    continue
    return root


class BrokerProcess:
    """One brokerd started from ``template`` on a free port, stopped on exit."""

    def __init__(self, template: str, workdir: Path, label: str, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.data_dir = workdir / f"data-{label}-{self.port}"
        self.log_path = workdir / f"broker-{label}-{self.port}.log"
        twistd = Path(sys.executable).with_name("twistd")
        self.command = shlex.split(
            template.format(
                port=self.port,
                data_dir=shlex.quote(str(self.data_dir)),
                twistd=shlex.quote(str(twistd) if twistd.exists() else "twistd"),
            )
        )
        self.proc: subprocess.Popen | None = None
        self.pid = 0

    def __enter__(self) -> BrokerProcess:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_raise_nofile, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"broker did not listen on {self.port}:\n{self.log_tail()}") from None
                time.sleep(0.1)
        self.pid = listener_pid(self.port, self.proc.pid)
        time.sleep(0.3)  # let the probe connection's close be processed
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        # The broker runs in its own session: signal its process group, which also reaches
        # the broker when --broker-cmd wraps it in a shell.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def nofile_limit(self) -> int:
        with open(f"/proc/{self.pid}/limits") as handle:
            for line in handle:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
        return 0

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def problems(self) -> list[str]:
        """Tracebacks and critical lines in the broker's log (there should be none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if "Traceback" in line or "#critical" in line
                or "Unhandled" in line][:20]


# ---------------------------------------------------------------------------- running

@dataclass
class Options:
    binary: Path
    broker_cmd: str
    broker_env: dict[str, str]
    workdir: Path
    runs: int
    scale: float
    rate_scale: float
    idle_connections: int
    quiet_limit: float
    noise_limit: float
    retries: int
    max_wait: float
    timeout: float
    log: Callable[[str], None]


def wait_for_quiet(opts: Options) -> dict[str, Any]:
    """Wait (up to ``max_wait``) until the machine is busy less than ``quiet_limit`` % of a
    core, with our broker idle; return what was seen."""
    waited = 0.0
    while True:
        busy = machine_busy(1.0)
        if busy <= opts.quiet_limit or waited >= opts.max_wait:
            return {"busy_pct": round(busy, 1), "loadavg": loadavg(), "waited_s": waited}
        opts.log(f"    machine busy {busy:.0f}% of a core (load {loadavg()[0]:.2f}); waiting")
        time.sleep(5)
        waited += 6


def n_for(workload: Workload, opts: Options) -> int:
    scale = opts.scale if workload.kind == "sat" else opts.rate_scale
    return max(10, int(workload.n * scale))


def traffic_run(opts: Options, broker: BrokerProcess, workload: Workload, n: int) -> dict[str, Any]:
    """One pbload run plus the broker's and the machine's CPU over pbload's measured window."""
    args = [*workload.args, "-N", str(n)]
    with Sampler(broker.pid) as sampler:
        run = run_pbload(opts.binary, broker.port, args, opts.timeout)
    result = run.result
    record: dict[str, Any] = {"args": args, "returncode": run.returncode, "pbload": result}
    if run.stderr:
        record["stderr"] = run.stderr
    elapsed = result.get("elapsed_s")
    if not elapsed:
        record["valid"] = False
        return record
    # pbload's window is first send to last delivery.  It ends where the broker last worked
    # before pbload printed its result (pbload sorts its latencies in between).
    end = sampler.last_active(run.printed)
    start = end - elapsed
    broker_pct = sampler.percent(start, end, BROKER_CPU)
    machine_pct = sampler.percent(start, end, MACHINE_IDLE)
    gen_pct = result.get("gen_cpu_pct", 0.0)
    record.update(
        valid=run.returncode == 0 and result.get("delivered") == result.get("expected"),
        deliv_per_s=result["deliv_per_s"],
        msgs_per_s=result["deliv_per_s"] / workload.fanout,
        p50_ms=result["p50_us"] / 1000,
        p99_ms=result["p99_us"] / 1000,
        gen_cpu_pct=gen_pct,
        broker_cpu_pct=round(broker_pct, 1),
        machine_cpu_pct=round(machine_pct, 1),
        other_cpu_pct=round(machine_pct - broker_pct - gen_pct, 1),
        broker_wait_pct=round(sampler.percent(start, end, BROKER_WAIT), 1),
        broker_system_share=_share(sampler.percent(start, end, BROKER_SYSTEM),
                                   sampler.percent(start, end, BROKER_USER)),
        steal_pct=round(sampler.percent(start, end, STEAL), 1),
    )
    return record


def _share(system: float, user: float) -> float | None:
    """Kernel share of the broker's CPU (None when it hardly ran)."""
    total = system + user
    return round(100.0 * system / total, 1) if total > 1 else None


def run_traffic_workload(opts: Options, workload: Workload) -> dict[str, Any]:
    n = n_for(workload, opts)
    out: dict[str, Any] = {"workload": workload.name, "title": workload.title, "kind": workload.kind,
                           "n": n, "fanout": workload.fanout, "runs": [], "discarded": []}
    with BrokerProcess(opts.broker_cmd, opts.workdir, workload.name, opts.broker_env) as broker:
        out["broker_pid"] = broker.pid
        out["quiet_check"] = wait_for_quiet(opts)
        warm = traffic_run(opts, broker, workload, max(10, n // 10))
        out["warmup"] = warm
        opts.log(f"    warm-up N={max(10, n // 10)}: {_brief(warm)}")
        retries = opts.retries
        while len(out["runs"]) < opts.runs:
            record = traffic_run(opts, broker, workload, n)
            record["loadavg"] = loadavg()
            noisy = record.get("other_cpu_pct", 0) > opts.noise_limit
            opts.log(f"    run N={n}: {_brief(record)}{'  [noisy]' if noisy else ''}")
            if noisy and retries > 0:
                retries -= 1
                out["discarded"].append(record)
                wait_for_quiet(opts)
                continue
            record["noisy"] = noisy
            out["runs"].append(record)
        out["broker_problems"] = broker.problems()
    out["summary"] = summarize(out["runs"], workload)
    return out


def _brief(record: dict[str, Any]) -> str:
    if "deliv_per_s" not in record:
        return f"FAILED rc={record.get('returncode')} {record.get('stderr', '')[:200]}"
    flag = "" if record.get("valid") else " INCOMPLETE"
    return (f"{record['deliv_per_s']:,.0f} deliv/s, p50 {record['p50_ms']:.2f} ms, "
            f"p99 {record['p99_ms']:.2f} ms, gen {record['gen_cpu_pct']:.0f}%, "
            f"broker {record['broker_cpu_pct']:.0f}% (kernel {record['broker_system_share'] or 0:.0f}% of it; "
            f"+{record['broker_wait_pct']:.0f}% waiting for a CPU), "
            f"other {record['other_cpu_pct']:.0f}%{flag}")


def idle_run(opts: Options, workload: Workload, count: int) -> dict[str, Any]:
    """A fresh broker; a small warm-up; VmRSS; ``count`` idle connections; VmRSS again."""
    with BrokerProcess(opts.broker_cmd, opts.workdir, "idle", opts.broker_env) as broker:
        limit = broker.nofile_limit()
        if limit and limit < count + 100:
            raise RuntimeError(f"the broker may open {limit} files, fewer than {count} connections")
        record: dict[str, Any] = {"connections": count, "broker_nofile": limit}
        record["quiet_check"] = wait_for_quiet(opts)
        warm = subprocess.run(
            [str(opts.binary), "--proto", "ssmp", "--port", str(broker.port), "--idle",
             str(min(IDLE_WARMUP, count)), "--hold", "0.5"],
            capture_output=True, text=True, timeout=opts.timeout,
        )
        record["warmup_returncode"] = warm.returncode
        time.sleep(1.0)  # the warm-up's disconnections
        before = vm_status(broker.pid)
        command = [str(opts.binary), "--proto", "ssmp", "--port", str(broker.port), "--idle",
                   str(count), "--hold", str(IDLE_HOLD)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        time.sleep(IDLE_SETTLE)
        after = vm_status(broker.pid)
        rest, errors = proc.communicate(timeout=opts.timeout)
        final = [line for line in rest.splitlines() if line.startswith("{")]
        record.update(
            ready=ready,
            returncode=proc.returncode,
            pbload=json.loads(final[-1]) if final else {},
            rss_before_kb=before["VmRSS"],
            rss_after_kb=after["VmRSS"],
            hwm_after_kb=after["VmHWM"],
            bytes_per_conn=(after["VmRSS"] - before["VmRSS"]) * 1024 / count,
            loadavg=loadavg(),
            broker_problems=broker.problems(),
        )
        if errors.strip():
            record["stderr"] = errors.strip()[-2000:]
        record["valid"] = proc.returncode == 0 and ready.startswith(f"READY ok={count} fail=0")
        return record


def run_idle_workload(opts: Options, workload: Workload) -> dict[str, Any]:
    count = opts.idle_connections
    out: dict[str, Any] = {"workload": workload.name, "title": workload.title, "kind": "idle",
                           "n": count, "runs": []}
    for _ in range(opts.runs):
        record = idle_run(opts, workload, count)
        opts.log(f"    {record['ready']}: RSS {record['rss_before_kb']} -> {record['rss_after_kb']} kB, "
                 f"{record['bytes_per_conn']:,.0f} B/conn{'' if record['valid'] else ' INVALID'}")
        out["runs"].append(record)
    values = [r["bytes_per_conn"] for r in out["runs"]]
    out["summary"] = {
        "valid": all(r["valid"] for r in out["runs"]),
        "bytes_per_conn": _stats(values),
        "rss_before_kb": _stats([r["rss_before_kb"] for r in out["runs"]]),
        "rss_after_kb": _stats([r["rss_after_kb"] for r in out["runs"]]),
        "targets": _check(workload, {"bytes_per_conn": statistics.median(values)}),
    }
    return out


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _check(workload: Workload, medians: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"target": t.label, "metric": t.metric, "value": medians[t.metric], "met": t.met(medians[t.metric])}
        for t in workload.targets
    ]


def summarize(runs: list[dict[str, Any]], workload: Workload) -> dict[str, Any]:
    measured = [r for r in runs if "deliv_per_s" in r]
    if not measured:
        return {"valid": False}
    summary: dict[str, Any] = {"valid": all(r.get("valid") for r in runs) and len(measured) == len(runs)}
    for key in ("deliv_per_s", "msgs_per_s", "p50_ms", "p99_ms", "gen_cpu_pct", "broker_cpu_pct",
                "broker_wait_pct", "other_cpu_pct", "steal_pct", "broker_system_share"):
        values = [r[key] for r in measured if r.get(key) is not None]
        if values:
            summary[key] = _stats(values)
    summary["stalls"] = sum(r["pbload"].get("stalls", 0) for r in measured)
    summary["runs"] = len(runs)
    summary["disturbed"] = sum(1 for r in runs if r.get("noisy"))
    summary["targets"] = _check(workload, {k: summary[k]["median"] for k in ("deliv_per_s", "msgs_per_s",
                                                                                "p50_ms", "p99_ms")})
    return summary


# ---------------------------------------------------------------------------- profiling

def profile_workload(opts: Options, workload: Workload, results_dir: Path, stamp: str,
                     rate: int) -> dict[str, Any]:
    """py-spy on the broker during one run of ``workload``: a flame graph (SVG) and raw
    collapsed stacks, plus a text summary of where the samples fall."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    n = n_for(workload, opts)
    out: dict[str, Any] = {"workload": workload.name, "n": n, "files": {}, "runs": {}}
    with BrokerProcess(opts.broker_cmd, opts.workdir, f"profile-{workload.name}", opts.broker_env) as broker:
        wait_for_quiet(opts)
        traffic_run(opts, broker, workload, max(10, n // 10))
        for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
            path = results_dir / f"profile-{workload.name}-{stamp}.{suffix}"
            spy = subprocess.Popen(
                [py_spy, "record", "-p", str(broker.pid), "--nonblocking", "--idle", "--threads", "--rate", str(rate),
                 "--format", fmt, "-o", str(path)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            time.sleep(1.0)  # attach
            record = traffic_run(opts, broker, workload, n)
            spy.send_signal(signal.SIGINT)
            spy_output, _ = spy.communicate(timeout=60)
            out["files"][fmt] = str(path)
            out["runs"][fmt] = record
            out.setdefault("py_spy_output", {})[fmt] = spy_output.strip()[-500:]
            opts.log(f"    profiled ({fmt}) run: {_brief(record)} -> {path}")
        raw = results_dir / f"profile-{workload.name}-{stamp}.txt"
        if raw.exists():
            report = summarize_profile(raw.read_text())
            summary_path = results_dir / f"profile-{workload.name}-{stamp}-summary.txt"
            summary_path.write_text(report)
            out["files"]["summary"] = str(summary_path)
            opts.log(report)
    return out


_WAITING = {
    "EPollReactor.doPoll (twisted/internet/epollreactor.py)",  # the reactor in epoll_wait
    "Condition.wait (threading.py)",
    "Event.wait (threading.py)",
    "Queue.get (queue.py)",
    "SimpleQueue.get (queue.py)",
}
"""Innermost frames that mean a thread is waiting, not working.  (The rest of the reactor's
doPoll is a loop over the ready descriptors, whose time shows in its callees.)"""


def _function(frame: str) -> str:
    """``name (file:line)`` -> ``name (file)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else frame


def summarize_profile(raw: str, top: int = 20) -> str:
    """Where py-spy's samples fall, per thread: waiting vs. working; then, over the working
    samples, self time by line and by function, and inclusive time by function."""
    threads: dict[str, list[tuple[list[str], int]]] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not (stack and count.isdigit()):
            continue
        frames = stack.split(";")
        thread = "all threads"
        if frames[0].startswith("thread ("):
            thread = frames[0].split(": ", 1)[-1].strip() or frames[0]
            frames = frames[1:]
        threads.setdefault(thread, []).append((frames, int(count)))
    if not threads:
        return "no samples\n"

    def table(title: str, counts: dict[str, int], busy: int) -> list[str]:
        rows = [f"  {title} (% of working samples)"]
        for name, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            rows.append(f"    {100.0 * count / busy:5.1f}%  {name}")
        return rows

    lines = []
    for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(c for _, c in kv[1])):
        total = sum(count for _, count in stacks)
        working = [(frames, count) for frames, count in stacks if frames and _function(frames[-1]) not in _WAITING]
        busy = sum(count for _, count in working)
        lines.append(f"{thread}: {total} samples, waiting {100.0 * (total - busy) / total:.1f}%, "
                     f"working {100.0 * busy / total:.1f}%")
        if busy < 0.02 * total or not busy:
            lines.append("")
            continue
        self_line: dict[str, int] = {}
        self_func: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        for frames, count in working:
            leaf = frames[-1]
            self_line[leaf] = self_line.get(leaf, 0) + count
            self_func[_function(leaf)] = self_func.get(_function(leaf), 0) + count
            for name in {_function(frame) for frame in frames}:
                inclusive[name] = inclusive.get(name, 0) + count
        lines += table("self time by line", self_line, busy)
        lines += table("self time by function", self_func, busy)
        # Frames in (nearly) every working sample are the twistd/reactor scaffolding.
        inclusive = {name: count for name, count in inclusive.items() if count < 0.95 * busy}
        lines += table("inclusive time by function (below the reactor loop)", inclusive, busy)
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- reporting

def export_commit(revision: str, into: Path) -> tuple[str, Path]:
    """``git archive`` brokerd/ of ``revision`` into ``into``; return the full commit id and
    the directory to put first on the broker's PYTHONPATH.  Measuring a commit keeps a long
    run from measuring a working tree that others are editing."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=REPO,
                            capture_output=True, text=True)
    if commit.returncode != 0:
        sys.exit(f"run_ssmp: --commit {revision}: {commit.stderr.strip()}")
    target = into / "source"
    target.mkdir()
    archive = subprocess.run(["git", "archive", commit.stdout.strip(), "brokerd"], cwd=REPO,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return commit.stdout.strip(), target


def source_state(exported: Path | None = None) -> dict[str, Any]:
    """Which brokerd was measured: the git commit and a digest of the brokerd/ sources (the
    working tree's, uncommitted changes included, or those exported by --commit)."""
    state: dict[str, Any] = {}
    try:
        state["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                         text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "brokerd"], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout.splitlines()
        state["uncommitted_brokerd_files"] = len(changed)
    except (OSError, subprocess.CalledProcessError):
        pass
    root = exported if exported is not None else REPO
    digest = hashlib.sha256()
    for path in sorted((root / "brokerd").rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    state["brokerd_sources_sha256"] = digest.hexdigest()[:16]
    return state


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    with open("/proc/meminfo") as handle:
        mem_kb = int(handle.readline().split()[1])
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_implementation() + " " + platform.python_version(),
        "mem_gb": round(mem_kb / 1024 / 1024, 1),
        "loadavg_at_start": loadavg(),
    }


def _k(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.2f}M"
    return f"{value / 1000:.0f}k"


def _range(stats: dict[str, float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(stats['median'])} ({fmt(stats['min'])}–{fmt(stats['max'])})"


def _verdict(summary: dict[str, Any]) -> str:
    if not summary.get("valid", False):
        return "INVALID"
    checks = summary.get("targets", [])
    if not checks:
        return "—"
    return ", ".join(f"{'PASS' if c['met'] else 'MISS'} ({c['target']})" for c in checks)


def markdown(results: dict[str, Any]) -> str:
    workloads = results["workloads"]
    ms = lambda v: f"{v:.2f}"  # noqa: E731
    pct = lambda v: f"{v:.0f}"  # noqa: E731
    out = []
    for kind, head in (("sat", "| saturation | N/pub | deliveries/s | msgs/s | p99 ms (queue) "),
                       ("rate", "| fixed rate | N/pub | deliveries/s | p50 ms | p99 ms ")):
        chosen = [w for w in workloads.values() if w["kind"] == kind]
        if not chosen:
            continue
        out += [head + "| gen CPU % | broker CPU % | broker waiting % | other CPU % | disturbed | target |",
                "|---" * 11 + "|"]
        for w in chosen:
            s = w["summary"]
            if "deliv_per_s" not in s:
                out.append(f"| {w['title']} | {w['n']:,} | failed ||||||||INVALID |")
                continue
            if kind == "sat":
                figures = (f"{_range(s['deliv_per_s'], _k)} | {_range(s['msgs_per_s'], _k)} | "
                           f"{ms(s['p99_ms']['median'])}")
            else:
                figures = (f"{_k(s['deliv_per_s']['median'])} | {_range(s['p50_ms'], ms)} | "
                           f"{_range(s['p99_ms'], ms)}")
            out.append(f"| {w['title']} | {w['n']:,} | {figures} | {_range(s['gen_cpu_pct'], pct)} | "
                       f"{_range(s['broker_cpu_pct'], pct)} | {pct(s['broker_wait_pct']['median'])} | "
                       f"{pct(s['other_cpu_pct']['median'])} | {s['disturbed']}/{s['runs']} | {_verdict(s)} |")
        out.append("")
    idle = [w for w in workloads.values() if w["kind"] == "idle"]
    for w in idle:
        s = w["summary"]
        kb = lambda v: f"{v / 1024:.2f}"  # noqa: E731
        mb = lambda v: f"{v / 1024:.1f}"  # noqa: E731
        out += ["| idle connections | RSS before MB | RSS after MB | KB per connection | target |",
                "|---|---|---|---|---|",
                f"| {w['n']:,} logged in + subscribed | {_range(s['rss_before_kb'], mb)} | "
                f"{_range(s['rss_after_kb'], mb)} | {_range(s['bytes_per_conn'], kb)} | {_verdict(s)} |", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated workloads: {','.join(WORKLOADS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: N/5 of the bench README's, 1 run, 1,000 idle connections")
    parser.add_argument("--runs", type=int, help="measured runs per workload (default 3; --quick 1)")
    parser.add_argument("--scale", type=float,
                        help="saturation N = the bench README's N times this (default 5, as the README "
                             "advises for a fast server: runs under ~1 s are noisy; --quick 0.2)")
    parser.add_argument("--idle-connections", type=int, help="idle workload size (default 10000; --quick 1000)")
    parser.add_argument("--profile", metavar="WORKLOAD",
                        help="run py-spy on the broker during one run of these workloads (comma-separated); "
                             "without --only, only the profiles run")
    parser.add_argument("--summarize-profile", type=Path, metavar="RAW",
                        help="print the summary of a raw py-spy file written by --profile, and exit")
    parser.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second [250]")
    parser.add_argument("--pbload-src", type=Path, default=DEFAULT_PBLOAD_SRC, help="pbload.c [%(default)s]")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                        help="where the compiled pbload is kept [%(default)s]")
    parser.add_argument("--broker-cmd", default=DEFAULT_BROKER_CMD,
                        help="broker command; {port}, {data_dir} and {twistd} are filled in [%(default)s]")
    parser.add_argument("--commit", metavar="REV",
                        help="measure brokerd/ as of this git revision (exported to a temporary "
                             "directory, first on the broker's PYTHONPATH) instead of the working tree")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="[%(default)s]")
    parser.add_argument("--quiet-limit", type=float, default=25.0,
                        help="before a workload, wait until the machine is busy less than this %% of a core [25]")
    parser.add_argument("--noise-limit", type=float, default=30.0,
                        help="a run where other processes used more than this %% of a core is repeated [30]")
    parser.add_argument("--retries", type=int, default=3, help="repeats of noisy runs per workload [3]")
    parser.add_argument("--max-wait", type=float, default=180.0, help="longest wait for a quiet machine, s [180]")
    parser.add_argument("--timeout", type=float, default=300.0, help="limit for one pbload run, s [300]")
    args = parser.parse_args(argv)
    profile = [n.strip() for n in args.profile.split(",")] if args.profile else []
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    else:
        names = [] if profile else list(WORKLOADS)  # --profile alone runs only the profiles
    unknown = [n for n in names + profile if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if any(WORKLOADS[n].kind == "idle" for n in profile):
        parser.error("--profile takes traffic workloads, not idle")
    args.names, args.profile_names = names, profile
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize_profile:
        print(summarize_profile(args.summarize_profile.read_text()), end="")
        return 0
    quick = args.quick
    binary = build_pbload(args.pbload_src.resolve(), args.cache_dir)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="brokerd-bench-") as workdir:
        exported = None
        broker_env: dict[str, str] = {}
        if args.commit:
            commit, exported = export_commit(args.commit, Path(workdir))
            broker_env["PYTHONPATH"] = os.pathsep.join(
                [str(exported)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        opts = Options(
            binary=binary,
            broker_cmd=args.broker_cmd,
            broker_env=broker_env,
            workdir=Path(workdir),
            runs=args.runs or (1 if quick else 3),
            scale=args.scale if args.scale is not None else (0.2 if quick else 5.0),
            rate_scale=0.2 if quick else 1.0,
            idle_connections=args.idle_connections or (1000 if quick else 10_000),
            quiet_limit=args.quiet_limit,
            noise_limit=args.noise_limit,
            retries=args.retries,
            max_wait=args.max_wait,
            timeout=args.timeout,
            log=log,
        )
        results: dict[str, Any] = {
            "started": _dt.datetime.now().isoformat(timespec="seconds"),
            "machine": machine_info(),
            "source": {**source_state(exported), **({"measured_commit": commit} if exported else {})},
            "pbload": {"source": str(args.pbload_src.resolve()), "binary": str(binary)},
            "broker_cmd": args.broker_cmd,
            "settings": {"runs": opts.runs, "scale": opts.scale, "rate_scale": opts.rate_scale,
                         "idle_connections": opts.idle_connections, "quick": quick,
                         "noise_limit": opts.noise_limit, "quiet_limit": opts.quiet_limit},
            "workloads": {},
        }
        m = results["machine"]
        log(f"{m['cpus']} x {m['cpu_model']}, {m['python']}, load {m['loadavg_at_start']}")
        try:
            for name in args.names:
                workload = WORKLOADS[name]
                log(f"{workload.title}")
                if workload.kind == "idle":
                    results["workloads"][name] = run_idle_workload(opts, workload)
                else:
                    results["workloads"][name] = run_traffic_workload(opts, workload)
            if args.profile_names:
                results["profiles"] = {}
                for name in args.profile_names:
                    log(f"profile {WORKLOADS[name].title}")
                    results["profiles"][name] = profile_workload(
                        opts, WORKLOADS[name], args.results_dir, stamp, args.profile_rate)
        finally:
            results["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
            results["source_at_end"] = source_state(exported)
            if exported is None and results["source_at_end"] != results["source"]:
                log("WARNING: brokerd's sources changed during the run; the workloads measured "
                    "different code")
            results["loadavg_at_end"] = loadavg()
            results["markdown"] = markdown(results)
            path = args.results_dir / f"ssmp-{stamp}{'-quick' if quick else ''}.json"
            path.write_text(json.dumps(results, indent=1) + "\n")
            log(f"raw results: {path}")
    print(results["markdown"])
    invalid = [w["workload"] for w in results["workloads"].values() if not w["summary"].get("valid")]
    if invalid:
        log(f"INVALID (lost messages, errors or failed runs): {', '.join(invalid)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

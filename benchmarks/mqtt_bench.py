"""brokerd's MQTT front end beside Debian's mosquitto, in the same run.

Workloads (MQTT 3.1.1, 64-byte payloads, loopback):

* ``q0-1``     QoS 0, 1 publisher -> 1 subscriber (pbload ``--proto mqtt``);
* ``q0-50``    QoS 0, 1 publisher -> 50 subscribers of one topic (fan-out);
* ``q0-pairs`` QoS 0, 10 publishers each to its own topic with one subscriber;
* ``q0-pairs-rate`` the same at a fixed 2,000 messages/s per publisher (pbload ``--rate``):
  both servers at an equal load, where the saturated pairs compare a brokerd whose publishers
  gave up their window (pbload's ``stalls``) with a mosquitto whose publishers poll it;
* ``q1-ack``   QoS 1, one publisher waiting for each PUBACK, one subscriber at QoS 1;
* ``q1-win``   QoS 1, the same with up to ``--window`` (64) PUBLISHes awaiting their PUBACK;
* ``q1-stored`` q1-win with a persistent subscriber (Clean Session 0): on brokerd its
  subscription is the core's durable one, so every message is committed to the SQLite store
  before its PUBACK and settled at the subscriber's (mosquitto keeps the session in memory:
  ``persistence false``, and with persistence on it writes only every ``autosave_interval``).

pbload (the shared load generator, ``../shared/bench/pbload.c``) speaks MQTT at QoS 0 only
(window 1000, batch 16: its defaults).  The QoS 1 workloads use a client of this script: a
publisher and a subscriber, each its own forked process with a blocking socket.  The handshakes
are encoded with brokerd.protocols.mqtt.encoder.encode and read with MQTTClientDecoder; in the
measured part the publisher writes PUBLISH packets encoded before the clock starts and counts
the 4-byte PUBACKs, and the subscriber frames what it reads with a few lines of its own (fixed
header, topic, Packet Identifier) and answers each PUBLISH with a PUBACK, all of one read in
one ``send()``.  The publisher also stays at most 500 messages ahead of what the subscriber
received (a counter in shared memory), below both servers' default queue of 1,000 QoS 1
messages per session.  Each client process reports its own CPU, so a saturated client shows.

Servers, started fresh for each workload and running side by side (idle while the other is
measured): brokerd (``twistd -n brokerd --mqtt ... --no-event-log``) and mosquitto
(``/usr/sbin/mosquitto -c``, a config of ``listener PORT 127.0.0.1``, ``allow_anonymous
true``, ``persistence false``, ``log_type none``).  One warm-up run each at N/10, then
``--runs`` (3) rounds, the servers alternating (brokerd first in odd rounds, mosquitto first
in even ones).  Per run: the server process's utime + stime (/proc/PID/stat) over the run,
divided by the messages delivered to subscribers, and deliveries/s (pbload's first send to
last delivery; for QoS 1 the publisher's first send to the subscriber's last receipt); the
medians (min-max) are printed as a table with /proc/loadavg before and after.

    python benchmarks/mqtt_bench.py                       # everything, ~3 minutes
    python benchmarks/mqtt_bench.py --quick               # smoke check: one short round, no warm-up
    python benchmarks/mqtt_bench.py --only q0-50,q1-win --runs 5
    python benchmarks/mqtt_bench.py --commits HEAD        # brokerd of a commit (git archive)
    python benchmarks/mqtt_bench.py --profile /tmp/prof --only q0-1   # cProfile of brokerd, one run each

Needs gcc, Linux /proc and /usr/sbin/mosquitto (``--mosquitto``).  Run from the repository
root with brokerd's environment (twistd finds the brokerd plugin there).  Exit status 1 when a
run lost messages or failed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pstats
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ssmp import cpu_seconds, revisions
from run_ssmp import (
    DEFAULT_CACHE_DIR,
    DEFAULT_PBLOAD_SRC,
    REPO,
    BrokerProcess,
    build_pbload,
    loadavg,
    run_pbload,
)

from brokerd.protocols.mqtt.decoder import MQTTClientDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_311,
    Connack,
    Connect,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)

BROKERD_CMD = "{twistd} -n --pidfile= brokerd --mqtt tcp:{port}:interface=127.0.0.1 --data-dir {data_dir} --no-event-log"
MOSQUITTO = "/usr/sbin/mosquitto"
MINIMAL_MQTT = Path(__file__).resolve().parent / "minimal_mqtt.py"
MOSQUITTO_CONF = ("listener {port} 127.0.0.1", "allow_anonymous true", "persistence false", "log_type none")
PAYLOAD_BYTES = 64
Q1_TOPIC = "bench0"
Q1_AHEAD = 500
"""QoS 1: messages the publisher may be ahead of the subscriber's receipts (both servers keep
1,000 QoS 1 messages per session by default, 20 of them in flight, and drop the rest)."""


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    n: int
    """Messages per publisher in a measured run."""
    pbload: tuple[str, ...] = ()
    """pbload's arguments (QoS 0); empty for the QoS 1 client."""
    window: int = 0
    """QoS 1: PUBLISHes awaiting their PUBACK at most."""
    persistent: bool = False
    """QoS 1: the subscriber's session outlives its connection (Clean Session 0)."""


WORKLOADS = {
    w.key: w
    for w in (
        Workload("q0-1", "QoS 0, 1 -> 1", 120_000, ("-P", "1", "-S", "1")),
        Workload("q0-50", "QoS 0, 1 -> 50 fan-out", 12_000, ("-P", "1", "-S", "50")),
        Workload("q0-pairs", "QoS 0, 10 pairs on their own topics", 12_000, ("-P", "10", "-S", "10", "--own", "1")),
        Workload("q0-pairs-rate", "QoS 0, 10 pairs on their own topics, 10 x 2,000/s", 6_000,
                 ("-P", "10", "-S", "10", "--own", "1", "--rate", "2000")),
        Workload("q1-ack", "QoS 1, 1 -> 1, each PUBACK awaited", 20_000, window=1),
        Workload("q1-win", "QoS 1, 1 -> 1, window of {window} PUBACKs", 80_000, window=64),
        Workload("q1-stored", "QoS 1, 1 -> 1 persistent subscriber, window of {window}", 80_000, window=64,
                 persistent=True),
    )
}


def find_pbload_source() -> Path:
    """run_ssmp's default (``../shared/bench/pbload.c`` beside the repository), else the first
    ``shared/bench/pbload.c`` above the repository (a git worktree sits deeper)."""
    if DEFAULT_PBLOAD_SRC.is_file():
        return DEFAULT_PBLOAD_SRC
    for parent in REPO.parents:
        candidate = parent / "shared" / "bench" / "pbload.c"
        if candidate.is_file():
            return candidate
    return DEFAULT_PBLOAD_SRC


def proc_loadavg() -> str:
    with open("/proc/loadavg") as handle:
        return handle.read().strip()


# ---------------------------------------------------------------------------- servers

def mosquitto_server(binary: str, work: Path, label: str) -> BrokerProcess:
    """mosquitto as a BrokerProcess (free port, readiness, stop), its config in its data dir."""
    server = BrokerProcess(f"{binary} -c {{data_dir}}/mosquitto.conf", work, label)
    server.data_dir.mkdir(parents=True)
    lines = [line.format(port=server.port) for line in MOSQUITTO_CONF]
    (server.data_dir / "mosquitto.conf").write_text("\n".join(lines) + "\n")
    return server


# ---------------------------------------------------------------------------- the QoS 1 client

def _client_socket(port: int, client_id: str, timeout: float,
                   persistent: bool = False) -> tuple[socket.socket, MQTTClientDecoder]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = MQTTClientDecoder(MQTT_311)
    sock.sendall(encode(Connect(client_id, clean_start=not persistent), MQTT_311))
    connack = _expect(sock, decoder, Connack)
    if connack.reason_code != 0:
        raise SystemExit(f"mqtt_bench: CONNACK {connack.reason_code}")
    return sock, decoder


def _expect(sock: socket.socket, decoder: MQTTClientDecoder, kind: type) -> Any:
    while True:
        data = sock.recv(4096)
        if not data:
            raise SystemExit(f"mqtt_bench: connection closed before {kind.__name__}")
        packets, error = decoder.feed(data)
        if error is not None:
            raise SystemExit(f"mqtt_bench: {error}")
        if packets:
            if not isinstance(packets[0], kind) or len(packets) > 1:
                raise SystemExit(f"mqtt_bench: expected {kind.__name__}, got {packets}")
            return packets[0]


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def q1_subscriber(port: int, n: int, timeout: float, received: Any, pipe: Any, persistent: bool = False) -> None:
    """Subscribe to Q1_TOPIC at QoS 1, then PUBACK every PUBLISH until n arrived."""
    sock, decoder = _client_socket(port, f"q1s-{os.getpid()}", timeout, persistent)
    sock.sendall(encode(Subscribe(1, (Subscription(Q1_TOPIC, qos=1),)), MQTT_311))
    suback = _expect(sock, decoder, Suback)
    if suback.reason_codes != (1,):
        raise SystemExit(f"mqtt_bench: SUBACK {suback.reason_codes}")
    pipe.send("ready")
    cpu0 = _own_cpu()
    got = bad = 0
    rest = b""
    recv, sendall = sock.recv, sock.sendall
    while got < n:
        data = recv(262_144)
        if not data:
            break
        if rest:
            data = rest + data
        end = len(data)
        pos = 0
        acks = []
        while end - pos >= 2:
            first = data[pos]
            i = pos + 1
            length = shift = 0
            while i < end:
                byte = data[i]
                i += 1
                length |= (byte & 127) << shift
                shift += 7
                if byte < 128:
                    break
            else:
                break
            if i + length > end:
                break
            if first & 0xFE == 0x32:  # PUBLISH at QoS 1, DUP clear
                topic_end = i + 2 + (data[i] << 8 | data[i + 1])
                acks.append(data[topic_end:topic_end + 2])
                got += 1
            else:
                bad += 1
            pos = i + length
        rest = data[pos:]
        if acks:
            sendall(b"\x40\x02" + b"\x40\x02".join(acks))
        received.value = got
    last = time.monotonic()
    pipe.send({"received": got, "bad": bad, "last": last, "cpu_s": _own_cpu() - cpu0})
    sock.close()


def q1_publisher(port: int, n: int, window: int, timeout: float, received: Any, pipe: Any) -> None:
    """Publish n QoS 1 messages to Q1_TOPIC, at most ``window`` awaiting their PUBACK and at
    most Q1_AHEAD ahead of the subscriber's receipts."""
    sock, _ = _client_socket(port, f"q1p-{os.getpid()}", timeout)
    packets = [encode(Publish(Q1_TOPIC, f"{seq}:".encode().ljust(PAYLOAD_BYTES, b"x"), qos=1,
                              packet_id=seq % 65_535 + 1), MQTT_311) for seq in range(n)]
    offsets = [0]
    for packet in packets:
        offsets.append(offsets[-1] + len(packet))
    blob = memoryview(b"".join(packets))
    del packets
    pipe.send("ready")
    pipe.recv()  # go
    cpu0 = _own_cpu()
    started = time.monotonic()
    sent = acked = 0
    answers = []
    answered = 0
    recv, sendall = sock.recv, sock.sendall
    while acked < n:
        limit = min(acked + window, received.value + Q1_AHEAD, n)
        if sent < limit:
            sendall(blob[offsets[sent]:offsets[limit]])
            sent = limit
        if acked < sent:
            data = recv(65_536)
            if not data:
                break
            answers.append(data)
            answered += len(data)
            acked = answered // 4
        else:
            time.sleep(0.0001)
    cpu = _own_cpu() - cpu0
    answer = b"".join(answers)
    pipe.send({"acked": acked, "started": started, "cpu_s": cpu,
               "all_pubacks": len(answer) == 4 * n and answer[::4] == b"\x40" * n})
    sock.close()


def q1_run(port: int, n: int, window: int, timeout: float, pid: int, persistent: bool = False) -> dict[str, Any]:
    """One QoS 1 run: the subscriber and the publisher each in a forked process; the server's
    CPU from the publisher's go to the subscriber's last receipt."""
    context = multiprocessing.get_context("fork")
    received = context.Value("q", 0, lock=False)
    sub_end, sub_child = context.Pipe()
    pub_end, pub_child = context.Pipe()
    sub = context.Process(target=q1_subscriber, args=(port, n, timeout, received, sub_child, persistent), daemon=True)
    sub.start()
    pub = None
    try:
        if not sub_end.poll(timeout) or sub_end.recv() != "ready":
            raise SystemExit("mqtt_bench: the QoS 1 subscriber did not get ready")
        pub = context.Process(target=q1_publisher, args=(port, n, window, timeout, received, pub_child), daemon=True)
        pub.start()
        if not pub_end.poll(timeout) or pub_end.recv() != "ready":
            raise SystemExit("mqtt_bench: the QoS 1 publisher did not get ready")
        load = loadavg()[0]
        before = cpu_seconds(pid)
        pub_end.send("go")
        if not sub_end.poll(timeout):
            raise SystemExit("mqtt_bench: the QoS 1 run timed out")
        subscriber = sub_end.recv()
        used = cpu_seconds(pid) - before
        publisher = pub_end.recv() if pub_end.poll(timeout) else {}
    finally:
        for process in (sub, pub):
            if process is not None:
                process.join(5)
                if process.is_alive():
                    process.kill()
    delivered = subscriber["received"]
    elapsed = subscriber["last"] - publisher.get("started", subscriber["last"])
    return {
        "ok": delivered == n and subscriber["bad"] == 0 and publisher.get("all_pubacks", False),
        "delivered": delivered,
        "expected": n,
        "deliv_per_s": delivered / elapsed if elapsed > 0 else 0.0,
        "cpu_us_per_delivery": 1e6 * used / delivered if delivered else float("inf"),
        "server_cpu_pct": 100 * used / elapsed if elapsed > 0 else 0.0,
        "client_cpu_pct": {"pub": round(100 * publisher.get("cpu_s", 0) / elapsed, 1) if elapsed > 0 else 0.0,
                           "sub": round(100 * subscriber["cpu_s"] / elapsed, 1) if elapsed > 0 else 0.0},
        "stalls": 0,
        "load": load,
    }


# ---------------------------------------------------------------------------- runs

def pbload_run(binary: Path, server: BrokerProcess, workload: Workload, n: int, timeout: float) -> dict[str, Any]:
    load = loadavg()[0]
    before = cpu_seconds(server.pid)
    started = time.monotonic()
    run = run_pbload(binary, server.port, ["--proto", "mqtt", *workload.pbload, "-N", str(n)], timeout)
    used = cpu_seconds(server.pid) - before
    wall = time.monotonic() - started
    result = run.result
    delivered = result.get("delivered", 0)
    return {
        "ok": run.returncode == 0 and delivered == result.get("expected"),
        "delivered": delivered,
        "expected": result.get("expected"),
        "deliv_per_s": result.get("deliv_per_s", 0.0),
        "cpu_us_per_delivery": 1e6 * used / delivered if delivered else float("inf"),
        "server_cpu_pct": 100 * used / wall,
        "client_cpu_pct": result.get("gen_cpu_pct", 0.0),
        "stalls": result.get("stalls", 0),
        "load": load,
        **({"stderr": run.stderr} if run.returncode else {}),
    }


def one_run(binary: Path, server: BrokerProcess, workload: Workload, n: int, timeout: float) -> dict[str, Any]:
    if workload.pbload:
        return pbload_run(binary, server, workload, n, timeout)
    return q1_run(server.port, n, workload.window, timeout, server.pid, workload.persistent)


def title(workload: Workload) -> str:
    return workload.title.format(window=workload.window)


def _median_range(values: list[float], fmt: str) -> str:
    text = format(statistics.median(values), fmt)
    if len(values) > 1:
        text += f" ({format(min(values), fmt)}–{format(max(values), fmt)})"
    return text


def _rate(value: float) -> str:
    return f"{value / 1e3:,.1f}k" if value < 1e6 else f"{value / 1e6:,.2f}M"


def _client(runs: list[dict[str, Any]]) -> str:
    first = runs[0]["client_cpu_pct"]
    if isinstance(first, dict):
        return " / ".join(f"{statistics.median(r['client_cpu_pct'][k] for r in runs):.0f}" for k in first)
    return f"{statistics.median(r['client_cpu_pct'] for r in runs):.0f}"


def table(rows: list[tuple[Workload, int, dict[str, list[dict[str, Any]]]]]) -> str:
    lines = [
        ("| workload | N (per publisher) | server | CPU µs per delivery | deliveries/s | CPU ratio (brokerd / mosquitto) "
         "| server CPU % | client CPU % | load (1 min) |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, n, results in rows:
        reference = [r["cpu_us_per_delivery"] for r in results.get("mosquitto", [])]
        for label, runs in results.items():
            if not runs:
                continue
            cpu = [r["cpu_us_per_delivery"] for r in runs]
            ratio = f"{statistics.median(cpu) / statistics.median(reference):.2f}" if reference and label != "mosquitto" else ""
            rates = [r["deliv_per_s"] for r in runs]
            rate = _rate(statistics.median(rates))
            if len(rates) > 1:
                rate += f" ({_rate(min(rates))}–{_rate(max(rates))})"
            stalls = sum(r["stalls"] for r in runs)
            lost = sum(not r["ok"] for r in runs)
            notes = (f", {stalls} stalls" if stalls else "") + (f", {lost} runs LOST MESSAGES" if lost else "")
            loads = ", ".join(f"{r['load']:.1f}" for r in runs)
            lines.append(
                f"| {title(workload)} | {n:,} | {label}{notes} | {_median_range(cpu, '.2f')} | {rate} | {ratio} "
                f"| {statistics.median(r['server_cpu_pct'] for r in runs):.0f} | {_client(runs)} | {loads} |"
            )
    return "\n".join(lines)


def profile(opts: argparse.Namespace, binary: Path, workloads: list[Workload], work: Path, env: dict[str, str]) -> None:
    """One run of each workload against brokerd under twistd's cProfile; top functions."""
    opts.profile.mkdir(parents=True, exist_ok=True)
    for workload in workloads:
        out = opts.profile / f"{workload.key}.prof"
        command = opts.broker_cmd.replace("{twistd} -n", f"{{twistd}} -n --profile={out} --profiler=cprofile --savestats")
        n = max(100, int(workload.n * opts.scale))
        with BrokerProcess(command, work, f"profile-{workload.key}", env) as server:
            one_run(binary, server, workload, max(10, n // 10), opts.timeout)
            record = one_run(binary, server, workload, n, opts.timeout)
        print(f"\n== {title(workload)}: {record['deliv_per_s']:,.0f} deliveries/s under cProfile; {out}", flush=True)
        stats = pstats.Stats(str(out))
        stats.sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"workloads [{','.join(WORKLOADS)}]")
    parser.add_argument("--runs", type=int, default=3, help="measured rounds after the warm-up [3]")
    parser.add_argument("--scale", type=float, default=1.0, help="N multiplier [1]")
    parser.add_argument("--window", type=int, default=64, help="q1-win: PUBLISHes awaiting their PUBACK [64]")
    parser.add_argument("--quick", action="store_true", help="smoke check: one round at N/10, no warm-up")
    parser.add_argument("--commits", default=".", help="brokerd revisions, comma-separated; '.' is the working tree [.]")
    parser.add_argument("--broker-cmd", default=BROKERD_CMD, help="brokerd's command ({port}, {data_dir}, {twistd})")
    parser.add_argument("--mosquitto", default=MOSQUITTO, help=f"the mosquitto binary [{MOSQUITTO}]")
    parser.add_argument("--no-mosquitto", action="store_true", help="brokerd revisions only")
    parser.add_argument("--minimal", action="store_true",
                        help="also benchmarks/minimal_mqtt.py, a minimal Twisted MQTT server (the Python floor)")
    parser.add_argument("--pbload-src", type=Path, default=find_pbload_source())
    parser.add_argument("--json", type=Path, help="write every run's record here")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="instead of measuring: one run of each workload against brokerd under cProfile")
    parser.add_argument("--timeout", type=float, default=120.0)
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.runs, opts.scale = 1, opts.scale / 10
    workloads = []
    for key in opts.only.split(","):
        if key not in WORKLOADS:
            parser.error(f"unknown workload {key!r} (known: {', '.join(WORKLOADS)})")
        workload = WORKLOADS[key]
        if workload.window > 1:
            workload = Workload(workload.key, workload.title, workload.n, workload.pbload, opts.window)
        workloads.append(workload)
    mosquitto = None
    if not opts.no_mosquitto and opts.profile is None:
        mosquitto = shutil.which(opts.mosquitto)
        if mosquitto is None:
            parser.error(f"{opts.mosquitto} not found (apt-get install mosquitto), or use --no-mosquitto")
    binary = build_pbload(opts.pbload_src, DEFAULT_CACHE_DIR)
    failures = 0
    records = []
    with tempfile.TemporaryDirectory(prefix="mqtt-bench-") as scratch:
        work = Path(scratch)
        brokers = {f"brokerd {label}" if opts.commits != "." else "brokerd": env
                   for label, env in revisions(opts.commits, work)}
        if opts.profile is not None:
            profile(opts, binary, workloads, work, next(iter(brokers.values())))
            return 0
        start_load = proc_loadavg()
        print(f"/proc/loadavg before: {start_load} ({os.cpu_count()} CPUs)", flush=True)
        rows = []
        for workload in workloads:
            n = max(100, int(workload.n * opts.scale))
            servers: dict[str, BrokerProcess] = {
                label: BrokerProcess(opts.broker_cmd, work, f"b{index}-{workload.key}", env)
                for index, (label, env) in enumerate(brokers.items())
            }
            if opts.minimal:
                servers["minimal Twisted"] = BrokerProcess(f"{sys.executable} {MINIMAL_MQTT} {{port}}", work,
                                                           f"minimal-{workload.key}")
            if mosquitto is not None:
                servers["mosquitto"] = mosquitto_server(mosquitto, work, f"mosquitto-{workload.key}")
            results: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
            try:
                for server in servers.values():
                    server.__enter__()
                rounds = [(0, max(10, n // 10))] * (not opts.quick) + [(r + 1, n) for r in range(opts.runs)]
                for number, count in rounds:
                    order = list(servers.items())
                    if number % 2 == 0:
                        order.reverse()
                    for label, server in order:
                        record = one_run(binary, server, workload, count, opts.timeout)
                        records.append({"workload": workload.key, "server": label, "round": number, "n": count, **record})
                        status = "" if record["ok"] else "  [LOST MESSAGES / FAILED]"
                        print(f"  {workload.key} {'warm-up' if number == 0 else f'round {number}'} {label}: "
                              f"{record['cpu_us_per_delivery']:.2f} µs CPU/delivery, {record['deliv_per_s']:,.0f} deliveries/s, "
                              f"server {record['server_cpu_pct']:.0f} %, client {record['client_cpu_pct']} %, "
                              f"stalls {record['stalls']}, load {record['load']:.1f}{status}", flush=True)
                        if number:
                            results[label].append(record)
                            failures += not record["ok"]
            finally:
                for server in servers.values():
                    server.__exit__()
            rows.append((workload, n, results))
        end_load = proc_loadavg()
    print(f"/proc/loadavg after: {end_load}\n")
    print(f"median (min–max) of {opts.runs} alternating round(s){'' if opts.quick else ' after a warm-up'}; "
          "client CPU %: pbload's, or the QoS 1 publisher / subscriber's (100 = one core)\n")
    print(table(rows))
    if opts.json is not None:
        opts.json.write_text(json.dumps({"loadavg_before": start_load, "loadavg_after": end_load,
                                         "cpus": os.cpu_count(), "runs": records}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

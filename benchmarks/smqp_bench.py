"""Durable publish with acknowledged delivery: throughput and latency.

    python benchmarks/smqp_bench.py                      # 1 and 10 publishers, group commit on and off
    python benchmarks/smqp_bench.py --publishers 10 --messages 500 --no-compare
    python benchmarks/smqp_bench.py --publishers 10 --messages 20000 --no-compare --runs 3 \
        --commit main --commit HEAD                      # two revisions side by side, median of 3
    python benchmarks/smqp_bench.py --publishers 10 --no-compare --ssmp   # SSMP MCAST publishers
    python benchmarks/smqp_bench.py --publishers 10 --messages 5000 --no-compare --drain   # one subscriber drains
    python benchmarks/smqp_bench.py --publishers 10 --messages 5000 --no-compare --drain --notify-window 64 \
        --runs 3                                         # the draft's one at a time and a window of 64
    python benchmarks/smqp_bench.py --publishers 10 --no-compare --runs 3 \
        --store sqlite --store postgresql                # the two stores side by side

A real ``twistd brokerd --smqp`` runs in its own process on a fresh data dir (SQLite,
synchronous=FULL).  Each publisher is its own process with a blocking socket that keeps
``--window`` PUBLISH commands in flight (pipelined); one durable subscriber process takes
every NOTIFY MESSAGE through the two-phase commit (``310 ACK`` -> ``310 ACK``) before the
next.  So the client side is never the bottleneck: every process does little but parse.

``--drain``: the subscriber subscribes first, is offline while the publishers publish, and
then drains the stored backlog alone: the acknowledged delivery rate of one subscriber
(``drain_rate``, first NOTIFY to last ``310``) with no publisher sharing the store's commits.
``--notify-window N`` drains once with the draft's exchange (one NOTIFY outstanding) and once
with ``SET NOTIFY WINDOW N`` (brokerd's extension, docs/smqp.md) in every run, side by side
(``--window-only``: with the window alone, which keeps a long publish phase quick to drain):
the subscriber then answers every NOTIFY a read brought in one write and counts the server's
``310``s, the drain ending at the last one.

``--profile DIR``: py-spy records the broker (all threads, idle samples left out; with
``--profile-gil`` only the thread holding the GIL) into DIR for each run, in its raw
collapsed-stack format (with ``--drain``: the publishing and the drain in a file each).  The drain also reports the
broker's CPU (all threads, from /proc) and the subscriber's per acknowledged delivery, and
the broker's CPU per durable publish while the publishers stored the backlog
(``publish_broker_cpu_us``: no subscriber connected then, so it is the publish path alone).

``--callgrind DIR``: the broker runs under ``valgrind --tool=callgrind`` with the
instrumentation off until the publishers start; it is on while they publish and (with
``--drain``) while the subscriber drains, each phase dumped into DIR on its own, and the run
reports the instructions the broker executed per durable publish (``publish_broker_ir``)
and per acknowledged delivery (``drain_broker_ir``), all threads.  Instruction counts do not
move with the machine's load, unlike CPU time: the evidence for a change on a busy machine
(the wall-clock figures of such a run mean nothing: everything runs some 50 times slower).

``--ssmp``: the publishers are SSMP clients (``MCAST bench`` pipelined the same way) and the
subscriber is still the SMQP durable subscriber of ``/bench``: every ``200`` then means the
core stored the message for it.

``--minimal`` also runs every figure against ``minimal_smqp.py`` (a ~200-line Twisted and
SQLite SMQP server, ``synchronous=FULL`` like brokerd's store, with the window extension too)
in the same run, each variant in turn: the floor for CPython.  Its "broker CPU" is that
server's process.

``--store postgresql`` runs the broker with ``--store postgresql://...`` on a PostgreSQL
server the benchmark starts for itself (initdb in a temp dir, fsync on, a fresh database per
run; tests/support/postgres.py); ``--store sqlite`` (the default) is the SQLite file.  Given
both, every run does each store in turn.

``--commit REV`` (repeatable) runs the broker from that revision (``brokerd/`` and
``twisted/`` exported with ``git archive``) instead of the working tree; with several, every
run does each revision in turn, so they share the machine's load.  ``--runs N`` repeats (after
one warm-up run per revision, not reported) and prints the median of each figure.

Reported per run: publish rate (200 replies per second, all publishers together), publish
latency (command sent -> its 200: persisted), end-to-end latency (publish sent -> NOTIFY at
the subscriber) as p50/p99, the acknowledged delivery rate, and how many store transactions
were needed.  "group commit off" runs the same broker with one operation per transaction
(``brokerd.store.sqlite.MAX_BATCH = 1``, patched in the broker process only).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from brokerd.auth.accounts import PasswordHash, write_accounts  # noqa: E402
from brokerd.protocols.smqp.codec import SMQPClientParser, encode_body, format_datetime  # noqa: E402
from brokerd.protocols.smqp.events import Body, Notify, Reply, Section  # noqa: E402

TOPIC = "/bench"
LAUNCH = """
import sys
import brokerd.store.sqlite as store
store.MAX_BATCH = int(sys.argv[1])
from twisted.scripts.twistd import run
sys.argv = ["twistd"] + sys.argv[2:]
run()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.parser = SMQPClientParser()
        self.events: list = []
        self.next()

    def next(self):
        while not self.events:
            data = self.sock.recv(262144)
            if not data:
                raise EOFError("closed")
            self.events.extend(self.parser.feed(data))
        return self.events.pop(0)

    def command(self, line: str) -> Reply:
        self.sock.sendall(line.encode() + b"\r\n")
        event = self.next()
        assert isinstance(event, Reply), event
        return event

    def login(self, account: str, channel: str, password: str) -> None:
        assert self.command(f"LOGIN {account}:{channel} CLEAR/1.0").code == 200
        reply = self.command(f"PASS {account} {password}")
        assert reply.code == 200, reply


def publish_command(cmuid: str, size: int) -> bytes:
    payload = repr(time.time()).encode().ljust(size, b".")
    body = Body((("Created", format_datetime(time.time())),),
                (Section((("Content-Type", "text/plain"),), payload),))
    return f"PUB MESSAGE {TOPIC} {cmuid}\r\n".encode() + encode_body(body)


def pipelined(send, acknowledged, command, count: int, window: int, start: float) -> list[float]:
    """From ``start`` on, keep ``window`` commands (``command(n)``) in flight until ``count``
    were acknowledged (``acknowledged()`` waits for the next one); each one's latency."""
    while time.time() < start:
        time.sleep(0.001)
    sent: list[float] = []
    latencies: list[float] = []
    in_flight = 0
    while len(latencies) < count:
        burst = []
        while in_flight < window and len(sent) < count:
            burst.append(command(len(sent)))
            sent.append(time.perf_counter())
            in_flight += 1
        if burst:
            send(b"".join(burst))
        acknowledged()
        latencies.append(time.perf_counter() - sent[len(latencies)])
        in_flight -= 1
    return latencies


def ssmp_publisher(port: int, index: int, count: int, window: int, size: int, start: float, out) -> None:
    """As :func:`publisher`, over SSMP: ``MCAST bench <send time>`` pipelined, one ``200``
    per message."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    reader = sock.makefile("rb")
    sock.sendall(f"LOGIN p{index} open\n".encode())
    assert reader.readline() == b"200\n"

    def acknowledged() -> None:
        line = reader.readline()
        assert line == b"200\n", line

    def command(_n: int) -> bytes:
        return b"MCAST bench " + repr(time.time()).encode().ljust(size, b".") + b"\n"

    latencies = pipelined(sock.sendall, acknowledged, command, count, window, start)
    out.put(("publisher", index, time.time(), latencies))


def publisher(port: int, index: int, count: int, window: int, size: int, start: float, out) -> None:
    conn = Conn(port)
    conn.login("alice", f"p{index}", "alicepw")

    def acknowledged() -> None:
        event = conn.next()
        assert isinstance(event, Reply) and event.code == 200, event

    latencies = pipelined(conn.sock.sendall, acknowledged, lambda n: publish_command(f"B{index}x{n}", size),
                          count, window, start)
    out.put(("publisher", index, time.time(), latencies))


def subscriber(port: int, total: int, ready, out, subscribe: bool = True) -> None:
    conn = Conn(port)
    conn.login("bob", "sub", "bobpw")
    if subscribe:
        conn.command(f"SUB MESSAGE {TOPIC}")
    ready.set()
    latencies: list[float] = []
    first = None
    cpu = 0.0
    while len(latencies) < total:
        event = conn.next()
        if not isinstance(event, Notify):
            continue
        now = time.time()
        if first is None:
            first, cpu = now, time.process_time()
        sent = float(event.body.sections[0].data.rstrip(b"."))
        latencies.append(now - sent)
        conn.sock.sendall(b"310 ACK\r\n")
        reply = conn.next()
        while not isinstance(reply, Reply):
            reply = conn.next()
        assert reply.code == 310, reply
    out.put(("subscriber", 0, time.time(), (first, latencies, time.process_time() - cpu)))


def windowed_subscriber(port: int, total: int, notify_window: int, ready, out) -> None:
    """The drain with ``SET NOTIFY WINDOW notify_window``: every NOTIFY a read brings is
    answered in one write; done once the server's ``310`` of the last one came."""
    conn = Conn(port)
    conn.login("bob", "sub", "bobpw")
    conn.sock.sendall(b"SET NOTIFY SUSPEND\r\n" + f"SET NOTIFY WINDOW {notify_window}\r\n".encode()
                      + b"SET NOTIFY RESUME\r\n")
    ready.set()
    latencies: list[float] = []
    first = None
    cpu = 0.0
    confirmed = 0
    replies: list[int] = []
    events, conn.events = conn.events, []
    while confirmed < total:
        answers = 0
        for event in events:
            if isinstance(event, Notify):
                now = time.time()
                if first is None:
                    first, cpu = now, time.process_time()
                latencies.append(now - float(event.body.sections[0].data.rstrip(b".")))
                answers += 1
            elif isinstance(event, Reply):
                if event.code == 310:
                    confirmed += 1
                else:
                    replies.append(event.code)
        if answers:
            conn.sock.sendall(b"310 ACK\r\n" * answers)
        if confirmed >= total:
            break
        data = conn.sock.recv(262144)
        if not data:
            raise EOFError("closed")
        events = conn.parser.feed(data)
    assert replies[:3] == [200, 200, 200], f"SET NOTIFY WINDOW {notify_window} refused: {replies}"
    out.put(("subscriber", 0, time.time(), (first, latencies, time.process_time() - cpu)))


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (all threads, user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _callgrind(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True, timeout=300)


def _callgrind_phase(pid: int, directory: Path, label: str, phase: str) -> float:
    """Dump the instructions counted since the last dump (the phase ``phase``), zero the
    counters, and return the instructions of that dump (all threads)."""
    before = set(directory.iterdir())
    _callgrind(pid, f"--dump={phase}")
    _callgrind(pid, "-z")
    deadline = time.time() + 300
    while True:
        new = [path for path in set(directory.iterdir()) - before if label in path.name]
        if new:
            time.sleep(1)  # the dump is written by the broker process
            break
        if time.time() > deadline:
            raise RuntimeError("callgrind wrote no dump")
        time.sleep(0.2)
    total = 0
    for path in new:
        for line in path.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return float(total)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def export(revision: str) -> Path:
    """``brokerd/`` and ``twisted/`` (the plugin) of ``revision`` in a temporary directory."""
    tree = Path(tempfile.mkdtemp(prefix="smqp-bench-tree-"))
    archive = subprocess.run(["git", "archive", revision, "brokerd", "twisted"], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def run_once(publishers: int, messages: int, window: int, size: int, group_commit: bool,
             tree: Path = REPO, ssmp: bool = False, drain: bool = False, profile: Path | None = None,
             label: str = "", gil: bool = False, store_url: str | None = None,
             notify_window: int = 1, minimal: bool = False, callgrind: Path | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="smqp-bench-"))
    accounts = work / "accounts"
    write_accounts(accounts, {"alice": PasswordHash.create("alicepw", n=2), "bob": PasswordHash.create("bobpw", n=2)})
    port = free_port()
    ssmp_port = free_port()
    args = [sys.executable, "-c", LAUNCH, "512" if group_commit else "1", "-n", "--pidfile=", "brokerd",
            "--smqp", f"tcp:{port}:interface=127.0.0.1", "--data-dir", str(work / "data"),
            "--accounts", str(accounts)]
    if ssmp:
        args += ["--ssmp", f"tcp:{ssmp_port}:interface=127.0.0.1", "--open-login"]
    if store_url is not None:
        args += ["--store", store_url]
    if notify_window > 64:
        args += ["--smqp-max-notify-window", str(notify_window)]
    if minimal:
        args = [sys.executable, str(REPO / "benchmarks" / "minimal_smqp.py"), str(port), str(work / "data")]
    if callgrind is not None:
        callgrind.mkdir(parents=True, exist_ok=True)
        if not minimal:  # some 50 times slower: the publishers' logins must not time out
            args += ["--login-timeout", "600"]
        args = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no",
                f"--callgrind-out-file={callgrind / ('callgrind.' + label + '.%p')}", *args]
    log = open(work / "broker.log", "wb")
    broker = subprocess.Popen(args, cwd=tree, stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, PYTHONPATH=str(tree)))
    try:
        deadline = time.time() + (600 if callgrind is not None else 30)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or broker.poll() is not None:
                    raise RuntimeError((work / "broker.log").read_text())
                time.sleep(0.05)
        setup = Conn(port)
        setup.login("alice", "setup", "alicepw")
        setup.command(f"CREATE TOPIC {TOPIC}")
        total = publishers * messages
        queue: multiprocessing.Queue = multiprocessing.Queue()
        ready = multiprocessing.Event()
        if drain:
            offline = Conn(port)
            offline.login("bob", "sub", "bobpw")
            offline.command(f"SUB MESSAGE {TOPIC}")
            offline.sock.close()
        if notify_window > 1:
            sub = multiprocessing.Process(target=windowed_subscriber, args=(port, total, notify_window, ready, queue))
        else:
            sub = multiprocessing.Process(target=subscriber, args=(port, total, ready, queue, not drain))
        if not drain:
            sub.start()
            ready.wait(30)
        spy = None

        def record(phase: str = "") -> subprocess.Popen:
            profile.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            name = f"smqp-{label}{phase}-{int(time.time())}.txt"
            flags = ["--nonblocking", "--threads", "-r", "500", "-f", "raw"] + (["--gil"] if gil else [])
            return subprocess.Popen(["py-spy", "record", *flags, "-o", str(profile / name),  # type: ignore[operator]
                                     "--pid", str(broker.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        if profile is not None:
            spy = record("-publish" if drain else "")
        start = time.time() + 0.5
        if callgrind is not None:
            _callgrind(broker.pid, "-i", "on")
        publish_cpu = _cpu_seconds(broker.pid)
        target, target_port = (ssmp_publisher, ssmp_port) if ssmp else (publisher, port)
        procs = [multiprocessing.Process(target=target, args=(target_port, i, messages, window, size, start, queue))
                 for i in range(publishers)]
        for proc in procs:
            proc.start()
        if drain:
            results = [queue.get(timeout=600) for _ in range(publishers)]
            broker_cpu = _cpu_seconds(broker.pid)
            publish_cpu = broker_cpu - publish_cpu
            if callgrind is not None:
                publish_ir = _callgrind_phase(broker.pid, callgrind, label, "publish")
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
                spy = record("-drain")
            sub.start()
            results.append(queue.get(timeout=600))
        else:
            results = [queue.get(timeout=600) for _ in range(publishers + 1)]
        for proc in procs + [sub]:
            proc.join(30)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        if callgrind is not None:
            phase = "drain" if drain else "publish"
            ir = _callgrind_phase(broker.pid, callgrind, label, phase)
            if not drain:
                publish_ir = ir
        published_at = max(r[2] for r in results if r[0] == "publisher")
        publish_latencies = [x for r in results if r[0] == "publisher" for x in r[3]]
        done_at, (first, e2e, sub_cpu) = next((r[2], r[3]) for r in results if r[0] == "subscriber")
        figures = {}
        if drain:
            figures = {"publish_broker_cpu_us": round(publish_cpu / total * 1e6, 1),
                       "drain_rate": round(total / (done_at - first), 1),
                       "drain_broker_cpu_us": round((_cpu_seconds(broker.pid) - broker_cpu) / total * 1e6, 1),
                       "drain_subscriber_cpu_us": round(sub_cpu / total * 1e6, 1)}
        if callgrind is not None:
            figures["publish_broker_ir"] = round(publish_ir / total, 1)
            if drain:
                figures["drain_broker_ir"] = round(ir / total, 1)
        return {**figures,
            "publishers": publishers, "protocol": "ssmp" if ssmp else "smqp", "messages": total,
            "window": window, "size": size, "group_commit": group_commit, "notify_window": notify_window,
            "publish_rate": round(total / (published_at - start), 1),
            "publish_p50_ms": round(percentile(publish_latencies, 50) * 1000, 2),
            "publish_p99_ms": round(percentile(publish_latencies, 99) * 1000, 2),
            "delivered_acked_rate": round(total / (done_at - start), 1),
            "e2e_p50_ms": round(percentile(e2e, 50) * 1000, 2),
            "e2e_p99_ms": round(percentile(e2e, 99) * 1000, 2),
            "e2e_mean_ms": round(statistics.fmean(e2e) * 1000, 2),
        }
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(15)
        except subprocess.TimeoutExpired:
            broker.kill()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishers", type=int, action="append", help="repeatable [1 and 10]")
    parser.add_argument("--messages", type=int, default=1000, help="in all, shared by the publishers [1000]")
    parser.add_argument("--window", type=int, default=16, help="publishes in flight per publisher [16]")
    parser.add_argument("--size", type=int, default=64, help="payload bytes [64]")
    parser.add_argument("--no-compare", action="store_true", help="group commit on only")
    parser.add_argument("--ssmp", action="store_true", help="SSMP publishers (MCAST), SMQP durable subscriber")
    parser.add_argument("--drain", action="store_true",
                        help="the subscriber drains the stored backlog after the publishers finished")
    parser.add_argument("--notify-window", type=int, metavar="N",
                        help="with --drain: also drain with SET NOTIFY WINDOW N, side by side with the default")
    parser.add_argument("--window-only", action="store_true",
                        help="with --notify-window: drain with the window only (not the draft's exchange too)")
    parser.add_argument("--minimal", action="store_true",
                        help="also measure minimal_smqp.py in the same run (SMQP publishers only)")
    parser.add_argument("--profile", metavar="DIR", type=Path,
                        help="py-spy's raw collapsed stacks of the broker into DIR, one file per run")
    parser.add_argument("--profile-gil", action="store_true",
                        help="with --profile: only samples of the thread holding the GIL (Python's CPU)")
    parser.add_argument("--callgrind", metavar="DIR", type=Path,
                        help="the broker under callgrind: instructions per publish and per delivery")
    parser.add_argument("--commit", metavar="REV", action="append",
                        help="run the broker from this revision; repeatable: side by side [the working tree]")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), action="append",
                        help="repeatable: side by side [sqlite]")
    parser.add_argument("--runs", type=int, default=1, help="measured runs, after one warm-up when > 1 [1]")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    options = parser.parse_args()
    if options.notify_window is not None and (not options.drain or options.notify_window < 2):
        parser.error("--notify-window N needs --drain and N >= 2")
    if options.window_only and options.notify_window is None:
        parser.error("--window-only needs --notify-window N")
    if options.minimal and (options.ssmp or options.profile):
        parser.error("--minimal: SMQP publishers, no profile")
    trees = {rev: export(rev) for rev in options.commit} if options.commit else {"working tree": REPO}
    stores = options.store or ["sqlite"]
    server = None
    if "postgresql" in stores:
        from tests.support.postgres import PostgresServer, binaries

        found = binaries()
        if found is None:
            parser.error("--store postgresql: initdb and postgres not found (apt-get install postgresql)")
        server = PostgresServer(found)
        server.start()
    try:
        results = _measure(options, trees, stores, server)
    finally:
        if server is not None:
            server.destroy()
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2))


def _measure(options, trees: dict, stores: list[str], server) -> list[dict]:
    windows = [1, options.notify_window] if options.notify_window else [1]
    if options.window_only:
        windows = [options.notify_window]
    variants = {_variant(rev, store, len(stores), window): (tree, store, window, False)
                for rev, tree in trees.items() for store in stores for window in windows}
    if options.minimal:
        variants.update({_variant("minimal server", "", 1, window): (REPO, "sqlite", window, True)
                         for window in windows})
    results = []
    for count in options.publishers or [1, 10]:
        modes = [True] if options.no_compare else [True, False]
        for group_commit in modes:
            per = max(1, options.messages // count) if count > 1 else options.messages
            measured: dict[str, list[dict]] = {rev: [] for rev in variants}
            for run in range(options.runs + (options.runs > 1)):
                for rev, (tree, store, notify_window, minimal) in variants.items():
                    url = server.create_database() if store == "postgresql" else None
                    result = run_once(count, per, options.window, options.size, group_commit, tree, options.ssmp,
                                      options.drain, options.profile, rev.replace("/", "_").replace(" ", "_"),
                                      options.profile_gil, url, notify_window, minimal, options.callgrind)
                    result.update(revision=rev, run=run, load=os.getloadavg()[0])
                    print(json.dumps(result), flush=True)
                    if options.runs == 1 or run > 0:
                        measured[rev].append(result)
            for rev, runs in measured.items():
                median = {key: statistics.median(r[key] for r in runs) for key in runs[0]
                          if isinstance(runs[0][key], float) and key != "load"}
                summary = {"revision": rev, "publishers": count, "protocol": runs[0]["protocol"],
                           "group_commit": group_commit, "runs": len(runs),
                           "load": [r["load"] for r in runs], **median}
                results.append(summary)
                print("median", json.dumps(summary), flush=True)
    return results


def _variant(rev: str, store: str, stores: int, window: int) -> str:
    name = rev if stores == 1 else f"{rev} / {store}"
    return name if window == 1 else f"{name} / notify window {window}"


if __name__ == "__main__":
    main()

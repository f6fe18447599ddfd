"""Cross-node fan-out: 1 SSMP publisher on node 1 -> 50 SSMP subscribers spread over 3 brokerd
nodes sharing a redis-server, against the same 50 subscribers on one brokerd without
``--cluster``.  Reports deliveries/s and broker CPU per delivery (utime + stime of every
brokerd process over the run, from /proc; Redis's CPU separately), median of ``--runs``.

    python benchmarks/cluster_fanout.py [--messages 20000] [--subscribers 50] [--runs 3] [--per-write 100]
                                        [--rate MESSAGES_PER_S] [--redis-cluster]

``--rate`` paces the publisher so that every setup delivers at the same rate (CPU per delivery
at equal load); without it each setup runs as fast as it answers.  ``--redis-cluster`` adds a third setup: the same 3 nodes on a 3-master Redis Cluster (the topic's
channel on one master, the nodes connected to all three; needs redis-cli too).

Needs redis-server on PATH and Linux /proc; standard library only.  Run from the repository
root with the venv active (twistd finds the brokerd plugin there).
"""
from __future__ import annotations

import argparse
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TWISTD = [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()",
          "-n", "--pidfile=", "brokerd"]
TOPIC = b"bench"
WINDOW = 2000
"""MCASTs the publisher may have sent and not had answered."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise SystemExit(f"{process.args} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"nothing listens on {port}") from None
            time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Line:
    def __init__(self, port: int, name: bytes) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.request(b"LOGIN " + name + b" open")

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("the broker closed a connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def request(self, data: bytes) -> None:
        self.sock.sendall(data + b"\n")
        reply = self.line()
        if reply != b"200":
            raise SystemExit(f"{data!r}: {reply!r}")


def secret_file(tmp: Path) -> Path:
    """The --cluster-secret-file the benchmark's nodes share (mode 600, made once per run)."""
    path = tmp / "cluster.secret"
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(os.urandom(24).hex() + "\n")
    return path


def start_nodes(tmp: Path, count: int, redis_url: str | None) -> tuple[list[subprocess.Popen], list[int]]:
    processes, ports = [], []
    for index in range(count):
        port = free_port()
        args = [*TWISTD, "--ssmp", f"tcp:{port}:interface=127.0.0.1", "--open-login", "--no-event-log",
                "--data-dir", str(tmp / f"node{index}")]
        if redis_url is not None:
            args += ["--cluster", redis_url, "--node-name", f"node{index}",
                     "--cluster-secret-file", str(secret_file(tmp))]
        log = open(tmp / f"node{index}.log", "wb")
        processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        ports.append(port)
    for process, port in zip(processes, ports):
        wait_port(port, process)
    return processes, ports


def start_redis(tmp: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port),
                              "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp), *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_port(port, redis)
    return redis, port


def redis_cli(port: int, *args: object) -> str:
    return subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(port), *map(str, args)],
                          capture_output=True, text=True, check=True).stdout


def start_redis_cluster(tmp: Path) -> tuple[list[subprocess.Popen], list[int]]:
    """Three masters, a third of the slots each, joined with CLUSTER MEET; returns once all
    three say cluster_state:ok."""
    servers, ports = [], []
    for index, (first, last) in enumerate([(0, 5460), (5461, 10922), (10923, 16383)]):
        bus = free_port()
        server, port = start_redis(tmp / f"redis{index}", "--cluster-enabled", "yes", "--cluster-port", str(bus),
                                   "--cluster-config-file", str(tmp / f"redis{index}" / "nodes.conf"))
        servers.append(server)
        ports.append(port)
        redis_cli(port, "cluster", "addslotsrange", first, last)
        if index:
            redis_cli(ports[0], "cluster", "meet", "127.0.0.1", port, bus)
    deadline = time.monotonic() + 30
    while not all("cluster_state:ok" in redis_cli(port, "cluster", "info") for port in ports):
        if time.monotonic() > deadline:
            raise SystemExit("the Redis Cluster did not come up")
        time.sleep(0.05)
    return servers, ports


def run_once(tmp: Path, nodes: int, subscribers: int, messages: int, per_write: int,
             redis_cluster: bool = False, rate: float = 0.0) -> dict[str, float]:
    redis_servers: list[subprocess.Popen] = []
    redis_url = None
    if redis_cluster:
        redis_servers, redis_ports = start_redis_cluster(tmp)
        redis_url = f"redis://127.0.0.1:{redis_ports[0]}"
    elif nodes > 1:
        redis, redis_port = start_redis(tmp)
        redis_servers = [redis]
        redis_url = f"redis://127.0.0.1:{redis_port}"
    brokers, ports = start_nodes(tmp, nodes, redis_url)
    try:
        subs = [Line(ports[i % nodes], b"sub%d" % i) for i in range(subscribers)]
        for sub in subs:
            sub.request(b"SUBSCRIBE " + TOPIC)
        publisher = Line(ports[0], b"publisher")
        # Warm-up: probe until every subscriber got one (the remote nodes' SSUBSCRIBE is in).
        selector = selectors.DefaultSelector()
        for sub in subs:
            sub.sock.setblocking(False)
            selector.register(sub.sock, selectors.EVENT_READ, sub)
        waiting = set(subs)
        deadline = time.monotonic() + 30
        while waiting:
            publisher.sock.sendall(b"MCAST " + TOPIC + b" probe\n")
            publisher.line()
            for key, _ in selector.select(0.2):
                sub = key.data
                sub.buffer += sub.sock.recv(1 << 20)
                if b"probe\n" in sub.buffer:
                    waiting.discard(sub)
            if time.monotonic() > deadline:
                raise SystemExit("the subscribers never all got a probe")
        time.sleep(0.5)
        for sub in subs:
            try:
                sub.sock.recv(1 << 22)
            except BlockingIOError:
                pass
            sub.buffer = b""
        counts = {sub: 0 for sub in subs}
        pids = [process.pid for process in brokers]
        cpu_before_each = [cpu_seconds(pid) for pid in pids]
        cpu_before = sum(cpu_before_each)
        redis_before = sum(cpu_seconds(redis.pid) for redis in redis_servers)

        def publish() -> None:
            sent = answered = 0
            pending = b""
            start = time.monotonic()
            while sent < messages:
                batch = min(per_write, messages - sent, WINDOW - (sent - answered))
                if rate:  # paced: the next write leaves when the schedule says, not earlier
                    wait = start + sent / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                if batch > 0:
                    publisher.sock.sendall(b"".join(b"MCAST %s m%d\n" % (TOPIC, sent + i) for i in range(batch)))
                    sent += batch
                chunk = publisher.sock.recv(65536)
                pending += chunk
                answered += pending.count(b"\n")
                pending = pending[pending.rfind(b"\n") + 1:]
            while answered < messages:
                chunk = publisher.sock.recv(65536)
                if not chunk:
                    return  # the broker closed the publisher: the subscribers' loop times out
                answered += chunk.count(b"\n")

        started = time.monotonic()
        thread = threading.Thread(target=publish)
        thread.start()
        remaining = subscribers
        deadline = time.monotonic() + 300
        while remaining and time.monotonic() < deadline:
            for key, _ in selector.select(1.0):
                sub = key.data
                try:
                    data = sub.sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    # The broker cut a subscriber this reader did not drain fast enough (slow
                    # consumer: its messages were dropped): the run cannot complete.
                    raise SystemExit("a subscriber was disconnected (this reader fell behind: "
                                     "a slow consumer on a loaded machine); run again")
                before = counts[sub]
                counts[sub] += data.count(b"\n")
                if before < messages <= counts[sub]:
                    remaining -= 1
        elapsed = time.monotonic() - started
        thread.join()
        cpu_each = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before_each)]
        cpu = sum(cpu_each)
        redis_cpu = sum(cpu_seconds(redis.pid) for redis in redis_servers) - redis_before
        delivered = sum(min(count, messages) for count in counts.values())
        return {"deliveries_per_s": delivered / elapsed, "cpu_us_per_delivery": 1e6 * cpu / delivered,
                "redis_cpu_us_per_delivery": 1e6 * redis_cpu / delivered, "lost": subscribers * messages - delivered,
                "publishing_node_cpu_share": cpu_each[0] / cpu if cpu else 0.0}
    finally:
        for process in brokers:
            process.send_signal(signal.SIGTERM)
        for process in brokers:
            process.wait(30)
        for redis in redis_servers:
            redis.terminate()
        for redis in redis_servers:
            redis.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-write", type=int, default=100,
                        help="MCASTs the publisher writes at once (1: one per write, each awaiting its reply)")
    parser.add_argument("--redis-cluster", action="store_true",
                        help="also run the 3 nodes on a 3-master Redis Cluster")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="messages/s the publisher offers (paced writes), so every setup delivers at the "
                             "same rate and its CPU per delivery is compared at equal load; 0: as fast as the "
                             "broker answers (each setup saturated, where a busier process batches more per read)")
    options = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    lost = 0
    setups = [("1 node", 1, False), ("3 nodes + Redis", 3, False)]
    if options.redis_cluster:
        setups.append(("3 nodes + Redis Cluster (3 masters)", 3, True))
    for label, nodes, redis_cluster in setups:
        results = []
        for _ in range(options.runs):
            with tempfile.TemporaryDirectory(prefix="brokerd-cluster-bench-") as tmp:
                results.append(run_once(Path(tmp), nodes, options.subscribers, options.messages, options.per_write,
                                        redis_cluster, options.rate))
        lost += sum(int(r["lost"]) for r in results)
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{label}: {median['deliveries_per_s']:,.0f} deliveries/s, "
              f"{median['cpu_us_per_delivery']:.3f} us broker CPU/delivery, "
              f"{median['redis_cpu_us_per_delivery']:.3f} us Redis CPU/delivery, "
              f"{100 * median['publishing_node_cpu_share']:.0f} % of it on node 1, lost {int(median['lost'])} "
              f"(median of {options.runs}; load now {os.getloadavg()[0]:.1f})")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())

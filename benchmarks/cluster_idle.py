"""Idle memory in a cluster: what a logged-in, subscribed SSMP connection costs a brokerd node
with ``--cluster`` against one without (same binary, same options), and whether 3 nodes hold
3x the idle connections of one (3 nodes x N against 1 node x N).

    python benchmarks/cluster_idle.py [--connections 10000] [--topics 0] [--runs 1]

For each setup: fresh nodes (and a fresh redis-server for the cluster ones), a warm-up of 1,000
connections opened and closed on each node, VmRSS of every node, then N idle connections per
node (LOGIN + SUBSCRIBE, topic ``idle<i>``, or ``idle<i % k>`` with ``--topics k``; each node's
clients from a child process of their own, all nodes at once), a wait until no node uses CPU any
more (the other nodes' join announcements are applied), VmRSS again.  KB per connection is the
node's growth over the connections connected to it; in a cluster it includes the node's copy
of the other nodes' members (brokerd/cluster/directory.py).  Every child process (nodes,
clients) raises its RLIMIT_NOFILE soft limit to the hard one.

Needs redis-server on PATH and Linux /proc; standard library only.  Run from the repository
root with the venv active (twistd finds the brokerd plugin there).
"""
from __future__ import annotations

import argparse
import os
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cluster_fanout import TWISTD, cpu_seconds, free_port, secret_file, wait_port  # noqa: E402

WARMUP = 1_000
BATCH = 200
"""Connections a client opens before reading their answers (under --max-unauthenticated)."""


def raise_nofile() -> None:
    """In a child process: allow as many files as the hard limit does."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# ---------------------------------------------------------------------- the idle client (child)

def client_main(port: int, count: int, prefix: str, topics: int) -> int:
    """Open ``count`` logged-in, subscribed connections; print READY; hold them until stdin
    closes."""
    raise_nofile()
    selector = selectors.DefaultSelector()
    sockets = []
    failed = 0
    for start in range(0, count, BATCH):
        # LOGIN, then SUBSCRIBE once it is answered (a SUBSCRIBE sent in the same write as the
        # LOGIN is answered only after a delay of the server's, ~0.1 s).
        waiting: dict[socket.socket, tuple[bytes, bytes]] = {}
        for i in range(start, min(count, start + BATCH)):
            sock = socket.create_connection(("127.0.0.1", port))
            topic = i % topics if topics else i
            sock.sendall(b"LOGIN %s-%d open\n" % (prefix.encode(), i))
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            waiting[sock] = (b"", b"SUBSCRIBE idle%d\n" % topic)
            sockets.append(sock)
        deadline = time.monotonic() + 60
        while waiting:
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(waiting)} connections never answered")
            for key, _ in selector.select(1.0):
                sock = key.fileobj
                data = sock.recv(4096)
                if not data:
                    raise SystemExit("the broker closed a connection")
                got, subscribe = waiting[sock]
                got += data
                if got == b"200\n" and subscribe:
                    sock.sendall(subscribe)
                    waiting[sock] = (got, b"")
                elif got.count(b"\n") >= 2 or (got.endswith(b"\n") and got != b"200\n"):
                    failed += got != b"200\n200\n"
                    selector.unregister(sock)
                    del waiting[sock]
                else:
                    waiting[sock] = (got, subscribe)
    print(f"READY ok={count - failed} fail={failed}", flush=True)
    sys.stdin.read()  # held until the parent closes our stdin
    for sock in sockets:
        sock.close()
    return 0 if failed == 0 else 1


def spawn_client(port: int, count: int, prefix: str, topics: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--client", str(port), str(count), prefix, str(topics)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def ready(client: subprocess.Popen) -> str:
    assert client.stdout is not None
    line = client.stdout.readline().strip()
    if not line.startswith("READY"):
        raise SystemExit(f"an idle client failed: {line!r}")
    return line


def release(clients: list[subprocess.Popen]) -> None:
    for client in clients:
        assert client.stdin is not None
        client.stdin.close()
    for client in clients:
        client.wait(60)


# ---------------------------------------------------------------------- nodes

def start_nodes(tmp: Path, count: int, redis_url: str | None, connections: int) -> tuple[list[subprocess.Popen], list[int]]:
    processes, ports = [], []
    for index in range(count):
        port = free_port()
        args = [*TWISTD, "--ssmp", f"tcp:{port}:interface=127.0.0.1", "--open-login", "--no-event-log",
                "--data-dir", str(tmp / f"node{index}"),
                "--max-connections-per-address", str(connections + WARMUP),
                "--max-listener-connections", str(connections + WARMUP)]
        if redis_url is not None:
            args += ["--cluster", redis_url, "--node-name", f"node{index}",
                     "--cluster-secret-file", str(secret_file(tmp))]
        log = open(tmp / f"node{index}.log", "wb")
        processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=raise_nofile))
        ports.append(port)
    for process, port in zip(processes, ports):
        wait_port(port, process)
    return processes, ports


def quiet(pids: list[int], still: float = 0.02, every: float = 1.0, timeout: float = 120.0) -> None:
    """Wait until no node used more than ``still`` s of CPU in the last ``every`` s."""
    deadline = time.monotonic() + timeout
    before = [cpu_seconds(pid) for pid in pids]
    while time.monotonic() < deadline:
        time.sleep(every)
        now = [cpu_seconds(pid) for pid in pids]
        if all(b - a <= still for a, b in zip(before, now)):
            return
        before = now
    raise SystemExit("the nodes never went quiet")


def run_once(tmp: Path, nodes: int, cluster: bool, connections: int, topics: int) -> dict[str, float]:
    redis = redis_url = None
    if cluster:
        redis_port = free_port()
        redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port),
                                  "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp),
                                  "--maxclients", "1000"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=raise_nofile)
        wait_port(redis_port, redis)
        redis_url = f"redis://127.0.0.1:{redis_port}"
    brokers, ports = start_nodes(tmp, nodes, redis_url, connections)
    pids = [process.pid for process in brokers]
    try:
        warm = [spawn_client(port, WARMUP, f"w{index}", topics) for index, port in enumerate(ports)]
        for client in warm:
            ready(client)
        release(warm)
        quiet(pids)
        before = [rss_kb(pid) for pid in pids]
        redis_before = rss_kb(redis.pid) if redis else 0
        started = time.monotonic()
        clients = [spawn_client(port, connections, f"n{index}", topics) for index, port in enumerate(ports)]
        for client in clients:
            ready(client)
        setup = time.monotonic() - started
        quiet(pids)
        after = [rss_kb(pid) for pid in pids]
        redis_after = rss_kb(redis.pid) if redis else 0
        release(clients)
        per_node = [(a - b) / connections for a, b in zip(after, before)]
        return {"kb_per_connection": statistics.mean(per_node), "kb_per_connection_max": max(per_node),
                "rss_before_mb": statistics.mean(before) / 1024, "rss_after_mb": statistics.mean(after) / 1024,
                "redis_kb_per_connection": (redis_after - redis_before) / (connections * nodes),
                "setup_s": setup, "held": connections * nodes}
    finally:
        for process in brokers:
            process.send_signal(signal.SIGTERM)
        for process in brokers:
            process.wait(60)
        if redis is not None:
            redis.terminate()
            redis.wait(30)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, count, prefix, topics = sys.argv[2:6]
        return client_main(int(port), int(count), prefix, int(topics))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000, help="idle connections per node")
    parser.add_argument("--topics", type=int, default=0, help="topics idle<i %% k>; 0: one per connection")
    parser.add_argument("--runs", type=int, default=1)
    options = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{options.connections:,} idle SSMP connections per node, "
          f"{'one topic each' if not options.topics else f'{options.topics} topics'}")
    for label, nodes, cluster in (("1 node, no --cluster", 1, False), ("1 node, --cluster", 1, True),
                                  ("3 nodes, --cluster", 3, True)):
        results = []
        for _ in range(options.runs):
            with tempfile.TemporaryDirectory(prefix="brokerd-cluster-idle-") as tmp:
                results.append(run_once(Path(tmp), nodes, cluster, options.connections, options.topics))
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{label}: {median['held']:,.0f} connections held; per node RSS {median['rss_before_mb']:.1f} -> "
              f"{median['rss_after_mb']:.1f} MB, {median['kb_per_connection']:.2f} KB per connection "
              f"(worst node {median['kb_per_connection_max']:.2f}); Redis {median['redis_kb_per_connection']:.2f} KB "
              f"per connection; set up in {median['setup_s']:.1f} s "
              f"(median of {options.runs}; load now {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Request round trips where the reply follows an event on the same connection.

A client sends one request that makes the broker send it an event and then the reply (SSMP:
``UCAST`` to itself, the event then ``200``; MCCHAT: ``MSG`` to a topic it is subscribed to
plus ``TLRQ``, its own copy then the topic list) and waits for the reply before the next one.
If the two leave as two small segments while Nagle's algorithm is on, the second waits for the
client's delayed acknowledgement of the first (about 40 ms on Linux).  ``PING`` (one reply, no
event) is the baseline.  The client is a plain blocking socket with Nagle on, like most.

Each commit (``--commits``, default ``main,HEAD``; ``.`` is the working tree) gets its own
broker; the brokers alternate, round after round: one warm-up round, then ``--runs`` measured
rounds, median of the rounds' p50 and p99.

    python benchmarks/latency.py                      # main against HEAD, ~1 minute
    python benchmarks/latency.py --commits . --trips 500
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ssmp import revisions  # noqa: E402
from run_ssmp import BrokerProcess, free_port  # noqa: E402

TEMPLATE = (
    "{twistd} -n --pidfile= brokerd --ssmp tcp:{port}:interface=127.0.0.1 "
    "--mcchat tcp:MCCHAT_PORT:interface=127.0.0.1 --open-login --data-dir {data_dir} --no-event-log"
)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock  # Nagle left on, as in most clients


class Lines:
    """SSMP lines from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def ssmp_trips(port: int, request: bytes, reply: bytes, trips: int) -> list[float]:
    sock = _connect(port)
    lines = Lines(sock)
    sock.sendall(b"LOGIN me open\n")
    assert lines.line() == b"200"
    times = []
    for _ in range(trips):
        start = time.perf_counter()
        sock.sendall(request)
        while lines.line() != reply:
            pass
        times.append(time.perf_counter() - start)
    sock.close()
    return times


def _mcchat_string(value: bytes) -> bytes:
    return value + b"\x00"


def mcchat_trips(port: int, trips: int) -> list[float]:
    """MSG to a topic the client is subscribed to, then TLRQ; wait for the TL answer."""
    sock = _connect(port)
    buffer = b""
    while len(buffer) < 2:  # INFO
        buffer += sock.recv(16)
    sock.sendall(b"\x01" + _mcchat_string(b"t"))
    request = b"\x03" + _mcchat_string(b"t") + _mcchat_string(b"me") + _mcchat_string(b"x" * 32) + b"\x04"
    answer = b"\x05" + _mcchat_string(b"t") + b"\x04"
    buffer = b""
    times = []
    for _ in range(trips):
        start = time.perf_counter()
        sock.sendall(request)
        while not buffer.endswith(answer):
            buffer += sock.recv(65536)
        buffer = b""
        times.append(time.perf_counter() - start)
    sock.close()
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_round(ssmp: int, mcchat: int, trips: int) -> dict[str, tuple[float, float]]:
    results = {
        "SSMP PING -> PONG": ssmp_trips(ssmp, b"PING\n", b"000 . PONG", trips),
        "SSMP UCAST to itself -> event + 200": ssmp_trips(ssmp, b"UCAST me hello\n", b"200", trips),
        "MCCHAT MSG + TLRQ -> own copy + TL": mcchat_trips(mcchat, trips),
    }
    return {name: (percentile(t, 0.5) * 1e3, percentile(t, 0.99) * 1e3) for name, t in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", default="main,HEAD", help="comma-separated revisions; '.' = working tree")
    parser.add_argument("--trips", type=int, default=300, help="round trips per workload and round [300]")
    parser.add_argument("--runs", type=int, default=3, help="measured rounds [3]")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="brokerd-latency-") as tmp:
        work = Path(tmp)
        brokers = []
        for index, (label, env) in enumerate(revisions(opts.commits, work)):
            mcchat = free_port()
            template = TEMPLATE.replace("MCCHAT_PORT", str(mcchat))
            brokers.append((label, BrokerProcess(template, work, f"b{index}", env), mcchat))
        print(f"load average at the start: {os.getloadavg()[0]:.2f} (uptime: "
              f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()})")
        rounds: dict[str, list[dict]] = {label: [] for label, _, _ in brokers}
        try:
            for _, process, _ in brokers:
                process.__enter__()
            for round_number in range(opts.runs + 1):
                for label, process, mcchat in brokers:
                    result = one_round(process.port, mcchat, opts.trips if round_number else opts.trips // 10)
                    if round_number:
                        rounds[label].append(result)
        finally:
            for _, process, _ in brokers:
                process.__exit__()
        print(f"\n{opts.trips} round trips per round, median of {opts.runs} rounds after a warm-up; ms\n")
        print("| workload | " + " | ".join(f"{label} p50 / p99" for label in rounds) + " |")
        print("|---|" + "---|" * len(rounds))
        for name in rounds[brokers[0][0]][0]:
            cells = []
            for label in rounds:
                p50 = statistics.median(r[name][0] for r in rounds[label])
                p99 = statistics.median(r[name][1] for r in rounds[label])
                cells.append(f"{p50:.3f} / {p99:.3f}")
            print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

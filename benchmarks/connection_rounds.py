"""Rounds of many logged-in connections against a real ``twistd brokerd``: does the broker's
memory come back after they close?

Each round opens N connections spread over the four protocols (SSMP LOGIN + SUBSCRIBE, an
MCCHAT SUB, an SMQP guest login, a socket.mq WebSocket), waits until
every one is served, closes them all, waits for the broker to settle and reads its resident
memory (VmRSS).  A leak shows as growth that does not level off from round to round.

    python benchmarks/connection_rounds.py --connections 5000 --rounds 6

Linux only (/proc).  The clients are tests/support/rounds.py (SMQP channels are the same each
round, as reconnecting clients' are).  RSS only shows a leak after several rounds; the
regression test tests/integration/test_connection_rounds.py (marked slow) runs 3 rounds of
500 with the broker in process and counts the live objects left after each instead.
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.rounds import PROTOCOLS, one_round  # noqa: E402

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def start(data_dir: Path) -> tuple[subprocess.Popen, dict[str, int]]:
    ports = {protocol: free_port() for protocol in PROTOCOLS}
    args = [sys.executable, "-c", "import sys; from twisted.scripts.twistd import run; sys.argv[0]='twistd'; run()",
            "-n", "--pidfile=", "brokerd", "--data-dir", str(data_dir), "--open-login", "--no-event-log",
            "--max-connections", "100000", "--max-listener-connections", "100000",
            "--max-connections-per-address", "100000", "--max-unauthenticated", "100000"]
    for protocol, port in ports.items():
        args += [f"--{protocol}", f"tcp:{port}:interface=127.0.0.1"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for port in ports.values():
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
    return process, ports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after a round before RSS is read")
    options = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        process, ports = start(Path(tmp))
        try:
            time.sleep(options.settle)
            before = rss_kib(process.pid)
            print(f"idle broker: {before / 1024:.1f} MiB")
            previous = before
            for number in range(options.rounds):
                began = time.monotonic()
                one_round(ports, options.connections, f"r{number}")
                took = time.monotonic() - began
                time.sleep(options.settle)
                now = rss_kib(process.pid)
                print(f"round {number + 1}: {options.connections} connections in {took:.1f} s, "
                      f"RSS {now / 1024:.1f} MiB ({(now - previous) / 1024:+.1f} MiB)", flush=True)
                previous = now
        finally:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()

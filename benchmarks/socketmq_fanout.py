"""socket.mq WebSocket fan-out (1 -> N) over loopback: brokerd against a minimal Autobahn
pub/sub server (benchmarks/minimal_ws_pubsub.py) measured in the same run.

Servers, each its own process: brokerd (``--socketmq``, event log off) with the direct write of
prepared frames (session.FAST_FANOUT, the default on a checked Autobahn), brokerd forced onto
Autobahn's sendPreparedMessage for every recipient, and the minimal server.  One publisher
sends EVENTS text messages of SIZE bytes, at most WINDOW ahead of the slowest of N subscribers
(so no reader is ever congested and nothing is dropped); the subscribers run in this process.
Per server: deliveries/s and the server process's CPU (utime + stime from /proc) per delivered
event, median of ``--runs`` rounds after one warm-up, the servers taking turns.

    python benchmarks/socketmq_fanout.py                  # N=50, 4,000 events, 3 rounds
    python benchmarks/socketmq_fanout.py --subscribers 200 --events 1000
    python benchmarks/socketmq_fanout.py --commit d7fd3e2  # also brokerd of that revision
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BROKERD = (
    "import sys\n"
    "import brokerd.protocols.socketmq.session as session\n"
    "session.FAST_FANOUT = getattr(session, 'FAST_FANOUT', True) and {fast}\n"
    "from twisted.scripts.twistd import run\n"
    "sys.argv = ['twistd', '-n', '--pidfile=', 'brokerd', '--socketmq', 'tcp:{port}:interface=127.0.0.1',"
    " '--data-dir', {data!r}, '--no-event-log']\n"
    "run()\n"
)
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, path: str, command: list[str], port: int, tree: str | None = None) -> None:
        """``tree``: a directory holding another revision of brokerd to run instead."""
        self.name, self.path, self.port = name, path, port
        env = dict(os.environ, PYTHONPATH=tree) if tree else None
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"{name} did not start")

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def client_frame(payload: bytes) -> bytes:
    """A masked text frame with a zero mask (RFC 6455 allows any mask key)."""
    size = len(payload)
    if size < 126:
        header = bytes((0x81, 0x80 | size))
    else:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    return header + b"\0\0\0\0" + payload


class Peer:
    def __init__(self) -> None:
        self.received = 0
        self.buffer = b""

    async def open(self, server: Server) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", server.port)
        key = base64.b64encode(os.urandom(16)).decode()
        self.writer.write(
            f"GET {server.path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: socketmq.v1\r\n\r\n".encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    async def frames(self, count: int) -> None:
        """Read until ``count`` more frames arrived (unmasked, unfragmented server frames)."""
        target = self.received + count
        buffer = self.buffer
        while self.received < target:
            buffer += await self.reader.read(1 << 16)
            while len(buffer) >= 2:
                size = buffer[1] & 0x7F
                start = 2 if size < 126 else 4 if size == 126 else 10
                if size >= 126 and len(buffer) < start:
                    break
                if size == 126:
                    size = struct.unpack("!H", buffer[2:4])[0]
                elif size == 127:
                    size = struct.unpack("!Q", buffer[2:10])[0]
                if len(buffer) < start + size:
                    break
                buffer = buffer[start + size:]
                self.received += 1
        self.buffer = buffer


async def run_once(server: Server, brokerd: bool, subscribers: int, events: int, size: int, window: int) -> tuple[float, float]:
    peers = [Peer() for _ in range(subscribers)]
    for peer in peers:
        await peer.open(server)
        if brokerd:
            await peer.frames(1)  # hello
            peer.writer.write(client_frame(b'{"type":"subscribe","id":1,"event":"bench"}'))
            await peer.frames(1)  # result
    publisher = Peer()
    await publisher.open(server)
    if brokerd:
        await publisher.frames(1)
        message = client_frame(json.dumps({"type": "publish", "event": "bench", "data": "x" * size}).encode())
    else:
        message = client_frame(b"x" * size)
    cpu, start = server.cpu(), time.perf_counter()
    sent = 0
    while sent < events:
        batch = min(window, events - sent)
        publisher.writer.write(message * batch)
        sent += batch
        await asyncio.gather(*(peer.frames(batch) for peer in peers))
    elapsed, used = time.perf_counter() - start, server.cpu() - cpu
    for peer in [*peers, publisher]:
        peer.writer.close()
    deliveries = events * subscribers
    return deliveries / elapsed, used / deliveries * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes per event [100]")
    parser.add_argument("--window", type=int, default=50, help="events the publisher may be ahead [50]")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--commit", help="also measure brokerd of this git revision (e.g. the one before a change)")
    args = parser.parse_args()
    print("load before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    data = tempfile.mkdtemp(prefix="socketmq-fanout-")
    servers = []
    try:
        for name, fast in (("brokerd (direct write)", True), ("brokerd (sendPreparedMessage)", False)):
            port = free_port()
            code = BROKERD.format(fast=fast, port=port, data=os.path.join(data, str(port)))
            servers.append((Server(name, "/socket.mq/ws", [sys.executable, "-c", code], port), True))
        if args.commit:
            tree = os.path.join(data, "tree")
            os.mkdir(tree)
            archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", args.commit], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
            port = free_port()
            code = BROKERD.format(fast=True, port=port, data=os.path.join(data, str(port)))
            servers.append((Server(f"brokerd {args.commit}", "/socket.mq/ws", [sys.executable, "-c", code], port, tree), True))
        port = free_port()
        servers.append((Server("minimal Autobahn", "/", [sys.executable, str(HERE / "minimal_ws_pubsub.py"), str(port)], port), False))
        results: dict[str, list[tuple[float, float]]] = {server.name: [] for server, _ in servers}
        for round in range(args.runs + 1):
            for server, brokerd in servers:
                events = args.events // 10 if round == 0 else args.events
                result = asyncio.run(run_once(server, brokerd, args.subscribers, events, args.size, args.window))
                if round:
                    results[server.name].append(result)
        print(f"1 -> {args.subscribers}, {args.events} events of {args.size} B, median of {args.runs} after a warm-up")
        for name, rounds in results.items():
            rate = statistics.median(r[0] for r in rounds)
            cpu = statistics.median(r[1] for r in rounds)
            print(f"{name:32} {rate:12,.0f} deliveries/s {cpu:8.2f} us CPU/delivery")
    finally:
        for server, _ in servers:
            server.stop()
    print("load after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""mcchat_load: a non-blocking MCCHAT v1 load generator (stdlib only, Linux: epoll).

One process, one thread, one epoll loop over every socket, so the client is not what limits a
Python broker: subscribers ``recv()`` up to 256 KiB at a time and count MSG packets by counting
NUL bytes (three per MSG) in C; publishers write pre-built batches.  Latency is sampled once per
read (the last complete MSG of the read: receive time minus the send time stamped in it).

Payload (as ../shared/bench/pbload.c): ASCII ``<pub>:<seq>:<send time ns>:`` padded with
``x`` to ``-B`` bytes, CLOCK_MONOTONIC, so SSMP messages from pbload parse the same way.

With ``--rate`` each MCCHAT publisher sends at a fixed rate (latency figures; saturation p99
measures queue depth, as pbload's README explains).

Modes:

  MCCHAT -> MCCHAT:  mcchat_load.py --port 1502 -P 1 -S 50 -N 20000
      P publishers send N MSGs each to topic bench0 (or bench<i % P> with --own), staying at
      most -W messages ahead of the slowest subscriber.
  SSMP -> MCCHAT:    mcchat_load.py --port 1502 -S 50 -N 20000 --pbload /tmp/pbload --ssmp-port 8787
      S MCCHAT subscribers of bench0; once they are subscribed, ``pbload --proto ssmp -P 1 -S 1``
      publishes N messages to bench0 over SSMP (its one SSMP subscriber gives it its window).
      The output includes pbload's own JSON line.

Prints one JSON line: expected, delivered, elapsed_s (first send -> last delivery),
deliv_per_s, pub_per_s, p50_us/p90_us/p99_us/max_us (one sample per read), gen_cpu_s/gen_cpu_pct
(this process; 100 = one core), server_cpu_pct (with --server-pid).  Exit status 0 iff everything
was delivered.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import select
import socket
import subprocess
import sys
import time

NUL = b"\x00"
INFO = b"\x00\x01"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="the broker's MCCHAT port")
    p.add_argument("-P", dest="publishers", type=int, default=1, help="MCCHAT publishers [1]")
    p.add_argument("-S", dest="subscribers", type=int, default=1, help="MCCHAT subscribers [1]")
    p.add_argument("-N", dest="count", type=int, default=1000, help="messages per publisher [1000]")
    p.add_argument("-B", dest="size", type=int, default=64, help="payload bytes, 40..65536 [64]")
    p.add_argument("-W", dest="window", type=int, default=1000,
                   help="a publisher stays at most W messages ahead of its slowest subscriber; 0 = off [1000]")
    p.add_argument("--batch", type=int, default=16, help="messages per write [16]")
    p.add_argument("--rate", type=float, default=0.0,
                   help="messages/s per MCCHAT publisher on an absolute schedule (forces --batch 1); 0 = as fast as the window allows [0]")
    p.add_argument("--own", action="store_true", help="publisher i -> bench<i>, subscriber j -> bench<j %% P>")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds [120]")
    p.add_argument("--pbload", help="path of pbload: publish with it over SSMP instead of MCCHAT")
    p.add_argument("--ssmp-port", type=int, help="the broker's SSMP port (with --pbload)")
    p.add_argument("--server-pid", type=int, help="report this process's CPU use during the run")
    args = p.parse_args(argv)
    if not 40 <= args.size <= 65_536:
        p.error("-B must be 40..65536")
    if args.pbload and not args.ssmp_port:
        p.error("--pbload needs --ssmp-port")
    if args.pbload and (args.own or args.size > 1023):
        p.error("--pbload publishes one topic with at most 1023-byte payloads")
    if args.rate:
        args.batch = 1
    return args


# ---------------------------------------------------------------------------- setup (blocking)

def connect(args: argparse.Namespace) -> socket.socket:
    sock = socket.create_connection((args.host, args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise SystemExit("mcchat_load: the broker closed a connection during setup")
        data += chunk
    return data


def barrier(sock: socket.socket) -> None:
    """TLRQ, then read to the end of its TL: topics cannot hold 0x04, so the first 0x04 is the
    end (nothing else is sent to a subscriber before the run starts)."""
    sock.sendall(b"\x04")
    data = b""
    while b"\x04" not in data:
        chunk = sock.recv(65_536)
        if not chunk:
            raise SystemExit("mcchat_load: the broker closed a connection during setup")
        data += chunk


def topic_of(args: argparse.Namespace, index: int, publishers: int) -> bytes:
    return b"bench%d" % (index % publishers if args.own else 0)


# ---------------------------------------------------------------------------- measuring

def sample(data: bytes, nuls_before: int, nuls_here: int) -> int | None:
    """Send time stamped in the last complete MSG of ``data``, or None.  ``nuls_before`` NULs
    of this connection came before ``data``; every MSG holds three, so the last
    ``(nuls_before + nuls_here) % 3`` NULs belong to an unfinished MSG."""
    after = (nuls_before + nuls_here) % 3
    if nuls_here < after + 2:  # the last complete message field did not start in this read
        return None
    end = len(data)
    for _ in range(after + 1):
        end = data.rfind(NUL, 0, end)
    start = data.rfind(NUL, 0, end)
    fields = data[start + 1 : end].split(b":", 3)
    try:
        return int(fields[2])
    except (IndexError, ValueError):
        return None


def first_stamp(data: bytes) -> int | None:
    """Send time of the first MSG of a stream that starts at a packet boundary."""
    first = data.find(NUL)
    second = data.find(NUL, first + 1)
    third = data.find(NUL, second + 1)
    if third < 0:
        return None
    fields = data[second + 1 : third].split(b":", 3)
    try:
        return int(fields[2])
    except (IndexError, ValueError):
        return None


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def percentile(values: list[int], fraction: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(len(values) * fraction))] / 1000.0


# ---------------------------------------------------------------------------- the run

class Publisher:
    __slots__ = ("sock", "index", "topic", "sent", "pending", "header", "size")

    def __init__(self, sock: socket.socket, index: int, topic: bytes, size: int) -> None:
        self.sock = sock
        self.index = index
        self.topic = topic
        self.sent = 0
        self.pending = b""
        self.header = b"\x03" + topic + b"\x00load\x00"
        self.size = size

    def batch(self, n: int) -> bytes:
        now = time.monotonic_ns()
        parts = []
        for seq in range(self.sent, self.sent + n):
            stamp = b"%d:%d:%d:" % (self.index, seq, now)
            parts.append(self.header + stamp.ljust(self.size, b"x") + NUL)
        self.sent += n
        return b"".join(parts)


def run(args: argparse.Namespace) -> dict:
    pub_count = 0 if args.pbload else args.publishers
    topics_count = max(1, args.publishers)
    subs = []
    for j in range(args.subscribers):
        sock = connect(args)
        if read_exactly(sock, 2) != INFO:
            raise SystemExit("mcchat_load: no INFO 00 01 from the broker")
        sock.sendall(b"\x01" + topic_of(args, j, topics_count) + NUL)
        subs.append(sock)
    for sock in subs:
        barrier(sock)
    pubs = []
    for i in range(pub_count):
        sock = connect(args)
        read_exactly(sock, 2)
        topic = b"bench%d" % i if args.own else b"bench0"
        pubs.append(Publisher(sock, i, topic, args.size))
    # The subscribers of each publisher's topic, whose slowest sets its window.
    watchers = {
        pub.index: [j for j in range(args.subscribers) if topic_of(args, j, topics_count) == pub.topic]
        for pub in pubs
    }
    if args.pbload:
        expected = args.subscribers * args.count
    else:
        expected = sum(len(watchers[pub.index]) for pub in pubs) * args.count

    epoll = select.epoll()
    fds = {}
    nuls = [0] * len(subs)
    for j, sock in enumerate(subs):
        sock.setblocking(False)
        epoll.register(sock.fileno(), select.EPOLLIN)
        fds[sock.fileno()] = j
    for pub in pubs:
        pub.sock.setblocking(False)

    server_ticks = cpu_ticks(args.server_pid) if args.server_pid else 0
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    pbload = None
    if args.pbload:
        pbload = subprocess.Popen(
            [args.pbload, "--proto", "ssmp", "--host", args.host, "--port", str(args.ssmp_port),
             "-P", "1", "-S", "1", "-N", str(args.count), "-B", str(args.size),
             "-W", str(args.window), "--batch", str(args.batch), "--timeout", str(args.timeout),
             "--rate", str(args.rate)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    first_send: int | None = None
    last_recv = 0
    latencies: list[int] = []
    delivered = 0
    deadline = wall0 + args.timeout
    idle_since = time.monotonic()
    counts = [0] * len(subs)
    pub_done_at: float | None = None
    recv = {sock.fileno(): sock.recv for sock in subs}

    while delivered < expected:
        now_wall = time.monotonic()
        if now_wall > deadline:
            break
        # Publishers: write while the window allows.
        for pub in pubs:
            while True:
                if pub.pending:
                    try:
                        written = pub.sock.send(pub.pending)
                    except BlockingIOError:
                        break
                    pub.pending = pub.pending[written:]
                    if pub.pending:
                        break
                if pub.sent >= args.count:
                    break
                room = args.count - pub.sent
                if args.window:
                    slowest = min((counts[j] for j in watchers[pub.index]), default=pub.sent)
                    room = min(room, args.window - (pub.sent - slowest))
                if args.rate:
                    room = min(room, int((time.monotonic() - wall0) * args.rate) + 1 - pub.sent)
                if room <= 0:
                    break
                if first_send is None:
                    first_send = time.monotonic_ns()
                pub.pending = pub.batch(min(room, args.batch))
        if pubs and pub_done_at is None and all(p.sent >= args.count and not p.pending for p in pubs):
            pub_done_at = time.monotonic()
        waiting = any(p.pending for p in pubs)
        if waiting:
            wait = 0.0
        elif args.rate and pub_done_at is None:
            wait = 1.0 / args.rate - (time.monotonic() - wall0) % (1.0 / args.rate)
        else:
            wait = 0.05
        events = epoll.poll(wait)
        if not events:
            if time.monotonic() - idle_since > 2.0 and (pub_done_at is not None or (pbload and pbload.poll() is not None)):
                break  # everything was sent and nothing arrives any more
            continue
        idle_since = time.monotonic()
        for fd, _mask in events:
            j = fds[fd]
            try:
                data = recv[fd](262_144)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit("mcchat_load: the broker closed a subscriber connection")
            n = data.count(NUL)
            before = nuls[j]
            if before == 0 and first_send is None:
                first_send = first_stamp(data)
            stamp = sample(data, before, n)
            nuls[j] = before + n
            got = nuls[j] // 3 - counts[j]
            counts[j] += got
            delivered += got
            received_at = time.monotonic_ns()
            last_recv = received_at
            if stamp is not None:
                latencies.append(received_at - stamp)

    wall = time.monotonic() - wall0
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    result: dict = {"expected": expected, "delivered": delivered}
    elapsed = (last_recv - first_send) / 1e9 if first_send and last_recv > first_send else 0.0
    result["elapsed_s"] = round(elapsed, 4)
    result["wall_s"] = round(wall, 4)
    result["deliv_per_s"] = round(delivered / elapsed) if elapsed else 0
    if pubs:
        sent = sum(p.sent for p in pubs)
        result["pub_per_s"] = round(sent / elapsed) if elapsed else 0
    latencies.sort()
    for name, fraction in (("p50_us", 0.5), ("p90_us", 0.9), ("p99_us", 0.99)):
        result[name] = round(percentile(latencies, fraction), 1)
    result["max_us"] = round(latencies[-1] / 1000.0, 1) if latencies else 0.0
    result["samples"] = len(latencies)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    result["gen_cpu_s"] = round(cpu, 3)
    result["gen_cpu_pct"] = round(100 * cpu / wall, 1) if wall else 0.0
    if args.server_pid:
        ticks = cpu_ticks(args.server_pid) - server_ticks
        result["server_cpu_pct"] = round(100 * ticks / os.sysconf("SC_CLK_TCK") / wall, 1) if wall else 0.0
    if pbload is not None:
        try:
            out, err = pbload.communicate(timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pbload.kill()
            out, err = pbload.communicate()
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            result["pbload"] = json.loads(lines[-1]) if lines else None
        except ValueError:
            result["pbload"] = {"output": lines[-1:], "stderr": err.decode(errors="replace")[-300:]}
    for sock in subs:
        sock.close()
    for pub in pubs:
        pub.sock.close()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result), flush=True)
    return 0 if result["delivered"] >= result["expected"] else 1


if __name__ == "__main__":
    sys.exit(main())

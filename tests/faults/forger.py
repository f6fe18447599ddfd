"""The forger of a fault-injection run: a plain Redis client that is not a node.  It finds the
channels the nodes use (``PUBSUB SHARDCHANNELS brokerd:*`` on every server), listens to them
for a while (``SSUBSCRIBE``), then, until its time is up, writes on each of them: every message
it captured again (a replay), each one damaged (truncated, a byte flipped, garbage appended),
random bytes, and JSON nested deeper than any parser's recursion.  Blocking sockets, so it
runs in a thread of its own; every socket operation is bounded by a timeout."""
from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass, field

from brokerd.cluster.connection import RespReader

PATTERN = b"brokerd:*"
SOCKET_TIMEOUT = 10.0
MAX_CAPTURED = 400


def encode(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Connection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT)
        self.reader = RespReader(RuntimeError)
        self.replies: list[object] = []

    def send(self, *args: bytes | str | int) -> None:
        self.sock.sendall(encode(*args))

    def read(self, timeout: float = SOCKET_TIMEOUT) -> object:
        """The next reply or push message; socket.timeout when none comes in ``timeout``."""
        self.sock.settimeout(timeout)
        while not self.replies:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.replies.extend(self.reader.feed(data))
        return self.replies.pop(0)

    def call(self, *args: bytes | str | int) -> object:
        self.send(*args)
        return self.read()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Forgery:
    captured: int = 0
    replayed: int = 0
    damaged: int = 0
    errors: list[str] = field(default_factory=list)


def capture(port: int, seconds: float, found: Forgery) -> list[tuple[bytes, bytes]]:
    """Messages seen on the node channels served by the server on ``port`` in ``seconds``."""
    connection = Connection(port)
    try:
        channels = connection.call("PUBSUB", "SHARDCHANNELS", PATTERN)
        if not isinstance(channels, list) or not channels:
            return []
        for name in channels:  # one channel a command: on a Redis Cluster they hash to different slots
            connection.send("SSUBSCRIBE", name)
        messages: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(messages) < MAX_CAPTURED:
            try:
                push = connection.read(max(0.05, deadline - time.monotonic()))
            except (socket.timeout, TimeoutError):
                break
            if isinstance(push, list) and len(push) == 3 and push[0] == b"smessage":
                messages.append((push[1], push[2]))
            elif isinstance(push, RuntimeError):
                found.errors.append(f"capture on {port}: {push}")
        found.captured += len(messages)
        return messages
    finally:
        connection.close()


def damaged(data: bytes, rng: random.Random) -> list[bytes]:
    flipped = bytearray(data)
    if flipped:
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    return [data[: max(1, len(data) // 2)], bytes(flipped), data + rng.randbytes(16)]


def garbage(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randrange(1, 512)), b"[" * 100_000 + b"]" * 100_000, b"{}", b"",
            b'{"k": "state", "n": "x"}', b"\x00" * 64]


def forge(ports: list[int], seconds: float, seed: int = 25) -> Forgery:
    """Capture for a few seconds on every server, then replay and write damaged messages and
    garbage on every node channel until ``seconds`` have passed."""
    rng = random.Random(seed)
    found = Forgery()
    deadline = time.monotonic() + seconds
    captured: dict[int, list[tuple[bytes, bytes]]] = {}
    for port in ports:
        try:
            captured[port] = capture(port, min(3.0, seconds / 3) / len(ports), found)  # 3 s in all
        except (OSError, RuntimeError, ConnectionError) as exc:
            found.errors.append(f"capture on {port}: {exc}")
    while time.monotonic() < deadline:
        for port, messages in captured.items():
            if not messages:
                continue
            try:
                connection = Connection(port)
                try:
                    channels = sorted({name for name, _ in messages})
                    for name, data in messages:
                        connection.call("SPUBLISH", name, data)
                        found.replayed += 1
                    for name, data in rng.sample(messages, min(20, len(messages))):
                        for forged in damaged(data, rng):
                            connection.call("SPUBLISH", name, forged)
                            found.damaged += 1
                    for name in channels:
                        for forged in garbage(rng):
                            connection.call("SPUBLISH", name, forged)
                            found.damaged += 1
                finally:
                    connection.close()
            except (OSError, RuntimeError, ConnectionError) as exc:
                found.errors.append(f"forging on {port}: {exc}")
        time.sleep(0.5)  # the forger's own pace
    return found

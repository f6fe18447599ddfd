"""A round of many logged-in connections over the four protocols, closed again: what the
connection-rounds test and benchmark (benchmarks/connection_rounds.py) run.  Blocking sockets."""
from __future__ import annotations

import socket

from brokerd.protocols.mcchat.codec import encode_sub

PROTOCOLS = ("ssmp", "mcchat", "smqp", "socketmq")
SMQP_PER_ROUND = 60
"""SMQP allows 64 concurrent logins of one account: the guest's share of a round."""
UPGRADE = (
    b"GET /socket.mq/ws HTTP/1.1\r\nHost: rounds\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: socketmq.v1\r\n\r\n"
)


def _read_until(sock: socket.socket, marker: bytes, count: int = 1) -> bytes:
    data = b""
    while data.count(marker) < count:
        chunk = sock.recv(4096)
        if not chunk:
            raise EOFError(data)
        data += chunk
    return data


def one_round(ports: dict[str, int], count: int, name: str) -> None:
    """Open ``count`` connections (a quarter per protocol, SMQP at most SMQP_PER_ROUND), each
    logged in (SSMP ``LOGIN <name>u<i> open`` and one subscription, an MCCHAT subscription, an
    SMQP guest login on channel ``c<i>``, a socket.mq WebSocket), wait until all are served,
    then close them all."""
    clients: list[tuple[str, socket.socket]] = []
    try:
        for i in range(count):
            protocol = PROTOCOLS[i % 4]
            if protocol == "smqp" and i // 4 >= SMQP_PER_ROUND:
                protocol = "ssmp"
            sock = socket.create_connection(("127.0.0.1", ports[protocol]), timeout=30)
            clients.append((protocol, sock))
            if protocol == "ssmp":
                sock.sendall(f"LOGIN {name}u{i} open\nSUBSCRIBE t{i % 50}\n".encode())
            elif protocol == "mcchat":
                sock.sendall(encode_sub(f"t{i % 50}".encode()))
            elif protocol == "smqp":
                sock.sendall(f"LOGIN guest:c{i} CLEAR/1.0\r\nPASS guest\r\n".encode())
            else:
                sock.sendall(UPGRADE)
        for protocol, sock in clients:
            if protocol == "ssmp":
                assert _read_until(sock, b"\n", 2) == b"200\n200\n"
            elif protocol == "mcchat":
                _read_until(sock, b"\x00\x01")
            elif protocol == "smqp":
                _read_until(sock, b"Suid")
            else:
                assert b" 101 " in _read_until(sock, b"\r\n\r\n")
    finally:
        for _protocol, sock in clients:
            sock.close()

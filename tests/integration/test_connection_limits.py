"""Connection limits on a real ``twistd brokerd``: connections are counted per listener, per
source address and while not logged in, so no flood of one of them locks the other protocols
(or other addresses) out, and an innocent client of every protocol is still served."""
from __future__ import annotations

import pytest

from brokerd.protocols.mcchat.codec import encode_sub
from tests.support.broker import LineClient, start_broker
from tests.support.innocent import ALL_PROTOCOLS, INNOCENT_SOURCE, assert_serves_every_protocol, connect

pytestmark = pytest.mark.slow

INFO = b"\x00\x01"


def mcchat_subscriber(port: int, source: str, topic: bytes | None) -> LineClient | None:
    """An MCCHAT connection from ``source`` holding one subscription (none without ``topic``),
    or None if refused (closed before the INFO packet)."""
    client = connect(port, source)
    while len(client.buffer) < len(INFO):
        chunk = client.sock.recv(2 - len(client.buffer))
        if not chunk:
            client.close()
            return None
        client.buffer += chunk
    assert client.buffer == INFO
    if topic is not None:
        client.send(encode_sub(topic))
    return client


def fill(port: int, source: str, topic: bytes, at_most: int) -> list[LineClient]:
    """Open MCCHAT subscribers from ``source`` until one is refused; return those admitted."""
    admitted: list[LineClient] = []
    for _ in range(at_most):
        client = mcchat_subscriber(port, source, topic)
        if client is None:
            return admitted
        admitted.append(client)
    raise AssertionError(f"{at_most} connections from {source} and none refused")


def test_an_mcchat_flood_locks_out_neither_other_addresses_nor_other_protocols(tmp_path):
    broker = start_broker(
        tmp_path, "--open-login", "--max-connections", "1000", "--max-listener-connections", "12",
        "--max-connections-per-address", "8", listeners=ALL_PROTOCOLS,
    )
    port = broker.ports["mcchat"]
    attack: list[LineClient] = []
    try:
        attack += fill(port, "127.0.0.4", b"flood", 50)
        assert len(attack) == 8  # the per-address limit
        assert_serves_every_protocol(broker)  # another address, every protocol, MCCHAT too

        attack += fill(port, "127.0.0.5", b"flood", 50)
        assert len(attack) == 12  # the MCCHAT listener's limit
        assert mcchat_subscriber(port, INNOCENT_SOURCE, None) is None
        assert_serves_every_protocol(broker, mcchat=False)  # the other listeners are not full

        for client in attack:
            client.close()
        innocent = None
        while innocent is None:  # the broker counts the closed connections out as it reads them
            innocent = mcchat_subscriber(port, INNOCENT_SOURCE, None)
        innocent.close()
    finally:
        for client in attack:
            client.close()
        broker.stop()
    assert "Traceback" not in broker.log()


def smqp_greeting(port: int, source: str) -> tuple[LineClient, bytes]:
    client = connect(port, source)
    return client, client.line()


def logged_in_once_admitted(port: int, name: str, attempts: int = 100) -> LineClient:
    """An SSMP session from the innocent address, retrying while connections are refused."""
    for _ in range(attempts):
        client = connect(port)
        try:
            assert client.request(f"LOGIN {name} open") == b"200"
            return client
        except EOFError:
            client.close()
    raise AssertionError(f"{attempts} connections refused")


def test_connections_not_logged_in_have_their_own_limit(tmp_path):
    broker = start_broker(
        tmp_path, "--open-login", "--max-unauthenticated", "4", "--login-timeout", "60",
        listeners=ALL_PROTOCOLS,
    )
    try:
        member = connect(broker.ports["ssmp"])
        assert member.request("LOGIN member open") == b"200"
        assert member.request("SUBSCRIBE news") == b"200"
        silent = []
        for _ in range(4):
            client, greeting = smqp_greeting(broker.ports["smqp"], "127.0.0.4")
            assert greeting.startswith(b"SMQP/1.0 Ready."), greeting
            silent.append(client)

        refused, greeting = smqp_greeting(broker.ports["smqp"], "127.0.0.5")
        assert greeting.startswith(b"SMQP/1.0 Not Available."), greeting
        assert refused.closed()
        late_ssmp = connect(broker.ports["ssmp"], "127.0.0.5")
        assert late_ssmp.closed() and late_ssmp.buffer == b""
        http = connect(broker.ports["socketmq"], "127.0.0.5")
        http.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 503 " in http.line()

        silent.pop().close()  # a slot for a connection not logged in is free once it is read
        publisher = logged_in_once_admitted(broker.ports["ssmp"], "publisher")
        assert publisher.request("MCAST news logged-in sessions keep working") == b"200"
        assert member.line() == b"000 publisher MCAST news logged-in sessions keep working"

        for client in silent:
            client.close()
        assert_serves_every_protocol(broker)
    finally:
        broker.stop()
    assert "Traceback" not in broker.log()

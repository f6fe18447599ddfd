"""Every protocol's listener as an onion service, reached by brokerd's own clients over Tor
(``--connect tor:ADDRESS:PORT:socksPort=N``, txtorcon's client endpoint) and by a WebSocket
through a SOCKS connection, on the private Tor network (tests/support/tor.py)."""
from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.broker import REPO, LineClient
from tests.support.tor import (
    OnionBroker,
    TorNetwork,
    read_exactly,
    socks_connect,
    socks_connect_retrying,
    start_onion_broker,
)

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT = 90
"""Seconds one client command gets (a first connection over Tor builds circuits)."""


@pytest.fixture(scope="module")
def onion_broker(tor_network: TorNetwork, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnionBroker]:
    assert tor_network.service is not None
    broker = start_onion_broker(
        tmp_path_factory.mktemp("onion-broker"), "--open-login", "--ping-interval", "600",
        "--tor-control", tor_network.service.control_endpoint,
        listeners={"ssmp": "onion:8787", "mqtt": "onion:1883", "socketmq": "onion:80", "mcchat": "onion:1502"})
    try:
        assert tor_network.client is not None
        for address in broker.addresses.values():  # the client tor has every descriptor: the CLIs do not retry
            socks_connect_retrying(tor_network.client.socks_port, *address).close()
        yield broker
    finally:
        broker.stop()


def tor_endpoint(network: TorNetwork, address: tuple[str, int]) -> str:
    assert network.client is not None
    return f"tor:{address[0]}:{address[1]}:socksPort={network.client.socks_port}"


def client(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"brokerd.cli.{module}", *args]


def run_client(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(client(module, *args), capture_output=True, text=True, timeout=CLIENT_TIMEOUT,
                          env=env, cwd=REPO)


def test_mqtt_qos1_publish_and_subscribe_with_brokerd_mqtt_over_tor(
        tor_network: TorNetwork, onion_broker: OnionBroker, tmp_path: Path) -> None:
    where = tor_endpoint(tor_network, onion_broker.addresses["mqtt"])
    log_path = tmp_path / "sub.log"
    subscriber = processes.spawn(client("mqtt", "sub", "--connect", where, "-q", "1", "-C", "1", "-d",
                                        "--timeout", str(CLIENT_TIMEOUT), "plant/+"), log_path,
                                 env=processes.repo_env(PYTHONUNBUFFERED="1"))
    processes.wait_for_output("Subscribed to plant/+", subscriber, log_path, CLIENT_TIMEOUT)
    published = run_client("mqtt", "pub", "--connect", where, "-q", "1", "-d", "plant/boiler", "87C")
    assert published.returncode == 0, published.stderr
    assert "Published to plant/boiler" in published.stderr  # the PUBACK came back over Tor
    assert subscriber.wait(CLIENT_TIMEOUT) == 0
    assert "plant/boiler 87C" in log_path.read_text().splitlines()  # stdout: QoS 1 end to end


def test_ssmp_and_mcchat_clients_publish_over_tor(tor_network: TorNetwork, onion_broker: OnionBroker) -> None:
    assert tor_network.client is not None
    subscriber = LineClient(socks_connect(tor_network.client.socks_port, *onion_broker.addresses["ssmp"]), timeout=60)
    assert subscriber.request("LOGIN watcher open") == b"200"
    assert subscriber.request("SUBSCRIBE news") == b"200"
    ssmp = run_client("ssmp", "--connect", tor_endpoint(tor_network, onion_broker.addresses["ssmp"]),
                      "-i", "sam", "pub", "news", "from brokerd-ssmp")
    assert ssmp.returncode == 0, ssmp.stderr
    assert subscriber.line() == b"000 sam MCAST news from brokerd-ssmp"
    mcchat = run_client("mcchat", "pub", "--connect", tor_endpoint(tor_network, onion_broker.addresses["mcchat"]),
                        "-u", "max", "news", "from brokerd-mcchat")
    assert mcchat.returncode == 0, mcchat.stderr
    line = subscriber.line()
    assert line.startswith(b"000 ") and line.endswith(b"MCAST news from brokerd-mcchat"), line


def _ws_send(sock, text: str) -> None:
    """One masked text frame (a client's frames must be masked)."""
    payload = text.encode()
    mask = os.urandom(4)
    header = bytes([0x81]) + (bytes([0x80 | len(payload)]) if len(payload) < 126
                              else bytes([0x80 | 126]) + struct.pack("!H", len(payload)))
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def _ws_receive(sock) -> dict:
    """The next text frame's JSON (the server's frames are unmasked)."""
    first, length = read_exactly(sock, 2)
    length &= 0x7F
    if length == 126:
        length = struct.unpack("!H", read_exactly(sock, 2))[0]
    elif length == 127:
        length = struct.unpack("!Q", read_exactly(sock, 8))[0]
    assert first == 0x81, f"not a text frame: {first:#x}"
    return json.loads(read_exactly(sock, length))


def test_a_socketmq_websocket_over_tor(tor_network: TorNetwork, onion_broker: OnionBroker) -> None:
    assert tor_network.client is not None
    host, port = onion_broker.addresses["socketmq"]
    sock = socks_connect(tor_network.client.socks_port, host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /socket.mq/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                 f"Sec-WebSocket-Protocol: socketmq.v1\r\n\r\n".encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += read_exactly(sock, 1)
    assert response.startswith(b"HTTP/1.1 101 "), response
    assert _ws_receive(sock)["type"] == "hello"
    _ws_send(sock, json.dumps({"type": "auth", "id": 1, "method": "open", "identity": "web"}))
    assert _ws_receive(sock)["status"] == 200
    _ws_send(sock, json.dumps({"type": "subscribe", "id": 2, "event": "plant/boiler"}))
    assert _ws_receive(sock)["status"] == 200
    publisher = LineClient(socks_connect(tor_network.client.socks_port, *onion_broker.addresses["ssmp"]), timeout=60)
    assert publisher.request("LOGIN sam open") == b"200"
    assert publisher.request("MCAST plant/boiler 91C") == b"200"
    event = _ws_receive(sock)
    assert (event["type"], event["event"], event["from"], event["data"]) == ("event", "plant/boiler", "sam", "91C")
    sock.close()

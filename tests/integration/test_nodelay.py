"""TCP_NODELAY on real sockets, both ends, every protocol, plain TCP and TLS: the server's
accepted socket (found among the reactor's readers by the client's port) and the socket of
brokerd's own client for that protocol.  Without it, a reply written right after an event
waits for the peer's delayed acknowledgement (40 ms on Linux); the latency itself is measured
by benchmarks/latency.py, these tests check the mechanism."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, tcp
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol

from brokerd.auth.tls import client_context
from brokerd.config import Settings
from brokerd.protocols.mcchat import client as mcchat_client
from brokerd.protocols.smqp import client as smqp_client
from brokerd.protocols.socketmq.api import Client as SocketMQClient
from brokerd.protocols.ssmp.client import SSMPClientFactory
from brokerd.protocols.ssmp.client import client_endpoint as ssmp_endpoint
from brokerd.tap import ListenerService, makeService
from tests.support.certs import SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401

TIMEOUT = 10.0
PLAIN = "tcp:0:interface=127.0.0.1"
TLS = "tls:0:interface=127.0.0.1"


def nodelay(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def tcp_layer(transport: Any) -> Any:
    """The TCP transport itself, or the one under a TLS layer."""
    return transport if isinstance(transport, tcp.Connection) else transport.transport


def accepted_socket(client_port: int) -> socket.socket:
    """The server side of the loopback connection whose client end has ``client_port``."""
    for reader in reactor.getReaders():
        if isinstance(reader, tcp.Server) and reader.getPeer().port == client_port:
            return reader.getHandle()
    raise LookupError(f"no accepted connection from port {client_port}")


class Broker:
    def __init__(self, tmp_path: Path, pki: TestPKI) -> None:  # noqa: F811
        protocols = ("ssmp", "mcchat", "smqp", "socketmq")
        self.settings = Settings(
            listeners={name: [PLAIN, TLS] for name in protocols},
            open_login=True, data_dir=tmp_path, event_log=False,
            tls_cert=pki.server.cert, tls_key=pki.server.key, tls_ca=pki.ca,
        )
        self.pki = pki
        self.service = makeService(self.settings, reactor)
        self.service.startService()

    def port(self, protocol: str, tls: bool) -> int:
        for service in self.service:
            if isinstance(service, ListenerService) and service.option == protocol:
                if service.description.startswith("tls:") == tls:
                    return service.running_port.getHost().port
        raise LookupError(protocol)

    def endpoint(self, protocol: str, tls: bool) -> str:
        return f"tcp:127.0.0.1:{self.port(protocol, tls)}"

    def tls(self) -> dict:
        return {"tls": True, "hostname": SERVER_HOSTNAME, "ca": self.pki.ca}


@pytest_twisted.async_yield_fixture
async def broker(tmp_path: Path, pki: TestPKI):  # noqa: F811
    running = Broker(tmp_path, pki)
    yield running
    await running.service.stopService()
    await running.service.runtime.store.close()


def check_both_ends(transport: Any) -> None:
    client = tcp_layer(transport)
    assert nodelay(client.getHandle()), "the client's socket has Nagle on"
    assert nodelay(accepted_socket(client.getHost().port)), "the server's socket has Nagle on"


async def ssmp(broker: Broker, tls: bool) -> Any:
    endpoint = ssmp_endpoint(reactor, broker.endpoint("ssmp", tls), **(broker.tls() if tls else {}))
    protocol = await endpoint.connect(SSMPClientFactory(reactor)).addTimeout(TIMEOUT, reactor)
    return await protocol.login(b"alice").addTimeout(TIMEOUT, reactor)


async def mcchat(broker: Broker, tls: bool) -> Any:
    endpoint = mcchat_client.client_endpoint(reactor, broker.endpoint("mcchat", tls), **(broker.tls() if tls else {}))
    return await Deferred.fromCoroutine(mcchat_client.connect(endpoint)).addTimeout(TIMEOUT, reactor)


async def smqp(broker: Broker, tls: bool) -> Any:
    endpoint = smqp_client.client_endpoint(reactor, broker.endpoint("smqp", tls), **(broker.tls() if tls else {}))
    return await smqp_client.connect(endpoint).addTimeout(TIMEOUT, reactor)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest.mark.parametrize("connect", [ssmp, mcchat, smqp], ids=["ssmp", "mcchat", "smqp"])
@pytest_twisted.ensureDeferred
async def test_both_ends(broker: Broker, connect: Any, tls: bool) -> None:
    """The server's socket, and the client's (a logged-in SSMP client, an MCCHAT client that
    got INFO, an SMQP client that got the greeting)."""
    protocol = await connect(broker, tls)
    try:
        check_both_ends(protocol.transport)
    finally:
        protocol.transport.loseConnection()


@pytest.mark.parametrize("tls", [False, True], ids=["ws", "wss"])
@pytest_twisted.ensureDeferred
async def test_socketmq_websocket_both_ends(broker: Broker, tls: bool) -> None:
    port = broker.port("socketmq", tls)
    if tls:
        creator = client_context(SERVER_HOSTNAME, broker.pki.ca, None, None)
        client = SocketMQClient(f"https://{SERVER_HOSTNAME}:{port}", tls=creator, reactor=reactor)
    else:
        client = SocketMQClient(f"http://127.0.0.1:{port}", reactor=reactor)
    connection = await client.connect().addTimeout(TIMEOUT, reactor)
    try:
        check_both_ends(connection.transport)
    finally:
        await client.close()


class _FirstBytes(Protocol):
    def __init__(self) -> None:
        self.arrived: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        if not self.arrived.called:
            self.arrived.callback(data)


@pytest_twisted.ensureDeferred
async def test_socketmq_http_connection_before_any_upgrade(broker: Broker) -> None:
    """twisted.web's HTTP channel sets it when the connection is made (the WebSocket that
    an upgrade makes of the connection keeps it)."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", broker.port("socketmq", False))
    protocol = await connectProtocol(endpoint, _FirstBytes())
    try:
        protocol.transport.write(b"GET /socket.mq/nothing-here HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = await protocol.arrived.addTimeout(TIMEOUT, reactor)
        assert first.startswith(b"HTTP/1.1 ")
        assert not nodelay(protocol.transport.getHandle())  # a plain Twisted client: Nagle on
        assert nodelay(accepted_socket(protocol.transport.getHost().port))
    finally:
        protocol.transport.loseConnection()

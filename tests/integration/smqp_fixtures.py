"""A real SMQP front end on a loopback port, for end-to-end tests with the real client.

    from tests.integration.smqp_fixtures import smqp_server  # noqa: F401

``smqp_server`` is a factory (call it with options) so a test can shape settings, write a UAL
file first, or start a second server on the same data directory (restarts).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString

from brokerd.auth.accounts import PasswordHash, write_accounts
from brokerd.auth.tls import ServerTLS, listen_endpoint
from brokerd.config import Settings
from brokerd.protocols.smqp.client import SMQPClientProtocol, client_endpoint, connect
from brokerd.protocols.smqp.plugin import front_end as smqp
from brokerd.runtime import Runtime
from brokerd.store.sqlite import FILENAME, SQLiteStore
from tests.support.services import services_for

# Cheap hashes: the tests exercise the protocol, not scrypt's cost.
ACCOUNTS = {"alice": "alicepw", "bob": "bobpw", "guest": ""}


def write_test_accounts(path: Path, accounts: dict[str, str] = ACCOUNTS) -> None:
    write_accounts(path, {name: PasswordHash.create(pw, n=2) for name, pw in accounts.items()})


@dataclass
class Running:
    settings: Settings
    runtime: Runtime
    factory: Any
    port: Any
    clients: list[SMQPClientProtocol] = field(default_factory=list)
    stopped: bool = False

    @property
    def port_number(self) -> int:
        return self.port.getHost().port

    async def connect(self, **tls: Any) -> SMQPClientProtocol:
        if tls:
            endpoint = client_endpoint(reactor, f"tcp:127.0.0.1:{self.port_number}", tls=True,
                                       hostname="localhost", **tls)
        else:
            endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port_number)
        client = await connect(endpoint)
        self.clients.append(client)
        return client

    async def login(self, account: str = "alice", channel: str = "c1") -> SMQPClientProtocol:
        client = await self.connect()
        await client.login(account, channel, ACCOUNTS[account])
        return client

    async def stop(self) -> None:
        """Drop the clients, stop listening, close the store (once)."""
        if self.stopped:
            return
        self.stopped = True
        for client in self.clients:
            if client.transport is not None and client._lost is None:
                client.transport.abortConnection()
                await client.when_closed()
        await self.port.stopListening()
        await self.runtime.services.store.close()


@pytest_twisted.async_yield_fixture
async def smqp_server(tmp_path: Path):
    """``await smqp_server(**settings)`` starts a server; all are stopped afterwards."""
    running: list[Running] = []
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)

    async def start(tls: ServerTLS | None = None, **overrides: Any) -> Running:
        settings = Settings(**{"data_dir": tmp_path / "data", "accounts_file": accounts, **overrides})
        services = services_for(settings, reactor, store=SQLiteStore(Path(settings.data_dir) / FILENAME, reactor),
                                tls=tls)
        factory = smqp.build(services)
        runtime = Runtime(services, front_ends={"smqp": factory})
        await factory.started
        if tls is not None:
            endpoint = listen_endpoint(reactor, tls, "tls:0:interface=127.0.0.1")
        else:
            endpoint = serverFromString(reactor, "tcp:0:interface=127.0.0.1")
        port = await endpoint.listen(factory)
        server = Running(settings, runtime, factory, port)
        running.append(server)
        return server

    yield start
    for server in running:
        await server.stop()


class BlockingSMQP:
    """A blocking SMQP client over a plain socket, for tests against a ``twistd`` subprocess
    (crash tests, benchmarks): the real codec parses what the server sends."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        import socket

        from brokerd.protocols.smqp.codec import SMQPClientParser

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.parser = SMQPClientParser()
        self.events: list[Any] = []
        self.greeting = self._next()

    def _next(self) -> Any:
        while not self.events:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the server closed the connection")
            self.events.extend(self.parser.feed(data))
        return self.events.pop(0)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> Any:
        """The next reply; notifications met first are kept for :meth:`notify`."""
        from brokerd.protocols.smqp.events import Reply

        kept = []
        while True:
            event = self._next()
            if isinstance(event, Reply):
                self.events[:0] = kept
                return event
            kept.append(event)

    def notify(self) -> Any:
        from brokerd.protocols.smqp.events import Notify

        for index, event in enumerate(self.events):
            if isinstance(event, Notify):
                return self.events.pop(index)
        while True:
            event = self._next()
            if isinstance(event, Notify):
                return event
            self.events.append(event)

    def command(self, line: str) -> Any:
        self.send(line.encode("utf-8") + b"\r\n")
        return self.reply()

    def login(self, account: str, channel: str) -> Any:
        assert self.command(f"LOGIN {account}:{channel} CLEAR/1.0").code == 200
        password = ACCOUNTS[account]
        reply = self.command(f"PASS {account} {password}" if password else f"PASS {account}")
        assert reply.code == 200, reply
        return reply

    def publish_bytes(self, topic: str, cmuid: str, data: bytes, *headers: tuple[str, str]) -> bytes:
        from brokerd.protocols.smqp.codec import encode_publish, format_datetime
        from brokerd.protocols.smqp.events import Body, Section

        import time

        body = Body((("Created", format_datetime(time.time())), *headers),
                    (Section((("Content-Type", "application/octet-stream"),), data),))
        return encode_publish(topic, cmuid, body)

    def close(self) -> None:
        self.sock.close()

"""A real SMQP front end on a loopback port, for end-to-end tests with the real client.

    from tests.integration.smqp_fixtures import smqp_server  # noqa: F401

``smqp_server`` is a factory (call it with options) so a test can shape settings, write a UAL
file first, or start a second server on the same data directory (restarts).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString

from brokerd.auth.accounts import PasswordHash, write_accounts
from brokerd.auth.tls import ServerTLS, listen_endpoint
from brokerd.config import Runtime, Settings
from brokerd.core.broker import Broker
from brokerd.protocols.smqp.client import SMQPClientProtocol, client_endpoint, connect
from brokerd.protocols.smqp.server import build_factory

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
        await self.runtime.resources["store"].close()


@pytest_twisted.async_yield_fixture
async def smqp_server(tmp_path: Path):
    """``await smqp_server(**settings)`` starts a server; all are stopped afterwards."""
    running: list[Running] = []
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)

    async def start(tls: ServerTLS | None = None, **overrides: Any) -> Running:
        values: dict[str, Any] = {"data_dir": tmp_path / "data", "accounts_file": accounts}
        known = {f.name for f in fields(Settings)}
        values.update({k: v for k, v in overrides.items() if k in known})
        settings = Settings(**values)
        for name, value in overrides.items():
            if name not in known:  # settings the SMQP front end reads with getattr (ual_file...)
                setattr(settings, name, value)
        runtime = Runtime(settings=settings, broker=Broker(), portal=None, reactor=reactor, tls=tls)
        factory = build_factory(runtime)
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

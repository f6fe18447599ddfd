"""A real broker (brokerd.tap.makeService) on loopback ports chosen by the OS, with MCCHAT and
SSMP clients and bounded waits, for the real-socket tests in tests/integration."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred

from brokerd.config import Settings
from brokerd.protocols.mcchat.client import MCChatClientProtocol, client_endpoint, connect
from brokerd.protocols.ssmp.client import SSMPClient
from brokerd.protocols.ssmp.client import client_endpoint as ssmp_endpoint
from brokerd.tap import ListenerService, makeService

TIMEOUT = 10.0
"""Seconds any single wait may take before the test fails instead of hanging."""
LOOPBACK = "tcp:0:interface=127.0.0.1"


def reactor() -> Any:
    from twisted.internet import reactor as global_reactor

    return global_reactor


class Inbox:
    """What one client received, with bounded waits for more of it."""

    def __init__(self) -> None:
        self.messages: list[tuple] = []
        self.presence: list[tuple] = []
        self._waits: list[tuple[Any, Deferred]] = []

    def on_message(self, *message: Any) -> None:
        self.messages.append(message)
        self._check()

    def on_presence(self, *change: Any) -> None:
        self.presence.append(change)
        self._check()

    def until(self, condition: Any) -> Deferred:
        """Fires once ``condition(self)`` holds; fails after TIMEOUT seconds."""
        d: Deferred = Deferred()
        self._waits.append((condition, d))
        self._check()
        return d.addTimeout(TIMEOUT, reactor())

    def count(self, n: int) -> Deferred:
        return self.until(lambda inbox: len(inbox.messages) >= n)

    def _check(self) -> None:
        for condition, d in list(self._waits):
            if not d.called and condition(self):
                self._waits.remove((condition, d))
                d.callback(None)


class LiveBroker:
    """makeService with SSMP and MCCHAT listeners on loopback, started on the global reactor."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.service: MultiService | None = None
        self.mcchat_clients: list[MCChatClientProtocol] = []
        self.ssmp_clients: list[SSMPClient] = []

    @classmethod
    def start(cls, data_dir: Path, **fields: Any) -> LiveBroker:
        listeners = fields.pop("listeners", {"ssmp": [LOOPBACK], "mcchat": [LOOPBACK]})
        extra = {k: fields.pop(k) for k in list(fields) if k.startswith("mcchat_")}
        settings = Settings(listeners=listeners, data_dir=data_dir, open_login=True, **fields)
        for name, value in extra.items():
            setattr(settings, name, value)  # fields the lead adds to Settings
        live = cls(settings)
        live.service = makeService(settings, reactor())
        live.service.startService()
        return live

    @property
    def runtime(self) -> Any:
        return self.service.runtime  # type: ignore[union-attr]

    @property
    def broker(self) -> Any:
        return self.runtime.broker

    def port(self, protocol: str) -> int:
        for service in self.service:  # type: ignore[union-attr]
            if isinstance(service, ListenerService) and service.option == protocol:
                return service.running_port.getHost().port  # type: ignore[no-any-return]
        raise LookupError(protocol)

    def mcchat_factory(self) -> Any:
        for service in self.service:  # type: ignore[union-attr]
            if isinstance(service, ListenerService) and service.option == "mcchat":
                return service.factory
        raise LookupError("mcchat")

    async def mcchat(self, inbox: Inbox | None = None, **tls: Any) -> MCChatClientProtocol:
        """A connected MCCHAT client (INFO received)."""
        endpoint = client_endpoint(reactor(), f"tcp:127.0.0.1:{self.port('mcchat')}", **tls)
        handler = inbox.on_message if inbox is not None else None
        d = Deferred.fromCoroutine(connect(endpoint, handler))
        protocol = await d.addTimeout(TIMEOUT, reactor())
        self.mcchat_clients.append(protocol)
        return protocol  # type: ignore[no-any-return]

    async def ssmp(self, identifier: bytes, inbox: Inbox | None = None) -> SSMPClient:
        """A logged-in SSMP client."""
        inbox = inbox or Inbox()
        client = SSMPClient(
            ssmp_endpoint(reactor(), f"tcp:127.0.0.1:{self.port('ssmp')}"),
            identifier,
            reactor=reactor(),
            on_message=inbox.on_message,
            on_presence=inbox.on_presence,
        )
        self.ssmp_clients.append(client)
        client.startService()
        await client.whenConnected(failAfterFailures=1).addTimeout(TIMEOUT, reactor())
        return client

    async def stop(self) -> None:
        for mc in self.mcchat_clients:
            await mc.close().addTimeout(TIMEOUT, reactor())
        for client in self.ssmp_clients:
            await client.stopService()
        if self.service is not None:
            await self.service.stopService()


async def synced(*clients: MCChatClientProtocol) -> None:
    """Wait until the server handled everything each client sent so far (TLRQ barrier)."""
    for client in clients:
        await client.sync().addTimeout(TIMEOUT, reactor())


def mcchat_session(live: LiveBroker, client: Any) -> Any:
    """The server's protocol object for a client connection (found by its ``ip:port``)."""
    name = f"127.0.0.1:{client.transport.getHost().port}".encode()
    for protocol in live.mcchat_factory().live:
        if protocol.name == name:
            return protocol
    raise LookupError(name)

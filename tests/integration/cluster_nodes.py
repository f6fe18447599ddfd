"""brokerd nodes of one cluster in this process: makeService with SSMP, MCCHAT and socket.mq on
OS-chosen loopback ports and ``--cluster`` pointing at the test's redis-server, all on the
test's reactor, with one client helper per protocol.  With ``store=postgresql://...`` a node
listens for SMQP too (a cluster with SMQP needs the shared PostgreSQL store); ``protocols``
names the listeners of a node that runs fewer."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory

from brokerd.config import Settings
from brokerd.protocols.mcchat.client import MCChatClientProtocol, client_endpoint, connect
from brokerd.protocols.smqp.client import SMQPClientProtocol
from brokerd.protocols.smqp.client import connect as smqp_connect
from brokerd.protocols.socketmq.api import Client
from brokerd.tap import ListenerService, makeService
from tests.support.live import Inbox
from tests.support.redis import cluster_secret
from tests.support.live import TIMEOUT, LineProtocol, Waiter, reactor

LOOPBACK = "tcp:0:interface=127.0.0.1"
LISTENERS = ("ssmp", "mcchat", "socketmq")


class Node:
    """One node; ``engine`` is its Redis engine."""

    def __init__(self, data_dir: Path, cluster: str, name: str, protocols: tuple[str, ...] | None = None,
                 **fields: Any) -> None:
        self.name = name
        if protocols is None:
            protocols = (*LISTENERS, "smqp") if fields.get("store") else LISTENERS
        if "cluster_secret_file" not in fields:  # every test node shares the test secret
            fields["cluster_secret_file"] = cluster_secret(data_dir.parent / f"{name}.secret")
        self.settings = Settings(
            listeners={protocol: [LOOPBACK] for protocol in protocols},
            data_dir=data_dir, open_login=True, cluster=cluster, node_name=name, **{"event_log": False, **fields},
        )
        self.data_dir = data_dir
        self.service: Any = None
        self.clients: list[Any] = []

    async def start(self) -> Node:
        self.service = makeService(self.settings, reactor())
        self.service.startService()
        await self.engine.when_connected().addTimeout(TIMEOUT, reactor())
        return self

    @property
    def broker(self) -> Any:
        return self.service.runtime.broker

    @property
    def engine(self) -> Any:
        return self.broker.engine

    @property
    def smqp_factory(self) -> Any:
        """The SMQP front end (its ``tree``)."""
        for service in self.service:
            if isinstance(service, ListenerService) and service.option == "smqp":
                return service.factory
        raise LookupError("smqp")

    def port(self, protocol: str) -> int:
        for service in self.service:
            if isinstance(service, ListenerService) and service.option == protocol:
                return service.running_port.getHost().port  # type: ignore[no-any-return]
        raise LookupError(protocol)

    async def ssmp(self, name: bytes) -> LineProtocol:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.port("ssmp"))
        client: LineProtocol = await endpoint.connect(Factory.forProtocol(LineProtocol)).addTimeout(TIMEOUT, reactor())
        self.clients.append(client)
        await client.login(name)
        return client

    async def mcchat(self, inbox: Inbox) -> MCChatClientProtocol:
        endpoint = client_endpoint(reactor(), f"tcp:127.0.0.1:{self.port('mcchat')}")
        client = await Deferred.fromCoroutine(connect(endpoint, inbox.on_message)).addTimeout(TIMEOUT, reactor())
        self.clients.append(client)
        return client  # type: ignore[no-any-return]

    async def socketmq(self) -> Client:
        client = Client(f"http://127.0.0.1:{self.port('socketmq')}")
        await client.connect().addTimeout(TIMEOUT, reactor())
        self.clients.append(client)
        return client

    async def smqp_connection(self) -> SMQPClientProtocol:
        """An SMQP connection, greeted, not logged in."""
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.port("smqp"))
        client: SMQPClientProtocol = await smqp_connect(endpoint).addTimeout(TIMEOUT, reactor())
        self.clients.append(client)
        return client

    async def smqp(self, account: str, channel: str, password: str) -> SMQPClientProtocol:
        """An SMQP session logged in as ``account``/``channel``."""
        client = await self.smqp_connection()
        await client.login(account, channel, password).addTimeout(TIMEOUT, reactor())
        return client

    async def stop(self) -> None:
        for client in self.clients:
            if isinstance(client, SMQPClientProtocol):
                if client.transport is not None and client._lost is None:
                    client.transport.abortConnection()
                    await client.when_closed().addTimeout(TIMEOUT, reactor())
                continue
            if not hasattr(client, "close"):  # an MQTT client (brokerd.protocols.mqtt.client)
                client.abort()
                continue
            close = client.close()
            if isinstance(close, Deferred):
                try:
                    await close.addTimeout(TIMEOUT, reactor())
                except Exception:  # noqa: BLE001 - a client the test already closed
                    pass
        self.clients = []
        if self.service is not None:
            service, self.service = self.service, None
            await service.stopService()


async def ssmp_subscribed(client: LineProtocol, topic: bytes) -> None:
    """SUBSCRIBE and wait for the 200."""
    before = len(client.lines.items)
    client.send(b"SUBSCRIBE " + topic)
    await client.lines.count(before + 1)
    assert client.lines.items[before] == b"200", client.lines.items


__all__ = ["Inbox", "LineProtocol", "Node", "TIMEOUT", "Waiter", "reactor", "ssmp_subscribed"]

"""Real-socket harnesses for socket.mq tests: the socket.mq and SSMP front ends on loopback ports
around one Broker (``LiveBrokerd``: a test can hand the front ends its own event recorder), and
a real ``twistd brokerd`` serving both (``TwistdBroker``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory

from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.protocols.socketmq.plugin import front_end as socketmq
from brokerd.protocols.ssmp.server import SSMPServerFactory
from tests.support.broker import RunningBroker, start_broker
from tests.support.collect import eventually
from tests.support.live import TIMEOUT, LineProtocol, reactor
from tests.support.services import services_for


class LiveBrokerd:
    """SSMP and socket.mq front ends on 127.0.0.1 (OS-chosen ports) around one Broker."""

    def __init__(self, data_dir: Path, events: Any = None, **settings: Any) -> None:
        """``events``: an IEventRecorder for the front ends (the services' ``event_log``)."""
        self.settings = Settings(open_login=True, data_dir=data_dir, **settings)
        self.broker = Broker(max_connections=self.settings.max_connections)
        portal = build_portal(open_login=True)
        self.services = services_for(self.settings, reactor(), broker=self.broker, portal=portal,
                                     events=events if events is not None else NULL_EVENT_LOG)
        self.ssmp_factory = SSMPServerFactory(self.broker, portal, self.settings, reactor())
        self.site = socketmq.build(self.services)
        self.hub = self.site.hub
        self.ports: list[Any] = []
        self.clients: list[Any] = []

    async def start(self, tls_endpoint: Any = None) -> LiveBrokerd:
        self.ssmp_port = await endpoints.serverFromString(reactor(), "tcp:0:interface=127.0.0.1").listen(self.ssmp_factory)
        self.http_port = await endpoints.serverFromString(reactor(), "tcp:0:interface=127.0.0.1").listen(self.site)
        self.ports += [self.ssmp_port, self.http_port]
        if tls_endpoint is not None:
            self.tls_port = await tls_endpoint.listen(self.site)
            self.ports.append(self.tls_port)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port.getHost().port}"

    @property
    def tls_url(self) -> str:
        return f"https://localhost:{self.tls_port.getHost().port}"

    async def ssmp(self, name: bytes = b"sam") -> LineProtocol:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.ssmp_port.getHost().port)
        client: LineProtocol = await endpoint.connect(Factory.forProtocol(LineProtocol))
        self.clients.append(client)
        await client.login(name)
        return client

    def track(self, client: Any) -> Any:
        self.clients.append(client)
        return client

    async def stop(self) -> None:
        for client in self.clients:
            close = client.close()
            if isinstance(close, Deferred):
                await close.addTimeout(TIMEOUT, reactor())
        for session in self.broker.sessions():
            drop = getattr(session, "dropConnection", None)
            if drop is not None:
                drop(abort=True)
        for port in self.ports:
            await port.stopListening()
        # aborted connections finish closing on a later reactor turn: wait for that, so the
        # next test starts with none of them left
        await eventually(lambda: self.broker.stats.connections == 0, "every connection to close")


class TwistdBroker:
    """A real ``twistd -n brokerd`` (:func:`tests.support.broker.start_broker`) with SSMP and
    socket.mq on loopback ports and open login."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.tmp_path = tmp_path
        self.extra = extra
        self.running: RunningBroker | None = None

    @property
    def data_dir(self) -> Path:
        return self.tmp_path / "data"

    @property
    def url(self) -> str:
        assert self.running is not None
        return f"http://127.0.0.1:{self.running.ports['socketmq']}"

    async def start(self) -> TwistdBroker:
        """Start it; returns once both listeners accept (bounded)."""
        self.running = start_broker(self.tmp_path, "--open-login", *self.extra, listeners={
            "ssmp": "tcp:{port}:interface=127.0.0.1", "socketmq": "tcp:{port}:interface=127.0.0.1"})
        return self

    async def ssmp(self, name: bytes) -> LineProtocol:
        assert self.running is not None
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.running.ports["ssmp"])
        client: LineProtocol = await endpoint.connect(Factory.forProtocol(LineProtocol))
        await client.login(name)
        return client

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()

"""An SSMP server on StringTransports and a Clock: fast, deterministic adapter tests."""
from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.ssmp.server import SSMPServerFactory
from tests.protocols.recording import RecordingEvents


class RecordedEvents(RecordingEvents):
    """The front-end half of the event log (IEventRecorder), kept in lists."""

    def __init__(self) -> None:
        super().__init__()
        self.auth_failures: list[dict] = []

    def auth_failure(self, protocol, identity, source=None, scheme=None, reason=None) -> None:
        self.auth_failures.append(
            {"protocol": protocol, "identity": identity, "source": source, "scheme": scheme, "reason": reason}
        )
        super().auth_failure(protocol, identity, source, scheme, reason)


class Harness:
    def __init__(self, secret: bytes | None = None, open_login: bool = True, **settings) -> None:
        self.clock = Clock()
        self.settings = Settings(**settings)
        self.broker = Broker(
            max_subscriptions=self.settings.max_subscriptions,
            max_connections=self.settings.max_connections,
        )
        self.portal = build_portal(open_login=open_login, secret=secret)
        self.events = RecordedEvents()
        self.factory = SSMPServerFactory(self.broker, self.portal, self.settings, self.clock, self.events)
        self.factory.startFactory()
        self._port = 40000

    def connect(self):
        self._port += 1
        protocol = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", self._port))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", self._port))
        protocol.makeConnection(transport)
        return Client(protocol, transport)

    def login(self, name: str):
        client = self.connect()
        assert client.request(f"LOGIN {name} open") == b"200\n"
        return client


class Client:
    def __init__(self, protocol, transport: StringTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.protocol.dataReceived(data)

    def take(self) -> bytes:
        data = self.transport.value()
        self.transport.clear()
        return data

    def request(self, line: bytes | str) -> bytes:
        if isinstance(line, str):
            line = line.encode()
        self.take()
        self.send(line + b"\n")
        return self.take()

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting

    def lose(self) -> None:
        from twisted.internet.error import ConnectionDone
        from twisted.python.failure import Failure

        self.protocol.connectionLost(Failure(ConnectionDone()))

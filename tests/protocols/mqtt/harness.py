"""The MQTT server on StringTransports and a Clock: its protocol logic (the CONNECT timeout,
keep-alive, the QoS 1 and 2 windows, redelivery, session expiry, wills) driven by raw packet
bytes, with no socket and no reactor, and the server's bytes read back as they were written."""
from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.mqtt.decoder import MQTTClientDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import MQTT_5, Connect, Packet
from brokerd.protocols.mqtt.server import MQTTServerFactory
from brokerd.protocols.mqtt.sessions import MQTTSessions
from tests.protocols.recording import RecordingEvents


class Harness:
    """One MQTT listener's factory on a Clock, its sessions and a Broker with no store."""

    def __init__(self, **settings: Any) -> None:
        self.clock = Clock()
        self.settings = Settings(**settings)
        self.broker = Broker(max_subscriptions=self.settings.max_subscriptions,
                             max_connections=self.settings.max_connections,
                             max_unauthenticated=self.settings.max_unauthenticated)
        self.events = RecordingEvents()
        self.sessions = MQTTSessions(self.broker, self.settings, self.clock)
        self.factory = MQTTServerFactory(self.broker, build_portal(open_login=True), self.settings, self.clock,
                                         self.sessions, self.events)
        self.factory.startFactory()
        self._port = 40000

    def connection(self) -> Client:
        """A new TCP connection, before its CONNECT."""
        self._port += 1
        address = IPv4Address("TCP", "127.0.0.1", self._port)
        protocol = self.factory.buildProtocol(address)
        transport = StringTransport(hostAddress=IPv4Address("TCP", "127.0.0.1", 1883), peerAddress=address)
        protocol.makeConnection(transport)
        return Client(protocol, transport)

    def connected(self, version: int, client_id: str = "c", **connect: Any) -> Client:
        """A connection whose CONNECT was accepted; its CONNACK is taken from the transport
        (and kept in :attr:`Client.connack`)."""
        client = self.connection()
        client.version = version
        client.send(Connect(client_id, **connect))
        client.connack = client.take()
        assert client.connack[:1] == b"\x20" and client.connack[3:4] == b"\x00", client.connack
        return client

    def elapse(self, seconds: float, step: float = 0.25) -> None:
        """Let ``seconds`` pass as a reactor would, in ``step``s: one ``Clock.advance`` over
        several periods of a LoopingCall (the keep-alive sweep) runs it once, not once a period."""
        for _ in range(round(seconds / step)):
            self.clock.advance(step)


class Client:
    """The client side of one connection: packets in (encoded as ``version``), bytes out."""

    version: int = MQTT_5
    connack: bytes = b""

    def __init__(self, protocol: Any, transport: StringTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, packet: Packet) -> None:
        self.send_bytes(encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def take(self) -> bytes:
        """What the server wrote since the last take."""
        data = self.transport.value()
        self.transport.clear()
        return data

    def take_packets(self) -> list[Packet]:
        """What the server wrote since the last take, decoded as a client reads it."""
        packets, error = MQTTClientDecoder(self.version).feed(self.take())
        assert error is None, error
        return packets

    @property
    def closed(self) -> bool:
        """The server closed (or is closing) the connection."""
        return self.transport.disconnecting

    def lose(self) -> None:
        """The TCP connection ended (after the server closed it, or the client went away)."""
        self.protocol.connectionLost(Failure(ConnectionDone()))

"""MQTT over WebSocket (MQTT 5.0 and 3.1.1, section 6), served at ``/mqtt`` on the socket.mq
listeners.

The MQTT connection is an unchanged :class:`~.server.MQTTServerProtocol` of the front end's
factory; only its transport differs: a :class:`WebSocketStream` over one Autobahn WebSocket.
Every binary message's bytes are fed to ``dataReceived`` as they come (the decoder is
incremental: a packet may span messages, a message may hold several packets), and every
``write`` is one binary message.  Flow control, addresses and TLS are the TCP connection's
underneath: the MQTT protocol is the streaming producer of that connection, paused when more
than ``--max-output-buffer`` bytes wait, and ``brokerd.auth.tls.peer_names`` sees the verified
client certificate of a ``tls:`` socket.mq listener through the stream.

Section 6 and RFC 6455: the client must offer the subprotocol ``mqtt`` (``mqttv3.1``, what some
3.1.1 clients offer, is accepted when ``mqtt`` is not offered); otherwise the handshake is
refused (400) and never completed.  A text message is not MQTT: the server closes with 1003
(unsupported data) and the connection ends, as an abnormal end (the will is published).

Front ends never import each other, so this module knows nothing of socket.mq: the MQTT front
end's plugin calls :func:`mount` when it is built, which puts an Autobahn factory under ``b"mqtt"``
in the broker's :class:`~brokerd.frontend.WebSocketMounts`; socket.mq's listeners serve what it holds,
after their Origin check (``--socketmq-origins``), and hand the connection over: the HTTP
request's connection count is released and :class:`~.server.MQTTServerProtocol` counts the
connection itself (not logged in until its CONNECT is accepted, as over TCP).

Every timer is the MQTT front end's clock's (its factory's ``clock``, which runs MQTT's
keep-alive), none Autobahn's (brokerd.protocols.websocket): the close handshake the server
began is bounded by :data:`~brokerd.protocols.websocket.CLOSE_HANDSHAKE_TIMEOUT` on it, the
opening handshake by the socket.mq listener's HTTP deadline (``--socketmq-handshake-timeout``),
and liveness is MQTT's own Keep Alive (no WebSocket pings).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, cast

from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IAddress, IConsumer, ISSLTransport, ITransport
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.frontend import WebSocketMounts
from brokerd.protocols.mqtt.server import MQTTServerFactory, MQTTServerProtocol
from brokerd.protocols.nodelay import no_delay
from brokerd.protocols.websocket import ClockedServerFactory, ClockedServerProtocol
from brokerd.twistedio import limit_output_buffer

PATH = b"mqtt"
"""The path (``/mqtt``) MQTT is served at on socket.mq listeners."""
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""The WebSocket subprotocols accepted, in the server's preference."""
MESSAGE_SLACK = 1 << 16
"""Bytes one WebSocket message may have beyond ``--mqtt-max-packet-size`` (a message may hold
a packet of the largest size and others); a larger message closes the connection with 1009.
Autobahn applies the bound to the messages it sends too, so longer writes are split."""
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED_DATA = 1003


def mount(mounts: WebSocketMounts, factory: MQTTServerFactory) -> None:
    """Serve ``factory``'s MQTT at ``/mqtt`` on the socket.mq listeners."""
    mounts.mount(PATH, MQTTWebSocketFactory(factory))


class Connection(Protocol):
    """The TCP connection (or TLS layer) under a WebSocket, as :class:`WebSocketStream` uses
    it: Twisted has no one interface for a transport that is also a producer and, over TLS,
    has TCP options and a certificate (ITCPTransport, IProducer, ISSLTransport)."""

    def getPeer(self) -> IAddress: ...

    def getHost(self) -> IAddress: ...

    def registerProducer(self, producer: object, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def getTcpNoDelay(self) -> bool: ...

    def setTcpNoDelay(self, enabled: bool) -> None: ...

    def getTcpKeepAlive(self) -> bool: ...

    def setTcpKeepAlive(self, enabled: bool) -> None: ...

    def getHandle(self) -> object: ...

    def getPeerCertificate(self) -> object: ...


@implementer(ITransport, IConsumer)
class WebSocketStream:
    """The transport an MQTTServerProtocol has over a WebSocket: binary messages out, the TCP
    (or TLS) connection's flow control, addresses and closing (see the module docstring)."""

    disconnecting = False

    def __init__(self, websocket: MQTTWebSocketProtocol) -> None:
        self.websocket = websocket
        self.connection = cast(Connection, websocket.transport)  # the WebSocket is open: it has one
        """The TCP connection (or TLS layer) under the WebSocket."""

    def write(self, data: bytes) -> None:
        websocket = self.websocket
        if not data or websocket.state != websocket.STATE_OPEN:  # nothing may follow a close frame
            return
        if type(data) is not bytes:
            data = bytes(data)
        largest = websocket.maxMessagePayloadSize
        if len(data) <= largest or not largest:
            websocket.sendMessage(data, isBinary=True)
            return
        for start in range(0, len(data), largest):  # a packet may span messages (MQTT-6.0.0-2)
            websocket.sendMessage(data[start:start + largest], isBinary=True)

    def writeSequence(self, data: Iterable[bytes]) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        """Close the WebSocket (a close frame after what was written), then the connection."""
        self.disconnecting = True
        websocket = self.websocket
        if websocket.state == websocket.STATE_OPEN:
            websocket.sendCloseFrame(CLOSE_NORMAL)
        elif websocket.state != websocket.STATE_CLOSING:
            websocket.dropConnection(abort=False)

    def abortConnection(self) -> None:
        self.disconnecting = True
        self.websocket.dropConnection(abort=True)

    def getPeer(self) -> IAddress:
        return self.connection.getPeer()

    def getHost(self) -> IAddress:
        return self.connection.getHost()

    def registerProducer(self, producer: object, streaming: bool) -> None:
        self.connection.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self.connection.unregisterProducer()

    def pauseProducing(self) -> None:
        """Stop reading the connection (the MQTT protocol waits for a login, or is congested)."""
        self.connection.pauseProducing()

    def resumeProducing(self) -> None:
        self.connection.resumeProducing()


@implementer(ISSLTransport)
class TLSWebSocketStream(WebSocketStream):
    """A WebSocketStream over TLS: ISSLTransport (so the client certificate can log in), and
    so ITCPTransport, whose TCP options are the connection's."""

    def getPeer(self) -> IPv4Address | IPv6Address:
        return cast("IPv4Address | IPv6Address", self.connection.getPeer())  # TLS here is over TCP

    def getHost(self) -> IPv4Address | IPv6Address:
        return cast("IPv4Address | IPv6Address", self.connection.getHost())

    def loseWriteConnection(self) -> None:
        """A WebSocket cannot be half-closed: close it."""
        self.loseConnection()

    def getTcpNoDelay(self) -> bool:
        return bool(self.connection.getTcpNoDelay())

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.connection.setTcpNoDelay(enabled)

    def getTcpKeepAlive(self) -> bool:
        return bool(self.connection.getTcpKeepAlive())

    def setTcpKeepAlive(self, enabled: bool) -> None:
        self.connection.setTcpKeepAlive(enabled)

    def getHandle(self) -> object:
        return self.connection.getHandle()

    def getPeerCertificate(self) -> object:
        return self.connection.getPeerCertificate()


class MQTTWebSocketProtocol(ClockedServerProtocol):
    """One WebSocket carrying one MQTT connection (see the module docstring)."""

    _log = Logger()
    factory: MQTTWebSocketFactory
    mqtt: MQTTServerProtocol | None = None
    maxMessagePayloadSize: int
    """Set by Autobahn from the factory's protocol options (:class:`MQTTWebSocketFactory`)."""
    refused = False
    """A text message came: nothing more is read."""

    def onConnect(self, request: ConnectionRequest) -> str:
        for subprotocol in SUBPROTOCOLS:
            if subprotocol in request.protocols:
                return subprotocol
        raise ConnectionDeny(400, "offer the WebSocket subprotocol mqtt")

    def onOpen(self) -> None:
        transport = cast(Connection, self.transport)  # open: the HTTP channel's connection
        limit_output_buffer(transport, self.factory.mqtt.settings.max_output_buffer)
        no_delay(transport)
        transport.unregisterProducer()  # the HTTP channel's, from before the upgrade
        stream = (TLSWebSocketStream if ISSLTransport.providedBy(transport) else WebSocketStream)(self)
        mqtt = self.mqtt = self.factory.mqtt.buildProtocol(transport.getPeer())
        if mqtt is None:  # the factory refused the connection
            self.dropConnection(abort=True)
            return
        try:
            mqtt.makeConnection(stream)
        except Exception:  # noqa: BLE001 - Autobahn would swallow it and keep a WebSocket
            # that nothing reads and nothing times out: log it, and drop the connection.
            self._log.failure("MQTT over WebSocket: the connection could not start")
            self.dropConnection(abort=True)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        mqtt = self.mqtt
        if mqtt is None or self.refused:
            return
        if not isBinary:
            self.refused = True  # MQTT-6.0.0-1: close the network connection
            self.sendCloseFrame(CLOSE_UNSUPPORTED_DATA, b"MQTT is sent in binary WebSocket messages")
            return
        mqtt.dataReceived(payload)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        mqtt, self.mqtt = self.mqtt, None
        if mqtt is not None:
            mqtt.connectionLost(reason)


class MQTTWebSocketFactory(ClockedServerFactory):
    """Builds the WebSocket protocols of one MQTT front end (``mqtt``, its factory)."""

    protocol = MQTTWebSocketProtocol  # type: ignore[assignment]  # Autobahn's factories are not generic over their protocol as Twisted's Factory[P] is

    def __init__(self, mqtt: MQTTServerFactory) -> None:
        super().__init__(mqtt.clock)  # the MQTT front end's, which runs MQTT's keep-alive
        self.mqtt = mqtt
        largest = mqtt.settings.mqtt_max_packet_size + MESSAGE_SLACK
        self.setProtocolOptions(
            maxMessagePayloadSize=largest,
            maxFramePayloadSize=largest,
            failByDrop=False,
            webStatus=False,
        )

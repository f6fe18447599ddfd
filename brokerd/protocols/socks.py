"""A SOCKS5 client endpoint: the connection to a host name through Tor's SOCKS port.

brokerd's ``tor:`` client endpoint strings use it rather than txtorcon's TorClientEndpoint:
that one keeps the bytes that arrive together with the SOCKS reply until more arrive, so a
protocol whose server speaks first (SMQP's greeting) waits forever.  The host name is sent
to the proxy unresolved (an onion address never leaves Tor); no authentication is offered.
"""
from __future__ import annotations

from twisted.internet.address import HostnameAddress
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IStreamClientEndpoint, ITransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

REPLIES = {
    0x01: "general SOCKS server failure", 0x02: "connection not allowed by ruleset", 0x03: "network unreachable",
    0x04: "host unreachable", 0x05: "connection refused", 0x06: "TTL expired", 0x07: "command not supported",
    0x08: "address type not supported", 0xF0: "onion service descriptor not found",
    0xF1: "onion service descriptor is invalid", 0xF2: "onion service introduction failed",
    0xF3: "onion service rendezvous failed", 0xF4: "onion service needs a client authorization key",
    0xF5: "onion service client authorization key is wrong", 0xF6: "not an onion address",
    0xF7: "onion service introduction timed out",
}
"""SOCKS5 reply codes (RFC 1928) and Tor's extended ones (its SocksPort ExtendedErrors)."""

_ADDRESS_LENGTHS = {0x01: 4, 0x04: 16}
"""Bound-address lengths by type (0x03, a name, carries its own)."""


class SOCKSError(ConnectError):
    """The proxy could not connect: its reply code and what it means."""


class _Handshake(Protocol):
    """Speaks SOCKS5 on the proxy connection, then hands it to the application's protocol
    (bytes that came with the reply included)."""

    def __init__(self, host: str, port: int, factory: IProtocolFactory, done: Deferred[IProtocol]) -> None:
        self.host, self.port, self.done = host, port, done
        self.application_factory = factory  # not self.factory: Factory.buildProtocol sets that
        self.buffer = b""
        self.application: IProtocol | None = None
        self.step = "method"

    def _made(self) -> ITransport:
        """The proxy connection (every caller runs once it was made)."""
        transport = self.transport
        assert transport is not None
        return transport

    def connectionMade(self) -> None:
        self._made().write(b"\x05\x01\x00")  # version 5, one method: no authentication

    def dataReceived(self, data: bytes) -> None:
        if self.application is not None:
            self.application.dataReceived(data)
            return
        self.buffer += data
        if self.step == "method" and len(self.buffer) >= 2:
            if self.buffer[:2] != b"\x05\x00":
                return self._fail("the SOCKS proxy wants an authentication brokerd does not offer")
            self.buffer = self.buffer[2:]
            self.step = "reply"
            name = self.host.encode("idna")
            self._made().write(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + self.port.to_bytes(2, "big"))
        if self.step == "reply":
            self._reply()

    def _reply(self) -> None:
        if len(self.buffer) < 5:
            return
        if self.buffer[1] != 0:
            code = self.buffer[1]
            return self._fail(f"SOCKS5 reply {code:#04x}: {REPLIES.get(code, 'unknown')}")
        kind = self.buffer[3]
        length = 4 + (_ADDRESS_LENGTHS.get(kind) or 1 + self.buffer[4]) + 2
        if len(self.buffer) < length:
            return
        rest, self.buffer = self.buffer[length:], b""
        application = self.application_factory.buildProtocol(HostnameAddress(self.host.encode("idna"), self.port))
        self.application = application
        if application is None:
            self._made().loseConnection()
            return self.done.errback(ConnectError(string="the factory built no protocol"))
        application.makeConnection(self._made())
        self.done.callback(application)
        if rest:
            application.dataReceived(rest)

    def _fail(self, reason: str) -> None:
        self.step = "failed"
        self._made().loseConnection()
        if not self.done.called:
            self.done.errback(SOCKSError(string=f"{self.host}:{self.port}: {reason}"))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.application is not None:
            self.application.connectionLost(reason)
        elif not self.done.called:
            self.done.errback(ConnectError(string=f"the SOCKS proxy closed the connection to {self.host}:{self.port}"))


@implementer(IStreamClientEndpoint)
class SOCKS5ClientEndpoint:
    """``host:port`` through the SOCKS5 proxy ``proxy`` (a client endpoint)."""

    def __init__(self, proxy: IStreamClientEndpoint, host: str, port: int) -> None:
        self.proxy, self.host, self.port = proxy, host, port

    def connect(self, factory: IProtocolFactory) -> Deferred[IProtocol]:
        done: Deferred[IProtocol] = Deferred()
        handshake = Factory.forProtocol(lambda: _Handshake(self.host, self.port, factory, done))
        connecting = self.proxy.connect(handshake)
        connecting.addErrback(lambda failure: done.errback(failure) if not done.called else None)
        return done

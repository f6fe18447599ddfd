"""brokerd's SOCKS5 client endpoint (``tor:`` client endpoint strings), in memory: the bytes
that arrive with the proxy's reply reach the application (a server that speaks first, as
SMQP's greeting does), and a refusal is an error naming Tor's reason."""
from __future__ import annotations

import pytest
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import StringTransport

from brokerd.protocols.endpoints import client_from_string
from brokerd.protocols.socks import SOCKS5ClientEndpoint, SOCKSError

ONION = "a" * 56 + ".onion"


class Proxy:
    """A client endpoint whose connection is a StringTransport the test reads and feeds."""

    def __init__(self) -> None:
        self.transport = StringTransport()
        self.protocol: Protocol | None = None

    def connect(self, factory: Factory):
        from twisted.internet.defer import succeed

        self.protocol = factory.buildProtocol(None)
        self.protocol.makeConnection(self.transport)
        return succeed(self.protocol)


class Received(Protocol):
    def __init__(self) -> None:
        self.data = b""

    def dataReceived(self, data: bytes) -> None:
        self.data += data


def connected(proxy: Proxy):
    results: list = []
    SOCKS5ClientEndpoint(proxy, ONION, 7720).connect(Factory.forProtocol(Received)).addBoth(results.append)
    assert proxy.transport.value() == b"\x05\x01\x00"
    proxy.transport.clear()
    assert proxy.protocol is not None
    proxy.protocol.dataReceived(b"\x05\x00")
    name = ONION.encode()
    assert proxy.transport.value() == b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (7720).to_bytes(2, "big")
    return results


def test_bytes_that_come_with_the_reply_reach_the_application() -> None:
    proxy = Proxy()
    results = connected(proxy)
    assert proxy.protocol is not None
    proxy.protocol.dataReceived(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"200 SMQP server ready\r\n")
    application = results[0]
    assert isinstance(application, Received)
    assert application.data == b"200 SMQP server ready\r\n"
    proxy.protocol.dataReceived(b"more")
    assert application.data.endswith(b"more")
    application.transport.write(b"LOGIN")
    assert proxy.transport.value().endswith(b"LOGIN")


def test_a_reply_split_across_reads_still_connects() -> None:
    proxy = Proxy()
    results = connected(proxy)
    assert proxy.protocol is not None
    for byte in b"\x05\x00\x00\x03\x04host\x1e\x28":
        assert results == []
        proxy.protocol.dataReceived(bytes([byte]))
    assert isinstance(results[0], Received) and results[0].data == b""


def test_a_refusal_names_tors_reason() -> None:
    proxy = Proxy()
    results = connected(proxy)
    assert proxy.protocol is not None
    proxy.protocol.dataReceived(b"\x05\xf4\x00\x01\x00\x00\x00\x00\x00\x00")
    failure = results[0]
    assert failure.check(SOCKSError)
    assert "0xf4: onion service needs a client authorization key" in failure.getErrorMessage()
    assert proxy.transport.disconnecting


def test_tor_endpoint_strings() -> None:
    from twisted.internet import reactor

    endpoint = client_from_string(reactor, f"tor:{ONION}:7720:socksPort=19050")
    assert (endpoint.host, endpoint.port) == (ONION, 7720)
    assert endpoint.proxy._hostText == "127.0.0.1" and endpoint.proxy._port == 19050
    default = client_from_string(reactor, f"tor:host={ONION}:port=80")
    assert default.proxy._port == 9050
    for bad in ("tor:", f"tor:{ONION}", f"tor:{ONION}:http", f"tor:{ONION}:80:socks=1", f"tor:{ONION}:80:socksPort=x"):
        with pytest.raises(ValueError, match="tor:HOST:PORT"):
            client_from_string(reactor, bad)

"""The MCCHAT client: exact bytes on a StringTransport, what it does with what a server sends
(good and bad), and conversations with the real server through iosim."""
from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionClosed, ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.test import iosim

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.mcchat.client import (
    MCChatClientFactory,
    MCChatClientProtocol,
    MCChatError,
    client_endpoint,
)
from brokerd.protocols.mcchat.codec import encode_msg, encode_tl
from brokerd.protocols.mcchat.server import MCChatServerFactory


def outcome(d: Deferred) -> list[Any]:
    seen: list[Any] = []
    d.addBoth(seen.append)
    return seen


def connect() -> tuple[MCChatClientProtocol, StringTransport, list]:
    received: list = []
    protocol = MCChatClientFactory(lambda *m: received.append(m)).buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, received


def ready() -> tuple[MCChatClientProtocol, StringTransport, list]:
    protocol, transport, received = connect()
    protocol.dataReceived(b"\x00\x01")
    return protocol, transport, received


def test_ready_once_info_version_1_arrives() -> None:
    protocol, _transport, _received = connect()
    seen = outcome(protocol.when_ready())
    assert seen == []
    protocol.dataReceived(b"\x00")
    assert seen == []
    protocol.dataReceived(b"\x01")
    assert seen == [protocol] and protocol.version == 1
    assert outcome(protocol.when_ready()) == [protocol]


def test_a_server_of_another_version_is_refused() -> None:
    protocol, transport, _received = connect()
    seen = outcome(protocol.when_ready())
    protocol.dataReceived(b"\x00\x02")
    assert isinstance(seen[0].value, MCChatError)
    assert transport.disconnecting
    assert not protocol.is_open


def test_packets_are_written_as_the_spec_lays_them_out() -> None:
    protocol, transport, _received = ready()
    protocol.subscribe("caf\u00e9")
    protocol.unsubscribe(b"news")
    protocol.publish("news", "Zo\u00eb", "hi \u2713")
    protocol.topics()
    assert transport.value() == (
        b"\x01caf\xc3\xa9\x00\x02news\x00\x03news\x00Zo\xc3\xab\x00hi \xe2\x9c\x93\x00\x04"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.subscribe("a\x04b"),
        lambda p: p.subscribe("a\x00b"),
        lambda p: p.publish("t", "u", "x" * 65_537),
        lambda p: p.publish("t", "u" * 257, "m"),
    ],
)
def test_what_the_server_could_not_frame_is_refused_before_sending(call) -> None:
    protocol, transport, _received = ready()
    with pytest.raises(ValueError):
        call(protocol)
    assert transport.value() == b""


def test_messages_arrive_as_str_in_any_chunking() -> None:
    protocol, _transport, received = ready()
    data = encode_msg("caf\u00e9".encode(), b"bob", "\u65e5\u672c".encode()) + encode_msg(b"t", b"", b"")
    for i in range(len(data)):
        protocol.dataReceived(data[i : i + 1])
    assert received == [("caf\u00e9", "bob", "\u65e5\u672c"), ("t", "", "")]


def test_topics_fire_in_order_with_their_tl() -> None:
    protocol, _transport, _received = ready()
    first, second = outcome(protocol.topics()), outcome(protocol.sync())
    protocol.dataReceived(encode_tl([b"a", "caf\u00e9".encode()]))
    assert first == [["a", "caf\u00e9"]] and second == []
    protocol.dataReceived(b"\x05\x04")
    assert second == [None]
    protocol.dataReceived(b"\x05\x04")  # nobody asked: ignored
    assert protocol.is_open


def test_a_malformed_packet_is_skipped() -> None:
    protocol, transport, received = ready()
    protocol.dataReceived(b"\x03t\x00u\x00\xff\x00" + encode_msg(b"t", b"u", b"ok"))
    assert received == [("t", "u", "ok")]
    assert not transport.disconnecting


@pytest.mark.parametrize("data", [b"\x01news\x00", b"\x04", b"\x09"])
def test_a_server_that_breaks_the_protocol_is_dropped(data: bytes) -> None:
    protocol, transport, received = ready()
    pending = outcome(protocol.topics())
    protocol.dataReceived(data + encode_msg(b"t", b"u", b"after"))
    assert transport.disconnecting
    assert received == []
    protocol.connectionLost(Failure(ConnectionDone()))
    assert pending[0].check(ConnectionDone)


def test_a_lost_connection_fails_what_waits_and_refuses_more() -> None:
    protocol, _transport, _received = connect()
    waiting = outcome(protocol.when_ready())
    closed = outcome(protocol.when_closed())
    protocol.connectionLost(Failure(ConnectionDone()))
    assert waiting[0].check(ConnectionDone)
    assert isinstance(closed[0], ConnectionDone)
    assert outcome(protocol.topics())[0].check(ConnectionClosed)
    with pytest.raises(ConnectionClosed):
        protocol.publish("t", "u", "m")
    assert outcome(protocol.when_ready())[0].check(ConnectionDone)


def test_close_loses_the_connection() -> None:
    protocol, transport, _received = ready()
    done = outcome(protocol.close())
    assert transport.disconnecting and done == []
    protocol.connectionLost(Failure(ConnectionDone()))
    assert isinstance(done[0], ConnectionDone)


def test_client_endpoint_needs_a_hostname_for_tls() -> None:
    with pytest.raises(ValueError):
        client_endpoint(Clock(), "tcp:127.0.0.1:1502", tls=True)
    with pytest.raises(ValueError):
        client_endpoint(Clock(), "nonsense:1")
    assert client_endpoint(Clock(), "tcp:127.0.0.1:1502") is not None


# ---------------------------------------------------------------------------- with the server


def conversation(broker: Broker, received: list) -> tuple[MCChatClientProtocol, Any, Any]:
    server_factory = MCChatServerFactory(broker, Settings(), Clock())
    client, server, pump = iosim.connectedServerAndClient(
        lambda: server_factory.buildProtocol(None),
        lambda: MCChatClientFactory(lambda *m: received.append(m)).buildProtocol(None),
    )
    pump.flush()
    return client, server, pump


def test_a_conversation_with_the_server() -> None:
    broker = Broker()
    got_a: list = []
    got_b: list = []
    a, _server_a, pump_a = conversation(broker, got_a)
    b, _server_b, pump_b = conversation(broker, got_b)
    assert a.version == 1 and b.version == 1
    a.subscribe("room")
    synced = outcome(a.sync())
    pump_a.flush()
    assert synced == [None]
    b.publish("room", "bob", "hello")
    b.publish("room", "bob", "again")
    pump_b.flush()
    pump_a.flush()
    assert got_a == [("room", "bob", "hello"), ("room", "bob", "again")]
    topics = outcome(b.topics())
    pump_b.flush()
    assert topics == [["room"]]
    a.unsubscribe("room")
    after = outcome(b.topics())
    pump_a.flush()
    pump_b.flush()
    assert after == [[]]

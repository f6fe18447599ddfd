"""The MCCHAT server on StringTransport: every packet, every bad input, the idle rule, flow
control, discovery through the topic "", username binding, and delivery to and from SSMP
sessions on the same Broker.  Input is fed one byte at a time unless a test is about reads."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from zope.interface import implementer

from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.message import BROADCAST, MULTICAST, Message
from brokerd.core.principal import NOBODY
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.mcchat import server as mcchat_server
from brokerd.protocols.mcchat.codec import encode_msg, encode_sub, encode_tl, encode_unsub
from brokerd.protocols.mcchat.server import (
    MCChatServerFactory,
    MCChatServerProtocol,
    transport_id,
)
from brokerd.protocols.mcchat.plugin import front_end as mcchat
from brokerd.protocols.ssmp.server import SSMPServerFactory
from tests.protocols.recording import RecordingEvents
from tests.support.services import services_for
from tests.support.examples import examples

TLRQ = b"\x04"


class Conn:
    """One client connection to the server under test."""

    def __init__(self, protocol: MCChatServerProtocol, transport: StringTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, data: bytes, bytewise: bool = True) -> None:
        if bytewise:
            for i in range(len(data)):
                self.protocol.dataReceived(data[i : i + 1])
        else:
            self.protocol.dataReceived(data)

    def take(self) -> bytes:
        value = self.transport.value()
        self.transport.clear()
        return value

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting

    def lose(self) -> None:
        self.protocol.connectionLost(None)


class Server:
    def __init__(self, broker: Broker | None = None, settings: Settings | None = None, events: Any = None,
                 **fields: Any) -> None:
        """``fields``: Settings fields without their ``mcchat_`` prefix (``idle_timeout=40.0``)."""
        self.clock = Clock()
        self.broker = broker or Broker()
        self.settings = settings or Settings(**{f"mcchat_{name}": value for name, value in fields.items()})
        options = {} if events is None else {"events": events}
        self.factory = MCChatServerFactory(self.broker, self.settings, self.clock, **options)
        self.factory.startFactory()
        self._port = 40000

    def connect(self, address: Any = None, info: bool = True) -> Conn:
        if address is None:
            self._port += 1
            address = IPv4Address("TCP", "127.0.0.1", self._port)
        protocol = self.factory.buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        conn = Conn(protocol, transport)
        if info:
            assert conn.take() == b"\x00\x01"
        return conn


@implementer(IWireFormat)
class RecordingWire(WireFormat):
    protocol = "other"

    def render_message(self, message: Message) -> bytes:
        return b"M"

    def render_presence(self, topic: bytes, member: Any, joined: bool, presence: bool) -> bytes:
        return b"+" if joined else b"-"


@implementer(ISubscriber)
class Foreign:
    """A session of another protocol that records what the core sends it."""

    protocol = "other"
    address = None
    principal = NOBODY

    def __init__(self, name: bytes = b"x") -> None:
        self.name = name
        self.wire_format = RecordingWire()
        self.received: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.received.append(data)

    def replaced(self) -> None:
        raise AssertionError("not expected")


@pytest.fixture
def server() -> Server:
    return Server()


# ---------------------------------------------------------------------------- connection


def test_info_version_1_is_the_first_thing_sent(server: Server) -> None:
    conn = server.connect(info=False)
    assert conn.transport.value() == b"\x00\x01"
    assert not conn.closed


def test_sessions_are_named_by_the_transport(server: Server) -> None:
    conn = server.connect(IPv4Address("TCP", "10.1.2.3", 5555))
    assert conn.protocol.name == b"10.1.2.3:5555"
    assert conn.protocol.address is None
    assert conn.protocol in server.broker.sessions()
    assert transport_id(IPv6Address("TCP", "::1", 80)) == b"[::1]:80"
    first, second = transport_id(UNIXAddress(None)), transport_id(UNIXAddress(None))
    assert first.startswith(b"unix#") and first != second


def test_connections_over_the_limit_are_closed_without_info() -> None:
    server = Server(broker=Broker(max_connections=1))
    server.connect()
    refused = server.connect(info=False)
    assert refused.transport.value() == b""
    assert refused.closed
    assert server.broker.stats.refused_connections == 1
    refused.lose()
    assert server.broker.stats.connections == 1


def test_the_plugin_builds_over_the_services(server: Server, tmp_path) -> None:
    services = services_for(Settings(data_dir=tmp_path), Clock())
    factory = mcchat.build(services)
    assert factory.broker is services.broker and factory.clock is services.reactor
    assert factory.idle_timeout == 300.0 and factory.bind_username is False
    assert factory.events is NULL_EVENT_LOG
    events = RecordingEvents()
    assert mcchat.build(services_for(Settings(data_dir=tmp_path), Clock(), events=events)).events is events


# ---------------------------------------------------------------------------- SUB, MSG, UNSUB


def test_sub_is_not_answered_and_subscribes(server: Server) -> None:
    a = server.connect()
    a.send(encode_sub(b"news"))
    assert a.take() == b""
    assert server.broker.subscriptions(a.protocol) == [b"news"]


def test_msg_reaches_every_subscriber_verbatim_and_a_subscribed_sender(server: Server) -> None:
    a, b, c = server.connect(), server.connect(), server.connect()
    a.send(encode_sub(b"news"))
    b.send(encode_sub(b"news"))
    packet = encode_msg("caf\u00e9".encode(), "Zo\u00eb".encode(), "h\u00e9llo \u2713".encode())
    a.send(encode_sub("caf\u00e9".encode()))
    c.send(packet)
    assert (a.take(), b.take(), c.take()) == (packet, b"", b"")
    news = encode_msg(b"news", b"bob", b"hi")
    b.send(news)
    assert a.take() == news
    assert b.take() == news  # the sender is subscribed: it gets a copy (spec section 4)
    assert c.take() == b""


def test_unsub_stops_delivery_and_is_not_answered(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"news") + encode_sub(b"sport"))
    a.send(encode_unsub(b"news"))
    assert a.take() == b""
    b.send(encode_msg(b"news", b"b", b"gone") + encode_msg(b"sport", b"b", b"kept"))
    assert a.take() == encode_msg(b"sport", b"b", b"kept")


def test_unsub_of_a_topic_not_subscribed_and_sub_twice_change_nothing(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_unsub(b"never"))
    a.send(encode_sub(b"news") + encode_sub(b"news"))
    assert a.protocol.subscribed == 1
    b.send(encode_msg(b"news", b"b", b"once"))
    assert a.take() == encode_msg(b"news", b"b", b"once")
    assert not a.closed


def test_subscriptions_over_the_limit_are_ignored_and_counted() -> None:
    server = Server(broker=Broker(max_subscriptions=2))
    a = server.connect()
    a.send(encode_sub(b"1") + encode_sub(b"2") + encode_sub(b"3"))
    assert server.broker.subscriptions(a.protocol) == [b"1", b"2"]
    assert server.factory.stats.subscription_limit == 1
    assert not a.closed


def test_disconnect_unsubscribes_from_everything(server: Server) -> None:
    a = server.connect()
    watcher = Foreign()
    server.broker.attach(watcher)
    server.broker.subscribe(watcher, b"news", presence=True)
    a.send(encode_sub(b"news") + encode_sub(b"solo"))
    assert watcher.received == [b"+"]
    a.lose()
    assert watcher.received == [b"+", b"-"]
    assert server.broker.active_topics() == [b"news"]
    assert server.broker.stats.connections == 0
    assert a.protocol not in server.broker.sessions()


# ---------------------------------------------------------------------------- TLRQ / TL


def test_tlrq_lists_the_active_topics_of_every_protocol(server: Server) -> None:
    a = server.connect()
    a.send(TLRQ)
    assert a.take() == b"\x05\x04"
    other = Foreign()
    server.broker.attach(other)
    for topic in (b"ssmp-topic", b"bad\x04", b"\xff\xfe", b"x" * 300):
        server.broker.subscribe(other, topic)
    a.send(encode_sub(b"news") + encode_sub(b""))
    a.take()
    a.send(TLRQ)
    assert a.take() == encode_tl([b"ssmp-topic", b"news"])


def test_msg_then_tlrq_then_msg_arrive_in_that_order(server: Server) -> None:
    a = server.connect()
    a.send(encode_sub(b"t"))
    one, two = encode_msg(b"t", b"u", b"1"), encode_msg(b"t", b"u", b"2")
    a.send(one + TLRQ + two, bytewise=False)
    assert a.take() == one + encode_tl([b"t"]) + two


def test_many_tlrqs_in_one_read_are_all_answered(server: Server) -> None:
    a = server.connect()
    a.send(encode_sub(b"t"))
    a.send(TLRQ * 5, bytewise=False)
    assert a.take() == encode_tl([b"t"]) * 5


# ---------------------------------------------------------------------------- coalescing


def test_a_run_of_msgs_to_one_topic_is_one_write_per_subscriber(server: Server) -> None:
    a, b, c = server.connect(), server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    b.send(encode_sub(b"t") + encode_sub(b"u"))
    writes: list[bytes] = []
    a.protocol.send = writes.append  # type: ignore[method-assign]
    run = b"".join(encode_msg(b"t", b"c", str(i).encode()) for i in range(10))
    other = encode_msg(b"u", b"c", b"x")
    c.send(run + other + run, bytewise=False)
    assert writes == [run, run]
    assert b.take() == run + other + run
    assert server.broker.stats.published == 21


def recorded_writes(conn: Conn) -> list[bytes]:
    """Every transport.write of ``conn`` from now on, one entry per call."""
    writes: list[bytes] = []
    write = conn.transport.write

    def recording(data: bytes) -> None:
        writes.append(data)
        write(data)

    conn.transport.write = recording  # type: ignore[method-assign]
    return writes


def test_what_one_read_makes_for_its_sender_leaves_in_one_write(server: Server) -> None:
    a = server.connect()
    a.send(encode_sub(b"t"))
    writes = recorded_writes(a)
    one, two = encode_msg(b"t", b"u", b"1"), encode_msg(b"t", b"u", b"2")
    a.send(one + TLRQ + two, bytewise=False)
    # the topic list is written as it is made (under the output limit), with what came
    # before it in the read; what comes after it is the read's next and last write
    assert writes == [one + encode_tl([b"t"]), two]
    writes.clear()
    a.send(one + two, bytewise=False)
    assert writes == [one + two]
    a.send(TLRQ, bytewise=False)  # and afterwards, writes go out as before
    assert writes[1:] == [encode_tl([b"t"])]


def test_what_one_read_holds_is_bounded_by_the_output_limit() -> None:
    server = Server(settings=Settings(max_output_buffer=1000))
    a = server.connect()
    a.send(encode_sub(b"t"))
    writes = recorded_writes(a)
    answer = encode_tl([b"t"])
    a.send(TLRQ * 1000, bytewise=False)
    assert b"".join(writes) == answer * 1000
    assert len(writes) > 1 and max(len(w) for w in writes) <= 1000 + len(answer)


# ---------------------------------------------------------------------------- bad input


def test_unknown_opcode_closes_after_handling_what_came_before(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    b.send(encode_msg(b"t", b"b", b"before") + b"\x07" + encode_msg(b"t", b"b", b"after"))
    assert a.take() == encode_msg(b"t", b"b", b"before")
    assert b.closed
    assert b.take() == b""
    assert server.factory.stats.protocol_errors == 1
    assert b.protocol not in server.broker.sessions()


def test_a_senders_own_copies_before_a_bad_packet_are_written_before_the_close(server: Server) -> None:
    a = server.connect()
    a.send(encode_sub(b"t"))
    a.send(encode_msg(b"t", b"a", b"before") + b"\x07", bytewise=False)
    assert a.closed
    assert a.take() == encode_msg(b"t", b"a", b"before")


@pytest.mark.parametrize(
    "data",
    [
        b"\x01" + b"t" * 257,
        b"\x02" + b"t" * 257,
        b"\x03t\x00" + b"u" * 257,
        b"\x03t\x00u\x00" + b"m" * 65_537,
        b"\x05" + b"t" * 257,
    ],
)
def test_a_string_over_its_limit_closes_the_connection(server: Server, data: bytes) -> None:
    a = server.connect()
    a.send(data, bytewise=len(data) < 1000)
    assert a.closed
    assert a.take() == b""
    assert server.factory.stats.protocol_errors == 1


def test_a_topic_with_0x04_is_dropped_and_counted(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    a.send(b"\x01bad\x04topic\x00")
    b.send(b"\x03t\x04\x00b\x00x\x00" + encode_msg(b"t", b"b", b"fine"))
    assert server.broker.subscriptions(a.protocol) == [b"t"]
    assert a.take() == encode_msg(b"t", b"b", b"fine")
    assert server.factory.stats.eot_in_topic == 2
    assert not a.closed and not b.closed


def test_invalid_utf8_is_dropped_and_counted(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    a.send(b"\x01\xff\x00")
    b.send(b"\x03t\x00\xc3\x00x\x00" + b"\x03t\x00b\x00caf\xe9\x00" + encode_msg(b"t", b"b", b"ok"))
    assert a.take() == encode_msg(b"t", b"b", b"ok")
    assert server.factory.stats.not_utf8 == 3
    assert server.broker.subscriptions(a.protocol) == [b"t"]
    assert not a.closed and not b.closed


def test_info_and_tl_from_a_client_are_ignored_and_counted(server: Server) -> None:
    a = server.connect()
    a.send(b"\x00\x01" + encode_tl([b"a"]) + TLRQ)
    assert a.take() == b"\x05\x04"
    assert server.factory.stats.client_only_packets == 2


def test_msg_to_the_discovery_topic_is_dropped_and_counted(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b""))
    b.send(encode_msg(b"", b"mallory", b"fake-topic") + encode_msg(b"", b"m", b"again"))
    assert a.take() == b""
    assert server.factory.stats.reserved_topic == 2


# ---------------------------------------------------------------------------- silence and floods


def test_a_client_that_sends_nothing_is_closed_after_the_idle_timeout() -> None:
    server = Server(idle_timeout=40.0)
    silent = server.connect()
    server.clock.advance(39.0)
    assert not silent.closed
    for _ in range(3):
        server.clock.advance(10.0)
    assert silent.closed
    assert server.factory.stats.idle_closed == 1


def test_subscribers_and_active_clients_are_not_idle() -> None:
    server = Server(idle_timeout=40.0)
    listener, talker = server.connect(), server.connect()
    listener.send(encode_sub(b"t"))
    for _ in range(20):
        server.clock.advance(10.0)
        talker.send(encode_msg(b"t", b"u", b"ping"))
    assert not listener.closed and not talker.closed
    listener.send(encode_unsub(b"t"))
    for _ in range(6):
        server.clock.advance(10.0)
        talker.send(encode_msg(b"t", b"u", b"ping"))
    assert listener.closed and not talker.closed


def test_an_idle_connection_closed_or_lost_leaves_the_sweep_and_no_timer() -> None:
    server = Server(idle_timeout=40.0)
    assert len(server.clock.getDelayedCalls()) == 1  # the idle sweep
    silent, lost, kept = server.connect(), server.connect(), server.connect()
    kept.send(encode_sub(b"t"))
    lost.lose()
    for _ in range(5):
        server.clock.advance(10.0)
    assert silent.closed and not kept.closed
    assert list(server.factory.live) == [kept.protocol]  # the closed one left at once
    silent.lose()
    assert server.broker.stats.connections == 1
    assert len(server.clock.getDelayedCalls()) == 1
    server.factory.stopFactory()
    assert server.clock.getDelayedCalls() == []


def test_a_connection_over_the_limit_is_closed_before_info_and_counts_nothing() -> None:
    server = Server(broker=Broker(max_connections=1))
    admitted = server.connect()
    refused = server.connect(info=False)
    assert refused.take() == b"" and refused.closed
    assert list(server.factory.live) == [admitted.protocol]
    refused.lose()
    assert server.broker.stats.connections == 1


def test_stop_factory_stops_the_sweep() -> None:
    server = Server(idle_timeout=40.0)
    server.factory.stopFactory()
    silent = server.connect()
    server.clock.advance(1000.0)
    assert not silent.closed


def test_a_congested_reader_loses_messages_and_is_not_read(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    a.protocol.pauseProducing()
    assert a.transport.producerState == "paused"
    b.send(encode_msg(b"t", b"b", b"lost"))
    a.send(TLRQ, bytewise=False)
    assert a.take() == b""
    assert a.protocol.dropped == 1
    assert server.broker.stats.slow_consumer_drops == 1
    a.protocol.resumeProducing()
    assert a.transport.producerState == "producing"
    b.send(encode_msg(b"t", b"b", b"kept"))
    # the TL answer is never dropped: it is written once the reader caught up
    assert a.take() == encode_tl([b"t"]) + encode_msg(b"t", b"b", b"kept")


# ---------------------------------------------------------------------------- the event log


def test_a_congestion_episode_is_one_event_when_it_ends() -> None:
    events = RecordingEvents()
    server = Server(events=events)
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    a.protocol.pauseProducing()
    b.send(encode_msg(b"t", b"b", b"lost") * 3, bytewise=False)
    a.send(TLRQ, bytewise=False)
    assert events.records == []  # nothing per message
    a.protocol.resumeProducing()
    # counted in writes, like broker.stats: the run of three MSGs was one write (the TL
    # answer is not dropped, it waits for the reader)
    assert server.broker.stats.slow_consumer_drops == 1
    expected = {"protocol": "mcchat", "kind": "dropped", "session": a.protocol.name.decode(),
                "reason": "slow_consumer", "dropped": 1, "outcome": "dropped"}
    assert events.records == [expected]
    a.protocol.pauseProducing()
    b.send(encode_msg(b"t", b"b", b"lost at the end"))
    a.lose()  # the episode ends with the connection
    assert events.records == [expected, dict(expected, dropped=1)]
    b.lose()
    assert len(events.records) == 2


def test_rejected_msgs_are_one_event_when_the_connection_ends() -> None:
    events = RecordingEvents()
    server = Server(events=events)
    a = server.connect()
    a.send(encode_msg(b"", b"m", b"to the discovery topic") + b"\x03t\x04\x00b\x00x\x00" + b"\x03t\x00\xc3\x00x\x00")
    a.send(b"\x01\xff\x00" + b"\x00\x01" + encode_sub(b"t"))  # a bad SUB, an INFO: not messages
    a.send(encode_msg(b"t", b"a", b"fine"))
    assert events.records == []
    a.lose()
    assert events.records == [
        {"protocol": "mcchat", "kind": "dropped", "session": a.protocol.name.decode(), "reason": "rejected",
         "dropped": 3, "outcome": "dropped"}
    ]
    quiet = server.connect()
    quiet.send(encode_msg(b"t", b"q", b"fine"))
    quiet.lose()
    assert len(events.records) == 1


def test_input_that_cannot_be_framed_closes_with_an_event() -> None:
    events = RecordingEvents()
    server = Server(events=events)
    a = server.connect()
    a.send(encode_msg(b"", b"m", b"x") + b"\x07")
    assert a.closed
    assert events.records == [
        {"protocol": "mcchat", "kind": "dropped", "session": a.protocol.name.decode(), "reason": "rejected",
         "dropped": 2, "outcome": "closed"}
    ]
    a.lose()
    assert len(events.records) == 1


def test_flow_control_starts_with_the_first_read(server: Server) -> None:
    a = server.connect()
    assert a.transport.bufferSize == Settings().max_output_buffer  # type: ignore[attr-defined]
    assert a.transport.producer is None  # TLS would pause it before the handshake
    a.send(TLRQ)
    assert a.transport.producer is a.protocol and a.transport.streaming


def test_a_flood_of_msgs_in_one_read_is_handled_in_order(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    flood = b"".join(encode_msg(b"t", b"f", str(i).encode()) for i in range(5000))
    b.send(flood, bytewise=False)
    assert a.take() == flood
    assert server.broker.stats.delivered == 5000


# ---------------------------------------------------------------------------- discovery


def test_subscribing_to_the_discovery_topic_lists_the_active_topics(server: Server) -> None:
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"news") + encode_sub("caf\u00e9".encode()))
    other = Foreign()
    server.broker.attach(other)
    server.broker.subscribe(other, b"\xff")  # not UTF-8: MCCHAT cannot name it
    b.send(encode_sub(b""))
    assert b.take() == encode_msg(b"", b"", b"news") + encode_msg(b"", b"", "caf\u00e9".encode())


def test_topics_that_become_active_are_announced_once(server: Server) -> None:
    watcher, a, b = server.connect(), server.connect(), server.connect()
    watcher.send(encode_sub(b""))
    a.send(encode_sub(b"fresh"))
    assert watcher.take() == encode_msg(b"", b"", b"fresh")
    b.send(encode_sub(b"fresh"))
    assert watcher.take() == b""
    a.lose()
    b.lose()
    a2 = server.connect()
    a2.send(encode_sub(b"fresh"))
    assert watcher.take() == encode_msg(b"", b"", b"fresh")
    assert server.factory.stats.announcements == 2


def test_activations_by_any_protocol_are_announced() -> None:
    server = Server(broker=Broker())
    watcher, a = server.connect(), server.connect()
    watcher.send(encode_sub(b""))
    other = Foreign()
    server.broker.attach(other)
    server.broker.subscribe(other, b"from-ssmp")
    a.send(encode_sub(b"from-mcchat"))
    server.broker.unsubscribe(other, b"from-ssmp")
    assert watcher.take() == encode_msg(b"", b"", b"from-ssmp") + encode_msg(b"", b"", b"from-mcchat")
    assert server.factory.stats.announcements == 2


def test_one_discovery_per_broker(server: Server) -> None:
    second = MCChatServerFactory(server.broker, Settings(), server.clock)
    assert second.discovery is server.factory.discovery


# ---------------------------------------------------------------------------- username binding


def test_bound_usernames_replace_what_the_client_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcchat_server, "peer_names", lambda transport: ("alice", "alice.example"))
    server = Server(bind_username=True)
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    b.send(encode_msg(b"t", b"root", b"hi"))
    assert a.take() == encode_msg(b"t", b"alice", b"hi")


def test_without_a_verified_certificate_usernames_pass_as_sent() -> None:
    server = Server(bind_username=True)
    a, b = server.connect(), server.connect()
    a.send(encode_sub(b"t"))
    b.send(encode_msg(b"t", b"root", b"hi"))
    assert a.take() == encode_msg(b"t", b"root", b"hi")


def test_binding_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcchat_server, "peer_names", lambda transport: ("alice",))
    server = Server()
    a = server.connect()
    a.send(encode_sub(b"t") + encode_msg(b"t", b"root", b"hi"))
    assert a.take() == encode_msg(b"t", b"root", b"hi")


def test_the_settings_field_turns_binding_on(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    settings.mcchat_bind_username = True  # type: ignore[attr-defined]
    settings.mcchat_idle_timeout = 12.0  # type: ignore[attr-defined]
    server = Server(settings=settings)
    assert server.factory.bind_username is True
    assert server.factory.idle_timeout == 12.0


# ---------------------------------------------------------------------------- with SSMP


def ssmp_session(broker: Broker, clock: Clock, identifier: bytes) -> tuple[Any, StringTransport]:
    factory = SSMPServerFactory(broker, build_portal(open_login=True), Settings(), clock)
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9))
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b"LOGIN " + identifier + b" open\n")
    assert transport.value() == b"200\n"
    transport.clear()
    return protocol, transport


def test_mcchat_and_ssmp_deliver_to_each_other(server: Server) -> None:
    ssmp, ssmp_out = ssmp_session(server.broker, server.clock, b"alice")
    mc = server.connect(IPv4Address("TCP", "127.0.0.1", 5000))
    mc.send(encode_sub(b"room"))
    ssmp.dataReceived(b"SUBSCRIBE room PRESENCE\n")
    assert ssmp_out.value() == b"000 mcchat:127.0.0.1:5000 SUBSCRIBE room\n200\n"
    ssmp_out.clear()
    mc.send(encode_msg(b"room", b"Zoe", b"hello ssmp"))
    assert ssmp_out.value() == b"000 mcchat:127.0.0.1:5000 MCAST room hello ssmp\n"
    assert mc.take() == encode_msg(b"room", b"Zoe", b"hello ssmp")
    ssmp_out.clear()
    ssmp.dataReceived(b"MCAST room hello mcchat\n")
    assert mc.take() == encode_msg(b"room", b"ssmp:alice", b"hello mcchat")
    ssmp.dataReceived(b"MCAST room \x00\x02a\x00b\n")
    assert mc.take() == b""
    mc.lose()
    assert ssmp_out.value() == b"200\n200\n000 mcchat:127.0.0.1:5000 UNSUBSCRIBE room\n"


def test_broadcasts_from_other_protocols_cannot_reach_mcchat(server: Server) -> None:
    mc = server.connect()
    mc.send(encode_sub(b"room"))
    other = Foreign()
    server.broker.attach(other)
    server.broker.subscribe(other, b"room")
    assert server.broker.broadcast(Message(BROADCAST, None, b"x", "other", b"o"), other) == 0
    assert mc.take() == b""
    assert server.broker.stats.unrenderable == 1
    assert server.broker.publish(Message(MULTICAST, b"room", b"y", "other", b"o")) == 2
    assert mc.take() == encode_msg(b"room", b"other:o", b"y")


# ---------------------------------------------------------------------------- any input


@given(
    st.lists(
        st.one_of(
            st.sampled_from([b"\x01t\x00", b"\x02t\x00", b"\x03t\x00u\x00m\x00", b"\x04", b"\x01\x00",
                             b"\x03\x00u\x00m\x00", b"\x00\x01", b"\x05t\x00\x04", b"\x01\xff\x00", b"\x01a\x04\x00"]),
            st.binary(max_size=6),
        ),
        max_size=30,
    ).map(b"".join),
    st.lists(st.integers(0, 1000), max_size=10),
)
@settings(max_examples=examples(200), deadline=None)
def test_any_input_in_any_chunking_has_the_same_effect(data: bytes, cuts: list[int]) -> None:
    """Never an exception; what an observer of topic t receives, what the client itself gets,
    whether it is closed and what the event log gets when it ends do not depend on how the
    bytes were cut."""
    outcomes = []
    for pieces in ([data], _chunks(data, cuts)):
        events = RecordingEvents()
        server = Server(events=events)
        observer, client = server.connect(), server.connect()
        observer.send(encode_sub(b"t"))
        for piece in pieces:
            if not client.closed:
                client.send(piece, bytewise=False)
        closed = client.closed
        client.lose()
        outcomes.append((observer.take(), client.take(), closed, server.factory.stats.as_dict(), events.records))
    assert outcomes[0] == outcomes[1]


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts}) + [len(data)]
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    return pieces

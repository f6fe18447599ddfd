"""Bad input to the MQTT front end of a real ``twistd brokerd``, over raw sockets: malformed
framing, packets over ``--mqtt-max-packet-size``, a first packet that is not CONNECT, an
unsupported protocol level, a second CONNECT, PUBLISH to a wildcard topic and other protocol
violations (a v5 client gets DISCONNECT with the reason code, then the close; a 3.1.1 one just
the close), connections that never send CONNECT (``--mqtt-connect-timeout``, and many of them
against ``--max-unauthenticated``), keep-alive.  After each, a normal client (paho) still
works, and the broker's log never has a traceback.

The packets are written out by hand here (:func:`connect_packet` and friends), not with the
codec under test.  :class:`RawMQTT` is shared with test_mqtt_access.
"""
from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.test_mqtt_paho import (
    BOUND,
    MQTT_LISTENER,
    MQTTClient,
    assert_clean_log,
)
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

MAX_PACKET_SIZE = 2048
CONNECT_TIMEOUT = 2
MAX_UNAUTHENTICATED = 20
OPTIONS = ("--mqtt-max-packet-size", str(MAX_PACKET_SIZE), "--mqtt-connect-timeout", str(CONNECT_TIMEOUT),
           "--max-unauthenticated", str(MAX_UNAUTHENTICATED))
V311, V5 = 4, 5


# ---------------------------------------------------------------------- packets, by hand


def varint(value: int) -> bytes:
    """A Variable Byte Integer (1.5.5)."""
    out = bytearray()
    while True:
        value, byte = divmod(value, 128)
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def string(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return len(data).to_bytes(2, "big") + data


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def connect_packet(version: int = V5, client_id: str = "", *, username: str | None = None,
                   password: bytes | None = None, keepalive: int = 60, clean: bool = True,
                   name: bytes = b"MQTT", session_expiry: int | None = None) -> bytes:
    flags = (0x02 if clean else 0) | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = string(name) + bytes((version, flags)) + keepalive.to_bytes(2, "big")
    if version == V5:
        properties = b"" if session_expiry is None else b"\x11" + session_expiry.to_bytes(4, "big")
        body += varint(len(properties)) + properties
    body += string(client_id)
    if username is not None:
        body += string(username)
    if password is not None:
        body += string(password)
    return packet(0x10, body)


def publish_packet(version: int, topic: str, payload: bytes, qos: int = 0, packet_id: int = 1,
                   properties: bytes = b"") -> bytes:
    body = string(topic) + (packet_id.to_bytes(2, "big") if qos else b"")
    if version == V5:
        body += varint(len(properties)) + properties
    return packet(0x30 | (qos << 1), body + payload)


def subscribe_packet(version: int, topic_filter: str, qos: int = 0, packet_id: int = 1) -> bytes:
    body = packet_id.to_bytes(2, "big") + (b"\x00" if version == V5 else b"")
    return packet(0x82, body + string(topic_filter) + bytes((qos,)))


class RawMQTT:
    """A client socket that reads whole MQTT packets, each read bounded by :data:`BOUND`."""

    def __init__(self, broker: RunningBroker, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.ports["mqtt"]), BOUND, (source, 0))
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, size: int) -> bool:
        while len(self.buffer) < size:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return False
            self.buffer += data
        return True

    def read(self) -> tuple[int, bytes] | None:
        """The next packet (first byte, body), or None when the broker closed the connection."""
        if not self._fill(2):
            assert not self.buffer, f"closed inside a fixed header: {self.buffer!r}"
            return None
        size, shift, index = 0, 0, 1
        while True:
            assert self._fill(index + 1), f"closed inside a fixed header: {self.buffer!r}"
            byte = self.buffer[index]
            size |= (byte & 0x7F) << shift
            index += 1
            if byte < 0x80:
                break
            shift += 7
        assert self._fill(index + size), f"closed inside a packet: {self.buffer!r}"
        first, body = self.buffer[0], self.buffer[index:index + size]
        self.buffer = self.buffer[index + size:]
        return first, body

    def closed(self) -> None:
        """The broker closes the connection next (without sending anything more)."""
        assert self.read() is None

    def connack(self, version: int = V5, client_id: str = "", **options) -> tuple[int, int]:
        """CONNECT; (Session Present, reason or return code) of the CONNACK."""
        self.send(connect_packet(version, client_id, **options))
        got = self.read()
        assert got is not None and got[0] == 0x20, got
        return got[1][0], got[1][1]

    def connect(self, version: int = V5, client_id: str = "", **options) -> None:
        assert self.connack(version, client_id, **options)[1] == 0

    def disconnect_reason(self) -> int:
        """The reason code of the broker's DISCONNECT, which must come next, then the close."""
        got = self.read()
        assert got is not None and got[0] == 0xE0, got
        self.closed()
        return got[1][0] if got[1] else 0

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------- the broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-bad-input"), *OPTIONS, listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


@pytest.fixture
def raw(broker: RunningBroker) -> Iterator:
    """``raw()``: RawMQTT connections, closed after the test; which must leave the broker
    serving a normal client and with a log free of tracebacks."""
    made: list[RawMQTT] = []

    def make(source: str = "127.0.0.1") -> RawMQTT:
        client = RawMQTT(broker, source)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
    normal_client_works(broker)


def normal_client_works(broker: RunningBroker) -> None:
    sub = MQTTClient(broker.ports["mqtt"], MQTTv5)
    pub = MQTTClient(broker.ports["mqtt"], MQTTv5)
    try:
        assert sub.subscribe("normal/client", 1) == 1
        assert pub.publish("normal/client", b"still served", 1) == 0
        assert sub.message().payload == b"still served"
    finally:
        sub.disconnect()
        pub.disconnect()
    assert_clean_log(broker)


# ---------------------------------------------------------------------- before CONNECT


@pytest.mark.parametrize("data", [
    pytest.param(b"\x10\xff\xff\xff\xff\x01", id="five-byte-remaining-length"),
    pytest.param(b"\x10\xff\xff\xff\xff", id="four-continuation-bytes"),
    pytest.param(b"\xc0\x00", id="pingreq-first"),
    pytest.param(publish_packet(V311, "a/b", b"x"), id="publish-first"),
    pytest.param(packet(0x82, b"\x00\x01" + string("a/b") + b"\x00"), id="subscribe-first"),
    pytest.param(b"\x00\x00", id="reserved-packet-type"),
    pytest.param(packet(0x12, connect_packet()[2:]), id="connect-with-flag-bits"),
    pytest.param(connect_packet(V5, "x" * (MAX_PACKET_SIZE + 10)), id="connect-over-max-packet-size"),
])
def test_bad_first_packet_closes_without_an_answer(raw, data: bytes) -> None:
    client = raw()
    client.send(data)
    client.closed()


@pytest.mark.parametrize(("name", "level"), [(b"MQTT", 6), (b"MQTT", 3), (b"MQIsdp", 3), (b"MQTT", 0)])
def test_unsupported_protocol_level_gets_return_code_1_in_the_311_form(raw, name: bytes, level: int) -> None:
    client = raw()
    client.send(connect_packet(level, "old", name=name))
    assert client.read() == (0x20, b"\x00\x01")
    client.closed()


def will_connect(version: int, topic: str, will_flags: int = 0x04) -> bytes:
    body = string(b"MQTT") + bytes((version, 0x02 | will_flags)) + (60).to_bytes(2, "big")
    if version == V5:
        body += b"\x00" + string("willing") + b"\x00"
    else:
        body += string("willing")
    return packet(0x10, body + string(topic) + string(b"last words"))


def with_flags(connect: bytes, flags: int) -> bytes:
    """``connect`` (a short one, from connect_packet) with its Connect Flags byte replaced."""
    return connect[:9] + bytes((flags,)) + connect[10:]


@pytest.mark.parametrize(("data", "reason"), [
    pytest.param(with_flags(connect_packet(V5, "r"), 0x03), 0x81, id="reserved-flag"),
    pytest.param(will_connect(V5, "will/x", 0x04 | 0x18), 0x81, id="will-qos-3"),
    pytest.param(will_connect(V5, "will/x", 0x20), 0x81, id="will-retain-without-will"),
    pytest.param(will_connect(V5, "will/+"), 0x90, id="will-topic-wildcard"),
    pytest.param(connect_packet(V5, "c" * 300), 0x85, id="client-id-too-long"),
    pytest.param(packet(0x10, string(b"MQTT") + b"\x05\x02\x00\x3c\x00" + b"\x00\x02\xc3\x28"), 0x81,
                 id="client-id-not-utf8"),
    pytest.param(packet(0x10, string(b"MQTT") + b"\x05\x02\x00\x3c" + b"\x08\x15" + string("SCRAM") + string("a")),
                 0x8C, id="authentication-method"),
    pytest.param(packet(0x10, string(b"MQTT") + b"\x05\x02\x00\x3c" + b"\x03\x21\x00\x00" + string("a")), 0x82,
                 id="receive-maximum-0"),
    pytest.param(packet(0x10, string(b"MQTT") + b"\x05"), 0x81, id="truncated"),
])
def test_v5_bad_connect_gets_a_connack_with_its_reason_then_the_close(raw, data: bytes, reason: int) -> None:
    client = raw()
    client.send(data)
    first, body = client.read()
    assert (first, body[:2]) == (0x20, bytes((0, reason))), body
    client.closed()


@pytest.mark.parametrize(("data", "answer"), [
    pytest.param(connect_packet(V311, "c" * 300), b"\x00\x02", id="client-id-too-long"),
    pytest.param(with_flags(connect_packet(V311, "r"), 0x03), None, id="reserved-flag"),
    pytest.param(will_connect(V311, "will/+"), None, id="will-topic-wildcard"),
    pytest.param(connect_packet(V311, "p", password=b"pw"), None, id="password-without-user-name"),
])
def test_v311_bad_connect_gets_its_return_code_or_the_close(raw, data: bytes, answer: bytes | None) -> None:
    client = raw()
    client.send(data)
    if answer is not None:
        assert client.read() == (0x20, answer)
    client.closed()


def test_v311_empty_client_id_without_clean_session_gets_return_code_2(raw) -> None:
    client = raw()
    client.send(connect_packet(V311, "", clean=False))  # 10 0c 00 04 'MQTT' 04 00 00 3c 00 00
    assert client.read() == (0x20, b"\x00\x02")
    client.closed()


# ---------------------------------------------------------------------- after CONNECT


V5_VIOLATIONS = [
    pytest.param(b"\x30\xff\xff\xff\xff\x01", 0x81, id="five-byte-remaining-length"),
    pytest.param(b"\x30\x80\x00", 0x81, id="remaining-length-not-shortest"),
    pytest.param(connect_packet(V5, "again"), 0x82, id="second-connect"),
    pytest.param(publish_packet(V5, "bad/+", b"wild"), 0x90, id="publish-to-plus"),
    pytest.param(publish_packet(V5, "bad/#", b"wild", 1), 0x90, id="publish-to-hash"),
    pytest.param(packet(0x36, string("bad/x") + b"\x00\x01\x00x"), 0x81, id="publish-qos-3"),
    pytest.param(packet(0x38, string("bad/x") + b"\x00x"), 0x81, id="qos-0-with-dup"),
    pytest.param(publish_packet(V5, "bad/x", b"x", properties=b"\x23\x00\x11"), 0x94, id="topic-alias-over-max"),
    # 3.3.2.3.4 forbids Topic Alias 0 without naming the code: Protocol Error or Topic Alias invalid.
    pytest.param(publish_packet(V5, "bad/x", b"x", properties=b"\x23\x00\x00"), {0x82, 0x94}, id="topic-alias-0"),
    pytest.param(publish_packet(V5, "", b"x", properties=b"\x23\x00\x05"), 0x82, id="unknown-topic-alias"),
    pytest.param(publish_packet(V5, "bad/x", b"x", properties=b"\x0b\x05"), 0x82, id="subscription-id-from-client"),
    pytest.param(packet(0x82, b"\x00\x01\x00"), 0x82, id="subscribe-without-filters"),
    pytest.param(subscribe_packet(V5, "$share/g/bad/x", 0x04), 0x82, id="no-local-on-a-shared-subscription"),
    pytest.param(subscribe_packet(V5, "bad/x", 0x30), 0x82, id="retain-handling-3"),
    pytest.param(subscribe_packet(V5, "bad/x", 0x03), 0x82, id="subscribe-qos-3"),
    pytest.param(subscribe_packet(V5, "bad/x", 0xC0), 0x81, id="subscribe-reserved-option-bits"),
    pytest.param(subscribe_packet(V5, "bad/x", 0, packet_id=0), 0x82, id="packet-identifier-0"),
    pytest.param(packet(0xA2, b"\x00\x01\x00"), 0x82, id="unsubscribe-without-filters"),
    pytest.param(publish_packet(V5, "bad/x", b"x", 1, properties=b"\x01\x01\x01\x01"), 0x82,
                 id="property-twice"),
    pytest.param(publish_packet(V5, "bad/\x00", b"x"), 0x81, id="topic-with-nul"),
    pytest.param(packet(0x30, b"\x00\x02\xc3\x28\x00x"), 0x81, id="topic-not-utf8"),
    pytest.param(b"\xc0\x01\x00", 0x81, id="pingreq-with-a-body"),
    pytest.param(packet(0x82, b"\x00\x01\x02\x0b\x00" + string("bad/x") + b"\x00"), 0x82,
                 id="subscription-identifier-0"),
    pytest.param(packet(0xE0, b"\x00\x05\x11\x00\x00\x00\x10"), 0x82, id="session-expiry-set-at-disconnect"),
    pytest.param(packet(0x60, b"\x00\x01"), 0x81, id="pubrel-flags"),
    pytest.param(packet(0xF0, b"\x00\x00"), 0x82, id="auth-not-begun"),
    pytest.param(packet(0x20, b"\x00\x00"), 0x82, id="connack-from-a-client"),
    pytest.param(b"\x30" + varint(MAX_PACKET_SIZE + 1) + b"\x00", 0x95, id="over-max-packet-size"),
]


@pytest.mark.parametrize(("data", "reason"), V5_VIOLATIONS)
def test_v5_protocol_violation_gets_disconnect_with_its_reason_and_nothing_is_published(
        raw, broker: RunningBroker, data: bytes, reason: int | set[int]) -> None:
    watcher = MQTTClient(broker.ports["mqtt"], MQTTv5)
    try:
        watcher.subscribe("bad/#", 0)
        client = raw()
        client.connect(V5)
        client.send(data)
        got_reason = client.disconnect_reason()
        assert got_reason in reason if isinstance(reason, set) else got_reason == reason, hex(got_reason)
        pub = raw()
        pub.connect(V5)
        pub.send(publish_packet(V5, "bad/ok", b"sentinel", 1))
        assert pub.read() == (0x40, b"\x00\x01")  # PUBACK, success (reason omitted)
        got = watcher.message()
        assert (got.topic, got.payload) == ("bad/ok", b"sentinel"), "the bad PUBLISH was routed"
    finally:
        watcher.disconnect()


@pytest.mark.parametrize("data", [
    pytest.param(b"\x30\xff\xff\xff\xff\x01", id="five-byte-remaining-length"),
    pytest.param(connect_packet(V311, "again"), id="second-connect"),
    pytest.param(publish_packet(V311, "bad/+", b"wild"), id="publish-to-plus"),
    pytest.param(packet(0xF0, b"\x00"), id="auth-in-311"),
    pytest.param(b"\x30" + varint(MAX_PACKET_SIZE + 1) + b"\x00", id="over-max-packet-size"),
])
def test_v311_protocol_violation_closes_the_connection(raw, data: bytes) -> None:
    client = raw()
    client.connect(V311)
    client.send(data)
    client.closed()


def test_input_cut_anywhere_or_joined_is_read_the_same(raw, broker: RunningBroker) -> None:
    """A CONNECT and a PUBLISH sent one byte per write; then a whole QoS 2 exchange in one
    write, its PUBLISH twice (the duplicate is acknowledged again and delivered once)."""
    watcher = MQTTClient(broker.ports["mqtt"], MQTTv5)
    try:
        watcher.subscribe("cut/+", 1)  # QoS 1: paho would hand a QoS 2 message over only at PUBREL
        trickle = raw()
        for byte in connect_packet(V5, "trickle") + publish_packet(V5, "cut/bytes", b"one byte at a time", 1, 5):
            trickle.send(bytes((byte,)))
        first, body = trickle.read()
        assert (first, body[:2]) == (0x20, b"\x00\x00")
        assert trickle.read() == (0x40, b"\x00\x05")
        assert watcher.message().payload == b"one byte at a time"

        joined = raw()
        qos2 = publish_packet(V5, "cut/joined", b"exactly once", 2, 9)
        joined.send(connect_packet(V5, "joined") + qos2 + bytes((qos2[0] | 0x08,)) + qos2[1:]
                    + packet(0x62, b"\x00\x09") + b"\xc0\x00" + b"\xe0\x00")
        first, body = joined.read()
        assert (first, body[:2]) == (0x20, b"\x00\x00")
        assert [joined.read() for _ in range(4)] == [
            (0x50, b"\x00\x09"), (0x50, b"\x00\x09"), (0x70, b"\x00\x09"), (0xD0, b"")]
        joined.closed()
        trickle.send(publish_packet(V5, "cut/after", b"sentinel", 1, 6))
        assert trickle.read() == (0x40, b"\x00\x06")
        got = [watcher.message(), watcher.message()]
        assert [m.payload for m in got] == [b"exactly once", b"sentinel"]
    finally:
        watcher.disconnect()


def test_a_packet_of_exactly_the_maximum_size_is_taken(raw, broker: RunningBroker) -> None:
    watcher = MQTTClient(broker.ports["mqtt"], MQTTv5)
    try:
        watcher.subscribe("size/limit", 1)
        client = raw()
        client.connect(V5)
        head = publish_packet(V5, "size/limit", b"", 1)
        payload = b"x" * (MAX_PACKET_SIZE - len(head) - 1)  # the Remaining Length takes one more byte
        data = publish_packet(V5, "size/limit", payload, 1)
        assert len(data) == MAX_PACKET_SIZE
        client.send(data)
        assert client.read() == (0x40, b"\x00\x01")
        assert watcher.message().payload == payload
    finally:
        watcher.disconnect()


def test_v5_connack_announces_the_maximum_packet_size(raw) -> None:
    client = raw()
    client.send(connect_packet(V5))
    first, body = client.read()
    assert first == 0x20 and body[:2] == b"\x00\x00"
    assert b"\x27" + MAX_PACKET_SIZE.to_bytes(4, "big") in body[2:]  # Maximum Packet Size property


# ---------------------------------------------------------------------- silence


def test_a_connection_that_sends_no_connect_is_closed_after_the_connect_timeout(raw) -> None:
    silent = raw()
    partial = raw()
    partial.send(connect_packet(V5, "slow")[:5])
    silent.closed()
    partial.closed()


def test_many_connections_that_never_connect_are_closed_and_bounded(raw) -> None:
    """More silent connections than ``--max-unauthenticated``: the ones over the limit are
    closed at once, the others after the connect timeout; none is ever answered."""
    silent = [raw() for _ in range(MAX_UNAUTHENTICATED + 15)]
    for client in silent:
        client.closed()


def test_keep_alive_closes_a_silent_connection(raw) -> None:
    """Keep-alive 1 s: silent for 1.5 s, a v5 connection gets DISCONNECT 0x8D (Keep Alive
    timeout), a 3.1.1 one is closed; a PINGREQ is answered."""
    quiet5, quiet3 = raw(), raw()
    quiet5.connect(V5, keepalive=1)
    quiet3.connect(V311, keepalive=1)
    quiet5.send(b"\xc0\x00")
    assert quiet5.read() == (0xD0, b"")
    assert quiet5.disconnect_reason() == 0x8D
    quiet3.closed()


def test_a_read_of_many_publishes_is_routed_and_answered_in_the_order_sent(raw, broker: RunningBroker) -> None:
    """PUBLISHes read together are routed as runs (one topic each): whatever a read holds
    (runs to two topics, a SUBSCRIBE between them, QoS 0 and 1), each message is delivered in
    the order sent, a SUBSCRIBE applies to what follows it, and the acknowledgements keep the
    order of the packets they answer (4.6)."""
    watcher = MQTTClient(broker.ports["mqtt"], MQTTv5)
    try:
        watcher.subscribe("run/#", 1)
        client = raw()
        first = [publish_packet(V5, "run/a", f"a{i}".encode(), 1, i + 1) for i in range(20)]
        second = [publish_packet(V5, "run/b", f"b{i}".encode(), 1, 21 + i) for i in range(5)]
        third = [publish_packet(V5, "run/a", f"c{i}".encode()) for i in range(20)]
        client.send(connect_packet(V5, "runner") + b"".join(first + second) + subscribe_packet(V5, "run/#", 0, 100)
                    + b"".join(third) + publish_packet(V5, "run/a", b"end", 1, 200))
        assert client.read()[0] == 0x20
        assert [client.read() for _ in range(25)] == [(0x40, n.to_bytes(2, "big")) for n in range(1, 26)]
        assert client.read() == (0x90, b"\x00\x64\x00\x00")  # SUBACK 100, QoS 0
        own = [client.read() for _ in range(21)]  # what it published after subscribing, then the PUBACK
        assert [body[8:] for first_byte, body in own if first_byte == 0x30] == [f"c{i}".encode() for i in range(20)] + [b"end"]
        assert client.read() == (0x40, b"\x00\xc8")
        got = [watcher.message() for _ in range(46)]
        # 4.6: in order per topic and QoS (QoS 0 ones may overtake QoS 1 ones waiting for the
        # subscriber's Receive Maximum)
        assert [m.payload for m in got if (m.topic, m.qos) == ("run/a", 1)] == \
            [f"a{i}".encode() for i in range(20)] + [b"end"]
        assert [m.payload for m in got if m.topic == "run/b"] == [f"b{i}".encode() for i in range(5)]
        assert [m.payload for m in got if m.qos == 0] == [f"c{i}".encode() for i in range(20)]
    finally:
        watcher.disconnect()

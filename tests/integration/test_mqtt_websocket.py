"""MQTT over WebSocket (MQTT 5.0 / 3.1.1 section 6) at ``/mqtt`` on the socket.mq listener of a
real ``twistd brokerd``: paho-mqtt 2.x (``transport="websockets"``) in 3.1.1 and 5.0 publishes
and receives at every QoS with MQTT clients over TCP and an SSMP client; the handshake needs the
``mqtt`` subprotocol and an allowed Origin; a text message closes the connection (and its will
is published); packets may span WebSocket messages and share them, both ways; the connection is
counted once against the connection limits; a client certificate of a ``tls:`` listener logs
in; without the MQTT front end there is no ``/mqtt``.

Blocking clients with bounded reads: test_mqtt_paho's MQTTClient (paho, every wait a bounded
``Queue.get``), tests/support/broker.py's LineClient for SSMP, and :class:`RawWebSocket`, a
WebSocket client at the frame level on a socket with a timeout.
"""
from __future__ import annotations

import json
import os
import queue
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311, WebsocketConnectionError

from tests.integration.test_mqtt_bad_input import V311, packet, string, subscribe_packet
from tests.integration.test_mqtt_paho import (
    BOUND,
    VERSIONS,
    MQTTClient,
    assert_clean_log,
    unique,
)
from tests.support.broker import LineClient, RunningBroker, start_broker
from tests.support.certs import make_pki

pytestmark = pytest.mark.slow

LOOPBACK = "tcp:{port}:interface=127.0.0.1"
LISTENERS = {"socketmq": LOOPBACK, "mqtt": LOOPBACK, "ssmp": LOOPBACK}
MAX_PACKET = 4096
"""The broker's --mqtt-max-packet-size: WebSocket messages may then have 4096 + 65536 bytes,
so a larger packet to a subscriber travels in several messages."""
LARGEST_MESSAGE = MAX_PACKET + (1 << 16)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-websocket"), "--open-login",
                           "--mqtt-max-packet-size", str(MAX_PACKET), listeners=LISTENERS)
    yield running
    running.stop()
    assert_clean_log(running)


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Clients to close after the test."""
    clients: list[Any] = []
    yield clients
    for client in clients:
        if isinstance(client, MQTTClient):
            try:
                client.disconnect()
            except (queue.Empty, OSError):
                client.stop()
        else:
            client.close()


def websocket_client(port: int, version: int, client_id: str = "", **options: Any) -> MQTTClient:
    """A connected paho client over WebSocket to ``/mqtt`` (paho offers the subprotocol
    ``mqtt`` and sends the Origin of the address it connects to, the listener's own)."""
    client = MQTTClient(port, version, client_id, connect=False, **options)
    client.client.transport = "websockets"
    client.client.ws_set_options(path="/mqtt")
    client.connect()
    return client


# ---------------------------------------------------------------------- raw clients


def client_frame(opcode: int, payload: bytes = b"") -> bytes:
    """One masked client-to-server frame (RFC 6455 section 5.2), of any length."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        header = bytes((0x80 | opcode, 0x80 | size))
    elif size < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawWebSocket:
    """A WebSocket client at the frame level on a blocking socket (every read bounded): the
    opening handshake as written, then frames; MQTT bytes are read across binary messages."""

    def __init__(self, port: int, protocols: str | None = "mqtt", origin: str | None = None,
                 host: str | None = None, path: str = "/mqtt") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
        self.buffer = b""
        self.stream = b""
        """MQTT bytes received and not read yet."""
        self.messages: list[bytes] = []
        """Every binary message received."""
        lines = [f"GET {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}", "Upgrade: websocket",
                 "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
        if protocols is not None:
            lines.append(f"Sec-WebSocket-Protocol: {protocols}")
        if origin is not None:
            lines.append(f"Origin: {origin}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.split(b"\r\n")
        self.status = int(status_line.split(b" ")[1])
        self.headers = {name.strip().lower(): value.strip()
                        for name, _, value in (line.partition(b":") for line in header_lines)}

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError(f"the server closed the connection; buffered {self.buffer[:200]!r}")
        self.buffer += data

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._read()
        taken, self.buffer = self.buffer[:size], self.buffer[size:]
        return taken

    def send(self, payload: bytes, opcode: int = 2) -> None:
        """One message (binary unless ``opcode`` says otherwise)."""
        self.sock.sendall(client_frame(opcode, payload))

    def frame(self) -> tuple[int, bytes]:
        """(opcode, payload) of the server's next frame (servers do not mask)."""
        first, second = self._take(2)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", self._take(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", self._take(8))
        return first & 0x0F, self._take(size)

    def mqtt(self, size: int) -> bytes:
        """The next ``size`` MQTT bytes, from as many binary messages as they take."""
        while len(self.stream) < size:
            opcode, payload = self.frame()
            assert opcode == 2, (opcode, payload)
            self.messages.append(payload)
            self.stream += payload
        taken, self.stream = self.stream[:size], self.stream[size:]
        return taken

    def packet(self) -> bytes:
        """The next whole MQTT packet."""
        head = self.mqtt(1)
        length, shift = 0, 0
        while True:
            byte = self.mqtt(1)
            head += byte
            length += (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                return head + self.mqtt(length)

    def close_code(self) -> int:
        """The code of the server's close frame (no data frame may come before it)."""
        opcode, payload = self.frame()
        assert opcode == 8, (opcode, payload)
        return struct.unpack("!H", payload[:2])[0]

    def finish_closing(self) -> None:
        """Answer the server's close frame and read until the server closes the connection
        (Autobahn aborts it once the closing handshake is done: a reset is a close too)."""
        self.send(b"", opcode=8)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass

    def close(self) -> None:
        self.sock.close()


def connect_packet(client_id: str, will: tuple[str, bytes] | None = None) -> bytes:
    """A 3.1.1 CONNECT, clean session, keep-alive 60 s, with a QoS 0 will if given."""
    flags, payload = 0x02, string(client_id)
    if will is not None:
        flags |= 0x04
        payload += string(will[0]) + string(will[1])
    return packet(0x10, string(b"MQTT") + bytes((V311, flags)) + (60).to_bytes(2, "big") + payload)


CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
PINGREQ, PINGRESP, DISCONNECT = b"\xc0\x00", b"\xd0\x00", b"\xe0\x00"


def mqtt_session(port: int, client_id: str, **handshake: Any) -> RawWebSocket:
    """A raw WebSocket whose MQTT CONNECT was accepted."""
    ws = RawWebSocket(port, **handshake)
    assert ws.status == 101, ws.headers
    ws.send(connect_packet(client_id))
    assert ws.packet() == CONNACK_ACCEPTED
    return ws


class SSMPPeer:
    def __init__(self, port: int, name: str) -> None:
        self.client = LineClient.connect(port, BOUND)
        assert self.client.request(f"LOGIN {name} open") == b"200"

    def subscribe(self, topic: str) -> None:
        assert self.client.request(f"SUBSCRIBE {topic}") == b"200"

    def publish(self, topic: str, text: str) -> None:
        assert self.client.request(f"MCAST {topic} {text}") == b"200"

    def message(self) -> tuple[bytes, bytes]:
        """(topic, payload) of the next ``000 <sender> MCAST <topic> <payload>``."""
        status, _sender, verb, topic, payload = self.client.line().split(b" ", 4)
        assert (status, verb) == (b"000", b"MCAST"), (status, verb)
        return topic, payload

    def close(self) -> None:
        self.client.close()


# ---------------------------------------------------------------------- delivery


@pytest.mark.parametrize("version", VERSIONS)
def test_every_qos_crosses_between_websocket_tcp_and_ssmp(broker: RunningBroker, closing: list, version: int) -> None:
    topic = unique("ws", version)
    web = broker.ports["socketmq"]
    ws_sub = websocket_client(web, version, unique("ws-sub", version))
    tcp_sub = MQTTClient(broker.ports["mqtt"], version, unique("tcp-sub", version))
    ssmp = SSMPPeer(broker.ports["ssmp"], unique("ssmp", version))
    closing += [ws_sub, tcp_sub, ssmp]
    assert ws_sub.subscribe(topic + "/#", 2) == 2
    assert tcp_sub.subscribe(topic + "/#", 2) == 2
    ssmp.subscribe(f"{topic}/from-ws")

    ws_pub = websocket_client(web, version, unique("ws-pub", version))
    closing.append(ws_pub)
    sent = [(f"{topic}/from-ws", f"ws-qos-{qos}".encode(), qos) for qos in (0, 1, 2)]
    for name, payload, qos in sent:
        assert ws_pub.publish(name, payload, qos) == 0
    for subscriber in (ws_sub, tcp_sub):  # paho hands QoS 2 over at PUBREL: compare as sets
        got = {(m.topic, m.payload, m.qos) for m in (subscriber.message() for _ in sent)}
        assert got == set(sent)
    assert sorted(ssmp.message() for _ in sent) == sorted((n.encode(), p) for n, p, _ in sent)

    tcp_pub = MQTTClient(broker.ports["mqtt"], version, unique("tcp-pub", version))
    closing.append(tcp_pub)
    sent = [(f"{topic}/from-tcp", f"tcp-qos-{qos}".encode(), qos) for qos in (0, 1, 2)]
    for name, payload, qos in sent:
        assert tcp_pub.publish(name, payload, qos) == 0
    assert {(m.topic, m.payload, m.qos) for m in (ws_sub.message() for _ in sent)} == set(sent)

    ssmp.publish(f"{topic}/from-ssmp", "hello-from-ssmp")
    message = ws_sub.message()
    assert (message.topic, message.payload, message.qos) == (f"{topic}/from-ssmp", b"hello-from-ssmp", 0)
    assert ws_sub.messages.empty()


def test_packets_may_span_and_share_websocket_messages_both_ways(broker: RunningBroker, closing: list) -> None:
    """A CONNECT in two messages, a SUBSCRIBE and a PINGREQ in one; a PUBLISH larger than a
    WebSocket message may be comes in several (socket.mq publishes it: 100 kB of text)."""
    topic = unique("span", MQTTv311)
    ws = RawWebSocket(broker.ports["socketmq"])
    closing.append(ws)
    assert ws.status == 101
    connect = connect_packet(unique("raw", MQTTv311))
    ws.send(connect[:5])
    ws.send(connect[5:])
    assert ws.packet() == CONNACK_ACCEPTED
    ws.send(subscribe_packet(V311, topic, 0, 7) + PINGREQ)
    assert ws.packet() == b"\x90\x03\x00\x07\x00"
    assert ws.packet() == PINGRESP

    socketmq = RawWebSocket(broker.ports["socketmq"], protocols="socketmq.v1", path="/socket.mq/ws")
    closing.append(socketmq)
    assert socketmq.status == 101
    assert json.loads(socketmq.frame()[1])["type"] == "hello"
    text = "x" * 100_000
    socketmq.send(json.dumps({"type": "publish", "id": 1, "event": topic, "data": text}).encode(), opcode=1)
    assert json.loads(socketmq.frame()[1])["status"] == 200

    ws.messages.clear()
    publish = ws.packet()
    body = publish[publish.index(string(topic)):]
    assert body == string(topic) + text.encode()
    assert len(ws.messages) >= 2 and max(map(len, ws.messages)) <= LARGEST_MESSAGE
    ws.send(DISCONNECT)
    assert ws.close_code() == 1000
    ws.finish_closing()


# ---------------------------------------------------------------------- the handshake


@pytest.mark.parametrize(("offered", "chosen"), [
    ("mqtt", b"mqtt"),
    ("chat, mqtt", b"mqtt"),
    ("mqttv3.1, mqtt", b"mqtt"),
    ("mqttv3.1", b"mqttv3.1"),
])
def test_a_handshake_offering_mqtt_is_completed(broker: RunningBroker, closing: list, offered: str, chosen: bytes) -> None:
    ws = mqtt_session(broker.ports["socketmq"], unique("offer", MQTTv311), protocols=offered)
    closing.append(ws)
    assert ws.headers[b"sec-websocket-protocol"] == chosen


@pytest.mark.parametrize("offered", [None, "chat", "mqttv5, socketmq.v1", "MQTT"])
def test_a_handshake_without_the_mqtt_subprotocol_is_refused(broker: RunningBroker, closing: list,
                                                              offered: str | None) -> None:
    ws = RawWebSocket(broker.ports["socketmq"], protocols=offered)
    closing.append(ws)
    assert ws.status == 400
    assert b"sec-websocket-accept" not in ws.headers


def test_paho_without_the_subprotocol_is_refused_and_with_it_connects(broker: RunningBroker, closing: list) -> None:
    def without_subprotocol(headers: dict[str, str]) -> dict[str, str]:
        return {name: value for name, value in headers.items() if name.lower() != "sec-websocket-protocol"}

    refused = MQTTClient(broker.ports["socketmq"], MQTTv311, unique("nosub", MQTTv311), connect=False)
    refused.client.transport = "websockets"
    refused.client.ws_set_options(path="/mqtt", headers=without_subprotocol)
    with pytest.raises(WebsocketConnectionError):
        refused.client.connect("127.0.0.1", broker.ports["socketmq"])

    accepted = websocket_client(broker.ports["socketmq"], MQTTv311, unique("sub", MQTTv311))
    closing.append(accepted)
    assert accepted.subscribe(unique("sub", MQTTv311), 1) == 1


@pytest.mark.parametrize(("host", "origin"), [
    (None, "http://evil.example"),
    (None, "null"),
    (None, "https://127.0.0.1:{port}"),  # another scheme: another origin
    ("evil.example:{port}", "http://evil.example:{port}"),  # DNS rebinding: not one of our names
])
def test_a_page_of_another_origin_is_refused(broker: RunningBroker, closing: list, host: str | None, origin: str) -> None:
    port = broker.ports["socketmq"]
    ws = RawWebSocket(port, origin=origin.format(port=port), host=host and host.format(port=port))
    closing.append(ws)
    assert ws.status == 403
    assert b"sec-websocket-accept" not in ws.headers


@pytest.mark.parametrize("origin", ["http://127.0.0.1:{port}", "http://localhost:{port}"])
def test_a_page_of_the_listeners_own_origin_connects(broker: RunningBroker, closing: list, origin: str) -> None:
    port = broker.ports["socketmq"]
    host = origin.format(port=port).removeprefix("http://")
    ws = mqtt_session(port, unique("origin", MQTTv311), origin=origin.format(port=port), host=host)
    closing.append(ws)


# ---------------------------------------------------------------------- text is refused


@pytest.mark.parametrize(("text", "code"), [
    (b"\x30\x05\x00\x01a", 1003),  # a PUBLISH (valid UTF-8) in a text message: unsupported data
    (PINGREQ, 1007),  # not UTF-8: Autobahn fails the message before MQTT sees it
])
def test_a_text_message_closes_the_connection_and_publishes_the_will(broker: RunningBroker, closing: list,
                                                                     text: bytes, code: int) -> None:
    topic = unique("text", MQTTv311)
    watcher = MQTTClient(broker.ports["mqtt"], MQTTv5, unique("watcher", MQTTv5))
    closing.append(watcher)
    assert watcher.subscribe(topic, 0) == 0
    ws = RawWebSocket(broker.ports["socketmq"])
    closing.append(ws)
    ws.send(connect_packet(unique("texter", MQTTv311), will=(topic, b"gone")))
    assert ws.packet() == CONNACK_ACCEPTED

    ws.send(text, opcode=1)
    assert ws.close_code() == code
    ws.finish_closing()
    will = watcher.message()
    assert (will.topic, will.payload) == (topic, b"gone")


# ---------------------------------------------------------------------- connection limits


def test_a_websocket_connection_counts_once_and_is_counted_out(tmp_path: Path) -> None:
    """With 3 connections per address, 3 MQTT WebSockets fit (the HTTP request's count moves to
    the MQTT connection: none is counted twice) and a 4th is refused (503); each one closed
    makes room for one more, again and again (none is left counted)."""
    running = start_broker(tmp_path, "--max-connections-per-address", "3",
                           listeners={"socketmq": LOOPBACK, "mqtt": LOOPBACK})
    port = running.ports["socketmq"]
    sessions = []
    try:
        sessions = [mqtt_session(port, f"count-{n}") for n in range(3)]
        for round_ in range(4):
            refused = RawWebSocket(port)
            assert refused.status == 503
            refused.close()
            oldest = sessions.pop(0)
            oldest.send(DISCONNECT)
            assert oldest.close_code() == 1000
            oldest.finish_closing()
            oldest.close()
            sessions.append(mqtt_session(port, f"count-again-{round_}"))
    finally:
        for ws in sessions:
            ws.close()
        running.stop()
    assert_clean_log(running)


# ---------------------------------------------------------------------- flow control


def test_a_subscriber_that_does_not_read_loses_qos_0_and_gets_qos_1_once_it_reads(tmp_path: Path) -> None:
    """The MQTT connection is the producer of the TCP connection under its WebSocket: with
    16 kB unwritten it is congested, so of 20 MB of QoS 0 messages (more than the kernel's
    buffers hold) most are dropped, and the QoS 1 message after them waits in the session
    and comes once the reader has drained the connection."""
    running = start_broker(tmp_path, "--max-output-buffer", "16384",
                           listeners={"socketmq": LOOPBACK, "mqtt": LOOPBACK})
    topic, flood = "flood", 20_000
    try:
        ws = mqtt_session(running.ports["socketmq"], "slow-reader")
        ws.send(subscribe_packet(V311, topic, 1, 1))
        assert ws.packet() == b"\x90\x03\x00\x01\x01"
        publisher = MQTTClient(running.ports["mqtt"], MQTTv311, "flooder")
        for _ in range(flood):
            assert publisher.client.publish(topic, b"x" * 1000, qos=0).rc == 0
        last = publisher.client.publish(topic, b"the end", qos=1)
        last.wait_for_publish(BOUND)
        assert last.is_published()
        received = 0
        while not (packet := ws.packet()).endswith(b"the end"):
            assert packet[0] == 0x30, packet[:8]  # QoS 0 PUBLISH
            received += 1
        assert packet[0] == 0x32  # QoS 1
        assert received < flood
        publisher.disconnect()
        ws.close()
    finally:
        running.stop()
    assert_clean_log(running)


# ---------------------------------------------------------------------- TLS, and no MQTT front end


def test_the_client_certificate_of_a_tls_listener_logs_in(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    running = start_broker(tmp_path, "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
                           "--tls-ca", str(pki.ca), "--no-mqtt-anonymous",
                           listeners={"socketmq": "tls:{port}:interface=127.0.0.1", "mqtt": LOOPBACK})
    made = []
    try:
        for cert, expected in ((pki.client, 0), (None, 0x87)):  # paho: return code 5 as 0x87, not authorized
            client = MQTTClient(running.ports["socketmq"], MQTTv311, f"tls-{expected}", connect=False)
            made.append(client)
            client.client.transport = "websockets"
            client.client.ws_set_options(path="/mqtt")
            if cert is None:
                client.client.tls_set(ca_certs=str(pki.ca))
            else:
                client.client.tls_set(ca_certs=str(pki.ca), certfile=str(cert.cert), keyfile=str(cert.key))
            client.start()
            assert client.connack()[1] == expected
    finally:
        for client in made:
            client.stop()
        running.stop()
    assert_clean_log(running)


def test_without_the_mqtt_front_end_there_is_no_mqtt_path(tmp_path: Path) -> None:
    running = start_broker(tmp_path, listeners={"socketmq": LOOPBACK, "ssmp": LOOPBACK})
    try:
        ws = RawWebSocket(running.ports["socketmq"])
        assert ws.status == 404
        ws.close()
    finally:
        running.stop()
    assert_clean_log(running)

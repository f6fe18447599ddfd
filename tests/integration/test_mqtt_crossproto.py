"""MQTT with every other protocol on one real ``twistd brokerd`` (all five listeners): an MQTT
publish reaches subscribers of SSMP, MCCHAT, SMQP (topic ``/a/b`` for core ``a/b``) and
socket.mq (a WebSocket), and each of those protocols' publishes reaches MQTT subscribers, of
3.1.1 and of 5.0, through an exact filter and through a ``+`` wildcard.

Blocking clients with bounded reads: tests/support/broker.py's LineClient for SSMP, the MCCHAT
codec on a socket, tests/integration/smqp_fixtures.py's BlockingSMQP, a WebSocket made of
test_socketmq_hardening's frames, and test_mqtt_paho's MQTTClient (paho).
"""
from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311

from brokerd.protocols.mcchat.codec import (
    MCChatParser,
    encode_msg,
    encode_sub,
    encode_tlrq,
)
from brokerd.protocols.mcchat.events import Msg, TopicList
from tests.integration.smqp_fixtures import BlockingSMQP, write_test_accounts
from tests.integration.test_mqtt_paho import ANONYMOUS_SESSIONS, BOUND, MQTTClient, assert_clean_log
from tests.integration.test_socketmq_hardening import UPGRADE, client_frame
from tests.support.broker import LineClient, RunningBroker, start_broker

pytestmark = pytest.mark.slow

LISTENERS = {protocol: "tcp:{port}:interface=127.0.0.1" for protocol in ("mqtt", "ssmp", "mcchat", "smqp", "socketmq")}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    tmp_path = tmp_path_factory.mktemp("mqtt-crossproto")
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    running = start_broker(tmp_path, "--open-login", "--accounts", str(accounts), *ANONYMOUS_SESSIONS,
                           listeners=LISTENERS)
    yield running
    running.stop()
    assert_clean_log(running)


# ---------------------------------------------------------------------- one client per protocol


class SSMPPeer:
    def __init__(self, broker: RunningBroker, name: str) -> None:
        self.client = LineClient.connect(broker.ports["ssmp"], BOUND)
        assert self.client.request(f"LOGIN {name} open") == b"200"

    def subscribe(self, topic: str) -> None:
        assert self.client.request(f"SUBSCRIBE {topic}") == b"200"

    def publish(self, topic: str, text: str) -> None:
        assert self.client.request(f"MCAST {topic} {text}") == b"200"

    def message(self) -> tuple[bytes, bytes, bytes]:
        """(sender, topic, payload) of the next ``000 <sender> MCAST <topic> <payload>``."""
        status, sender, verb, topic, payload = self.client.line().split(b" ", 4)
        assert (status, verb) == (b"000", b"MCAST"), (status, verb)
        return sender, topic, payload

    def close(self) -> None:
        self.client.close()


class MCChatPeer:
    """MCCHAT answers neither SUB nor MSG: a TLRQ, answered in order, shows the server handled
    what came before it."""

    def __init__(self, broker: RunningBroker) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.ports["mcchat"]), timeout=BOUND)
        self.parser = MCChatParser()
        self.events: list[Any] = []

    def _next(self, kind: type) -> Any:
        while True:
            for index, event in enumerate(self.events):
                if isinstance(event, kind):
                    return self.events.pop(index)
            data = self.sock.recv(65536)
            assert data, "the MCCHAT server closed the connection"
            events, error = self.parser.feed(data)
            assert error is None, error
            self.events += events

    def synced(self) -> None:
        self.sock.sendall(encode_tlrq())
        self._next(TopicList)

    def subscribe(self, topic: str) -> None:
        self.sock.sendall(encode_sub(topic.encode()))
        self.synced()

    def publish(self, topic: str, text: str) -> None:
        self.sock.sendall(encode_msg(topic.encode(), b"zoe", text.encode()))
        self.synced()

    def message(self) -> Msg:
        return self._next(Msg)

    def close(self) -> None:
        self.sock.close()


class SMQPPeer:
    """alice over SMQP; she creates the SMQP topics (with their parents) she uses."""

    def __init__(self, broker: RunningBroker, channel: str) -> None:
        self.client = BlockingSMQP(broker.ports["smqp"], BOUND)
        self.client.login("alice", channel)

    def create(self, topic: str) -> None:
        path = ""
        for level in topic.split("/"):
            path += "/" + level
            reply = self.client.command(f"CREATE TOPIC {path}")
            assert reply.code in (200, 409), reply

    def subscribe(self, topic: str) -> None:
        self.create(topic)
        assert self.client.command(f"SUB MESSAGE /{topic}").code == 200

    def publish(self, topic: str, text: str) -> None:
        self.create(topic)
        self.client.send(self.client.publish_bytes(f"/{topic}", "x1", text.encode(), ))
        assert self.client.reply().code == 200

    def message(self) -> Any:
        """The next NOTIFY MESSAGE, acknowledged."""
        notify = self.client.notify()
        assert notify.kind == "MESSAGE", notify
        if notify.body.get("Guarantee") != "NO":
            assert self.client.command("310 ACK").code == 310
        return notify

    def close(self) -> None:
        self.client.close()


class WebSocketPeer:
    """socket.mq over a WebSocket (text messages; anonymous)."""

    def __init__(self, broker: RunningBroker) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.ports["socketmq"]), timeout=BOUND)
        self.sock.sendall(UPGRADE)
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert self.next()["type"] == "hello"
        self.ids = 0

    def _read(self) -> None:
        data = self.sock.recv(65536)
        assert data, "the socket.mq server closed the connection"
        self.buffer += data

    def next(self) -> dict[str, Any]:
        """The next message from the server: a text message's JSON, or a binary message's
        JSON header with its payload as ``"bytes"``."""
        while True:
            while len(self.buffer) < 2:
                self._read()
            opcode, size, start = self.buffer[0] & 0x0F, self.buffer[1] & 0x7F, 2
            if size == 126:
                while len(self.buffer) < 4:
                    self._read()
                (size,), start = struct.unpack("!H", self.buffer[2:4]), 4
            elif size == 127:
                while len(self.buffer) < 10:
                    self._read()
                (size,), start = struct.unpack("!Q", self.buffer[2:10]), 10
            while len(self.buffer) < start + size:
                self._read()
            payload, self.buffer = self.buffer[start:start + size], self.buffer[start + size:]
            assert self.buffer[:0] == b"" and opcode in (1, 2, 9), (opcode, payload)  # no close
            if opcode == 1:
                return json.loads(payload)
            if opcode == 2:
                header, _, data = payload.partition(b"\n")
                return {**json.loads(header), "bytes": data}

    def request(self, **fields: Any) -> None:
        self.ids += 1
        self.sock.sendall(client_frame(1, json.dumps({**fields, "id": self.ids}).encode()))
        result = self.next()
        assert (result["type"], result["id"], result["status"]) == ("result", self.ids, 200), result

    def subscribe(self, topic: str) -> None:
        self.request(type="subscribe", event=topic)

    def publish(self, topic: str, text: str) -> None:
        self.request(type="publish", event=topic, data=text)

    def message(self) -> dict[str, Any]:
        event = self.next()
        assert event["type"] == "event", event
        return event

    def close(self) -> None:
        self.sock.close()


PEERS = {"ssmp": SSMPPeer, "mcchat": MCChatPeer, "smqp": SMQPPeer, "socketmq": WebSocketPeer}
VERSIONS = [pytest.param(MQTTv311, id="3.1.1"), pytest.param(MQTTv5, id="5.0")]


def peer(broker: RunningBroker, protocol: str, name: str) -> Any:
    if protocol in ("ssmp", "smqp"):
        return PEERS[protocol](broker, name)
    return PEERS[protocol](broker)


@pytest.fixture
def closing() -> Iterator[list]:
    """Clients to close after the test."""
    clients: list = []
    yield clients
    for client in clients:
        if isinstance(client, MQTTClient):
            client.disconnect()
        else:
            client.close()


# ---------------------------------------------------------------------- MQTT -> the others


@pytest.mark.parametrize("version", VERSIONS)
def test_an_mqtt_publish_reaches_every_other_protocol(broker: RunningBroker, closing: list, version: int) -> None:
    """ASCII text, UTF-8 text (valid UTF-8 is text; v5 may also say so with a Payload Format
    Indicator) and binary bytes, each as the other protocol
    carries text or binary: SSMP's binary form (two bytes of length - 1), a socket.mq binary
    message, an SMQP section typed application/octet-stream; MCCHAT carries only text, and its
    subscriber gets the last text message next."""
    topic = f"xp{version}/out/news"
    ssmp, mcchat, smqp, web = (peer(broker, p, f"sub{version}") for p in ("ssmp", "mcchat", "smqp", "socketmq"))
    closing += [ssmp, mcchat, smqp, web]
    for subscriber in (ssmp, mcchat, smqp, web):
        subscriber.subscribe(topic)
    mqtt = MQTTClient(broker.ports["mqtt"], version, f"mqtt-pub-{version}")
    closing.append(mqtt)
    utf8 = "grüße".encode()
    binary = b"\x00\x01\xfe\xff"

    # QoS 1 and 2: the acknowledgement comes once the message is stored for the SMQP (durable)
    # subscriber.  (QoS 0: see the next tests.)
    assert mqtt.publish(topic, b"hello from mqtt", 1) == 0
    assert mqtt.publish(topic, utf8, 1, **({"PayloadFormatIndicator": 1} if version == MQTTv5 else {})) == 0
    assert mqtt.publish(topic, binary, 2) == 0
    assert mqtt.publish(topic, b"last", 1) == 0

    def ssmp_binary(data: bytes) -> bytes:
        return (len(data) - 1).to_bytes(2, "big") + data

    assert ssmp.message() == (f"mqtt:mqtt-pub-{version}".encode(), topic.encode(), b"hello from mqtt")
    assert [ssmp.message()[1:] for _ in range(3)] == [
        (topic.encode(), utf8),
        (topic.encode(), ssmp_binary(binary)),
        (topic.encode(), b"last"),
    ]

    got = [mcchat.message() for _ in range(3)]
    assert [(m.topic, m.message) for m in got] == [(topic.encode(), b"hello from mqtt"), (topic.encode(), utf8),
                                                   (topic.encode(), b"last")]

    notifies = [smqp.message() for _ in range(4)]
    assert {n.args for n in notifies} == {(f"/{topic}", "ADD")}
    assert notifies[0].body.get("Cmuid").startswith(f"mqtt:mqtt-pub-{version}@")
    sections = [n.body.sections[0] for n in notifies]
    assert [s.data for s in sections] == [b"hello from mqtt", utf8, binary, b"last"]
    assert sections[0].content_type.startswith("text/plain")
    assert sections[1].content_type.startswith("text/plain")
    assert sections[2].content_type == "application/octet-stream"

    events = [web.message() for _ in range(4)]
    assert {(e["event"], e["protocol"]) for e in events} == {(topic, "mqtt")}
    assert events[0]["data"] == "hello from mqtt"
    assert events[1].get("data") == "grüße"
    assert events[2]["bytes"] == binary
    assert events[3]["data"] == "last"


@pytest.mark.parametrize("version", VERSIONS)
def test_an_mqtt_qos_0_publish_reaches_ssmp_mcchat_and_socketmq(broker: RunningBroker, closing: list,
                                                               version: int) -> None:
    topic = f"xp{version}/out/qos0"
    ssmp, mcchat, web = (peer(broker, p, f"q0sub{version}") for p in ("ssmp", "mcchat", "socketmq"))
    closing += [ssmp, mcchat, web]
    for subscriber in (ssmp, mcchat, web):
        subscriber.subscribe(topic)
    mqtt = MQTTClient(broker.ports["mqtt"], version)
    closing.append(mqtt)
    mqtt.publish(topic, b"at most once", 0)
    assert ssmp.message()[1:] == (topic.encode(), b"at most once")
    assert mcchat.message().message == b"at most once"
    assert web.message()["data"] == "at most once"


@pytest.mark.parametrize("version", VERSIONS)
def test_an_mqtt_qos_0_publish_reaches_an_smqp_subscriber(broker: RunningBroker, closing: list, version: int) -> None:
    """SSMP's MCAST, MCCHAT's MSG and socket.mq's publish (none of them acknowledged the MQTT
    QoS 1 way) all reach SMQP subscribers (docs/smqp.md, "Other protocols"); an MQTT QoS 0
    publish should too.  The QoS 1 one after it bounds the wait."""
    topic = f"xp{version}/out/smqp_qos0"
    smqp = SMQPPeer(broker, f"q0{version}")
    closing.append(smqp)
    smqp.subscribe(topic)
    mqtt = MQTTClient(broker.ports["mqtt"], version)
    closing.append(mqtt)
    mqtt.publish(topic, b"qos 0", 0)
    mqtt.publish(topic, b"qos 1", 1)
    assert smqp.message().body.sections[0].data == b"qos 0"
    assert smqp.message().body.sections[0].data == b"qos 1"


@pytest.mark.parametrize("version", VERSIONS)
def test_an_mqtt_qos_1_publish_waits_for_an_smqp_subscriber_who_is_away(broker: RunningBroker, closing: list,
                                                                        version: int) -> None:
    topic = f"xp{version}/out/away"
    smqp = SMQPPeer(broker, f"away{version}")
    smqp.subscribe(topic)
    assert smqp.client.command("QUIT").code == 200
    smqp.close()
    mqtt = MQTTClient(broker.ports["mqtt"], version)
    closing.append(mqtt)
    assert mqtt.publish(topic, b"kept for you", 1) == 0  # PUBACK after the commit
    back = SMQPPeer(broker, f"away{version}")
    closing.append(back)
    notify = back.message()
    assert (notify.args, notify.body.sections[0].data) == ((f"/{topic}", "ADD"), b"kept for you")


# ---------------------------------------------------------------------- the others -> MQTT


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("protocol", ["ssmp", "mcchat", "smqp", "socketmq"])
def test_each_protocols_publish_reaches_mqtt_subscribers(broker: RunningBroker, closing: list, protocol: str,
                                                         version: int) -> None:
    top = f"xp{version}/{protocol}"
    exact = MQTTClient(broker.ports["mqtt"], version)
    wild = MQTTClient(broker.ports["mqtt"], version)
    closing += [exact, wild]
    assert exact.subscribe(f"{top}/room/in", 1) == 1
    assert wild.subscribe(f"{top}/+/in", 0) == 0
    publisher = peer(broker, protocol, f"pub{version}")
    closing.append(publisher)

    publisher.publish(f"{top}/room/in", "first")
    publisher.publish(f"{top}/hall/in", "second")
    publisher.publish(f"{top}/room/out", "not matched")
    publisher.publish(f"{top}/room/in", "third")

    got = [exact.message(), exact.message()]
    assert [(m.topic, m.payload) for m in got] == [(f"{top}/room/in", b"first"), (f"{top}/room/in", b"third")]
    assert [m.qos for m in got] == [0, 0], "other protocols' messages are QoS 0"
    got = [wild.message() for _ in range(3)]
    assert [(m.topic, m.payload) for m in got] == [
        (f"{top}/room/in", b"first"), (f"{top}/hall/in", b"second"), (f"{top}/room/in", b"third")]
    assert exact.messages.empty() and wild.messages.empty()


@pytest.mark.parametrize("protocol", ["ssmp", "mcchat", "smqp", "socketmq"])
def test_each_protocols_publish_waits_in_the_store_for_a_persistent_session_away(broker: RunningBroker,
                                                                                 closing: list, protocol: str) -> None:
    """A persistent session's QoS 1 subscription is the core's durable subscription: what any
    protocol publishes while its client is away is stored for it, and comes at QoS 1 when the
    client is back (SMQP's own messages too: the core keeps them for the stored sessions)."""
    top = f"away/{protocol}"
    client_id = f"away-{protocol}"
    device = MQTTClient(broker.ports["mqtt"], MQTTv311, client_id, clean=False)
    assert device.subscribe(f"{top}/#", 1) == 1
    device.disconnect()
    publisher = peer(broker, protocol, "awaypub")
    closing.append(publisher)
    publisher.publish(f"{top}/a", "while away")
    publisher.publish(f"{top}_not/a", "not matched")

    back = MQTTClient(broker.ports["mqtt"], MQTTv311, client_id, clean=False, connect=False)
    closing.append(back)
    back.start()
    present, reason, _properties = back.connack()
    assert (present, reason) == (True, 0)
    message = back.message()
    assert (message.topic, message.payload, message.qos) == (f"{top}/a", b"while away", 1)
    publisher.publish(f"{top}/b", "live")
    message = back.message()
    assert (message.topic, message.payload) == (f"{top}/b", b"live"), "nothing else came first"


def test_an_mqtt_subscription_to_one_topic_is_a_member_that_ssmp_presence_sees(broker: RunningBroker,
                                                                               closing: list) -> None:
    """A filter without wildcards names one topic: the MQTT session joins it as a member, so an
    SSMP presence watcher sees it come and go (under MQTT's own name), while a wildcard filter
    is no member of any topic and is not shown."""
    watcher = SSMPPeer(broker, "presencewatch")
    closing.append(watcher)
    assert watcher.client.request("SUBSCRIBE roomp PRESENCE") == b"200"
    device = MQTTClient(broker.ports["mqtt"], MQTTv311, "presence-dev")
    closing.append(device)
    assert device.subscribe("+/nothing", 0) == 0  # a wildcard: no member of roomp
    assert device.subscribe("roomp", 1) == 1
    joined = watcher.client.line()
    assert joined.startswith(b"000 ") and joined.endswith(b" SUBSCRIBE roomp"), joined
    assert b"presence-dev" in joined and b"mqtt" in joined, joined
    watcher.publish("roomp", "hello")
    message = device.message()
    assert (message.topic, message.payload) == ("roomp", b"hello")
    device.unsubscribe("roomp")
    left = watcher.client.line()  # the next thing the watcher hears
    assert left == joined.replace(b" SUBSCRIBE ", b" UNSUBSCRIBE "), left

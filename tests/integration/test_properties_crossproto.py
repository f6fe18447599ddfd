"""Message properties across protocols on one real ``twistd brokerd`` (docs/architecture.md,
"Message properties"): an MQTT 5 request's User Properties reach SMQP as ``X-`` header lines
and socket.mq as event fields (with its Response Topic, Correlation Data and Content Type);
SMQP's ``X-`` attributes and a socket.mq publish's fields reach an MQTT 5 subscriber as its
properties, so a socket.mq client can ask and an MQTT client answer; each protocol refuses
properties over ``--max-user-properties`` in its own way.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.smqp_fixtures import write_test_accounts
from tests.integration.test_mqtt_crossproto import (  # noqa: F401  (closing: the fixture)
    LISTENERS,
    SMQPPeer,
    WebSocketPeer,
    closing,
)
from tests.integration.test_mqtt_paho import MQTTClient, assert_clean_log
from tests.integration.test_socketmq_hardening import client_frame
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

PAIRS = [("trace", "a"), ("lang", "fr"), ("trace", "b")]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    tmp_path = tmp_path_factory.mktemp("properties-crossproto")
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    running = start_broker(tmp_path, "--open-login", "--accounts", str(accounts), "--max-user-properties", "3",
                           listeners=LISTENERS)
    yield running
    running.stop()
    assert_clean_log(running)


def test_an_mqtt_request_reaches_smqp_and_socketmq_with_its_properties(broker: RunningBroker, closing: list) -> None:
    topic = "props/out"
    smqp = SMQPPeer(broker, "props1")
    web = WebSocketPeer(broker)
    closing += [smqp, web]
    smqp.subscribe(topic)
    web.subscribe(topic)
    mqtt = MQTTClient(broker.ports["mqtt"], MQTTv5)
    closing.append(mqtt)
    mqtt.publish(topic, b'{"op": 1}', 1, UserProperty=PAIRS, ResponseTopic="props/replies",
                 CorrelationData=b"\x00\xff", ContentType="application/json")

    notify = smqp.message()
    assert notify.body.get_all("X-trace") == ["a", "b"] and notify.body.get("X-lang") == "fr"
    assert [name for name, _ in notify.body.attributes if name.startswith("X-")] == ["X-trace", "X-lang", "X-trace"]
    assert notify.body.sections[0].data == b'{"op": 1}'
    assert notify.body.sections[0].attributes[0] == ("Content-Type", "application/json")

    event = web.message()
    assert (event["data"], event["content_type"], event["response_topic"]) == (
        '{"op": 1}', "application/json", "props/replies")
    assert base64.b64decode(event["correlation"]) == b"\x00\xff"
    assert [tuple(pair) for pair in event["user_properties"]] == PAIRS


def test_a_socketmq_request_is_answered_by_an_mqtt_client(broker: RunningBroker, closing: list) -> None:
    """socket.mq asks (response topic, correlation), MQTT 5 answers on the response topic
    with the correlation data, and the answer reaches the socket.mq client with it."""
    responder = MQTTClient(broker.ports["mqtt"], MQTTv5)
    closing.append(responder)
    responder.subscribe("props/requests", 1)
    web = WebSocketPeer(broker)
    closing.append(web)
    web.subscribe("props/answers")
    web.request(type="publish", event="props/requests", data="what time is it",
                response_topic="props/answers", correlation=base64.b64encode(b"q-1").decode(),
                user_properties=[["k", "v"], ["k", "w"]], content_type="text/plain")

    request = responder.message()
    assert request.payload == b"what time is it"
    assert (request.properties.ResponseTopic, request.properties.CorrelationData) == ("props/answers", b"q-1")
    assert request.properties.UserProperty == [("k", "v"), ("k", "w")]
    assert request.properties.ContentType == "text/plain"
    responder.publish(request.properties.ResponseTopic, b"noon", 1, CorrelationData=request.properties.CorrelationData)
    answer = web.message()
    assert (answer["event"], answer["data"], base64.b64decode(answer["correlation"])) == ("props/answers", "noon", b"q-1")


def test_smqp_extension_attributes_are_mqtt_user_properties(broker: RunningBroker, closing: list) -> None:
    topic = "props/smqp"
    mqtt = MQTTClient(broker.ports["mqtt"], MQTTv5)
    closing.append(mqtt)
    mqtt.subscribe(topic, 1)
    smqp = SMQPPeer(broker, "props2")
    closing.append(smqp)
    smqp.create(topic)
    smqp.client.send(smqp.client.publish_bytes(f"/{topic}", "p1", b"reading", ("X-trace", "a"), ("Name", "n"),
                                               ("X-trace", "b")))
    assert smqp.client.reply().code == 200
    got = mqtt.message()
    assert got.payload == b"reading" and got.properties.UserProperty == [("trace", "a"), ("trace", "b")]


def test_each_protocol_refuses_more_user_properties_than_the_limit(broker: RunningBroker, closing: list) -> None:
    """``--max-user-properties 3``: three go (the positive control, last), four are refused:
    MQTT 0x97, SMQP 413, socket.mq 413; none of the refused ones is delivered."""
    topic = "props/limit"
    watcher = MQTTClient(broker.ports["mqtt"], MQTTv5)
    closing.append(watcher)
    watcher.subscribe(topic, 1)
    four = [("k", str(n)) for n in range(4)]

    mqtt = MQTTClient(broker.ports["mqtt"], MQTTv5)
    closing.append(mqtt)
    assert mqtt.publish(topic, b"mqtt four", 1, UserProperty=four) == 0x97

    smqp = SMQPPeer(broker, "props3")
    closing.append(smqp)
    smqp.create(topic)
    smqp.client.send(smqp.client.publish_bytes(f"/{topic}", "p2", b"smqp four", *[(f"X-{n}", v) for n, v in four]))
    reply = smqp.client.reply()
    assert reply.code == 413, reply

    web = WebSocketPeer(broker)
    closing.append(web)
    web.sock.sendall(client_frame(1, json.dumps({"type": "publish", "id": 9, "event": topic, "data": "web four",
                                                 "user_properties": [list(p) for p in four]}).encode()))
    result = web.next()
    assert (result["type"], result["id"], result["status"]) == ("result", 9, 413), result

    web.request(type="publish", event=topic, data="web three", user_properties=[list(p) for p in four[:3]])
    got = watcher.message()
    assert got.payload == b"web three", "nothing refused came before"
    assert got.properties.UserProperty == four[:3]

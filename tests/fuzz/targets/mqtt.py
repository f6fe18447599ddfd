"""MQTT 3.1.1 and 5.0: the server's decoder (a CONNECT first, then what a client sends) and
the client's decoders of both versions, with a small packet size limit, fed whole, cut in two
and byte by byte."""
from __future__ import annotations

from functools import partial
from typing import Any

from brokerd.protocols.mqtt.decoder import MQTTClientDecoder, MQTTServerDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from tests.fuzz.harness import Stream

MAX_PACKET = 1024


def _decoder(make) -> Stream:
    return Stream(make, lambda decoder, data: decoder.feed(data), lambda decoder: decoder.buffered, MAX_PACKET)


SERVER = _decoder(partial(MQTTServerDecoder, MAX_PACKET))
CLIENTS = [_decoder(partial(MQTTClientDecoder, version, MAX_PACKET)) for version in (MQTT_311, MQTT_5)]


def check(data: bytes) -> tuple:
    return SERVER.check(data), *(client.check(data) for client in CLIENTS)


def seeds() -> dict[str, bytes]:
    rich = Properties(content_type="text/plain", response_topic="reply/to", correlation_data=b"\x01",
                      user_properties=(("k", "v"),), message_expiry_interval=60, topic_alias=1)
    found = {}
    for version in (MQTT_311, MQTT_5):
        v5 = version == MQTT_5
        will = Will("last/will", b"gone", 1, True, Properties(will_delay_interval=5) if v5 else Properties())
        client: list[Any] = [
            Connect("c1", True, 30, will, "alice", b"secret",
                    Properties(session_expiry_interval=10, receive_maximum=20) if v5 else Properties()),
            Subscribe(1, (Subscription("a/+/c", 1), Subscription("#", 2)),
                      Properties(subscription_identifiers=(7,)) if v5 else Properties()),
            Publish("a/b/c", b"hello", 1, False, False, 2, rich if v5 else Properties()),
            Publish("a/b", b"\x00\xff", 0, True), Puback(3), Pubrec(4), Pubrel(4), Pubcomp(4),
            Unsubscribe(5, ("a/+/c",)), Pingreq(), Disconnect(),
        ]
        server: list[Any] = [
            Connack(True, 0, Properties(assigned_client_identifier="c1", topic_alias_maximum=5) if v5 else Properties()),
            Suback(1, (1, 2)), Publish("a/b/c", b"hello", 2, False, False, 9), Unsuback(5, (0,) if v5 else ()),
            Pingresp(), Puback(9),
        ]
        if v5:
            client.append(Auth(0x18, Properties(authentication_method="SCRAM", authentication_data=b"x")))
            server.append(Disconnect(0x8E, Properties(reason_string="taken over")))
        found[f"client-v{version}"] = b"\x80" + b"".join(encode(packet, version) for packet in client)
        found[f"server-v{version}"] = b"\x10" + b"".join(encode(packet, version) for packet in server)
    return found

"""The MQTT encoder refuses what the other side's decoder would refuse; and PublishFrame, the
PUBLISH encoded once for many subscribers, gives the same bytes as encoding each copy."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.protocols.mqtt.datatypes import encode_vbi
from brokerd.protocols.mqtt.decoder import MQTTClientDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubrel,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from brokerd.protocols.mqtt.publish import PublishFrame
from tests.protocols.mqtt.strategies import publish
from tests.support.examples import examples

V4, V5 = MQTT_311, MQTT_5
ALIAS = Properties(topic_alias=1)
REFUSED = [
    (V4, Connect("c", properties=Properties(session_expiry_interval=1))),
    (V4, Connect("c", password=b"p")),
    (V4, Connect("", clean_start=False)),
    (V5, Connect("c", keep_alive=65536)),
    (V5, Connect("c", will=Will("a/+"))),
    (V5, Connect("c", will=Will(""))),
    (V5, Connect("c", will=Will("w", qos=3))),
    (V5, Connect("c", will=Will("w", payload=b"x" * 65536))),
    (V5, Connect("c", will=Will("w", properties=Properties(session_expiry_interval=1)))),
    (V5, Connect("c\x00")),
    (V5, Connect("\ud800")),
    (V5, Connect("c", properties=Properties(authentication_data=b"x"))),
    (V4, Connack(False, 6)),
    (V4, Connack(False, 0x84)),
    (V5, Connack(False, 0x01)),
    (V5, Connack(True, 0x80)),
    (V4, Publish("t", qos=1)),
    (V4, Publish("t", packet_id=1)),
    (V4, Publish("t", dup=True)),
    (V4, Publish("t", qos=3, packet_id=1)),
    (V4, Publish("t", qos=1, packet_id=65536)),
    (V4, Publish("t", qos=1, packet_id=0)),
    (V4, Publish("a/#")),
    (V4, Publish("")),
    (V5, Publish("")),
    (V4, Publish("", properties=ALIAS)),
    (V5, Publish("t", properties=Properties(receive_maximum=1))),
    (V4, Puback(1, 0x10)),
    (V4, Puback(1, properties=Properties(reason_string="r"))),
    (V5, Puback(1, 0x92)),
    (V5, Pubrel(1, 0x10)),
    (V5, Puback(0)),
    (V5, Subscribe(1, ())),
    (V4, Subscribe(1, (Subscription("t", 1, no_local=True),))),
    (V4, Subscribe(1, (Subscription("t", 1, retain_handling=1),))),
    (V5, Subscribe(1, (Subscription("t", 3),))),
    (V5, Subscribe(1, (Subscription("t", 1, retain_handling=3),))),
    (V5, Subscribe(1, (Subscription("$share/g/t", 1, no_local=True),))),
    (V5, Suback(1, ())),
    (V4, Suback(1, (0x8F,))),
    (V5, Suback(1, (0x03,))),
    (V5, Unsubscribe(1, ())),
    (V4, Unsuback(1, (0,))),
    (V5, Unsuback(1, ())),
    (V5, Unsuback(1, (0x01,))),
    (V4, Disconnect(0x04)),
    (V5, Disconnect(0x01)),
    (V5, Disconnect(properties=Properties(topic_alias=1))),
    (V4, Auth()),
    (V5, Auth(0x80)),
]


@pytest.mark.parametrize("version, packet", REFUSED)
def test_what_the_encoder_refuses(version, packet) -> None:
    with pytest.raises(ValueError):
        encode(packet, version)


def test_wrong_types_and_versions() -> None:
    with pytest.raises(TypeError):
        encode(object(), V5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode(Disconnect(), 3)
    with pytest.raises(TypeError):
        encode(Publish("t", "text"), V5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode(Connect(b"c"), V5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode(Connect("c", password="p"), V5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_vbi(268_435_456)
    with pytest.raises(ValueError):
        encode_vbi(-1)
    assert encode(Publish("t", b"x" * 16_384), V4)[:4] == b"\x30\x83\x80\x01"


def test_a_publish_frame_gives_each_subscriber_its_copy() -> None:
    frame = PublishFrame("a/b", b"hi", V5, Properties(content_type="text/plain"))
    assert frame.packet() == encode(Publish("a/b", b"hi", properties=Properties(content_type="text/plain")), V5)
    assert frame.packet() is frame.packet()
    assert frame.packet(retain=True) == encode(
        Publish("a/b", b"hi", retain=True, properties=Properties(content_type="text/plain")), V5
    )
    for packet_id in (1, 258, 65535):
        expected = encode(
            Publish("a/b", b"hi", 2, True, True, packet_id, Properties(content_type="text/plain")), V5
        )
        assert frame.packet(2, True, packet_id, True) == expected
        assert frame.head(2, True, packet_id, True) + frame.tail == expected
        assert frame.size(2) == len(expected)
    assert frame.size(0) == len(frame.packet())
    decoded, error = MQTTClientDecoder(V5).feed(frame.packet(1, packet_id=7))
    assert error is None and decoded[0].packet_id == 7


def test_a_publish_frame_with_subscription_identifiers() -> None:
    frame = PublishFrame("a/b", b"hi", V5, Properties(user_properties=(("k", "v"),)))
    tagged = frame.with_subscription_identifiers((3, 300))
    expected = Publish("a/b", b"hi", 1, packet_id=9, properties=Properties(
        subscription_identifiers=(3, 300), user_properties=(("k", "v"),)))
    assert MQTTClientDecoder(V5).feed(tagged.packet(1, packet_id=9)) == ([expected], None)
    assert frame.packet() != tagged.packet()
    assert tagged.topic == "a/b"
    with pytest.raises(ValueError):
        PublishFrame("a/b", b"", V4).with_subscription_identifiers((1,))
    with pytest.raises(ValueError):
        frame.with_subscription_identifiers((0,))


@pytest.mark.parametrize(
    "call",
    [
        lambda frame: frame.head(1),
        lambda frame: frame.head(1, packet_id=0),
        lambda frame: frame.head(3, packet_id=1),
        lambda frame: frame.head(0, packet_id=1),
        lambda frame: frame.head(0, dup=True),
        lambda frame: frame.packet(0, packet_id=1),
    ],
)
def test_a_publish_frame_refuses_what_a_subscriber_could_not_read(call) -> None:
    with pytest.raises(ValueError):
        call(PublishFrame("t", b"", V4))


def test_a_publish_frame_checks_once_at_construction() -> None:
    for args in (("a/+", b"", V4), ("", b"", V4), ("", b"", V5), ("t", b"", 6)):
        with pytest.raises(ValueError):
            PublishFrame(*args)
    with pytest.raises(TypeError):
        PublishFrame("t", "text", V4)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PublishFrame("t", b"", V4, ALIAS)
    assert PublishFrame("", b"", V5, ALIAS).packet() == bytes.fromhex("3006 0000 03 230001".replace(" ", ""))


@settings(max_examples=examples(100))
@given(st.sampled_from((V4, V5)).flatmap(lambda v: st.tuples(st.just(v), publish(v, from_server=True))))
def test_frames_and_encode_agree(case) -> None:
    version, packet = case
    frame = PublishFrame(packet.topic, packet.payload, version, packet.properties)
    wire = frame.packet(packet.qos, packet.retain, packet.packet_id, packet.dup)
    assert wire == encode(packet, version)
    assert frame.head(packet.qos, packet.retain, packet.packet_id, packet.dup) + frame.tail == wire
    assert MQTTClientDecoder(version).feed(wire) == ([packet], None)

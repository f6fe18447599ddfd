"""The v5 property table (MQTT 5.0 2.2.2.2) and the rules on property blocks: where each property
may go, which may repeat, and which values are refused."""
from __future__ import annotations

import pytest

from brokerd.protocols.mqtt.datatypes import encode_vbi
from brokerd.protocols.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PUBACK,
    PUBLISH,
    SUBSCRIBE,
    UNSUBSCRIBE,
    WILL,
    Properties,
)
from brokerd.protocols.mqtt.properties import (
    BINARY,
    BY_ATTRIBUTE,
    BYTE,
    FOUR_BYTE,
    PROPERTIES,
    STRING,
    STRING_PAIR,
    TWO_BYTE,
    VARIABLE_BYTE,
    allowed_in,
    check_properties,
    encode_properties,
    read_properties,
)
from brokerd.protocols.mqtt.reasons import MQTTProtocolError

SAMPLE = {
    BYTE: b"\x01",
    TWO_BYTE: b"\x00\x07",
    FOUR_BYTE: b"\x00\x00\x00\x07",
    VARIABLE_BYTE: b"\x07",
    STRING: b"\x00\x01a",
    BINARY: b"\x00\x01\xff",
    STRING_PAIR: b"\x00\x01k\x00\x01v",
}
PACKET_TYPES = [*range(1, 16), WILL]


def block(*items: bytes) -> bytes:
    body = b"".join(items)
    return encode_vbi(len(body)) + body


def read(raw: bytes, packet_type: int) -> Properties:
    properties, end = read_properties(raw, 0, len(raw), packet_type)
    assert end == len(raw)
    return properties


def test_the_table_has_every_v5_property_with_its_type() -> None:
    assert sorted(PROPERTIES) == [
        0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x11, 0x12, 0x13, 0x15, 0x16, 0x17, 0x18, 0x19,
        0x1A, 0x1C, 0x1F, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A,
    ]
    kinds = {identifier: spec.kind for identifier, spec in PROPERTIES.items()}
    assert kinds[0x01] == BYTE and kinds[0x02] == FOUR_BYTE and kinds[0x0B] == VARIABLE_BYTE
    assert kinds[0x13] == TWO_BYTE and kinds[0x16] == BINARY and kinds[0x26] == STRING_PAIR
    assert kinds[0x1F] == STRING
    assert set(BY_ATTRIBUTE) == set(Properties.__dataclass_fields__)
    assert {spec.identifier for spec in allowed_in(WILL)} == {0x01, 0x02, 0x03, 0x08, 0x09, 0x18, 0x26}
    assert {spec.identifier for spec in allowed_in(CONNECT)} == {0x11, 0x15, 0x16, 0x17, 0x19, 0x21, 0x22, 0x26, 0x27}
    assert {spec.identifier for spec in allowed_in(PUBACK)} == {0x1F, 0x26}
    assert {spec.identifier for spec in allowed_in(UNSUBSCRIBE)} == {0x26}
    assert {spec.identifier for spec in allowed_in(SUBSCRIBE)} == {0x0B, 0x26}
    assert {spec.identifier for spec in allowed_in(DISCONNECT)} == {0x11, 0x1C, 0x1F, 0x26}
    assert {spec.identifier for spec in allowed_in(AUTH)} == {0x15, 0x16, 0x1F, 0x26}
    assert allowed_in(12) == allowed_in(13) == ()


@pytest.mark.parametrize("identifier", sorted(PROPERTIES))
def test_each_property_is_read_where_allowed_and_refused_elsewhere(identifier) -> None:
    spec = PROPERTIES[identifier]
    raw = block(bytes((identifier,)), SAMPLE[spec.kind])
    for packet_type in PACKET_TYPES:
        if packet_type in spec.packets:
            properties = read(raw, packet_type)
            assert getattr(properties, spec.attribute) not in (None, ())
            assert encode_properties(properties, packet_type) == raw
        else:
            with pytest.raises(MQTTProtocolError) as caught:
                read(raw, packet_type)
            assert caught.value.reason_code == 0x81
            with pytest.raises(ValueError):
                encode_properties(read(raw, next(iter(spec.packets))), packet_type)


def test_user_properties_repeat_in_order() -> None:
    raw = block(b"\x26\x00\x01b\x00\x011", b"\x26\x00\x01a\x00\x012", b"\x26\x00\x01b\x00\x013")
    properties = read(raw, PUBLISH)
    assert properties.user_properties == (("b", "1"), ("a", "2"), ("b", "3"))
    assert encode_properties(properties, PUBLISH) == raw


def test_subscription_identifiers_repeat_in_publish_only() -> None:
    raw = block(b"\x0b\x01", b"\x0b\x80\x01")
    assert read(raw, PUBLISH).subscription_identifiers == (1, 128)
    with pytest.raises(MQTTProtocolError) as caught:
        read(raw, SUBSCRIBE)
    assert caught.value.reason_code == 0x82
    with pytest.raises(ValueError):
        check_properties(Properties(subscription_identifiers=(1, 2)), SUBSCRIBE)


@pytest.mark.parametrize("identifier", sorted(set(PROPERTIES) - {0x26, 0x0B}))
def test_other_properties_may_not_repeat(identifier) -> None:
    spec = PROPERTIES[identifier]
    one = bytes((identifier,)) + SAMPLE[spec.kind]
    packet_type = min(spec.packets)
    read(block(one), packet_type)
    with pytest.raises(MQTTProtocolError) as caught:
        read(block(one, one), packet_type)
    assert caught.value.reason_code == 0x82


@pytest.mark.parametrize(
    "raw, packet_type",
    [
        (b"\x01\x02", PUBLISH),
        (b"\x0b\x00", SUBSCRIBE),
        (b"\x17\x02", CONNECT),
        (b"\x19\x05", CONNECT),
        (b"\x21\x00\x00", CONNACK),
        (b"\x23\x00\x00", PUBLISH),
        (b"\x24\x02", CONNACK),
        (b"\x25\x02", CONNACK),
        (b"\x27\x00\x00\x00\x00", CONNECT),
        (b"\x28\x02", CONNACK),
        (b"\x29\x02", CONNACK),
        (b"\x2a\x02", CONNACK),
        (b"\x08\x00\x03a/#", WILL),
    ],
)
def test_values_the_spec_calls_a_protocol_error(raw, packet_type) -> None:
    with pytest.raises(MQTTProtocolError) as caught:
        read(block(raw), packet_type)
    assert caught.value.reason_code == 0x82
    spec = PROPERTIES[raw[0]]
    bad = {"payload_format_indicator": 2, "subscription_identifiers": (0,), "request_problem_information": 2,
           "request_response_information": 5, "receive_maximum": 0, "topic_alias": 0, "maximum_qos": 2,
           "retain_available": 2, "maximum_packet_size": 0, "wildcard_subscription_available": 2,
           "subscription_identifier_available": 2, "shared_subscription_available": 2,
           "response_topic": "a/#"}[spec.attribute]
    with pytest.raises(ValueError):
        check_properties(Properties(**{spec.attribute: bad}), packet_type)


def test_blocks_that_cannot_be_read() -> None:
    for raw in (b"\x05\x01\x01", b"\x02\x02\x00", b"\x03\x09\x00\x05", b"\x80", b"\x01\x00", b"\x02\x80\x01"):
        with pytest.raises(MQTTProtocolError) as caught:
            read(raw, PUBLISH)
        assert caught.value.reason_code == 0x81, raw
    assert read(b"\x00", PUBLISH) == Properties()


def test_writing_checks_types() -> None:
    with pytest.raises(TypeError):
        check_properties(Properties(topic_alias="1"), PUBLISH)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_properties(Properties(maximum_qos=True), CONNACK)
    with pytest.raises(ValueError):
        check_properties(Properties(user_properties=(("only one",),)), PUBLISH)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check_properties(Properties(message_expiry_interval=2**32), PUBLISH)
    with pytest.raises(ValueError):
        check_properties(Properties(content_type="x" * 65536), PUBLISH)
    with pytest.raises(TypeError):
        check_properties({"topic_alias": 1}, PUBLISH)  # type: ignore[arg-type]
    check_properties(Properties(message_expiry_interval=2**32 - 1, content_type="x" * 65535), PUBLISH)


def test_repr_shows_only_what_is_present() -> None:
    assert repr(Properties()) == "Properties()"
    assert repr(Properties(topic_alias=3, user_properties=(("a", "b"),))) == (
        "Properties(topic_alias=3, user_properties=(('a', 'b'),))"
    )

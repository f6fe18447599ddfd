"""Known bytes: each packet written out by hand from the layouts of MQTT 3.1.1 and MQTT 5.0 (the
figures of chapter 3 and the examples of 1.5.4, 1.5.5, 3.8.3, 3.9.3, 3.10.3), both encoded and
decoded; and the longer forms of the v5 acknowledgements that the encoder never writes but a
peer may."""
from __future__ import annotations

import pytest

from brokerd.protocols.mqtt.datatypes import encode_string, encode_vbi, read_string, read_vbi
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

V4, V5 = MQTT_311, MQTT_5
CONNECT_V4 = bytes.fromhex("100e00044d5154540402003c00026331")
CONNECT_V5 = bytes.fromhex("100f00044d5154540502003c0000026331")


def from_client(version: int, data: bytes) -> list:
    """What a server decodes from ``data`` sent after a plain CONNECT of ``version``."""
    decoder = MQTTServerDecoder()
    packets, error = decoder.feed((CONNECT_V4 if version == V4 else CONNECT_V5) + data)
    assert error is None, error
    return packets[1:]


def from_server(version: int, data: bytes) -> list:
    packets, error = MQTTClientDecoder(version).feed(data)
    assert error is None, error
    return packets


@pytest.mark.parametrize(
    "value, wire",
    [
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (16_383, "ff7f"),
        (16_384, "808001"),
        (2_097_151, "ffff7f"),
        (2_097_152, "80808001"),
        (268_435_455, "ffffff7f"),
    ],
)
def test_variable_byte_integers_of_the_spec_table(value, wire) -> None:
    raw = bytes.fromhex(wire)
    assert encode_vbi(value) == raw
    assert read_vbi(raw, 0, len(raw)) == (value, len(raw))


def test_the_utf8_string_example_of_1_5_4() -> None:
    raw = bytes.fromhex("000541f0aa9b94")
    assert encode_string("A\U0002A6D4") == raw
    assert read_string(raw, 0, len(raw)) == ("A\U0002A6D4", 7)


CLIENT_VECTORS = [
    (V4, Connect("c1", True, 60), "100e 00044d515454 04 02 003c 00026331"),
    (
        V4,
        Connect("id", True, 10, Will("w", b"x", 1, True), "u", b"p"),
        "101a 00044d515454 04 ee 000a 00026964 000177 000178 000175 000170",
    ),
    (
        V5,
        Connect("c", True, 10, properties=Properties(session_expiry_interval=10)),
        "1013 00044d515454 05 02 000a 05 110000000a 000163",
    ),
    (
        V5,
        Connect("c", False, 0, Will("w", b"", 0, False, Properties(will_delay_interval=5)), None, b"pw"),
        "101d 00044d515454 05 44 0000 00 000163 05 1800000005 000177 0000 00027077",
    ),
    (V4, Publish("a/b", b"hi"), "3007 0003612f62 6869"),
    (V4, Publish("a/b", b"hi", 1, True, True, 10), "3b09 0003612f62 000a 6869"),
    (V5, Publish("a/b", b"hi"), "3008 0003612f62 00 6869"),
    (
        V5,
        Publish(
            "a/b", b"hi", 1, packet_id=10,
            properties=Properties(payload_format_indicator=1, topic_alias=5, user_properties=(("k", "v"),)),
        ),
        "3216 0003612f62 000a 0c 0101 230005 2600016b000176 6869",
    ),
    (V5, Publish("", b"", 2, packet_id=1, properties=Properties(topic_alias=1)), "3408 0000 0001 03 230001"),
    (V4, Puback(10), "4002 000a"),
    (V5, Puback(10), "4002 000a"),
    (V5, Puback(10, 0x10), "4003 000a 10"),
    (V5, Puback(10, 0x10, Properties(reason_string="r")), "4008 000a 10 04 1f000172"),
    (V4, Pubrec(10), "5002 000a"),
    (V5, Pubrec(10, 0x97), "5003 000a 97"),
    (V4, Pubrel(10), "6202 000a"),
    (V5, Pubrel(10, 0x92), "6203 000a 92"),
    (V4, Pubcomp(10), "7002 000a"),
    (
        V4,
        Subscribe(10, (Subscription("a/b", 1), Subscription("c/d", 2))),
        "820e 000a 0003612f62 01 0003632f64 02",
    ),
    (
        V5,
        Subscribe(10, (Subscription("a/b", 1, True, True, 2),), Properties(subscription_identifiers=(5,))),
        "820b 000a 02 0b05 0003612f62 2d",
    ),
    (V4, Unsubscribe(10, ("a/b", "c/d")), "a20c 000a 0003612f62 0003632f64"),
    (V5, Unsubscribe(10, ("a/b", "c/d")), "a20d 000a 00 0003612f62 0003632f64"),
    (V4, Pingreq(), "c000"),
    (V4, Disconnect(), "e000"),
    (V5, Disconnect(), "e000"),
    (V5, Disconnect(0x04), "e001 04"),
    (V5, Disconnect(0, Properties(session_expiry_interval=0)), "e007 00 05 1100000000"),
    (V5, Auth(), "f000"),
    (
        V5,
        Auth(0x18, Properties(authentication_method="m", authentication_data=b"d")),
        "f00a 18 08 1500016d 16000164",
    ),
]

SERVER_VECTORS = [
    (V4, Connack(), "2002 00 00"),
    (V4, Connack(True, 0), "2002 01 00"),
    (V4, Connack(False, 5), "2002 00 05"),
    (V5, Connack(), "2003 00 00 00"),
    (
        V5,
        Connack(False, 0, Properties(assigned_client_identifier="ab", topic_alias_maximum=10)),
        "200b 00 00 08 1200026162 22000a",
    ),
    (V5, Connack(False, 0x84), "2003 00 84 00"),
    (V4, Publish("a/b", b"hi"), "3007 0003612f62 6869"),
    (
        V5,
        Publish("a/b", b"", properties=Properties(subscription_identifiers=(1, 200))),
        "300b 0003612f62 05 0b01 0bc801",
    ),
    (V4, Suback(10, (0x00, 0x02, 0x80)), "9005 000a 000280"),
    (V5, Suback(10, (0x01, 0x8F)), "9005 000a 00 018f"),
    (V4, Unsuback(10), "b002 000a"),
    (V5, Unsuback(10, (0x11,)), "b004 000a 00 11"),
    (V4, Pingresp(), "d000"),
    (V5, Disconnect(0x8E), "e001 8e"),
    (V5, Puback(10), "4002 000a"),
]


@pytest.mark.parametrize("version, packet, wire", CLIENT_VECTORS)
def test_client_packets_have_the_layout_of_the_spec(version, packet, wire) -> None:
    raw = bytes.fromhex(wire.replace(" ", ""))
    assert encode(packet, version) == raw
    if isinstance(packet, Connect):
        decoder = MQTTServerDecoder()
        assert decoder.feed(raw) == ([packet], None)
        assert decoder.version == version
    else:
        assert from_client(version, raw) == [packet]


@pytest.mark.parametrize("version, packet, wire", SERVER_VECTORS)
def test_server_packets_have_the_layout_of_the_spec(version, packet, wire) -> None:
    raw = bytes.fromhex(wire.replace(" ", ""))
    assert encode(packet, version) == raw
    assert from_server(version, raw) == [packet]


@pytest.mark.parametrize(
    "wire, packet",
    [
        ("4004 000a 00 00", Puback(10)),
        ("5004 000a 10 00", Pubrec(10, 0x10)),
        ("6203 000a 00", Pubrel(10)),
        ("e001 00", Disconnect()),
        ("e002 04 00", Disconnect(0x04)),
        ("f001 00", Auth()),
        ("f002 00 00", Auth()),
        ("3008 0003612f62 00 6869", Publish("a/b", b"hi")),
        ("3009 0003612f62 01 00 6869", None),  # a Property Length of 1 holding 0x00: no such property
    ],
)
def test_longer_v5_forms_a_peer_may_send(wire, packet) -> None:
    raw = bytes.fromhex(wire.replace(" ", ""))
    decoder = MQTTServerDecoder()
    packets, error = decoder.feed(CONNECT_V5 + raw)
    if packet is None:
        assert error is not None and error.reason_code == 0x81
        assert len(packets) == 1
    else:
        assert (packets[1:], error) == ([packet], None)

"""Every malformation the MQTT decoder refuses, and the v5 reason code it answers with; that the
fixed header is judged before a byte of the body is kept; and the error's bookkeeping (the
packets before it, its packet type and version, repeated on every later call)."""
from __future__ import annotations

import pytest

from brokerd.errors import ProtocolError
from brokerd.protocols.mqtt.decoder import MQTTClientDecoder, MQTTServerDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311, Pingreq, Publish
from brokerd.protocols.mqtt.reasons import MQTTProtocolError, connack_return_code
from tests.protocols.mqtt.test_vectors import CONNECT_V4, CONNECT_V5

MALFORMED, PROTOCOL, UNSUPPORTED, CLIENT_ID, TOPIC_NAME, TOO_LARGE = 0x81, 0x82, 0x84, 0x85, 0x90, 0x95
V4, V5 = MQTT_311, MQTT_5

# (version, bytes after a valid CONNECT, reason code): what a client may not send a server.
AFTER_CONNECT = [
    # fixed header
    (V4, "0000", MALFORMED),
    (V4, "f000", MALFORMED),
    (V5, "6002000a", MALFORMED),
    (V5, "8006000a00016100", MALFORMED),
    (V5, "a005000a000161", MALFORMED),
    (V4, "c100", MALFORMED),
    (V4, "e100", MALFORMED),
    (V4, "36070003612f62000a", MALFORMED),
    (V5, "38050003612f62", MALFORMED),
    (V4, "9003000a00", PROTOCOL),
    (V5, "20020000", PROTOCOL),
    (V4, CONNECT_V4.hex(), PROTOCOL),
    (V4, "30ffffff8001", MALFORMED),
    (V4, "c08000", MALFORMED),
    # Packet Identifier 0
    (V4, "32070003612f620000", PROTOCOL),
    (V5, "40020000", PROTOCOL),
    (V4, "8206000000016100", PROTOCOL),
    (V5, "a2050000000000", PROTOCOL),
    # UTF-8 strings
    (V4, "30050003610062", MALFORMED),
    (V4, "30050003eda080", MALFORMED),
    (V5, "30050002c32800", MALFORMED),
    (V4, "30040002c0af", MALFORMED),
    (V4, "8206000a0001ff00", MALFORMED),
    # topic names
    (V4, "30050003612f2b", TOPIC_NAME),
    (V5, "300600032f2f2300", TOPIC_NAME),
    (V4, "30020000", PROTOCOL),
    (V5, "3003000000", PROTOCOL),
    # SUBSCRIBE and UNSUBSCRIBE
    (V4, "8202000a", PROTOCOL),
    (V5, "8203000a00", PROTOCOL),
    (V4, "8206000a00016104", MALFORMED),
    (V4, "8206000a00016103", MALFORMED),
    (V5, "8207000a0000016140", MALFORMED),
    (V5, "8207000a0000016103", PROTOCOL),
    (V5, "8207000a0000016130", PROTOCOL),
    (V5, "8210000a00000a2473686172652f672f7404", PROTOCOL),
    (V4, "8205000a000161", MALFORMED),
    (V4, "a202000a", PROTOCOL),
    (V5, "a203000a00", PROTOCOL),
    (V4, "a204000a0003", MALFORMED),
    # properties
    (V5, "3006000161020500", MALFORMED),
    (V5, "3009000161051100000000", MALFORMED),
    (V5, "300a00016106230001230002", PROTOCOL),
    (V5, "300700016103230000", PROTOCOL),
    (V5, "3006000161020102", PROTOCOL),
    (V5, "30050001610201", MALFORMED),
    (V5, "300500016108ff", MALFORMED),
    (V5, "3006000161020b01", PROTOCOL),
    (V5, "820b000a040b010b0200016100", PROTOCOL),
    (V5, "8209000a020b0000016100", PROTOCOL),
    (V5, "300700016103080001", MALFORMED),
    (V5, "300900016105080002612b", PROTOCOL),
    (V5, "3006000161028001", MALFORMED),
    # reason codes and lengths of the acknowledgements and the rest
    (V5, "4003000a05", PROTOCOL),
    (V5, "6203000a10", PROTOCOL),
    (V5, "e00105", PROTOCOL),
    (V5, "f00104", PROTOCOL),
    (V5, "f0051803160000", PROTOCOL),
    (V4, "4003000a00", MALFORMED),
    (V4, "e00100", MALFORMED),
    (V4, "c00100", MALFORMED),
    (V5, "4005000a000100", MALFORMED),
    (V5, "4005000a00001f", MALFORMED),
]


@pytest.mark.parametrize("version, wire, reason", AFTER_CONNECT)
def test_what_a_server_refuses_after_connect(version, wire, reason) -> None:
    connect = CONNECT_V4 if version == V4 else CONNECT_V5
    decoder = MQTTServerDecoder()
    packets, error = decoder.feed(connect + bytes.fromhex(wire))
    assert len(packets) == 1
    assert isinstance(error, MQTTProtocolError), packets
    assert (hex(error.reason_code), error.version) == (hex(reason), version), str(error)
    assert error.packet_type == bytes.fromhex(wire)[0] >> 4
    assert decoder.buffered == 0


def _connect(flags: str, payload: str, level: str = "04", name: str = "00044d515454", props: str = "") -> bytes:
    body = bytes.fromhex(name + level + flags + "003c" + props + payload)
    return bytes((0x10, len(body))) + body


CONNECTS = [
    ("the protocol name MQTX", _connect("02", "000163", name="00044d515458"), MALFORMED, None),
    ("MQTT 3.1's MQIsdp", _connect("02", "000163", "03", "00064d5149736470"), UNSUPPORTED, None),
    ("protocol level 3", _connect("02", "000163", "03"), UNSUPPORTED, None),
    ("protocol level 6", _connect("02", "000163", "06"), UNSUPPORTED, None),
    ("the reserved flag", _connect("03", "000163"), MALFORMED, V4),
    ("Will QoS 3", _connect("1e", "000163000177000178"), MALFORMED, V4),
    ("Will QoS without the Will Flag", _connect("0a", "000163"), MALFORMED, V4),
    ("Will Retain without the Will Flag", _connect("22", "000163"), MALFORMED, V4),
    ("3.1.1 password without user name", _connect("42", "0001630001ff"), MALFORMED, V4),
    ("3.1.1 empty client id without Clean Session", _connect("00", "0000"), CLIENT_ID, V4),
    ("a client id holding U+0000", _connect("02", "000100"), MALFORMED, V4),
    ("a Will Topic with a wildcard", _connect("06", "0001630001230000"), TOPIC_NAME, V4),
    ("an empty Will Topic", _connect("06", "00016300000000"), TOPIC_NAME, V4),
    ("a missing Will Payload", _connect("06", "000163000177"), MALFORMED, V4),
    ("a missing user name", _connect("82", "000163"), MALFORMED, V4),
    ("trailing bytes", _connect("02", "00016300"), MALFORMED, V4),
    ("no flags at all", bytes.fromhex("100700044d51545404"), MALFORMED, V4),
    ("Receive Maximum 0", _connect("02", "000163", "05", props="03210000"), PROTOCOL, V5),
    ("Authentication Data alone", _connect("02", "000163", "05", props="0416000161"), PROTOCOL, V5),
    ("a Topic Alias in CONNECT", _connect("02", "000163", "05", props="03230001"), MALFORMED, V5),
    ("Will Delay Interval outside the will", _connect("02", "000163", "05", props="051800000001"), MALFORMED, V5),
    ("Request Problem Information 2", _connect("02", "000163", "05", props="021702"), PROTOCOL, V5),
    ("a PINGREQ before CONNECT", bytes.fromhex("c000"), PROTOCOL, None),
    ("a PUBLISH before CONNECT", encode(Publish("t"), V4), PROTOCOL, None),
]


@pytest.mark.parametrize("why, wire, reason, version", CONNECTS, ids=[c[0] for c in CONNECTS])
def test_what_a_server_refuses_in_the_connect(why, wire, reason, version) -> None:
    decoder = MQTTServerDecoder()
    packets, error = decoder.feed(wire)
    assert packets == []
    assert isinstance(error, MQTTProtocolError)
    assert (hex(error.reason_code), error.version) == (hex(reason), version), str(error)


def test_3_1_1_connect_errors_map_to_connack_return_codes() -> None:
    assert connack_return_code(UNSUPPORTED) == 1
    assert connack_return_code(CLIENT_ID) == 2
    assert connack_return_code(0x86) == 4
    assert connack_return_code(MALFORMED) is None


FROM_SERVERS = [
    (V4, "20020006", PROTOCOL),
    (V4, "20020200", MALFORMED),
    (V4, "20020101", PROTOCOL),
    (V5, "2003000100", PROTOCOL),
    (V5, "2003018000", PROTOCOL),
    (V5, "2003020000", MALFORMED),
    (V4, "2003000000", MALFORMED),
    (V4, "9003000a03", PROTOCOL),
    (V4, "9002000a", PROTOCOL),
    (V5, "9004000a0003", PROTOCOL),
    (V4, "b003000a00", MALFORMED),
    (V5, "b003000a00", PROTOCOL),
    (V4, "e000", PROTOCOL),
    (V4, "8206000a00016100", PROTOCOL),
    (V5, "c000", PROTOCOL),
    (V4, "f000", MALFORMED),
]


@pytest.mark.parametrize("version, wire, reason", FROM_SERVERS)
def test_what_a_client_refuses(version, wire, reason) -> None:
    packets, error = MQTTClientDecoder(version).feed(encode(Publish("ok"), version) + bytes.fromhex(wire))
    assert packets == [Publish("ok")]
    assert isinstance(error, MQTTProtocolError)
    assert hex(error.reason_code) == hex(reason), str(error)


def test_the_fixed_header_is_judged_before_the_body_arrives() -> None:
    for first in (b"\x00", b"\x60", b"\x90", b"\x10"):
        decoder = MQTTServerDecoder()
        decoder.feed(CONNECT_V4)
        packets, error = decoder.feed(first)
        assert packets == [] and isinstance(error, MQTTProtocolError), first
        assert decoder.buffered == 0
    # What may be fine is kept until the rest comes.
    decoder = MQTTServerDecoder()
    decoder.feed(CONNECT_V4)
    assert decoder.feed(b"\x30") == ([], None)
    assert decoder.buffered == 1
    assert decoder.feed(b"\x03\x00\x01t") == ([Publish("t")], None)


def test_a_fifth_length_byte_is_refused_without_waiting_for_it() -> None:
    decoder = MQTTServerDecoder()
    decoder.feed(CONNECT_V4)
    assert decoder.feed(b"\x30\xff\xff\xff") == ([], None)
    packets, error = decoder.feed(b"\xff")
    assert error is not None and error.reason_code == MALFORMED
    assert "four bytes" in str(error)


def test_a_packet_over_the_size_limit_is_refused_from_its_header() -> None:
    decoder = MQTTServerDecoder(max_packet_size=1000)
    decoder.feed(CONNECT_V5)
    # 1 + 2 + 997 = 1000 bytes: allowed, and it is kept until complete.
    allowed = encode(Publish("t", b"x" * (997 - 4)), MQTT_5)
    assert len(allowed) == 1000
    assert decoder.feed(allowed[:500]) == ([], None)
    assert decoder.buffered == 500
    assert decoder.feed(allowed[500:]) == ([Publish("t", b"x" * 993)], None)
    # One byte more: refused as soon as the Remaining Length is known, nothing kept.
    too_big = encode(Publish("t", b"x" * 994), MQTT_5)
    packets, error = decoder.feed(too_big[:3])
    assert packets == [] and error is not None
    assert (error.reason_code, error.packet_type, error.version) == (TOO_LARGE, 3, MQTT_5)
    assert decoder.buffered == 0
    # A Remaining Length of 268,435,455 is refused just the same.
    decoder = MQTTServerDecoder(max_packet_size=1000)
    decoder.feed(CONNECT_V5)
    assert decoder.feed(b"\x30\xff\xff\xff\x7f")[1].reason_code == TOO_LARGE


def test_an_error_ends_the_stream_after_the_packets_before_it() -> None:
    decoder = MQTTServerDecoder()
    ping = encode(Pingreq(), MQTT_311)
    packets, error = decoder.feed(CONNECT_V4 + ping + b"\x00\x00" + ping)
    assert [type(p).__name__ for p in packets] == ["Connect", "Pingreq"]
    assert isinstance(error, ProtocolError) and error.reply is None
    assert decoder.feed(ping) == ([], error)
    assert decoder.failed is error
    assert "0x81" in repr(error)


def test_limits_of_the_constructors() -> None:
    with pytest.raises(ValueError):
        MQTTServerDecoder(max_packet_size=1)
    with pytest.raises(ValueError):
        MQTTServerDecoder(max_packet_size=268_435_461)
    with pytest.raises(ValueError):
        MQTTClientDecoder(3)
    assert MQTTServerDecoder(max_packet_size=268_435_460).max_packet_size == 268_435_460

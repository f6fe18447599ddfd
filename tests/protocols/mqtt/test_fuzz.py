"""Hypothesis against the MQTT decoder: arbitrary bytes, and valid streams with bytes flipped,
inserted, dropped or cut off, under any chunking.  The decoder gives packets or its own
MQTTProtocolError, never another exception; the same result whatever the chunking (one read,
byte by byte, cut anywhere); never holds more than ``max_packet_size`` bytes; and every packet it
accepts the encoder writes again and reads back the same."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.protocols.mqtt.decoder import MQTTClientDecoder, MQTTServerDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311
from brokerd.protocols.mqtt.reasons import MQTTProtocolError
from tests.protocols.mqtt.strategies import client_stream, server_stream
from tests.protocols.mqtt.test_vectors import CONNECT_V4, CONNECT_V5
from tests.support.examples import examples

max_sizes = st.integers(16, 600)


def run(make, chunks: list[bytes]):
    """Feed ``chunks`` to a new decoder: (packets, the error's particulars or None, buffered)."""
    decoder = make()
    packets = []
    for chunk in chunks:
        got, error = decoder.feed(chunk)
        packets += got
        assert decoder.buffered <= decoder.max_packet_size
        if error is not None:
            assert isinstance(error, MQTTProtocolError)
            assert 0x80 <= error.reason_code <= 0xA2
            assert decoder.buffered == 0
            return packets, (error.reason_code, str(error), error.packet_type, error.version), 0, decoder
    return packets, None, decoder.buffered, decoder


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def check(make, data: bytes, points: list[int]) -> None:
    whole = run(make, [data])
    assert run(make, cuts(data, points))[:3] == whole[:3]
    if len(data) <= 400:
        assert run(make, [data[i : i + 1] for i in range(len(data))])[:3] == whole[:3]
    packets, decoder = whole[0], whole[3]
    for packet in packets:
        version = decoder.version
        again = make()
        if isinstance(again, MQTTServerDecoder) and type(packet).__name__ != "Connect":
            again.feed(CONNECT_V4 if version == MQTT_311 else CONNECT_V5)
        raw = encode(packet, version)
        assert again.feed(raw) == ([packet], None)


@st.composite
def mutated(draw, stream) -> bytes:
    version, packets = draw(stream)
    data = bytearray(b"".join(encode(packet, version) for packet in packets))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        where = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(("flip", "set", "insert", "delete", "truncate")))
        if kind == "flip":
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[where] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[where : where + draw(st.integers(1, 4))]
        else:
            del data[where:]
    return bytes(data)


chunk_points = st.lists(st.integers(0, 5000), max_size=8)


@settings(max_examples=examples(400))
@given(st.binary(max_size=300), chunk_points, max_sizes)
def test_arbitrary_bytes_to_a_server(data, points, max_size) -> None:
    check(lambda: MQTTServerDecoder(max_size), data, points)


@settings(max_examples=examples(400))
@given(st.sampled_from((CONNECT_V4, CONNECT_V5)), st.binary(max_size=300), chunk_points, max_sizes)
def test_arbitrary_bytes_after_a_connect(connect, data, points, max_size) -> None:
    check(lambda: MQTTServerDecoder(max_size), connect + data, points)


@settings(max_examples=examples(400))
@given(st.sampled_from((MQTT_311, MQTT_5)), st.binary(max_size=300), chunk_points, max_sizes)
def test_arbitrary_bytes_to_a_client(version, data, points, max_size) -> None:
    check(lambda: MQTTClientDecoder(version, max_size), data, points)


@settings(max_examples=examples(200))
@given(mutated(client_stream(max_packets=5)), chunk_points, max_sizes)
def test_mutated_client_streams(data, points, max_size) -> None:
    check(lambda: MQTTServerDecoder(max_size), data, points)


@settings(max_examples=examples(200))
@given(st.sampled_from((MQTT_311, MQTT_5)), mutated(server_stream(max_packets=5)), chunk_points, max_sizes)
def test_mutated_server_streams(version, data, points, max_size) -> None:
    # The stream's own version or the other one: a client reading the wrong version still
    # gets packets or the codec's error.
    check(lambda: MQTTClientDecoder(version, max_size), data, points)


def test_the_checks_can_fail() -> None:
    """The properties above hold for a reason: a stream that breaks MQTT does give an error,
    and a valid one gives its packets."""
    packets, error, buffered, _ = run(MQTTServerDecoder, [CONNECT_V4 + b"\x00\x00"])
    assert len(packets) == 1 and error is not None and error[0] == 0x81
    packets, error, buffered, _ = run(MQTTServerDecoder, [CONNECT_V4 + b"\xc0\x00\x30"])
    assert len(packets) == 2 and error is None and buffered == 1

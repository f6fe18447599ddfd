"""Every MQTT packet, both directions, both versions: encoded then decoded it is the same packet,
in one read, byte by byte, or cut anywhere; and the encoding of what was decoded is the same bytes."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.protocols.mqtt.decoder import MQTTClientDecoder, MQTTServerDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311, Connect, Pingreq, Pingresp
from tests.protocols.mqtt.strategies import client_stream, server_stream
from tests.support.examples import examples


def feed_chunks(decoder, chunks):
    packets = []
    for chunk in chunks:
        got, error = decoder.feed(chunk)
        packets += got
        assert error is None, error
        assert decoder.buffered <= decoder.max_packet_size
    return packets


def cut(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=examples(150))
@given(client_stream(), st.lists(st.integers(0, 10_000), max_size=6))
def test_what_a_client_sends_the_server_decodes(stream, points) -> None:
    version, packets = stream
    wire = [encode(packet, version) for packet in packets]
    data = b"".join(wire)
    decoder = MQTTServerDecoder()
    assert feed_chunks(decoder, [data]) == packets
    assert decoder.version == version
    assert decoder.buffered == 0
    assert feed_chunks(MQTTServerDecoder(), cut(data, points)) == packets
    for packet, raw in zip(packets, wire):
        assert encode(packet, version) == raw


@settings(max_examples=examples(150))
@given(server_stream(), st.lists(st.integers(0, 10_000), max_size=6))
def test_what_a_server_sends_the_client_decodes(stream, points) -> None:
    version, packets = stream
    data = b"".join(encode(packet, version) for packet in packets)
    assert feed_chunks(MQTTClientDecoder(version), [data]) == packets
    assert feed_chunks(MQTTClientDecoder(version), cut(data, points)) == packets


@settings(max_examples=examples(60))
@given(client_stream(max_packets=3))
def test_byte_by_byte_equals_one_read(stream) -> None:
    version, packets = stream
    data = b"".join(encode(packet, version) for packet in packets)
    decoder = MQTTServerDecoder()
    bytewise = feed_chunks(decoder, [data[i : i + 1] for i in range(len(data))])
    assert bytewise == feed_chunks(MQTTServerDecoder(), [data]) == packets
    assert decoder.buffered == 0


@settings(max_examples=examples(60))
@given(server_stream(max_packets=3))
def test_byte_by_byte_equals_one_read_on_the_client_side(stream) -> None:
    version, packets = stream
    data = b"".join(encode(packet, version) for packet in packets)
    bytewise = feed_chunks(MQTTClientDecoder(version), [data[i : i + 1] for i in range(len(data))])
    assert bytewise == packets


def test_the_connect_sets_the_version_the_rest_is_read_in() -> None:
    for version in (MQTT_311, MQTT_5):
        decoder = MQTTServerDecoder()
        assert decoder.version is None
        packets, error = decoder.feed(encode(Connect("c"), version) + encode(Pingreq(), version))
        assert (packets, error) == ([Connect("c"), Pingreq()], None)
        assert decoder.version == version


def test_a_large_packet_split_in_many_reads_is_kept_whole_once() -> None:
    from brokerd.protocols.mqtt.packets import Publish

    packet = Publish("big/topic", bytes(range(256)) * 1000, 1, packet_id=9)
    data = encode(Connect("c"), MQTT_5) + encode(packet, MQTT_5) + encode(Pingreq(), MQTT_5)
    decoder = MQTTServerDecoder(max_packet_size=300_000)
    chunks = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    assert feed_chunks(decoder, chunks) == [Connect("c"), packet, Pingreq()]
    assert MQTTClientDecoder(MQTT_311).feed(encode(Pingresp(), MQTT_311)) == ([Pingresp()], None)

"""The MCCHAT codec: exact bytes of every packet, framing under any chunking, the limits, the
content rules (0x04 in topics, UTF-8), and hypothesis: valid packets survive any chunking, and
any bytes in any chunking give the same events or MCChatProtocolError, nothing else."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.errors import ProtocolError
from brokerd.protocols.mcchat.codec import (
    MAX_MESSAGE,
    MAX_TOPIC,
    MAX_USERNAME,
    MCChatParser,
    MCChatProtocolError,
    check_topic,
    encode,
    encode_info,
    encode_msg,
    encode_sub,
    encode_tl,
    encode_tlrq,
    encode_unsub,
    topic_problem,
)
from brokerd.protocols.mcchat.events import (
    EOT_IN_TOPIC,
    MSG,
    NOT_UTF8,
    SUB,
    TL,
    UNSUB,
    Info,
    Malformed,
    Msg,
    Sub,
    TopicList,
    TopicListRequest,
    Unsub,
)
from tests.support.examples import examples


def parse(data: bytes, **limits: int) -> tuple[list, MCChatProtocolError | None]:
    return MCChatParser(**limits).feed(data)


def parse_chunks(chunks: list[bytes], **limits: int) -> tuple[list, MCChatProtocolError | None]:
    parser = MCChatParser(**limits)
    events: list = []
    for chunk in chunks:
        got, error = parser.feed(chunk)
        events += got
        if error is not None:
            return events, error
    return events, None


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# ---------------------------------------------------------------------------- encoding


def test_each_packet_has_the_layout_of_the_spec() -> None:
    assert encode_info() == b"\x00\x01"
    assert encode_sub(b"news") == b"\x01news\x00"
    assert encode_unsub(b"news") == b"\x02news\x00"
    assert encode_msg(b"news", b"bob", b"hi") == b"\x03news\x00bob\x00hi\x00"
    assert encode_tlrq() == b"\x04"
    assert encode_tl([b"a", b"b/c"]) == b"\x05a\x00b/c\x00\x04"
    assert encode_tl([]) == b"\x05\x04"


def test_encode_dispatches_on_the_packet_type() -> None:
    packets = [Info(1), Sub(b"t"), Unsub(b"t"), Msg(b"t", b"u", b"m"), TopicListRequest(), TopicList((b"t",))]
    assert b"".join(encode(p) for p in packets) == (
        b"\x00\x01\x01t\x00\x02t\x00\x03t\x00u\x00m\x00\x04\x05t\x00\x04"
    )
    with pytest.raises(TypeError):
        encode(Malformed(1, "x"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_sub(b"a\x00b"),
        lambda: encode_sub(b"a\x04b"),
        lambda: encode_sub(b"\xff"),
        lambda: encode_sub(b"x" * (MAX_TOPIC + 1)),
        lambda: encode_msg(b"t", b"u\x00", b"m"),
        lambda: encode_msg(b"t", b"u" * (MAX_USERNAME + 1), b"m"),
        lambda: encode_msg(b"t", b"u", b"m" * (MAX_MESSAGE + 1)),
        lambda: encode_msg(b"t", b"u", b"\xc3"),
        lambda: encode_tl([b"ok", b"bad\x04"]),
    ],
)
def test_encoders_refuse_what_the_peer_could_not_frame(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_encoders_take_bytes_only() -> None:
    with pytest.raises(TypeError):
        encode_sub("news")  # type: ignore[arg-type]


def test_limits_are_inclusive() -> None:
    assert encode_sub(b"x" * MAX_TOPIC) == b"\x01" + b"x" * MAX_TOPIC + b"\x00"
    assert check_topic(b"") == b""
    assert topic_problem(b"x" * (MAX_TOPIC + 1)) is not None
    assert topic_problem(b"caf\xc3\xa9") is None


# ---------------------------------------------------------------------------- decoding

STREAM = (
    b"\x00\x01"
    b"\x01news\x00"
    b"\x02news\x00"
    b"\x03news\x00bob\x00hello \xe2\x98\x83\x00"
    b"\x04"
    b"\x05a\x00\x00b\x00\x04"
    b"\x03\x00\x00\x00"
)
EVENTS = [
    Info(1),
    Sub(b"news"),
    Unsub(b"news"),
    Msg(b"news", b"bob", "hello \u2603".encode()),
    TopicListRequest(),
    TopicList((b"a", b"", b"b")),
    Msg(b"", b"", b""),
]


def test_every_packet_in_one_read() -> None:
    assert parse(STREAM) == (EVENTS, None)


def test_every_packet_one_byte_at_a_time() -> None:
    assert parse_chunks(bytewise(STREAM)) == (EVENTS, None)


def test_every_split_point_gives_the_same_packets() -> None:
    for cut in range(len(STREAM) + 1):
        assert parse_chunks([STREAM[:cut], STREAM[cut:]]) == (EVENTS, None), cut


def test_an_empty_tl_and_a_tl_split_before_its_terminator() -> None:
    assert parse(b"\x05\x04") == ([TopicList(())], None)
    assert parse_chunks([b"\x05a\x00", b"", b"\x04"]) == ([TopicList((b"a",))], None)


def test_a_multibyte_character_split_across_reads_is_valid() -> None:
    data = encode_msg(b"caf\xc3\xa9", b"zo\xc3\xab", b"\xe6\x97\xa5\xe6\x9c\xac")
    for cut in range(len(data)):
        assert parse_chunks([data[:cut], data[cut:]]) == (
            [Msg(b"caf\xc3\xa9", b"zo\xc3\xab", b"\xe6\x97\xa5\xe6\x9c\xac")],
            None,
        )


def test_incomplete_packets_wait_for_more() -> None:
    parser = MCChatParser()
    for part in (b"\x03to", b"pic\x00us", b"er\x00mess"):
        assert parser.feed(part) == ([], None)
    assert parser.buffered == len(b"\x03topic\x00user\x00mess")
    assert parser.feed(b"age\x00\x01") == ([Msg(b"topic", b"user", b"message")], None)
    assert parser.feed(b"x\x00") == ([Sub(b"x")], None)


def test_incomplete_info_then_the_rest() -> None:
    parser = MCChatParser()
    assert parser.feed(b"\x00") == ([], None)
    assert parser.buffered == 1
    assert parser.feed(b"\x07\x04") == ([Info(7), TopicListRequest()], None)
    assert parser.buffered == 0


def test_buffered_counts_the_packet_in_progress() -> None:
    parser = MCChatParser()
    parser.feed(b"\x03topic\x00us")
    assert parser.buffered == len(b"\x03topic\x00us")
    parser.feed(b"er\x00msg\x00")
    assert parser.buffered == 0


# ---------------------------------------------------------------------------- bad input


def test_unknown_opcode_is_a_protocol_error_after_the_packets_before_it() -> None:
    events, error = parse(b"\x01a\x00\x06\x01b\x00")
    assert events == [Sub(b"a")]
    assert isinstance(error, MCChatProtocolError)
    assert isinstance(error, ProtocolError)
    assert error.reply is None
    assert "opcode 6" in str(error)


def test_the_error_is_sticky() -> None:
    parser = MCChatParser()
    _events, error = parser.feed(b"\xff")
    assert parser.feed(b"\x04") == ([], error)


@pytest.mark.parametrize(
    "prefix, limit",
    [
        (b"\x01", {"max_topic": 8}),
        (b"\x02", {"max_topic": 8}),
        (b"\x03", {"max_topic": 8}),
        (b"\x03t\x00", {"max_username": 8}),
        (b"\x03t\x00u\x00", {"max_message": 8}),
        (b"\x05", {"max_topic": 8}),
        (b"\x05a\x00", {"max_topic": 8}),
    ],
)
def test_a_string_over_its_limit_is_a_protocol_error_in_any_chunking(prefix, limit) -> None:
    exact = prefix + b"x" * 8 + b"\x00"
    assert parse(exact, **limit)[1] is None
    over = prefix + b"x" * 9
    for chunks in ([over], bytewise(over)):
        events, error = parse_chunks(chunks, **limit)
        assert events == []
        assert isinstance(error, MCChatProtocolError), chunks
        assert "longer than 8 bytes" in str(error)


def test_the_limit_is_found_without_waiting_for_a_nul() -> None:
    parser = MCChatParser()
    _events, error = parser.feed(b"\x03" + b"x" * (MAX_TOPIC + 1))
    assert isinstance(error, MCChatProtocolError)
    assert "MSG topic longer than 256 bytes" in str(error)


def test_default_limits() -> None:
    ok = encode_msg(b"t" * MAX_TOPIC, b"u" * MAX_USERNAME, b"m" * MAX_MESSAGE)
    assert parse(ok) == ([Msg(b"t" * MAX_TOPIC, b"u" * MAX_USERNAME, b"m" * MAX_MESSAGE)], None)
    assert isinstance(parse(b"\x03t\x00u\x00" + b"m" * (MAX_MESSAGE + 1))[1], MCChatProtocolError)


def test_a_tl_with_too_many_topics_is_a_protocol_error() -> None:
    assert parse(b"\x05a\x00b\x00\x04", max_topics=2) == ([TopicList((b"a", b"b"))], None)
    events, error = parse(b"\x05a\x00b\x00c\x00\x04", max_topics=2)
    assert events == [] and isinstance(error, MCChatProtocolError)


@pytest.mark.parametrize(
    "packet, opcode",
    [
        (b"\x01a\x04b\x00", SUB),
        (b"\x02\x04\x00", UNSUB),
        (b"\x03a\x04\x00u\x00m\x00", MSG),
        (b"\x05ok\x00a\x04\x00\x04", TL),
    ],
)
def test_a_topic_with_0x04_is_malformed_and_the_stream_goes_on(packet, opcode) -> None:
    for chunks in ([packet + b"\x04"], bytewise(packet + b"\x04")):
        assert parse_chunks(chunks) == ([Malformed(opcode, EOT_IN_TOPIC), TopicListRequest()], None)


@pytest.mark.parametrize(
    "packet, opcode",
    [
        (b"\x01\xff\x00", SUB),
        (b"\x02\xc3\x00", UNSUB),
        (b"\x03\xed\xa0\x80\x00u\x00m\x00", MSG),
        (b"\x03t\x00\xc0\xaf\x00m\x00", MSG),
        (b"\x03t\x00u\x00caf\xe9\x00", MSG),
        (b"\x05\xfe\x00\x04", TL),
    ],
)
def test_invalid_utf8_is_malformed_and_the_stream_goes_on(packet, opcode) -> None:
    for chunks in ([packet + b"\x04"], bytewise(packet + b"\x04")):
        assert parse_chunks(chunks) == ([Malformed(opcode, NOT_UTF8), TopicListRequest()], None)


def test_one_bad_string_does_not_spoil_the_valid_packets_of_the_same_read() -> None:
    data = encode_msg(b"t", b"u", b"\xc3\xa9") + b"\x03t\x00u\x00\xff\x00" + encode_msg(b"t", b"u", b"ok")
    assert parse(data) == (
        [Msg(b"t", b"u", b"\xc3\xa9"), Malformed(MSG, NOT_UTF8), Msg(b"t", b"u", b"ok")],
        None,
    )


# ---------------------------------------------------------------------------- hypothesis

text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20)
topics = text.filter(lambda t: "\x04" not in t).map(lambda t: t.encode())
strings = text.map(lambda t: t.encode())
packets = st.one_of(
    st.builds(Info, st.integers(0, 255)),
    st.builds(Sub, topics),
    st.builds(Unsub, topics),
    st.builds(Msg, topics, strings, strings),
    st.just(TopicListRequest()),
    st.builds(TopicList, st.lists(topics, max_size=5).map(tuple)),
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points + [len(data)]:
        pieces.append(data[last:point])
        last = point
    return pieces


@given(st.lists(packets, max_size=20), st.lists(st.integers(0, 10_000), max_size=30))
@settings(max_examples=examples(300))
def test_packets_survive_any_chunking(items, cuts) -> None:
    data = b"".join(encode(p) for p in items)
    assert parse_chunks(chunked(data, cuts)) == (items, None)


@given(st.binary(max_size=300), st.lists(st.integers(0, 10_000), max_size=30))
@settings(max_examples=examples(500))
def test_any_bytes_in_any_chunking_give_the_same_events_or_our_error(data, cuts) -> None:
    limits = {"max_topic": 6, "max_username": 5, "max_message": 9, "max_topics": 3}
    whole_events, whole_error = parse(data, **limits)
    events, error = parse_chunks(chunked(data, cuts), **limits)
    assert events == whole_events
    assert type(error) is type(whole_error)
    assert whole_error is None or isinstance(whole_error, MCChatProtocolError)


opcode_heavy = st.lists(
    st.one_of(st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\x05", b"\x00\x00"]),
              st.binary(max_size=4), st.sampled_from([b"\xc3", b"\xa9", b"\xff"])),
    max_size=60,
).map(b"".join)


@given(opcode_heavy, st.lists(st.integers(0, 10_000), max_size=30))
@settings(max_examples=examples(500))
def test_streams_made_of_opcodes_parse_the_same_in_any_chunking(data, cuts) -> None:
    limits = {"max_topic": 6, "max_username": 5, "max_message": 9, "max_topics": 3}
    assert parse_chunks(chunked(data, cuts), **limits)[0] == parse(data, **limits)[0]
    whole = parse(data, **limits)
    chunks = parse_chunks(bytewise(data), **limits)
    assert chunks[0] == whole[0]
    assert type(chunks[1]) is type(whole[1])


# ------------------------------------------------------------------ what a refusal to encode says

@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: encode_msg(b"t\x00", b"u", b"m"), ValueError, "topic contains a NUL byte"),
        (lambda: encode_msg(b"t\x04", b"u", b"m"), ValueError, "topic contains the byte 0x04"),
        (lambda: encode_msg(b"t", b"u" * (MAX_USERNAME + 1), b"m"), ValueError, f"username longer than {MAX_USERNAME} bytes"),
        (lambda: encode_msg(b"t", b"u", b"\xff"), ValueError, "message is not UTF-8"),
        (lambda: encode_msg(b"t", "u", b"m"), TypeError, "MCCHAT strings are bytes here, not str"),
        (lambda: encode_tl([b"t"] * 65_537), ValueError, "a TL packet lists at most 65536 topics"),
        (lambda: encode(("not", "a packet")), TypeError, "not an MCCHAT packet: ('not', 'a packet')"),
    ],
)
def test_what_mcchat_cannot_carry_is_refused_with_the_reason(call, error, message) -> None:
    with pytest.raises(error) as refused:
        call()
    assert str(refused.value) == message


def test_a_topic_list_of_the_most_topics_encodes() -> None:
    assert encode_tl([b"t"] * 65_536) == b"\x05" + b"t\x00" * 65_536 + b"\x04"
    assert topic_problem(b"x" * (MAX_TOPIC + 1)) == f"topic longer than {MAX_TOPIC} bytes"

"""The envelope between nodes: every Message field survives the trip, and damaged bytes are
refused with EnvelopeError (never another exception)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.cluster.envelope import EnvelopeError, decode, encode, open_run, origin_of, section_limit
from brokerd.core.message import MULTICAST, PLAIN, Details, Message, Part
from brokerd.core.principal import Principal

ORIGIN = b"12345678"


def fields(message: Message) -> tuple:
    return tuple(getattr(message, name) for name in Message.__slots__)


def test_a_plain_run_round_trips_and_shares_plain_details() -> None:
    run = [Message(MULTICAST, b"room", b"hello %d" % i, "ssmp", b"sam") for i in range(3)]
    data = encode(ORIGIN, run)
    assert origin_of(data) == ORIGIN
    back = decode(data)
    assert [fields(m) for m in back] == [fields(m) for m in run]
    assert all(m.details is PLAIN for m in back)


def test_every_field_round_trips() -> None:
    details = Details(content_type="text/plain", message_id="m-1", created=1.5, priority=7, expires=None,
                      attributes=(("X-A", "1"), ("X-B", "\u00e9")),
                      parts=(Part("text/plain", (("Content-Type", "text/plain"),), b"part"),), qos=2, retained=True)
    message = Message(MULTICAST, b"/news", b"\x00\xff", "smqp", b"alice@host", True, b"Alice", details,
                      Principal("alice", "account"))
    (back,) = decode(encode(ORIGIN, [message]))
    assert fields(back) == fields(message)


def test_message_properties_round_trip_and_a_message_without_them_is_encoded_as_before() -> None:
    """Request/response properties travel between nodes whole (user properties in order,
    a name repeated, correlation bytes that are not UTF-8, an empty response topic); a
    message without them has the bytes a node that does not know them reads."""
    with_properties = Details(qos=1, response_topic="replies/\u00e9", correlation=b"\x00\xff", payload_format=0,
                              user_properties=(("k", "1"), ("a", "2"), ("k", "3")))
    message = Message(MULTICAST, b"req", b"x", "mqtt", b"c1", details=with_properties)
    (back,) = decode(encode(ORIGIN, [message]))
    assert fields(back) == fields(message)
    assert back.details.user_properties == (("k", "1"), ("a", "2"), ("k", "3"))
    only_correlation = Details(correlation=b"")
    (back,) = decode(encode(ORIGIN, [Message(MULTICAST, b"req", b"x", "mqtt", b"c1", details=only_correlation)]))
    assert back.details == only_correlation and back.payload_format is None and back.response_topic is None
    plain = encode(ORIGIN, [Message(MULTICAST, b"req", b"x", "mqtt", b"c1", details=Details(qos=1, retained=True))])
    assert plain.endswith(b"\x01\x01")  # QoS 1, retained: no properties follow
    damaged = encode(ORIGIN, [message]).replace(b"\x01\x02", b"\x01\x04", 1)
    with pytest.raises(EnvelopeError):
        decode(damaged)


@given(st.binary(max_size=200))
def test_damaged_bytes_are_refused_cleanly(data: bytes) -> None:
    try:
        decode(data)
    except EnvelopeError:
        pass


@given(st.integers(min_value=0, max_value=60))
def test_every_truncation_is_refused(cut: int) -> None:
    data = encode(ORIGIN, [Message(MULTICAST, b"room", b"payload", "mcchat", b"x", display_name=b"Zo")])
    if cut >= len(data):
        assert decode(data)[0].display_name == b"Zo"
    else:
        with pytest.raises(EnvelopeError):
            decode(data[:cut])


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(EnvelopeError):
        decode(encode(ORIGIN, [Message(MULTICAST, b"a", b"b", "ssmp", b"c")]) + b"x")


def test_a_run_from_one_sender_shares_its_objects_after_the_trip() -> None:
    principal = Principal("sam", "open")
    run = [Message(MULTICAST, b"room", b"m%d" % i, "ssmp", b"sam", principal=principal) for i in range(3)]
    run.append(Message(MULTICAST, b"room", b"other", "ssmp", b"eve", principal=principal))
    data = encode(ORIGIN, run)
    back = decode(data)
    assert [fields(m) for m in back] == [fields(m) for m in run]
    assert back[1].sender_name is back[0].sender_name and back[2].principal is back[0].principal
    assert back[3].sender_name == b"eve"
    assert len(data) < len(encode(ORIGIN, run[:1])) * 3  # the repeated head travels once


# ---------------------------------------------------------------------- rendered sections

def plain_run(count: int = 3) -> list[Message]:
    return [Message(MULTICAST, b"room", b"hello %d" % i, "ssmp", b"sam", principal=Principal("sam", "open"))
            for i in range(count)]


def test_a_uniform_run_carries_its_rendered_sections_and_head() -> None:
    run = plain_run()
    rendered = {"ssmp": b"000 sam MCAST room hello 0\n...", "mcchat": b"\x03room\x00sam\x00..."}
    data = encode(ORIGIN, run, rendered)
    opened = open_run(data)
    assert opened.sections == rendered
    assert opened.count == 3 and opened.total == sum(len(m.payload) for m in run)
    assert fields(opened.first) == fields(run[0])
    assert not opened.decoded
    assert [fields(m) for m in opened.messages()] == [fields(m) for m in run]
    assert opened.decoded
    assert [fields(m) for m in decode(data)] == [fields(m) for m in run]


@pytest.mark.parametrize("run", [
    [Message(MULTICAST, b"room", b"a", "ssmp", b"sam"), Message(MULTICAST, b"room", b"b", "ssmp", b"eve")],
    [Message(MULTICAST, b"room", b"a", "ssmp", b"sam", details=Details(message_id="m-1"))],
], ids=["two senders", "details"])
def test_a_run_that_is_not_uniform_travels_without_sections(run: list[Message]) -> None:
    data = encode(ORIGIN, run, {"ssmp": b"rendered"})
    opened = open_run(data)
    assert opened.sections == {} and opened.total == 0
    assert [fields(m) for m in opened.messages()] == [fields(m) for m in run]


def test_a_section_over_the_limit_is_left_out() -> None:
    run = plain_run(1)
    body = len(encode(ORIGIN, run)) - len(encode(ORIGIN, run[:0]))
    limit = section_limit(body, 1)
    data = encode(ORIGIN, run, {"ssmp": b"x" * limit, "mcchat": b"y" * (limit + 1)})
    assert open_run(data).sections == {"ssmp": b"x" * limit}


def test_an_oversized_section_received_is_refused() -> None:
    run = plain_run(1)
    data = bytearray(encode(ORIGIN, run, {"ssmp": b"x" * 10}))
    # Make the section claim more than any rendering of a run this size could take, with the
    # bytes to match, so only the bound refuses it.
    at = data.index(b"ssmp") + 4
    huge = 10 + 100_000
    data[at:at + 4] = huge.to_bytes(4, "big")
    data[at + 4:at + 4] = b"x" * 100_000
    with pytest.raises(EnvelopeError, match="rendered section"):
        open_run(bytes(data))


def test_sections_on_a_run_that_is_not_uniform_are_refused() -> None:
    uniform = encode(ORIGIN, plain_run(2), {"ssmp": b"r"})
    mixed = encode(ORIGIN, [plain_run(1)[0], Message(MULTICAST, b"room", b"b", "ssmp", b"eve")])
    # Graft the sections of the first onto the messages of the second.
    head = len(uniform) - (len(encode(ORIGIN, plain_run(2))) - 14)
    grafted = uniform[:head] + mixed[14:]
    grafted = grafted[:9] + (2).to_bytes(4, "big") + grafted[13:]
    with pytest.raises(EnvelopeError, match="not uniform"):
        open_run(grafted)


def test_a_count_beyond_the_bytes_is_refused() -> None:
    data = bytearray(encode(ORIGIN, plain_run(2), {"ssmp": b"r"}))
    data[9:13] = (1 << 30).to_bytes(4, "big")
    with pytest.raises(EnvelopeError, match="messages in"):
        open_run(bytes(data))


def test_an_envelope_of_the_previous_layout_is_refused() -> None:
    data = bytearray(encode(ORIGIN, plain_run(1)))
    data[0] = 0xB1
    with pytest.raises(EnvelopeError, match="not a brokerd envelope"):
        open_run(bytes(data))
    with pytest.raises(EnvelopeError):
        origin_of(bytes(data))


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=3))
def test_damaged_sections_are_refused_cleanly(noise: bytes, sections: int) -> None:
    data = encode(ORIGIN, plain_run(2), {f"f{i}": b"r" * i for i in range(sections)})
    for damaged in (data[:14] + noise, data[:len(data) // 2] + noise, noise):
        try:
            open_run(damaged).messages()
        except EnvelopeError:
            pass


@given(st.lists(st.tuples(st.binary(max_size=8), st.booleans(), st.sampled_from([b"sam", b"eve"]),
                          st.sampled_from([None, b"Sam"]), st.booleans()), min_size=1, max_size=6))
def test_any_run_round_trips_uniform_or_not(specs: list) -> None:
    principal = Principal("sam", "open")
    run = [Message(MULTICAST, b"room", payload, "ssmp", sender, binary, display,
                   Details(message_id="m") if detailed else PLAIN, principal)
           for payload, binary, sender, display, detailed in specs]
    opened = open_run(encode(ORIGIN, run, {"ssmp": b"r"}))
    assert [fields(m) for m in opened.messages()] == [fields(m) for m in run]
    uniform = all(fields(m)[:2] == fields(run[0])[:2] and m.sender_name == run[0].sender_name
                  and m.display_name == run[0].display_name and m.details is PLAIN for m in run)
    assert bool(opened.sections) == uniform


def test_a_part_without_a_content_type_is_refused() -> None:
    """A part's content type is a string on both ends: an envelope whose part says "none"
    there is refused, not read into a Part whose content type is None."""
    part = Part("part/type", (("X-Part", "1"),), b"data")
    message = Message(MULTICAST, b"room", b"x", "smqp", b"sam", details=Details(parts=(part,)))
    data = encode(ORIGIN, [message])
    (back,) = decode(data)
    assert back.details.parts == (part,)
    field = len(b"part/type").to_bytes(4, "big") + b"part/type"
    assert data.count(field) == 1
    with pytest.raises(EnvelopeError):
        decode(data.replace(field, b"\xff\xff\xff\xff"))

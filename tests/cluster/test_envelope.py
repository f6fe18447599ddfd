"""The envelope between nodes: every Message field survives the trip, and damaged bytes are
refused with EnvelopeError (never another exception)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.cluster.envelope import EnvelopeError, decode, encode, origin_of
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
                      parts=(Part("text/plain", (("Content-Type", "text/plain"),), b"part"),))
    message = Message(MULTICAST, b"/news", b"\x00\xff", "smqp", b"alice@host", True, b"Alice", details,
                      Principal("alice", "account"))
    (back,) = decode(encode(ORIGIN, [message]))
    assert fields(back) == fields(message)


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

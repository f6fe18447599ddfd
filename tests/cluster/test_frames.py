"""The frames of a node's own channel: what is sent reads back, damaged bytes are refused
with FrameError (the engine drops and counts them), never another exception."""
from __future__ import annotations

import pytest

from brokerd.cluster import frames
from brokerd.core.message import BROADCAST, UNICAST, Details, Message
from brokerd.core.principal import ACCOUNT, Principal

ORIGIN = b"\x01" * 8
NODE = "0123456789abcdef"


def test_a_unicast_reads_back() -> None:
    message = Message(UNICAST, b"alice", b"hi", "ssmp", b"bob")
    data = frames.unicast(ORIGIN, "ssmp", message)
    name, start = frames.kind(data)
    got = frames.one_message(data, start)
    assert name == "ssmp" and (got.target, got.payload, got.sender_name) == (b"alice", b"hi", b"bob")


def test_a_unicast_keeps_its_message_properties() -> None:
    details = Details(response_topic="replies/bob", correlation=b"\x07", payload_format=1,
                      user_properties=(("trace", "a"), ("trace", "b")))
    data = frames.unicast(ORIGIN, "ssmp", Message(UNICAST, b"alice", b"hi", "ssmp", b"bob", details=details))
    name, start = frames.kind(data)
    assert frames.one_message(data, start).details == details


def test_a_broadcast_reads_back_with_its_topics() -> None:
    message = Message(BROADCAST, None, b"to all", "ssmp", b"sam", principal=Principal("sam", ACCOUNT))
    data = frames.broadcast(ORIGIN, message, [b"lobby", b"", b"x" * 300])
    name, start = frames.kind(data)
    topics, got = frames.read_broadcast(data, start)
    assert name == frames.BROADCAST and topics == [b"lobby", b"", b"x" * 300]
    assert (got.kind, got.payload, got.principal) == (BROADCAST, b"to all", message.principal)


def test_a_service_message_reads_back() -> None:
    data = frames.service(NODE, "socketmq", b"{}\nbody")
    name, start = frames.kind(data)
    assert name == frames.SERVICE + "socketmq"
    assert frames.read_service(data, start) == (NODE, b"{}\nbody")


BROADCAST_FRAME = frames.broadcast(ORIGIN, Message(BROADCAST, None, b"p", "ssmp", b"s"), [b"t1", b"t2"])


@pytest.mark.parametrize("cut", range(len(BROADCAST_FRAME)))
def test_every_truncated_broadcast_is_refused(cut: int) -> None:
    with pytest.raises(frames.FrameError):
        name, start = frames.kind(BROADCAST_FRAME[:cut])
        frames.read_broadcast(BROADCAST_FRAME[:cut], start)


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x05ab", b"\x02\xff\xfe", b"\x03@s:" + b"zz" * 8, b"\x03@s:short"])
def test_damaged_frames_are_refused(data: bytes) -> None:
    with pytest.raises(frames.FrameError):
        name, start = frames.kind(data)
        frames.read_service(data, start)

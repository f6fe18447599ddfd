"""SSMP_WIRE.render_run: a run of one SSMP sender's text MCASTs in one join, byte for byte
what rendering each message and joining them gives; None for any other run."""
from __future__ import annotations

from brokerd.core.message import MULTICAST, Message
from brokerd.protocols.ssmp.wire import SSMP_WIRE


def run(*payloads: bytes, sender: bytes = b"alice", protocol: str = "ssmp", binary: bool = False) -> list[Message]:
    return [Message(MULTICAST, b"t", payload, protocol, sender, binary) for payload in payloads]


def test_a_text_run_is_one_join_equal_to_the_messages_rendered_one_by_one() -> None:
    messages = run(b"one", b"two two", b"x" * 1024)
    expected = b"".join(SSMP_WIRE.render_message(message) for message in messages)
    assert SSMP_WIRE.render_run(messages) == expected
    assert SSMP_WIRE.render_run(messages[:1]) == SSMP_WIRE.render_message(messages[0])


def test_runs_it_cannot_join_are_left_to_render_message() -> None:
    binary = run(b"text") + run(b"\x00\x01", binary=True)
    assert SSMP_WIRE.render_run(binary) is None
    assert SSMP_WIRE.render_run(run(b"a", b"b", protocol="mcchat")) is None
    assert SSMP_WIRE.render_run(run(b"a") + run(b"b", sender=b"bob")) is None

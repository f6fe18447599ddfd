"""The MCCHAT wire format: MCCHAT messages verbatim, messages of other protocols mapped (sender
as ``<protocol>:<name>`` or the ``username`` header), and what MCCHAT cannot carry dropped and
counted by reason."""
from __future__ import annotations

import pytest

from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Message
from brokerd.protocols.mcchat.codec import MAX_MESSAGE, MAX_USERNAME, MCChatParser
from brokerd.protocols.mcchat.events import Msg
from brokerd.protocols.mcchat.wire import (
    MCChatWireFormat,
    display_name,
    is_mcchat_topic,
)


@pytest.fixture
def wire() -> MCChatWireFormat:
    return MCChatWireFormat()


def parsed(data: bytes) -> list:
    events, error = MCChatParser().feed(data)
    assert error is None
    return events


def test_an_mcchat_message_renders_as_it_was_sent(wire: MCChatWireFormat) -> None:
    message = Message(MULTICAST, b"t", "h\u00e9".encode(), "mcchat", b"127.0.0.1:1", display_name=b"Zo\xc3\xab")
    assert wire.render_message(message) == b"\x03t\x00Zo\xc3\xab\x00h\xc3\xa9\x00"


def test_a_foreign_sender_is_protocol_colon_name(wire: MCChatWireFormat) -> None:
    message = Message(MULTICAST, b"news", b"hello", "ssmp", b"alice")
    assert parsed(wire.render_message(message)) == [Msg(b"news", b"ssmp:alice", b"hello")]


def test_a_display_name_wins(wire: MCChatWireFormat) -> None:
    message = Message(MULTICAST, b"news", b"hi", "socketmq", b"conn-7", display_name="Zo\u00eb".encode())
    assert parsed(wire.render_message(message)) == [Msg(b"news", "Zo\u00eb".encode(), b"hi")]


def test_a_binary_payload_that_is_utf8_text_is_delivered(wire: MCChatWireFormat) -> None:
    message = Message(MULTICAST, b"t", b"two\nlines", "ssmp", b"a", binary=True)
    assert parsed(wire.render_message(message)) == [Msg(b"t", b"ssmp:a", b"two\nlines")]


@pytest.mark.parametrize(
    "message, counter",
    [
        (Message(MULTICAST, b"t", b"a\x00b", "ssmp", b"a", binary=True), "not_text"),
        (Message(MULTICAST, b"t", b"\xff\xfe", "ssmp", b"a", binary=True), "not_text"),
        (Message(MULTICAST, b"t", b"x" * (MAX_MESSAGE + 1), "smqp", b"a"), "too_long"),
        (Message(MULTICAST, b"bad\x04", b"x", "smqp", b"a"), "bad_topic"),
        (Message(MULTICAST, b"\xff", b"x", "smqp", b"a"), "bad_topic"),
        (Message(MULTICAST, b"", b"x", "smqp", b"a"), "bad_topic"),
        (Message(MULTICAST, b"t" * 257, b"x", "smqp", b"a"), "bad_topic"),
        (Message(UNICAST, b"peer", b"x", "ssmp", b"a"), "not_multicast"),
        (Message(BROADCAST, None, b"x", "ssmp", b"a"), "not_multicast"),
    ],
)
def test_what_mcchat_cannot_carry_is_dropped_and_counted(wire: MCChatWireFormat, message, counter) -> None:
    assert wire.render_message(message) is None
    assert wire.counts()[counter] == 1
    assert wire.unrepresentable == 1


def test_the_longest_message_still_renders(wire: MCChatWireFormat) -> None:
    message = Message(MULTICAST, b"t", b"x" * MAX_MESSAGE, "smqp", b"a")
    assert parsed(wire.render_message(message)) == [Msg(b"t", b"smqp:a", b"x" * MAX_MESSAGE)]


def test_presence_renders_as_nothing(wire: MCChatWireFormat) -> None:
    assert wire.render_presence(b"t", object(), True, False) is None


def test_display_names_are_always_valid_mcchat_strings() -> None:
    assert display_name(b"alice") == b"alice"
    assert display_name(b"a\x00b") == b"a_b"
    assert display_name(b"caf\xe9") == "caf\ufffd".encode()
    long = display_name("\u00e9" * 200)
    assert len(long) <= MAX_USERNAME and long.decode() == "\u00e9" * (MAX_USERNAME // 2)


def test_topic_names_mcchat_can_use() -> None:
    assert is_mcchat_topic(b"a/b") and is_mcchat_topic("caf\u00e9".encode())
    assert is_mcchat_topic(b"a/b")  # remembered
    assert not is_mcchat_topic(b"")
    assert not is_mcchat_topic(b"a\x00b")

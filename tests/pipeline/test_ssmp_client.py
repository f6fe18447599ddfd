"""The pipeline's blocking SSMP client: its parser (examples, any chunking, any bytes) and
payload encoding.  No Spark, no sockets."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.pipeline.ssmp import SSMPClientError, SSMPConnection, _parse_message, wire_payload
from tests.support.examples import examples

STREAM = (
    b"200\n"
    b"401 open secret\n"
    b"000 alice MCAST news hello world\n"
    b"000 mcchat:bob MCAST news \x00\x04a\nb\x00c\n"  # binary payload with LF inside
    b"000 alice UCAST me psst\n"
    b"000 alice BCAST \x00\x00z\n"
    b"000 carol SUBSCRIBE news PRESENCE\n"
    b"000 carol UNSUBSCRIBE news\n"
    b"000 . PING\n"
)
EXPECTED = [
    (b"200", None),
    (b"401", b"open secret"),
    (b"000", b"alice", b"MCAST", b"news", b"hello world", False),
    (b"000", b"mcchat:bob", b"MCAST", b"news", b"a\nb\x00c", True),
    (b"000", b"alice", b"UCAST", b"me", b"psst", False),
    (b"000", b"alice", b"BCAST", None, b"z", True),
    (b"000", b"carol", b"SUBSCRIBE", b"news", b"PRESENCE", False),
    (b"000", b"carol", b"UNSUBSCRIBE", b"news", None, False),
    (b"000", b".", b"PING", None, None, False),
]


def _parse_all(data: bytes) -> tuple[list[tuple], bytes]:
    messages, start = [], 0
    while True:
        parsed = _parse_message(data, start)
        if parsed is None:
            return messages, data[start:]
        start, message = parsed
        messages.append(message)


def test_examples_parse() -> None:
    messages, rest = _parse_all(STREAM)
    assert messages == EXPECTED and rest == b""


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_chunking_gives_the_same_messages(cuts: list[int]) -> None:
    buffer, messages = b"", []
    bounds = sorted(set(cuts)) + [len(STREAM)]
    previous = 0
    for bound in bounds:
        buffer += STREAM[previous:bound]
        previous = bound
        parsed, buffer = _parse_all(buffer)
        messages.extend(parsed)
    assert messages == EXPECTED and buffer == b""


@settings(max_examples=examples(300))
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_the_client_error(data: bytes) -> None:
    try:
        _parse_all(data)
    except SSMPClientError:
        pass


def test_payloads_are_text_when_possible_and_binary_otherwise() -> None:
    assert wire_payload(b"hello") == b"hello"
    assert wire_payload(b"a\nb") == b"\x00\x02a\nb"
    assert wire_payload(b"\x01x") == b"\x00\x01\x01x"
    assert wire_payload(b"x" * 1024)[:2] == b"xx"
    for bad in (b"", b"x" * 1025):
        with pytest.raises(ValueError):
            wire_payload(bad)


def test_connecting_to_nothing_is_a_client_error() -> None:
    from tests.support.broker import free_port

    with pytest.raises(SSMPClientError):
        SSMPConnection("127.0.0.1", free_port(), b"x", timeout=2).connect()

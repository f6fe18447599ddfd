"""The RESP2 reader of the cluster's Redis connections: every reply type, replies split at
every byte, and what is not RESP refused with ProtocolError."""
from __future__ import annotations

import pytest

from brokerd.cluster.connection import MAX_REPLY, ProtocolError, RespReader
from tests.support.examples import examples


class Err(Exception):
    pass


STREAM = (b"+OK\r\n:42\r\n$5\r\nhe\r\no\r\n$-1\r\n-WRONGPASS no\r\n"
          b"*3\r\n$8\r\nsmessage\r\n$4\r\nchan\r\n$0\r\n\r\n*2\r\n*1\r\n:1\r\n$1\r\nx\r\n")
EXPECTED = [b"OK", 42, b"he\r\no", None, "WRONGPASS no", [b"smessage", b"chan", b""], [[1], b"x"]]


def normal(replies: list) -> list:
    return [str(r) if isinstance(r, Err) else r for r in replies]


def test_every_reply_type() -> None:
    assert normal(RespReader(Err).feed(STREAM)) == EXPECTED


def test_replies_split_anywhere() -> None:
    for cut in range(len(STREAM) + 1):
        reader = RespReader(Err)
        assert normal(reader.feed(STREAM[:cut]) + reader.feed(STREAM[cut:])) == EXPECTED


def test_one_byte_at_a_time() -> None:
    reader = RespReader(Err)
    replies: list = []
    for i in range(len(STREAM)):
        replies += reader.feed(STREAM[i:i + 1])
    assert normal(replies) == EXPECTED


@pytest.mark.parametrize("data", [b"?what\r\n", b":x1\r\n", b"$abc\r\n", b"$%d\r\n" % (MAX_REPLY + 1)])
def test_what_is_not_resp_is_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        RespReader(Err).feed(data)


class CountingReader(RespReader):
    """Counts the parses of a reply's head (each ``_read`` at the top level)."""

    parses = 0

    def _read(self, buffer: bytes, position: int, depth: int):
        if depth == 0:
            self.parses += 1
        return super()._read(buffer, position, depth)


def test_a_large_message_arriving_in_small_reads_is_parsed_once_it_is_all_there() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    stream = b"*3\r\n$8\r\nsmessage\r\n$9\r\nbrokerd:c\r\n$%d\r\n%s\r\n+OK\r\n" % (len(body), body)
    reader = CountingReader(Err)
    replies = []
    for start in range(0, len(stream), 1000):
        replies += reader.feed(stream[start:start + 1000])
    assert replies == [[b"smessage", b"brokerd:c", body], b"OK"]
    assert reader.parses <= 6  # not once per read (about 1,050 reads)
    assert reader.feed(b":1\r\n") == [1] and reader.rest == b""


def test_replies_split_into_many_reads_anywhere() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    stream = STREAM + b"$300\r\n" + b"y" * 300 + b"\r\n"
    expected = [*EXPECTED, b"y" * 300]

    @settings(max_examples=examples(300), deadline=None)
    @given(st.lists(st.integers(0, len(stream)), max_size=12))
    def check(cuts: list[int]) -> None:
        reader = RespReader(Err)
        replies: list = []
        start = 0
        for cut in sorted(cuts) + [len(stream)]:
            replies += reader.feed(stream[start:cut])
            start = cut
        assert normal(replies) == expected

    check()

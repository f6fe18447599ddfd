"""The RESP2 reader of the cluster's Redis connections: every reply type, replies split at
every byte, and what is not RESP refused with ProtocolError."""
from __future__ import annotations

import pytest

from brokerd.cluster.connection import MAX_REPLY, ProtocolError, RespReader


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

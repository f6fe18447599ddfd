"""MCCHAT: the one parser both sides use, with small limits so that fuzzed input reaches
every limit, fed whole, cut in two and byte by byte."""
from __future__ import annotations

from functools import partial

from brokerd.protocols.mcchat.codec import (
    MCChatParser,
    encode_info,
    encode_msg,
    encode_sub,
    encode_tl,
    encode_tlrq,
    encode_unsub,
)
from tests.fuzz.harness import Stream

TOPIC, USERNAME, MESSAGE, TOPICS = 32, 32, 512, 16
LIMIT = 1 + TOPICS * (TOPIC + 1) + USERNAME + 1 + MESSAGE + 1
"""The most one packet in progress may hold: a TL's topics, or a MSG's three strings."""

PARSER = Stream(partial(MCChatParser, TOPIC, USERNAME, MESSAGE, TOPICS), lambda parser, data: parser.feed(data),
                lambda parser: parser.buffered, LIMIT)


def check(data: bytes) -> tuple:
    return (PARSER.check(data),)


def seeds() -> dict[str, bytes]:
    client = b"".join((encode_sub(b"room"), encode_msg(b"room", b"alice", "h\u00e9llo".encode()), encode_tlrq(),
                       encode_unsub(b"room")))
    server = b"".join((encode_info(), encode_msg(b"room", b"bob", b"hi"), encode_tl([b"room", b"hall"]),
                       encode_tl([])))
    return {"client": b"\x80" + client, "server": b"\x30" + server,
            "long": b"\x10" + encode_msg(b"t" * TOPIC, b"u" * USERNAME, b"m" * MESSAGE)}

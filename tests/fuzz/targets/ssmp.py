"""SSMP: the server's request parser (bytes from clients) and the client's parser (bytes from
a server), each fed whole, cut in two and byte by byte."""
from __future__ import annotations

from brokerd.protocols.ssmp.codec import (
    MAX_EVENT_LINE,
    MAX_LINE,
    SSMPClientParser,
    SSMPParser,
    encode_event,
    encode_payload,
    encode_request,
    encode_response,
)
from tests.fuzz.harness import Stream

SERVER = Stream(SSMPParser, lambda parser, data: parser.feed(data), lambda parser: parser.buffered, MAX_LINE)
CLIENT = Stream(SSMPClientParser, lambda parser, data: parser.feed(data),
                lambda parser: parser._framer.buffered, MAX_EVENT_LINE)


def check(data: bytes) -> tuple:
    return SERVER.check(data), CLIENT.check(data)


def seeds() -> dict[str, bytes]:
    binary = encode_payload(b"\x00two\nlines", binary=True)
    assert binary is not None
    requests = b"".join((
        encode_request(b"LOGIN", b"alice", b"PLAIN", b"secret"),
        encode_request(b"SUBSCRIBE", b"room", b"PRESENCE"),
        encode_request(b"MCAST", b"room", b"hello"),
        encode_request(b"UCAST", b"bob", binary),
        encode_request(b"BCAST", b"everyone"),
        encode_request(b"UNSUBSCRIBE", b"room"),
        encode_request(b"PING"), encode_request(b"PONG"), encode_request(b"CLOSE"),
    ))
    answers = b"".join((
        encode_response(b"200"), encode_response(b"400", b"bad request"),
        encode_event(b"alice", b"MCAST", b"room", b"hello"),
        encode_event(b"alice", b"UCAST", b"bob", binary),
        encode_event(b"alice", b"BCAST", b"everyone"),
        encode_event(b"bob", b"PING"),
    ))
    return {"requests": b"\x80" + requests, "server": b"\x40" + answers,
            "binary": b"\x00" + encode_request(b"MCAST", b"room", binary)}

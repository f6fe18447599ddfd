"""socket.mq: one WebSocket message (Autobahn frames it) decoded as a client's or a server's,
as text (one JSON object) or binary (a JSON header, LF, the payload); and the socket.mq
requests and answers other nodes forward over the cluster.  The selector's bits choose:
bit 0 binary, bit 1 the server's messages, bit 2 a node's message."""
from __future__ import annotations

from typing import Any

from brokerd.protocols.socketmq import remote
from brokerd.protocols.socketmq.codec import FrameError, InvalidMessage, decode_client, decode_server, encode
from brokerd.protocols.socketmq.events import (
    Auth,
    Dropped,
    Event,
    Hello,
    Publish,
    Register,
    Request,
    Respond,
    Result,
    Subscribe,
    Unregister,
    Unsubscribe,
)
from tests.fuzz.harness import refused, selector_and_payload

BINARY, SERVER, NODE = 1, 2, 4


def check(data: bytes) -> tuple:
    selector, payload = selector_and_payload(data)
    if selector & NODE:
        return (refused(lambda: remote.decode(payload), (remote.RemoteError,)),)
    decode = decode_server if selector & SERVER else decode_client
    return (refused(lambda: decode(payload, bool(selector & BINARY)), (FrameError, InvalidMessage)),)


def seeds() -> dict[str, bytes]:
    client: list[Any] = [Auth(1, "secret", identity="alice", secret="pw"), Subscribe("s1", "news"), Unsubscribe(2, "news"),
              Publish(3, "news", "h\u00e9".encode()), Publish(4, "news", b"\x00\xff", binary=True),
              Register(5, "echo"), Unregister(6, "echo"), Respond(7, "tok", 200, b"answer", content_type="text/plain")]
    server: list[Any] = [Hello(1, "enabled", "n0nce", "ABCD"), Result(1, 200, "ok", identity="alice"), Dropped(3),
              Event("news", b"hi", sender="bob", protocol="ssmp"), Event("news", b"\x00", binary=True),
              Request("tok", "echo", "r1", b"body", client="bob", version="1", content_type="text/plain")]
    found: dict[str, bytes] = {}
    for side, messages in ((0, client), (SERVER, server)):
        for message in messages:
            payload, binary = encode(message)
            found[f"{type(message).__name__.lower()}-{side}-{int(binary)}"] = bytes((side | binary,)) + payload
    found["node-request"] = bytes((NODE,)) + remote.encode(
        {"k": "request", "token": "7", "application": "echo", "request_id": "r", "client": "bob",
         "names": ["bob"], "version": None, "content_type": None}, b"body")
    found["node-answer"] = bytes((NODE,)) + remote.encode(
        {"k": "answer", "token": "7", "status": 200, "content_type": None}, b"answer")
    return found

"""The frames other nodes send on this node's own channel: a unicast, a broadcast (its topics
and its message) or a service's bytes (socket.mq's)."""
from __future__ import annotations

from brokerd.cluster import frames
from brokerd.core.message import BROADCAST, UNICAST, Details, Message
from tests.fuzz.harness import refused, selector_and_payload

NODE = b"\x07" * 8


def _read(payload: bytes) -> object:
    name, start = frames.kind(payload)
    if name == frames.BROADCAST:
        return frames.read_broadcast(payload, start)
    if name.startswith(frames.SERVICE):
        return frames.read_service(payload, start)
    return frames.one_message(payload, start)


def check(data: bytes) -> tuple:
    _selector, payload = selector_and_payload(data)
    return (refused(lambda: _read(payload), (frames.FrameError,)),)


def seeds() -> dict[str, bytes]:
    return {
        "unicast": b"\x00" + frames.unicast(NODE, "ssmp", Message(UNICAST, b"alice", b"hi", "ssmp", b"bob")),
        "unicast-details": b"\x00" + frames.unicast(NODE, "smqp", Message(
            UNICAST, b"alice", b"hi", "smqp", b"bob", details=Details(content_type="text/plain", priority=2))),
        "broadcast": b"\x00" + frames.broadcast(NODE, Message(BROADCAST, None, b"all", "ssmp", b"bob"),
                                                [b"room", b"hall"]),
        "service": b"\x00" + frames.service(NODE.hex(), "socketmq", b'{"k":"answer","token":"7"}\nbody'),
    }

"""The cluster's envelopes (runs of messages another node publishes on a topic's channel):
opened with or without the channel's topic (selector bit 0), then every message decoded."""
from __future__ import annotations

from brokerd.cluster import envelope
from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Details, Message, Part
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.protocols.ssmp.wire import SSMP_WIRE
from tests.fuzz.harness import refused, selector_and_payload

TOPIC = b"room"
ORIGIN = b"\x07" * 8


def _open(payload: bytes, topic: bytes | None) -> list[Message]:
    envelope.origin_of(payload)
    run = envelope.open_run(payload, topic)
    messages = run.messages()
    assert len(messages) == run.count
    if topic is not None:
        assert all(m.kind == MULTICAST and m.target == topic for m in messages), "a message for another topic"
    return messages


def check(data: bytes) -> tuple:
    selector, payload = selector_and_payload(data)
    return (refused(lambda: _open(payload, TOPIC if selector & 1 else None), (envelope.EnvelopeError,)),)


def seeds() -> dict[str, bytes]:
    details = Details(content_type="text/plain", message_id="m1", created=1.5, priority=3, expires=9.0,
                      attributes=(("a", "b"),), parts=(Part("text/plain", (("k", "v"),), b"part"),))
    alice = Principal("alice", ACCOUNT)
    run = [Message(MULTICAST, TOPIC, b"hello %d" % i, "ssmp", b"alice", False, None, Details(), alice) for i in range(3)]
    mixed = [Message(MULTICAST, TOPIC, b"\x00\xff", "mcchat", b"bob", True, b"Bob", details),
             Message(MULTICAST, TOPIC, b"x", "x-made-up", b"carol")]
    others = [Message(UNICAST, b"bob", b"hi", "smqp", b"alice"), Message(BROADCAST, None, b"all", "socketmq", b"s")]
    rendered = SSMP_WIRE.render_run(run)
    assert rendered is not None
    return {
        "uniform": b"\x01" + envelope.encode(ORIGIN, run),
        "rendered": b"\x01" + envelope.encode(ORIGIN, run, {"ssmp": rendered}),
        "mixed": b"\x01" + envelope.encode(ORIGIN, mixed),
        "others": b"\x00" + envelope.encode(ORIGIN, others),
    }

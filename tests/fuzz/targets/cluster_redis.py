"""What a node reads from Redis before any envelope: the RESP replies (pushed messages
included), fed whole, cut in two and byte by byte; and the seal's header of each message
(a frame no node sealed is refused there, counted by reason, before anything decodes it)."""
from __future__ import annotations

from brokerd.cluster.connection import MAX_REPLY, ProtocolError, RespReader
from brokerd.cluster.seal import REASONS, Sealer
from tests.fuzz.harness import Stream, selector_and_payload

SECRET = b"the cluster secret of the fuzz target"
NOW = 1_800_000_000.0

READER = Stream(lambda: RespReader(RuntimeError), lambda reader, data: (reader.feed(data), None),
                lambda reader: len(reader.rest) + reader.buffered, MAX_REPLY,
                errors=(ProtocolError,), keeps_before_error=False)


def _open(sealer: Sealer, frame: bytes) -> bytes | None:
    before = sum(sealer.rejected.values())
    opened = sealer.open(b"brokerd:t:room", frame)
    own_echo = frame[:1] == b"\x01" and frame[5:13] == sealer.incarnation  # skipped, not counted
    assert opened is not None or own_echo or sum(sealer.rejected.values()) == before + 1, "refused, not counted"
    assert set(sealer.rejected) == set(REASONS)
    return opened


def check(data: bytes) -> tuple:
    replies = READER.check(data)
    _selector, payload = selector_and_payload(data)
    sealer = Sealer([SECRET], b"\x01" * 8, 15.0, clock=lambda: NOW)
    opened = _open(sealer, payload)
    return replies, (opened, None if opened is not None else "refused")


def seeds() -> dict[str, bytes]:
    peer = Sealer([SECRET], b"\x02" * 8, 15.0, clock=lambda: NOW)
    frame = peer.seal(b"brokerd:t:room", b"an envelope")
    push = b"*3\r\n$8\r\nsmessage\r\n$14\r\nbrokerd:t:room\r\n$%d\r\n%s\r\n" % (len(frame), frame)
    return {
        "push": b"\x80" + push,
        "replies": b"\x40" + b"+OK\r\n:12\r\n-ERR no\r\n$-1\r\n*-1\r\n*2\r\n*1\r\n:1\r\n$2\r\nhi\r\n",
        "sealed": b"\x00" + frame,
    }

"""What travels on a node's own channel (``brokerd:n:<node id>``): frames for that node only.

Three kinds, told apart by a short name at the front (one length byte, then the name):

* a protocol's namespace (``ssmp``, ``smqp``, ...): a unicast, then its envelope (one message)
  for the session of that namespace at the message's target;
* ``@b``: a broadcast, then the sender's topics it may publish to and the envelope of the
  message (the receiving node reaches its members of those topics, once each);
* ``@s:<service>``: a front end's own message (a socket.mq request or its answer), then the
  sending node's id (16 hex digits) and the service's bytes.

Shared groups add two more, ``@g`` (a run for one member of a group) and ``@d`` (the answers),
whose layout and codec are brokerd.cluster.sharing's.

Sans-IO: the envelope codec and struct only.  Anything that does not parse raises
:class:`FrameError`; the engine drops and counts it.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from brokerd.cluster import envelope
from brokerd.core.message import Message

BROADCAST = "@b"
SERVICE = "@s:"
ORIGIN_SIZE = 16
"""A node id in hex (8 random bytes)."""
_U16 = struct.Struct(">H")


class FrameError(ValueError):
    """Bytes that are not a node-channel frame."""


def _head(name: str) -> bytes:
    raw = name.encode("ascii")
    if not 0 < len(raw) < 256:
        raise ValueError(f"a frame name of {len(raw)} bytes")
    return bytes((len(raw),)) + raw


def unicast(instance: bytes, namespace: str, message: Message) -> bytes:
    return _head(namespace) + envelope.encode(instance, [message])


def broadcast(instance: bytes, message: Message, topics: Sequence[bytes]) -> bytes:
    parts = [_head(BROADCAST), _U16.pack(len(topics))]
    for topic in topics:
        parts.append(_U16.pack(len(topic)))
        parts.append(topic)
    parts.append(envelope.encode(instance, [message]))
    return b"".join(parts)


def service(origin: str, name: str, data: bytes) -> bytes:
    raw = origin.encode("ascii")
    if len(raw) != ORIGIN_SIZE:
        raise ValueError("a node id is 16 hex digits")
    return _head(SERVICE + name) + raw + data


def kind(data: bytes) -> tuple[str, int]:
    """The frame's name and where its body starts."""
    if not data:
        raise FrameError("an empty frame")
    end = 1 + data[0]
    if len(data) < end or data[0] == 0:
        raise FrameError("a truncated frame name")
    try:
        return data[1:end].decode("ascii"), end
    except UnicodeDecodeError:
        raise FrameError("a frame name that is not ASCII") from None


def one_message(data: bytes, start: int) -> Message:
    """The one message of the envelope at ``start`` (a unicast's, a broadcast's)."""
    try:
        messages = envelope.decode(data[start:])
    except envelope.EnvelopeError as exc:
        raise FrameError(str(exc)) from None
    if len(messages) != 1:
        raise FrameError(f"{len(messages)} messages where one was expected")
    return messages[0]


def read_broadcast(data: bytes, start: int) -> tuple[list[bytes], Message]:
    """The topics and the message of a broadcast frame whose body starts at ``start``."""
    try:
        (count,) = _U16.unpack_from(data, start)
        at = start + 2
        topics = []
        for _ in range(count):
            (size,) = _U16.unpack_from(data, at)
            at += 2
            if at + size > len(data):
                raise FrameError("a truncated topic")
            topics.append(data[at:at + size])
            at += size
    except struct.error:
        raise FrameError("a truncated broadcast") from None
    return topics, one_message(data, at)


def read_service(data: bytes, start: int) -> tuple[str, bytes]:
    """The sending node's id and the service's bytes."""
    raw = data[start:start + ORIGIN_SIZE]
    if len(raw) != ORIGIN_SIZE:
        raise FrameError("a truncated node id")
    try:
        origin = raw.decode("ascii")
        int(origin, 16)
    except (UnicodeDecodeError, ValueError):
        raise FrameError("a node id that is not hex") from None
    return origin, data[start + ORIGIN_SIZE:]

"""How broker events look to SSMP recipients (the SSMP IWireFormat).

One instance, shared by every SSMP connection, so the core renders each message once for all
SSMP recipients.  Messages and members from other protocols get an SSMP identifier made from
their protocol and name (see :func:`foreign_id`), since their names need not be SSMP ids.
"""
from __future__ import annotations

from zope.interface import implementer

from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Message
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.ssmp.codec import (
    _KNOWN_IDS,  # is_id's memory of valid ids: looked up inline, as the codec does, on the hot path
    ID_CHARS,
    MAX_ID,
    MAX_PAYLOAD,
    encode_payload,
    is_id,
)

_MCAST = b"MCAST"
_UCAST = b"UCAST"
_BCAST = b"BCAST"
_ID_BYTES = frozenset(ID_CHARS)
_LF = 10
"""A line feed, as the int a bytes object holds (``10 in data`` is a fast byte search)."""


def foreign_id(protocol: str, name: bytes) -> bytes:
    """The SSMP identifier shown for a sender of another protocol: ``<protocol>:<name>`` with
    every byte that is not an ID character replaced by ``_``, cut to 64 characters."""
    cleaned = bytes(b if b in _ID_BYTES else 0x5F for b in name)
    return (protocol.encode("ascii") + b":" + cleaned)[:MAX_ID]


def ssmp_name(protocol: str, name: bytes) -> bytes:
    """How a session or sender of ``protocol`` called ``name`` appears in SSMP: SSMP's own
    names as they are, another protocol's in its own namespace (:func:`foreign_id`)."""
    if protocol == "ssmp":
        return name
    return foreign_id(protocol, name)


@implementer(IWireFormat)
class SSMPWireFormat(WireFormat):
    protocol = "ssmp"
    portable = True
    """The bytes depend on the message only: another node of a cluster may send them as they
    are (brokerd.cluster.envelope, rendered sections)."""
    writes_after_read = True
    """A session holds what a read sends it until the read is handled (brokerd.protocols.flow):
    the delivery-latency sampler times that write (brokerd.core.sampling)."""

    def __init__(self) -> None:
        self.unrepresentable = 0
        """Messages SSMP cannot carry (empty, over 1024 bytes, or a topic that is no SSMP id)."""

    def render_message(self, message: Message) -> bytes | None:
        payload = message.payload
        # Text that SSMP carries as it is (the common case, checked inline: this runs once per
        # message and format on the hot path); anything else takes encode_payload's rules.
        if message.binary or not payload or payload[0] <= 3 or len(payload) > MAX_PAYLOAD or _LF in payload:
            encoded = encode_payload(payload, message.binary)
            if encoded is None:
                self.unrepresentable += 1
                return None
            payload = encoded
        kind = message.kind
        target = message.target or b""  # set for a multicast and a unicast (None for a broadcast)
        if kind == MULTICAST and target not in _KNOWN_IDS and not is_id(target):
            self.unrepresentable += 1
            return None
        protocol = message.protocol
        sender = message.sender_name if protocol == "ssmp" else foreign_id(protocol, message.sender_name)
        if kind == MULTICAST:
            return b"".join((b"000 ", sender, b" MCAST ", target, b" ", payload, b"\n"))
        if kind == UNICAST:
            return b"".join((b"000 ", sender, b" UCAST ", target, b" ", payload, b"\n"))
        if kind == BROADCAST:
            return b"".join((b"000 ", sender, b" BCAST ", payload, b"\n"))
        return None

    def render_run(self, messages: list[Message]) -> bytes | None:
        """A run of text MCASTs (or UCASTs) one SSMP session sent to one topic (or address),
        the SSMP front end's runs, as one join: ``head + (b"\\n" + head).join(payloads)``;
        None for any other run, which is rendered message by message."""
        first = messages[0]
        kind = first.kind
        if first.protocol != "ssmp" or (kind != MULTICAST and kind != UNICAST):
            return None
        sender = first.sender_name
        for message in messages:
            if message.binary or message.sender_name is not sender or message.protocol != "ssmp":
                return None
        verb = b" MCAST " if kind == MULTICAST else b" UCAST "
        head = b"".join((b"000 ", sender, verb, first.target or b"", b" "))
        return b"".join((head, (b"\n" + head).join([message.payload for message in messages]), b"\n"))

    def render_presence(
        self, topic: bytes, member: ISubscriber, joined: bool, presence: bool
    ) -> bytes | None:
        if not is_id(topic):
            return None
        name = ssmp_name(member.protocol, member.name)
        if joined:
            flag = b" PRESENCE" if presence else b""
            return b"".join((b"000 ", name, b" SUBSCRIBE ", topic, flag, b"\n"))
        return b"".join((b"000 ", name, b" UNSUBSCRIBE ", topic, b"\n"))


SSMP_WIRE = SSMPWireFormat()

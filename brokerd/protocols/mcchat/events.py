"""The six MCCHAT v1 packets, plus :class:`Malformed` for a well-framed packet whose content
breaks a rule of the spec (a topic holding 0x04, a string that is not UTF-8).

Strings are the raw UTF-8 bytes as they stood on the wire (the server forwards messages
verbatim).  NamedTuples rather than frozen dataclasses: one is built per packet on the hot path
and tuple construction is several times cheaper.
"""
from __future__ import annotations

from typing import NamedTuple

INFO = 0
SUB = 1
UNSUB = 2
MSG = 3
TLRQ = 4
TL = 5
OPCODES = {INFO: "INFO", SUB: "SUB", UNSUB: "UNSUB", MSG: "MSG", TLRQ: "TLRQ", TL: "TL"}

EOT_IN_TOPIC = "topic contains the byte 0x04"
"""Malformed.reason: topic names cannot hold 0x04, which ends a TL packet's list."""
NOT_UTF8 = "string is not UTF-8"
"""Malformed.reason: every MCCHAT string is UTF-8."""


class Info(NamedTuple):
    """``00 version``: the server's protocol version, sent once right after connect."""

    version: int


class Sub(NamedTuple):
    """``01 topic 00``: start receiving the topic's messages."""

    topic: bytes


class Unsub(NamedTuple):
    """``02 topic 00``: stop receiving the topic's messages."""

    topic: bytes


class Msg(NamedTuple):
    """``03 topic 00 username 00 message 00``: a message to (or from) a topic."""

    topic: bytes
    username: bytes
    message: bytes


class TopicListRequest(NamedTuple):
    """``04``: ask for the active topics."""


class TopicList(NamedTuple):
    """``05 (topic 00)* 04``: the active topics."""

    topics: tuple[bytes, ...]


class Malformed(NamedTuple):
    """A complete packet the spec forbids although it could be framed: ``opcode`` says which
    packet, ``reason`` what was wrong.  The stream stays in sync, so a receiver may drop it
    and read on (brokerd's server does, and counts it)."""

    opcode: int
    reason: str


Packet = Info | Sub | Unsub | Msg | TopicListRequest | TopicList
Event = Packet | Malformed

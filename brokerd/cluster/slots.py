"""Redis Cluster's key space, as a client sees it: which of the 16384 hash slots a channel
is in, which master serves each slot, and what a ``-MOVED``/``-ASK`` redirection says.

Sharded pub/sub (SPUBLISH, SSUBSCRIBE) hashes a channel name exactly as a key: CRC16
(XMODEM: polynomial 0x1021, initial value 0) of the name, or of its hash tag (the bytes
between the first ``{`` and the next ``}``, when not empty), modulo 16384.  The engine keeps
a :class:`SlotMap` made from ``CLUSTER SLOTS`` and sends each channel's commands to the
master that owns its slot.  Sans-IO: bytes and tuples in, tuples out.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SLOTS = 16384

Address = tuple[str, int]
"""A master's host and port, as CLUSTER SLOTS and redirections name it."""


def _table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with."""
    crc = 0
    table = _CRC16
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]
    return crc


def hash_slot(key: bytes) -> int:
    """The slot of a key or sharded channel: only its hash tag counts when it has one."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc16(key) % SLOTS


class TopologyError(ValueError):
    """A CLUSTER SLOTS reply or a redirection that does not parse."""


class Redirect:
    """A ``MOVED slot host:port`` or ``ASK slot host:port`` error: the slot is (MOVED) or,
    for this one command, may be (ASK) served by another master."""

    __slots__ = ("moved", "slot", "address")

    def __init__(self, moved: bool, slot: int, address: Address) -> None:
        self.moved = moved
        self.slot = slot
        self.address = address


def redirect(error: str, default_host: str) -> Redirect | None:
    """The redirection an error reply names, or None when it is another error.  A host left
    empty (a node that does not know its own address) is ``default_host``."""
    parts = error.split(" ")
    if len(parts) != 3 or parts[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = parts[2].rpartition(":")
    try:
        slot = int(parts[1])
        number = int(port)
    except ValueError:
        raise TopologyError(f"a redirection without a slot and port: {error!r}") from None
    if not 0 <= slot < SLOTS or not 0 < number < 65536:
        raise TopologyError(f"a redirection out of range: {error!r}")
    return Redirect(parts[0] == "MOVED", slot, (host or default_host, number))


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_cluster_slots(reply: object, default_host: str) -> list[tuple[int, int, Address]]:
    """The (first slot, last slot, master) ranges of a CLUSTER SLOTS reply.  A master whose
    address is empty or ``?`` is taken to be on ``default_host`` (the node asked)."""
    if not isinstance(reply, list):
        raise TopologyError("CLUSTER SLOTS did not answer an array")
    ranges = []
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list) or len(entry[2]) < 2:
            raise TopologyError(f"a CLUSTER SLOTS entry without a master: {entry!r}")
        try:
            first, last, port = int(entry[0]), int(entry[1]), int(entry[2][1])
        except (TypeError, ValueError):
            raise TopologyError(f"a CLUSTER SLOTS entry that is not numbers: {entry!r}") from None
        if not 0 <= first <= last < SLOTS:
            raise TopologyError(f"a slot range out of bounds: {first}-{last}")
        host = _text(entry[2][0])
        ranges.append((first, last, (host if host not in ("", "?") else default_host, port)))
    return ranges


class SlotMap:
    """Which master serves each slot (None: no master known for it)."""

    def __init__(self, ranges: Iterable[tuple[int, int, Address]] = ()) -> None:
        self.owners: list[Address | None] = [None] * SLOTS
        for first, last, address in ranges:
            self.owners[first:last + 1] = [address] * (last - first + 1)

    @classmethod
    def single(cls, address: Address) -> SlotMap:
        """Every slot on one server (a Redis that is not a cluster)."""
        return cls([(0, SLOTS - 1, address)])

    def owner(self, slot: int) -> Address | None:
        return self.owners[slot]

    def assign(self, slot: int, address: Address) -> None:
        """What a MOVED redirection teaches before the next CLUSTER SLOTS confirms it."""
        self.owners[slot] = address

    def masters(self) -> set[Address]:
        return {address for address in self.owners if address is not None}

    def covered(self) -> bool:
        return all(address is not None for address in self.owners)

"""Redis Cluster's hash slots, redirections and CLUSTER SLOTS replies (brokerd.cluster.slots),
against the values the Redis documentation gives (the cluster specification and the
CLUSTER KEYSLOT page); tests/integration/test_cluster_shards.py checks the same names
against a running cluster's CLUSTER KEYSLOT."""
from __future__ import annotations

import pytest

from brokerd.cluster import slots


def test_crc16_is_xmodem() -> None:
    # The cluster specification: "the output of CRC16 for the string 123456789 is 0x31C3".
    assert slots.crc16(b"123456789") == 0x31C3
    assert slots.crc16(b"") == 0


@pytest.mark.parametrize(("key", "slot"), [
    (b"somekey", 11058),        # CLUSTER KEYSLOT's examples
    (b"foo{hash_tag}", 2515),
    (b"bar{hash_tag}", 2515),
    (b"foo", 12182),
])
def test_documented_key_slots(key: bytes, slot: int) -> None:
    assert slots.hash_slot(key) == slot


def test_hash_tags_follow_the_specification() -> None:
    same = slots.hash_slot
    assert same(b"{user1000}.following") == same(b"{user1000}.followers") == same(b"user1000")
    assert same(b"foo{}{bar}") == slots.crc16(b"foo{}{bar}") % 16384  # an empty tag: the whole key
    assert same(b"foo{{bar}}zap") == same(b"{bar")  # from the first { to the first } after it
    assert same(b"foo{bar}{zap}") == same(b"bar")  # only the first tag
    assert same(b"foo{bar") == slots.crc16(b"foo{bar") % 16384  # no closing brace: the whole key


def test_redirections() -> None:
    moved = slots.redirect("MOVED 3999 127.0.0.1:6381", "seed")
    assert moved is not None and (moved.moved, moved.slot, moved.address) == (True, 3999, ("127.0.0.1", 6381))
    ask = slots.redirect("ASK 3999 :6381", "10.0.0.5")
    assert ask is not None and (ask.moved, ask.address) == (False, ("10.0.0.5", 6381))
    assert slots.redirect("ERR unknown command", "seed") is None
    for bad in ("MOVED x 127.0.0.1:6381", "MOVED 16384 h:1", "ASK 1 h:0", "MOVED 1 h:port"):
        with pytest.raises(slots.TopologyError):
            slots.redirect(bad, "seed")


def test_a_cluster_slots_reply_becomes_a_slot_map() -> None:
    reply = [
        [0, 5460, [b"127.0.0.1", 7000, b"id-a", []], [b"127.0.0.1", 7003, b"id-r", []]],
        [5461, 16383, [b"", 7001, b"id-b"]],
    ]
    ranges = slots.parse_cluster_slots(reply, "seed-host")
    assert ranges == [(0, 5460, ("127.0.0.1", 7000)), (5461, 16383, ("seed-host", 7001))]
    table = slots.SlotMap(ranges)
    assert table.owner(0) == table.owner(5460) == ("127.0.0.1", 7000)
    assert table.owner(5461) == table.owner(16383) == ("seed-host", 7001)
    assert table.covered() and table.masters() == {("127.0.0.1", 7000), ("seed-host", 7001)}
    table.assign(3, ("seed-host", 7001))
    assert table.owner(3) == ("seed-host", 7001)
    assert not slots.SlotMap(ranges[:1]).covered()


@pytest.mark.parametrize("reply", [
    b"not an array", [[0, 10]], [[0, 10, [b"h"]]], [[b"x", 10, [b"h", 1]]],
    [[10, 5, [b"h", 1]]], [[0, 16384, [b"h", 1]]],
])
def test_damaged_cluster_slots_replies_are_refused(reply: object) -> None:
    with pytest.raises(slots.TopologyError):
        slots.parse_cluster_slots(reply, "seed")

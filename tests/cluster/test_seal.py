"""Sealing of inter-node messages (brokerd.cluster.seal): what opens, what is rejected and why,
key rotation, the freshness window, what a receiver remembers, and the secret file's rules."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster import seal
from brokerd.cluster.seal import HEADER_SIZE, OVERHEAD, Sealer, read_secret_file
from brokerd.errors import ConfigurationError
from tests.support.redis import cluster_secret
from tests.support.examples import examples

OLD = b"old-secret-of-the-cluster-0001"
NEW = b"new-secret-of-the-cluster-0002"
ROOM = b"brokerd:t:room"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def pair(clock: Clock, sender_secrets: list[bytes] = [OLD], receiver_secrets: list[bytes] = [OLD],
         window: float = 15.0) -> tuple[Sealer, Sealer]:
    return (Sealer(sender_secrets, b"A" * 8, window, clock), Sealer(receiver_secrets, b"B" * 8, window, clock))


def test_a_frame_opens_once_on_its_channel_and_is_not_readable_on_redis() -> None:
    clock = Clock()
    sender, receiver = pair(clock)
    frame = sender.seal(ROOM, b"hello, node")
    assert b"hello" not in frame and len(frame) == len(b"hello, node") + OVERHEAD
    assert receiver.open(ROOM, frame) == b"hello, node"
    assert receiver.open(ROOM, frame) is None  # the same frame again
    assert receiver.rejected["replay"] == 1
    assert receiver.open(ROOM, sender.seal(ROOM, b"next")) == b"next"


def test_a_frame_moved_to_another_channel_does_not_open() -> None:
    sender, receiver = pair(Clock())
    assert receiver.open(b"brokerd:t:other", sender.seal(ROOM, b"x")) is None
    assert receiver.rejected["bad_tag"] == 1


def test_forged_damaged_and_unknown_frames_are_rejected_by_reason() -> None:
    clock = Clock()
    sender, receiver = pair(clock)
    frame = sender.seal(ROOM, b"payload")
    observed: list[str] = []
    receiver.observers.append(observed.append)
    assert receiver.open(ROOM, b"") is None
    assert receiver.open(ROOM, b"\x02" + frame[1:]) is None  # another version
    damaged = bytearray(frame)
    damaged[-1] ^= 1
    assert receiver.open(ROOM, bytes(damaged)) is None
    stranger = Sealer([b"a-secret-nobody-in-the-cluster-has"], b"C" * 8, 15.0, clock)
    assert receiver.open(ROOM, stranger.seal(ROOM, b"forged")) is None
    forged_header = bytearray(frame)
    forged_header[13:21] = (99).to_bytes(8, "big")  # another sequence under the same tag
    assert receiver.open(ROOM, bytes(forged_header)) is None
    assert observed == ["malformed", "malformed", "bad_tag", "unknown_key", "bad_tag"]
    assert receiver.open(ROOM, frame) == b"payload"  # the genuine one still opens


def test_own_echo_is_skipped_without_counting() -> None:
    sender, _ = pair(Clock())
    assert sender.open(ROOM, sender.seal(ROOM, b"mine")) is None
    assert not any(sender.rejected.values())
    assert sender.open_own(ROOM, sender.seal(ROOM, b"mine")) == b"mine"


def test_order_is_checked_per_channel_not_across_channels() -> None:
    sender, receiver = pair(Clock())
    first_room = sender.seal(ROOM, b"1")
    other = sender.seal(b"brokerd:c", b"2")
    second_room = sender.seal(ROOM, b"3")
    assert receiver.open(b"brokerd:c", other) == b"2"
    assert receiver.open(ROOM, first_room) == b"1"  # older than "2" but first on its channel
    assert receiver.open(ROOM, second_room) == b"3"
    assert receiver.open(ROOM, first_room) is None and receiver.rejected["replay"] == 1


def test_stale_and_future_frames_are_rejected_and_a_restarted_sender_is_accepted() -> None:
    clock = Clock()
    sender, receiver = pair(clock, window=15.0)
    old = sender.seal(ROOM, b"recorded")
    clock.now += 15.5
    assert receiver.open(ROOM, old) is None and receiver.rejected["stale"] == 1
    clock.now -= 40
    assert receiver.open(ROOM, sender.seal(ROOM, b"from the future")) is None
    assert receiver.rejected["stale"] == 2
    clock.now += 40
    restarted = Sealer([OLD], b"R" * 8, 15.0, clock)  # the same node started again: a new incarnation
    assert receiver.open(ROOM, restarted.seal(ROOM, b"again")) == b"again"


def test_a_frame_sealed_before_the_receiver_subscribed_to_its_channel_is_refused_beyond_the_skew() -> None:
    clock = Clock()
    sender = Sealer([OLD], b"A" * 8, 15.0, clock)
    captured = sender.seal(ROOM, b"sealed 2 s before the receiver started")
    clock.now += 1.5
    within_skew = sender.seal(ROOM, b"sealed 0.5 s before")
    clock.now += 0.5
    receiver = Sealer([OLD], b"B" * 8, 15.0, clock, skew=1.0)  # a node (re)started: no sequence on record
    receiver.subscribing(ROOM)
    assert receiver.open(ROOM, captured) is None and receiver.rejected["early"] == 1
    assert receiver.open(ROOM, within_skew) == b"sealed 0.5 s before"  # the allowance: once
    assert receiver.open(ROOM, within_skew) is None and receiver.rejected["replay"] == 1
    assert receiver.open(ROOM, sender.seal(ROOM, b"fresh")) == b"fresh"

    other = b"brokerd:t:other"  # a channel the running receiver follows only later
    unfollowed = sender.seal(other, b"sealed while the receiver did not follow the channel")
    clock.now += 3
    receiver.subscribing(other)
    assert receiver.open(other, unfollowed) is None and receiver.rejected["early"] == 2
    assert receiver.open(other, sender.seal(other, b"after")) == b"after"

    missed = sender.seal(ROOM, b"sealed while the receiver's connection was down")
    clock.now += 3
    receiver.subscribing(ROOM)  # subscribed again once Redis was back
    assert receiver.open(ROOM, missed) is None and receiver.rejected["early"] == 3
    receiver.unsubscribed(other)  # no longer followed: frames still in flight are checked against its start
    assert receiver.open(other, sender.seal(other, b"in flight")) == b"in flight"
    assert receiver.open(ROOM, sender.seal(ROOM, b"fresh again")) == b"fresh again"


def test_a_sender_clock_going_back_does_not_make_its_frames_look_old() -> None:
    clock = Clock()
    sender, receiver = pair(clock)
    assert receiver.open(ROOM, sender.seal(ROOM, b"1")) == b"1"
    clock.now -= 5  # the sender's clock stepped back; its sent_at stays where it was
    later = sender.seal(ROOM, b"2")
    clock.now += 5
    assert receiver.open(ROOM, later) == b"2"


def test_rotation_first_line_seals_every_line_opens() -> None:
    clock = Clock()
    old_node, new_node = Sealer([OLD], b"A" * 8, 15.0, clock), Sealer([OLD], b"B" * 8, 15.0, clock)
    new_node.install([OLD, NEW])  # step 1: the new secret opens everywhere
    assert new_node.open(ROOM, old_node.seal(ROOM, b"a")) == b"a"
    new_node.install([NEW, OLD])  # step 2: it seals
    assert old_node.open(ROOM, new_node.seal(ROOM, b"b")) is None  # a node not yet at step 1
    assert old_node.rejected["unknown_key"] == 1
    old_node.install([OLD, NEW])
    assert old_node.open(ROOM, new_node.seal(ROOM, b"c")) == b"c"
    old_node.install([NEW, OLD])
    assert new_node.open(ROOM, old_node.seal(ROOM, b"d")) == b"d"
    new_node.install([NEW])  # step 3: the old secret is gone
    assert new_node.open(ROOM, Sealer([OLD], b"C" * 8, 15.0, clock).seal(ROOM, b"e")) is None
    assert new_node.rejected["unknown_key"] == 1
    assert new_node.key_ids == [seal.Key(NEW).key_id]


def test_what_a_receiver_remembers_is_forgotten_after_the_window_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    _, receiver = pair(clock)
    senders = [Sealer([OLD], i.to_bytes(8, "big"), 15.0, clock) for i in range(1, 4)]
    frames = [sender.seal(ROOM, b"x") for sender in senders]
    monkeypatch.setattr(seal, "MAX_SENDERS", 2)
    assert receiver.open(ROOM, frames[0]) == b"x" and receiver.open(ROOM, frames[1]) == b"x"
    assert receiver.open(ROOM, frames[2]) is None and receiver.rejected["overflow"] == 1
    assert receiver.senders == 2
    clock.now += 16
    receiver.expire()
    assert receiver.senders == 0
    assert receiver.open(ROOM, frames[0]) is None and receiver.rejected["stale"] == 1  # forgotten, still refused
    assert receiver.open(ROOM, senders[2].seal(ROOM, b"y")) == b"y"


def test_rejections_are_logged_at_most_once_a_minute() -> None:
    _, receiver = pair(Clock())
    lines: list[dict[str, int]] = []
    receiver.log = lines.append
    for _ in range(1000):
        receiver.open(ROOM, b"garbage" * 10)
    assert lines == [{"malformed": 1}]
    assert receiver.rejected["malformed"] == 1000


def test_the_secret_file(tmp_path: Path) -> None:
    good = cluster_secret(tmp_path / "good", NEW, OLD)
    assert read_secret_file(good) == [NEW, OLD]
    loose = cluster_secret(tmp_path / "loose", NEW)
    os.chmod(loose, 0o640)
    cases = {
        loose: "must not be accessible to group or others",
        cluster_secret(tmp_path / "empty", b"  "): "the file is empty",
        cluster_secret(tmp_path / "three", NEW, OLD, OLD): "3 lines, at most 2",
        cluster_secret(tmp_path / "short", b"short"): "shorter than 16 bytes",
        tmp_path / "missing": "No such file",
    }
    for path, message in cases.items():
        with pytest.raises(ConfigurationError, match=message) as caught:
            read_secret_file(path)
        assert str(caught.value).startswith(f"--cluster-secret-file {path}: ") and "\n" not in str(caught.value)


_SENDER = Sealer([OLD], b"A" * 8, 15.0, Clock())
_GENUINE = _SENDER.seal(ROOM, b"genuine")


@given(st.one_of(
    st.binary(max_size=256),
    st.binary(max_size=256).map(lambda tail: _GENUINE[:HEADER_SIZE] + tail),  # a real header, any box
    st.tuples(st.integers(0, len(_GENUINE) - 1), st.integers(1, 255)).map(
        lambda flip: _GENUINE[:flip[0]] + bytes([_GENUINE[flip[0]] ^ flip[1]]) + _GENUINE[flip[0] + 1:]),
))
@settings(max_examples=examples(300), deadline=None)
def test_no_bytes_but_a_sealed_frame_open_and_none_raises(data: bytes) -> None:
    receiver = Sealer([OLD], b"B" * 8, 15.0, Clock())
    assert receiver.open(ROOM, data) is None
    assert sum(receiver.rejected.values()) == 1
    assert receiver.open(ROOM, _GENUINE) == b"genuine"  # positive control: the real frame opens

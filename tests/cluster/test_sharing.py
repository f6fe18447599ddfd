"""Shared groups across the nodes of a cluster (brokerd.cluster.sharing), without Redis: the
share and done frames, the ``share`` control message, the choosing node's weighted turn over
the nodes with members, and what happens to a run the chosen node did not take (it answered
that no member could, or it was declared dead).  The whole path over three real processes is
tests/integration/test_cluster_shared.py."""
from __future__ import annotations

from collections import Counter
import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from brokerd.core.publication import RemoteMulticast
from brokerd.cluster import directory as control
from brokerd.cluster import sharing
from brokerd.cluster.address import parse
from brokerd.cluster.redis_engine import NODE_PREFIX, RedisEngine
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, UNICAST, Message
from brokerd.protocols.ssmp.wire import SSMP_WIRE
from tests.cluster.test_decoders_hostile import HOSTILE, hostile
from tests.support.sessions import RecordingSession

TWO, THREE = "0000000000000002", "0000000000000003"
KEY = (b"pool", b"jobs/#")
INSTANCE = b"\x05" * 8


def job(payload: bytes = b"j", topic: bytes = b"jobs/a") -> Message:
    return Message(MULTICAST, topic, payload, "ssmp", b"boss")


class Node:
    """A RedisEngine (not connected) over a real Broker; ``members`` joins local members of KEY."""

    def __init__(self, max_pending: int = 100) -> None:
        self.broker = Broker()
        self.engine = RedisEngine(parse("redis://127.0.0.1:1"), Clock(), "node1", secrets=[b"s" * 32],
                                  max_shared_pending=max_pending)
        self.engine.broker = self.broker
        self.broker.use_engine(self.engine)
        self.sessions: list[RecordingSession] = []

    def members(self, count: int, key: tuple[bytes, bytes] = KEY) -> list[RecordingSession]:
        made = []
        for _ in range(count):
            session = RecordingSession(b"m%d" % len(self.sessions), SSMP_WIRE)
            self.broker.attach(session)
            self.broker.subscribe_filter(session, key[1], share=key[0])
            self.sessions.append(session)
            made.append(session)
        return made

    def announce(self, origin: str, members: int, key: tuple[bytes, bytes] = KEY) -> None:
        self.engine.directory.apply(control.decode(control.encode(
            origin, "n", control.SHARE, **control.share_fields(key, members))), 0.0)

    def sent(self) -> list[tuple[str, int, list[bytes]]]:
        """(node, sequence, payloads) of each share frame queued for another node (taken)."""
        found = []
        for name, data in self.engine._raw:
            if name.startswith(NODE_PREFIX):
                sequence, _key, _origin, messages = sharing.read_share(data, 3)
                found.append((name[len(NODE_PREFIX):].decode(), sequence, [m.payload for m in messages]))
        self.engine._raw.clear()
        return found


def test_the_frames_read_back_and_hostile_bytes_are_refused_with_their_error() -> None:
    data = sharing.share_frame(INSTANCE, 7, KEY, [job(b"1"), job(b"2")])
    assert data[:3] == b"\x02@g"
    sequence, key, origin, messages = sharing.read_share(data, 3)
    assert (sequence, key, origin, [m.payload for m in messages]) == (7, KEY, INSTANCE.hex(), [b"1", b"2"])
    done = sharing.done_frame(INSTANCE, [(7, True), (8, False)])
    assert sharing.read_done(done, 3) == (INSTANCE.hex(), [(7, True), (8, False)])
    for bad in (sharing.share_frame(INSTANCE, 1, KEY, [Message(UNICAST, b"a", b"x", "ssmp", b"b")]),
                sharing.share_frame(INSTANCE, 1, KEY, [job(topic=b"jobs/a"), job(topic=b"jobs/b")]),
                sharing.share_frame(INSTANCE, 1, (b"", b"jobs/#"), [job()]), data[:10], done[:-1], done + b"x"):
        with pytest.raises(sharing.ShareFrameError):
            (sharing.read_done if bad[1:3] == b"@d" else sharing.read_share)(bad, 3)


@HOSTILE
@given(hostile(st.sampled_from([sharing.share_frame(INSTANCE, 3, KEY, [job(b"1"), job(b"2")]),
                                sharing.done_frame(INSTANCE, [(3, True), (4, False)])])))
def test_a_share_or_done_frame_decodes_or_is_refused_with_share_frame_error(data: bytes) -> None:
    try:
        (sharing.read_done if data[1:3] == b"@d" else sharing.read_share)(data, 3)
    except sharing.ShareFrameError:
        pass


def test_a_share_announcement_is_checked_and_known_until_its_node_goes() -> None:
    node = Node()
    directory = node.engine.directory
    node.announce(TWO, 2)
    node.announce(THREE, 1, (b"audit", b"jobs/#"))
    assert set(directory.shared_groups(b"jobs/x")) == {KEY, (b"audit", b"jobs/#")}
    assert directory.shares[KEY] == {TWO: 2}
    node.announce(TWO, 0)
    assert directory.shared_groups(b"jobs/x") == ((b"audit", b"jobs/#"),)
    directory.apply(control.decode(control.encode(TWO, "n", control.STATE, shares=[["pool", "jobs/#", 3]])), 0.0)
    assert directory.shares[KEY] == {TWO: 3}
    directory.forget(TWO)
    directory.forget(THREE)
    assert directory.shares == {} and directory.shared_groups(b"jobs/x") == ()
    for fields in ({"g": "", "f": "a/#", "c": 1}, {"g": "g", "f": "a/#/b", "c": 1}, {"g": "g", "f": "a", "c": -1},
                   {"g": "g", "f": "a", "c": True}, {"g": "g", "f": "a", "c": 1.5}, {"g": "g", "f": "a"}):
        with pytest.raises(control.ControlError):
            control.decode(control.encode(TWO, "n", control.SHARE, **fields))
    with pytest.raises(control.ControlError):
        control.decode(control.encode(TWO, "n", control.STATE, shares=[["g", "a"]]))


def test_a_group_only_this_node_has_is_served_here_as_on_one_node() -> None:
    node = Node()
    one, two = node.members(2)
    assert node.engine.place_shared([job()]) is None
    for n in range(4):
        node.broker.publish(job(b"%d" % n))
    assert len(one.received) == 2 and len(two.received) == 2


def test_the_choosing_node_takes_turns_over_the_nodes_weighted_by_their_members() -> None:
    node = Node()
    local = node.members(1)
    node.announce(TWO, 2)
    node.announce(THREE, 1)
    for n in range(8):
        node.broker.publish(job(b"%d" % n))
    sent = node.sent()
    by_node = Counter(origin for origin, _seq, _payloads in sent)
    assert by_node == {TWO: 4, THREE: 2}
    assert len(local[0].received) == 2  # its turns, delivered here: each message once in all
    assert node.engine.sharing.pending == 6 and node.engine.sharing.stats["sent"] == 6


def test_a_run_the_chosen_node_did_not_take_goes_to_another_and_is_lost_only_with_no_member_left() -> None:
    node = Node()
    node.announce(TWO, 1)
    node.announce(THREE, 1)
    node.broker.publish_batch([job(b"a"), job(b"b")])
    [(first, sequence, payloads)] = node.sent()
    assert payloads == [b"a", b"b"]
    node.engine.sharing.answered(sharing.done_frame(bytes.fromhex(first), [(sequence, False)]), 3)
    [(second, sequence, payloads)] = node.sent()
    assert second != first and payloads == [b"a", b"b"]
    assert node.engine.sharing.pending == 2
    node.engine.directory.forget(second)
    node.engine._node_gone(second)  # declared dead: the first one was tried already, none is left
    assert node.sent() == [] and node.engine.sharing.stats["lost"] == 2 and node.engine.sharing.pending == 0


def test_a_run_kept_for_a_dead_node_goes_to_a_member_here_and_answers_forget_it() -> None:
    node = Node()
    [here] = node.members(1)
    node.announce(TWO, 1)
    node.broker.publish(job(b"x"))  # node2's turn (the other nodes by id, then this one): sent and kept
    node.broker.publish(job(b"y"))  # this node's turn: delivered here
    assert len(here.received) == 1 and b"y" in here.received[0]
    [(origin, sequence, payloads)] = node.sent()
    assert origin == TWO and payloads == [b"x"]
    node.engine.sharing.answered(sharing.done_frame(bytes.fromhex(THREE), [(sequence, True)]), 3)
    assert node.engine.sharing.pending == 1  # an answer from another node than the chosen one is ignored
    node.engine.directory.forget(TWO)
    node.engine._node_gone(TWO)
    assert len(here.received) == 2 and b"x" in here.received[-1]
    assert node.engine.sharing.pending == 0 and node.engine.sharing.stats["placed_again"] == 1
    node.announce(TWO, 1)
    node.broker.publish(job(b"z"))
    node.broker.publish(job(b"w"))
    [(origin, sequence, _payloads)] = node.sent()
    node.engine.sharing.answered(sharing.done_frame(bytes.fromhex(origin), [(sequence, True)]), 3)
    assert node.engine.sharing.pending == 0 and node.engine.sharing.stats["lost"] == 0


def test_a_run_left_unanswered_past_the_node_timeout_is_sent_again_a_bounded_number_of_times() -> None:
    node = Node()
    node.announce(TWO, 1)
    clock = node.engine.reactor
    node.broker.publish(job(b"lost-by-redis"))
    [(origin, first, _payloads)] = node.sent()
    node.engine.sharing.unanswered(clock.seconds())  # sent at this instant: not before it
    assert node.sent() == []
    for attempt in range(sharing.MAX_SENDS - 1):
        clock.advance(1)
        node.engine.sharing.unanswered(clock.seconds())
        [(again, sequence, payloads)] = node.sent()
        assert again == TWO and payloads == [b"lost-by-redis"] and sequence != first
    assert node.engine.sharing.stats["placed_again"] == sharing.MAX_SENDS - 1
    clock.advance(1)
    node.engine.sharing.unanswered(clock.seconds())
    assert node.sent() == [] and node.engine.sharing.stats["lost"] == 1 and node.engine.sharing.pending == 0


def test_past_the_pending_bound_runs_are_sent_unkept_and_counted() -> None:
    node = Node(max_pending=3)
    node.announce(TWO, 1)
    node.broker.publish_batch([job(b"1"), job(b"2")])
    node.broker.publish_batch([job(b"3"), job(b"4")])
    assert len(node.sent()) == 2
    assert node.engine.sharing.pending == 2 and node.engine.sharing.stats["unkept"] == 2


def test_the_chosen_node_hands_the_run_to_one_member_and_answers() -> None:
    node = Node()
    one, two = node.members(2)
    plain = RecordingSession(b"plain", SSMP_WIRE)
    node.broker.attach(plain)
    node.broker.subscribe_filter(plain, b"jobs/#")
    node.engine._node_message(sharing.share_frame(INSTANCE, 9, KEY, [job(b"1")]))
    node.engine._node_message(sharing.share_frame(INSTANCE, 10, KEY, [job(b"2")]))
    node.engine._node_message(sharing.share_frame(INSTANCE, 11, (b"gone", b"jobs/#"), [job(b"3")]))
    assert len(one.received) == 1 and len(two.received) == 1
    assert plain.received == []  # the plain subscriber gets runs from the topic's channel, not from these
    assert node.engine.sharing.answers() == [(INSTANCE.hex(), sharing.done_frame(
        node.engine.instance, [(9, True), (10, True), (11, False)]))]


def test_the_chosen_node_does_not_send_twice_to_a_member_that_also_subscribed_plainly() -> None:
    node = Node()
    [member] = node.members(1)
    node.broker.subscribe_filter(member, b"jobs/+")
    node.engine._node_message(sharing.share_frame(INSTANCE, 1, KEY, [job(b"1")]))
    assert member.received == []  # the topic's channel brings it to its plain subscription
    node.broker.route(RemoteMulticast([job(b"2")]))
    assert len(member.received) == 1
    assert node.engine.sharing.answers()[0][1] == sharing.done_frame(node.engine.instance, [(1, True)])


def test_a_run_from_another_node_s_channel_feeds_no_group_here() -> None:
    node = Node()
    [member] = node.members(1)
    plain = RecordingSession(b"plain", SSMP_WIRE)
    node.broker.attach(plain)
    node.broker.subscribe_filter(plain, b"jobs/#")
    node.broker.route(RemoteMulticast([job(b"1")]))
    assert member.received == [] and len(plain.received) == 1


"""Shared subscriptions across the nodes of a cluster: one member in the whole cluster gets
each message of a group.

A group (MQTT's ``$share/{group}/{filter}``) may have members on several nodes.  Each node
announces how many members it has of each group (a ``share`` control message when the count
changes, and its groups in each state; brokerd.cluster.directory), so every node knows, for
each group, the live nodes with members and their counts.  The node that accepted a run is
the one that chooses, with no coordinator: for each group whose filter matches the run's
topic it picks ONE node, in turn over the nodes weighted by their members (this node
included), and

* when it chose itself, its own routing hands the run to one local member (the Broker's
  ``groups`` argument);
* otherwise it sends the run once, on the chosen node's own channel, in a *share* frame
  naming the group; that node hands it to one of its members (``Router.route``) and
  answers with a *done* frame.  Every node skips the groups when it delivers a run from a
  topic's or the filter channel.

The choosing node keeps each run it sent until the chosen node answers (at most
``max_pending`` messages; beyond, runs are sent without being kept, and counted).  When the
chosen node answers that it has no member to take the run (its last one left meanwhile), or
is declared dead (its ``bye``, or ``--cluster-node-timeout`` of silence, whereupon its groups
leave the directory too), the run is placed again among the other nodes, this one included:
a run the chosen node never took is not lost while some member is left in the cluster.  A run
not answered within the node timeout although its node lives (Redis lost it, or the answer,
during a short outage) is placed again too, possibly on the same node: then a member may get
it twice.  A run is sent at most MAX_SENDS times.  What is still lost: a run a node handed to
its member before the node died, if the member's client had not received it (MQTT's in-flight
messages of a live session die with it); and the runs this node kept for others if this node
dies (as everything it had not yet written to Redis).

Frames on a node's channel (brokerd.cluster.frames' layout: a length byte and the name):

* ``@g``: u32 sequence, u16 + group name, u16 + filter, then the run's envelope;
* ``@d``: the answering node's id (8 bytes), u16 count, then count times (u32 sequence, one byte: 1 handed to a member, 0 none
  could take it).
"""
from __future__ import annotations

import struct
from collections.abc import Container, Sequence
from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from brokerd.cluster import envelope
from brokerd.cluster.directory import Directory
from brokerd.cluster.localbroker import LocalBroker
from brokerd.core.message import MULTICAST, Message
from brokerd.core.publication import RemoteShare

SHARE = "@g"
DONE = "@d"
NAMES = (SHARE, DONE)
SharedKey = tuple[bytes, bytes]
_SEQ = struct.Struct(">I")
_U16 = struct.Struct(">H")
_DONE = struct.Struct(">IB")
MAX_DONE = 0xFFFF
"""Answers one done frame carries at most (more leave in the next frame)."""
MAX_TURNS = 4096
"""Groups whose turn is remembered at most; past it the turns start again from the first
node (groups come and go: their count stays bounded)."""


class ShareFrameError(ValueError):
    """Bytes that are not a share or done frame."""


def _head(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes((len(raw),)) + raw


def share_frame(instance: bytes, sequence: int, key: SharedKey, messages: Sequence[Message]) -> bytes:
    group, topic_filter = key
    return b"".join((_head(SHARE), _SEQ.pack(sequence), _U16.pack(len(group)), group,
                     _U16.pack(len(topic_filter)), topic_filter, envelope.encode(instance, messages)))


def read_share(data: bytes, start: int) -> tuple[int, SharedKey, str, list[Message]]:
    """(sequence, group key, sending node's id, messages) of a share frame whose body starts
    at ``start``; ShareFrameError when it does not parse or is not a run of multicasts."""
    try:
        (sequence,) = _SEQ.unpack_from(data, start)
        at = start + 4
        parts = []
        for _ in range(2):
            (size,) = _U16.unpack_from(data, at)
            at += 2
            if size == 0 or at + size > len(data):
                raise ShareFrameError("a truncated or empty group name or filter")
            parts.append(data[at:at + size])
            at += size
        body = data[at:]
        origin = envelope.origin_of(body).hex()
        messages = envelope.decode(body)
    except (struct.error, envelope.EnvelopeError) as exc:
        raise ShareFrameError(f"a damaged share frame: {exc}") from None
    if not messages or not messages[0].target or any(
            m.kind != MULTICAST or m.target != messages[0].target for m in messages):
        raise ShareFrameError("a share frame whose run is not multicasts to one topic")
    return sequence, (parts[0], parts[1]), origin, messages


def done_frame(instance: bytes, answers: Sequence[tuple[int, bool]]) -> bytes:
    return b"".join((_head(DONE), instance, _U16.pack(len(answers)),
                     *(_DONE.pack(seq, int(ok)) for seq, ok in answers)))


def read_done(data: bytes, start: int) -> tuple[str, list[tuple[int, bool]]]:
    """(answering node's id, its answers) of a done frame whose body starts at ``start``."""
    try:
        origin = data[start:start + 8]
        (count,) = _U16.unpack_from(data, start + 8)
    except struct.error:
        raise ShareFrameError("a truncated done frame") from None
    body = start + 10
    if len(origin) != 8 or len(data) != body + count * _DONE.size:
        raise ShareFrameError("a done frame of the wrong length")
    return origin.hex(), [(seq, flag == 1) for seq, flag in _DONE.iter_unpack(data[body:])]


MAX_SENDS = 4
"""Times one run is sent at most (placed again after a refusal, a death, or no answer within
the node timeout); then it is lost and counted."""


class _Sent:
    """A run sent to another node for a group, kept until that node answers."""

    __slots__ = ("at", "key", "messages", "origin", "refused", "sends")

    def __init__(self, key: SharedKey, messages: list[Message], origin: str, at: float) -> None:
        self.key = key
        self.messages = messages
        self.origin = origin
        self.at = at
        """When it was last sent (the reactor's clock)."""
        self.refused: set[str] = set()
        """Nodes that had no member to take it, or died: not chosen again for it."""
        self.sends = 1


class PlacingEngine(Protocol):
    """What shared placement needs of the node's engine (brokerd.cluster.redis_engine)."""

    origin: str
    instance: bytes
    directory: Directory
    """The other nodes' groups."""

    @property
    def reactor(self) -> IReactorTime:
        """The clock of placements and their deadlines."""

    @property
    def broker(self) -> LocalBroker:
        """This node's groups and members."""

    def queue_frame(self, origin: str, data: bytes) -> None:
        """Queue a frame for another node's channel, sent at this turn's flush."""


class SharedPlacement:
    """The choosing side and the serving side of shared groups, for one node's engine."""

    def __init__(self, engine: PlacingEngine, max_pending: int) -> None:
        self.engine = engine
        self.max_pending = max_pending
        self._turns: dict[SharedKey, int] = {}
        self._sequence = 0
        self._sent: dict[int, _Sent] = {}
        self._kept = 0
        """Messages in :attr:`_sent`."""
        self._answers: dict[str, list[tuple[int, bool]]] = {}
        """This turn's done answers, by the node that sent the runs."""
        self.stats = {"sent": 0, "served": 0, "placed_again": 0, "lost": 0, "unkept": 0}

    @property
    def pending(self) -> int:
        """Messages sent to other nodes for their members and not yet answered."""
        return self._kept

    # ------------------------------------------------------------------ choosing

    def place(self, messages: list[Message]) -> frozenset[SharedKey] | None:
        """Choose the node of each shared group the run's topic matches, send the run to the
        chosen other nodes, and return the groups this node serves (None: no group has
        members on another node, so this node serves its own, as a single node does)."""
        directory = self.engine.directory
        if not directory.shares:
            return None
        topic = messages[0].target
        if topic is None:
            raise ValueError("a shared run has no topic")
        remote = directory.shared_groups(topic)
        if not remote:
            return None
        here = {group.key for group in self.engine.broker.filtered.shared.match(topic)}
        for key in remote:
            origin = self._choose(key, ())
            if origin is not None:
                here.discard(key)
                self._send(origin, key, list(messages))
        return frozenset(here)

    def _choose(self, key: SharedKey, excluded: Container[str]) -> str | None:
        """The node whose turn it is for ``key`` (None: this one), each node weighted by its
        members; ``excluded`` nodes are passed over.  Raises LookupError when no node is left."""
        shares = self.engine.directory.shares.get(key, {})
        nodes: list[tuple[str | None, int]] = sorted(
            (origin, count) for origin, count in shares.items() if origin not in excluded)
        local = self.engine.broker.filtered.group_size(key)
        if local and self.engine.origin not in excluded:
            nodes.append((None, local))
        total = sum(count for _origin, count in nodes)
        if not total:
            raise LookupError(key)
        turns = self._turns
        turn = turns.get(key, 0) % total
        if len(turns) >= MAX_TURNS and key not in turns:
            turns.clear()
        turns[key] = turn + 1
        for origin, count in nodes:
            if turn < count:
                return origin
            turn -= count
        raise AssertionError("unreachable: the turn is below the total")

    def _send(self, origin: str, key: SharedKey, messages: list[Message], kept: _Sent | None = None) -> None:
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        now = self.engine.reactor.seconds()
        if kept is not None:
            kept.origin = origin
            kept.at = now
            kept.sends += 1
            self._sent[self._sequence] = kept
        elif self._kept + len(messages) <= self.max_pending:
            self._sent[self._sequence] = _Sent(key, messages, origin, now)
            self._kept += len(messages)
        else:
            self.stats["unkept"] += len(messages)
        self.stats["sent"] += len(messages)
        self.engine.queue_frame(origin, share_frame(self.engine.instance, self._sequence, key, messages))

    def _place_again(self, sent: _Sent) -> None:
        """The node a kept run went to did not take it: choose among the nodes that did not
        refuse it (this one included); lost (counted) when no member is left, or the run was
        sent MAX_SENDS times."""
        count = len(sent.messages)
        self._kept -= count
        try:
            if sent.sends >= MAX_SENDS:
                raise LookupError(sent.key)
            origin = self._choose(sent.key, sent.refused)
        except LookupError:
            self.stats["lost"] += count
            return
        self.stats["placed_again"] += count
        if origin is not None:
            self._kept += count
            self._send(origin, sent.key, sent.messages, sent)
        elif not self.engine.broker.route(RemoteShare(sent.key, sent.messages)):
            self.stats["lost"] += count

    def answered(self, data: bytes, start: int) -> None:
        """A done frame: the runs the answering node took are forgotten, the others placed again."""
        origin, answers = read_done(data, start)
        for sequence, taken in answers:
            sent = self._sent.get(sequence)
            if sent is None or sent.origin != origin:
                continue
            del self._sent[sequence]
            if taken:
                self._kept -= len(sent.messages)
            else:
                sent.refused.add(origin)
                self._place_again(sent)

    def node_gone(self, origin: str) -> None:
        """Node ``origin`` left the cluster: every run kept for it goes to another member."""
        for sequence in [seq for seq, sent in self._sent.items() if sent.origin == origin]:
            sent = self._sent.pop(sequence)
            sent.refused.add(origin)
            self._place_again(sent)

    def unanswered(self, before: float) -> None:
        """Place again every run sent before ``before`` (the reactor's clock) and not answered:
        it or its answer was lost on the way (Redis was away for a moment, shorter than the
        node timeout).  The same node may be chosen again; if it had taken the run, its member
        gets it twice (at least once, for a run Redis lost once)."""
        for sequence in [seq for seq, sent in self._sent.items() if sent.at < before]:
            self._place_again(self._sent.pop(sequence))

    # ------------------------------------------------------------------ serving

    def received(self, data: bytes, start: int) -> int:
        """A share frame: hand the run to one local member of the group, answer at the flush;
        returns the run's messages."""
        sequence, key, origin, messages = read_share(data, start)
        taken = self.engine.broker.route(RemoteShare(key, messages)) > 0
        if taken:
            self.stats["served"] += len(messages)
        self._answers.setdefault(origin, []).append((sequence, taken))
        return len(messages)

    def answers(self) -> list[tuple[str, bytes]]:
        """This turn's done frames, (node, frame), for the flush."""
        answers, self._answers = self._answers, {}
        frames = []
        for origin, pairs in answers.items():
            for at in range(0, len(pairs), MAX_DONE):
                frames.append((origin, done_frame(self.engine.instance, pairs[at:at + MAX_DONE])))
        return frames

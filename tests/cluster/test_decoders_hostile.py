"""Every decoder of bytes that arrive from Redis, fed arbitrary bytes and mutations of valid
messages (Hypothesis): envelopes, node-channel frames, control messages, RESP replies, and the
engine's callback that dispatches them.  Any client of Redis can write these bytes, so a
decoder may only refuse them with its own error (which the engine drops and counts); nothing
escapes the engine's callback, and a refused message delivers nothing.  Each property has its
positive control: the unmutated message decodes and delivers."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from brokerd.cluster import directory as control
from brokerd.cluster import envelope, frames, sharing
from brokerd.cluster.address import parse
from brokerd.config import Settings
from brokerd.cluster.connection import MAX_DEPTH, ProtocolError, RespReader, channel
from brokerd.cluster.redis_engine import CONTROL_CHANNEL, RedisEngine
from brokerd.cluster.seal import Sealer
from brokerd.core.broker import Broker
from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Details, Message, Part
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.protocols.mcchat.wire import MCCHAT_WIRE
from brokerd.protocols.socketmq import remote
from brokerd.protocols.ssmp.wire import SSMP_WIRE
from tests.support.sessions import RecordingSession
from tests.support.examples import examples

TOPIC = b"room"
OTHER_NODE = b"\x07" * 8
OTHER_ORIGIN = OTHER_NODE.hex()
HOSTILE = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.binary(min_size=0, max_size=12)
protocols = st.sampled_from(["ssmp", "mcchat", "smqp", "socketmq", "sys", "x-made-up"])
details = st.builds(
    Details, content_type=st.none() | st.text(max_size=8), message_id=st.none() | st.text(max_size=8),
    created=st.none() | st.floats(allow_nan=False), priority=st.integers(-2**63, 2**63 - 1),
    expires=st.none() | st.floats(allow_nan=False),
    attributes=st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=2).map(tuple),
    parts=st.lists(st.builds(Part, st.text(max_size=4),
                             st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=2).map(tuple),
                             st.binary(max_size=8)), max_size=2).map(tuple),
)


@st.composite
def runs(draw: Any) -> list[Message]:
    """A run as a publishing node hands it to the engine: multicasts to TOPIC."""
    protocol = draw(protocols)
    sender = draw(names)
    principal = draw(st.none() | st.builds(Principal, st.text(max_size=6), st.just(ACCOUNT)))
    count = draw(st.integers(1, 4))
    return [Message(MULTICAST, TOPIC, draw(st.binary(max_size=16)), protocol, sender, draw(st.booleans()),
                    draw(st.none() | names), draw(st.just(None) | details) or Details(), principal)
            for _ in range(count)]


@st.composite
def envelopes(draw: Any) -> bytes:
    run = draw(runs())
    rendered = draw(st.none() | st.just({"ssmp": SSMP_WIRE.render_run(run) if run[0].protocol == "ssmp" else b"x"}))
    return envelope.encode(OTHER_NODE, run, rendered)


@st.composite
def mutated(draw: Any, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid message with one to three damages: a byte changed, bytes cut out, inserted,
    or the end cut off."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.integers(0, max(len(data) - 1, 0)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        if how == "flip" and data:
            data[where] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[where:where + draw(st.integers(1, 8))]
        elif how == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[where:]
    return bytes(data)


def hostile(valid: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=200) | mutated(valid)


# ---------------------------------------------------------------------------- the decoders


@HOSTILE
@given(hostile(envelopes()))
def test_an_envelope_decodes_or_is_refused_with_envelope_error(data: bytes) -> None:
    try:
        run = envelope.open_run(data, TOPIC)
        messages = run.messages()
    except envelope.EnvelopeError:
        return
    for message in messages:
        assert message.kind == MULTICAST and message.target == TOPIC
        assert message.protocol in envelope.PROTOCOLS or message.protocol == envelope.OTHER


@HOSTILE
@given(envelopes())
def test_a_valid_envelope_reads_back(data: bytes) -> None:
    assert len(envelope.open_run(data, TOPIC).messages()) >= 1


def test_a_protocol_outside_the_known_set_reads_as_other() -> None:
    data = envelope.encode(OTHER_NODE, [Message(MULTICAST, TOPIC, b"p", "x-forged-1234", b"s")])
    assert [m.protocol for m in envelope.decode(data)] == ["other"]
    data = envelope.encode(OTHER_NODE, [Message(MULTICAST, TOPIC, b"p", "mcchat", b"s")])
    assert [m.protocol for m in envelope.decode(data)] == ["mcchat"]


def test_an_envelope_for_another_topic_or_of_another_kind_is_refused_on_a_topic_channel() -> None:
    elsewhere = envelope.encode(OTHER_NODE, [Message(MULTICAST, b"secret", b"p", "ssmp", b"s")])
    unicast = envelope.encode(OTHER_NODE, [Message(UNICAST, TOPIC, b"p", "ssmp", b"s")])
    mixed = envelope.encode(OTHER_NODE, [Message(MULTICAST, TOPIC, b"p", "ssmp", b"s"),
                                         Message(MULTICAST, b"secret", b"p", "ssmp", b"s")])
    for data in (elsewhere, unicast):
        with pytest.raises(envelope.EnvelopeError):
            envelope.open_run(data, TOPIC)
    with pytest.raises(envelope.EnvelopeError):
        envelope.open_run(mixed, TOPIC).messages()
    assert envelope.open_run(elsewhere, b"secret").first.payload == b"p"  # its own topic's channel


def frame_messages() -> st.SearchStrategy[bytes]:
    message = Message(UNICAST, b"alice", b"hi", "ssmp", b"bob")
    shout = Message(BROADCAST, None, b"all", "ssmp", b"bob")
    return st.sampled_from([
        frames.unicast(OTHER_NODE, "ssmp", message),
        frames.broadcast(OTHER_NODE, shout, [TOPIC, b"other"]),
        frames.service(OTHER_ORIGIN, "socketmq", b'{"a":1}\nbody'),
    ])


@HOSTILE
@given(hostile(frame_messages()))
def test_a_frame_decodes_or_is_refused_with_frame_error(data: bytes) -> None:
    try:
        name, start = frames.kind(data)
        if name == frames.BROADCAST:
            frames.read_broadcast(data, start)
        elif name.startswith(frames.SERVICE):
            frames.read_service(data, start)
        else:
            frames.one_message(data, start)
    except frames.FrameError:
        pass


def control_messages() -> st.SearchStrategy[bytes]:
    def make(kind: str, **fields: Any) -> bytes:
        return control.encode(OTHER_ORIGIN, "node2", kind, **fields)

    return st.sampled_from([
        make(control.ATTACH, **control.address_fields("ssmp", b"alice", 1.0, Principal("alice", ACCOUNT))),
        make(control.DETACH, **control.address_fields("ssmp", b"alice")),
        make(control.JOIN, **control.member_fields(TOPIC, "ssmp", b"alice", True)),
        make(control.LEAVE, **control.member_fields(TOPIC, "ssmp", b"alice", True)),
        make(control.STATE, addresses=[["ssmp", "alice", 2.0, "alice", ACCOUNT], ["ssmp", "bob", 2.0]],
             members=[["room", "ssmp", "alice", True]]),
        make(control.DURABLE, **control.durable_fields(True, {"a:b"}, {"c:d"})),
        make(control.KEEP_OUT, **control.keep_out_fields(Principal("alice", ACCOUNT), 30.0)),
        make(control.SHARE, **control.share_fields((b"pool", b"room/#"), 2)),
        make(control.HELLO, re=1), make(control.BEAT), make(control.BYE),
    ])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def control_shaped(draw: Any) -> bytes:
    """A control message whose fields are any JSON values: the right keys, wrong contents."""
    message = json.loads(draw(control_messages()))
    for key in draw(st.lists(st.sampled_from(sorted(message) + ["addresses", "members", "t", "a"]), max_size=3)):
        message[key] = draw(json_values)
    return json.dumps(message).encode()


def directory() -> tuple[control.Directory, list[tuple]]:
    calls: list[tuple] = []
    return control.Directory(lambda *args: calls.append(("presence", *args)),
                             lambda *args: calls.append(("address", *args)),
                             lambda: calls.append(("topics",))), calls


@HOSTILE
@given(hostile(control_messages()) | control_shaped())
def test_a_control_message_decodes_and_applies_or_is_refused_with_control_error(data: bytes) -> None:
    try:
        message = control.decode(data)
    except control.ControlError:
        return
    table, _calls = directory()
    table.apply(message, 1.0)
    if message["k"] == control.DURABLE:
        control.read_durable(message)
    if message["k"] == control.KEEP_OUT:
        control.read_keep_out(message)


@HOSTILE
@given(control_messages())
def test_a_valid_control_message_decodes_and_applies(data: bytes) -> None:
    table, _calls = directory()
    table.apply(control.decode(data), 1.0)


def test_a_members_protocol_outside_the_known_set_reads_as_other() -> None:
    join = control.decode(control.encode(OTHER_ORIGIN, "node2", control.JOIN,
                                         **control.member_fields(TOPIC, "x\r\n200 fake", b"m", True)))
    state = control.decode(control.encode(OTHER_ORIGIN, "node2", control.STATE,
                                          members=[["room", "\u00e9t\u00e9", "m", True], ["room", "mcchat", "n", False]]))
    assert join["p"] == "other" and [entry[1] for entry in state["members"]] == ["other", "mcchat"]


def test_the_attacks_on_the_control_channel_are_refused() -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    short_state = control.encode(OTHER_ORIGIN, "node2", control.STATE, addresses=[["ssmp"]])
    wrong_member = control.encode(OTHER_ORIGIN, "node2", control.JOIN, t=["x"], p="ssmp", m="a", pr=True)
    not_latin1 = control.encode(OTHER_ORIGIN, "node2", control.ATTACH, ns="ssmp", a="\u20ac", at=1.0)
    huge = b'{"o":"' + b"0" * 16 + b'","k":"beat","x":"' + b"a" * Settings.cluster_max_control + b'"}'
    keep_out_forever = control.encode(OTHER_ORIGIN, "node2", control.KEEP_OUT, pn="alice", pr=ACCOUNT,
                                      **{"for": float("inf")})
    keep_out_nobody = control.encode(OTHER_ORIGIN, "node2", control.KEEP_OUT, pr=ACCOUNT, **{"for": 1.0})
    for data in (deep, short_state, wrong_member, not_latin1, huge, b"", b"\xff", b"nan", b'{"o":1,"k":"beat"}',
                 keep_out_forever, keep_out_nobody):
        with pytest.raises(control.ControlError):
            control.decode(data)


@HOSTILE
@given(st.binary(max_size=200) | mutated(st.sampled_from([
    b"*3\r\n$8\r\nsmessage\r\n$9\r\nbrokerd:c\r\n$2\r\nhi\r\n", b"+OK\r\n", b":12\r\n", b"-ERR no\r\n",
    b"*2\r\n*1\r\n:1\r\n$-1\r\n"])))
def test_a_resp_reply_reads_or_is_refused_with_protocol_error(data: bytes) -> None:
    reader = RespReader(RuntimeError)
    try:
        reader.feed(data)
        reader.feed(data)
    except ProtocolError:
        pass


@HOSTILE
@given(hostile(st.sampled_from([
    remote.encode({"k": "request", "token": "7", "application": "echo", "request_id": "r", "client": "bob",
                   "names": ["bob"], "version": None, "content_type": None}, b"body"),
    remote.encode({"k": "answer", "token": "7", "status": 200, "content_type": None}, b"answer"),
])) | st.just(b"[" * 100_000 + b"\n"))
def test_a_socketmq_node_message_decodes_or_is_refused_with_remote_error(data: bytes) -> None:
    try:
        remote.decode(data)
    except remote.RemoteError:
        pass


def test_resp_arrays_nested_past_the_limit_are_refused() -> None:
    reader = RespReader(RuntimeError)
    assert reader.feed(b"*1\r\n" * MAX_DEPTH + b":1\r\n") == [_nested(MAX_DEPTH)]
    with pytest.raises(ProtocolError):
        RespReader(RuntimeError).feed(b"*1\r\n" * 100_000 + b":1\r\n")


def _nested(depth: int) -> Any:
    return 1 if depth == 0 else [_nested(depth - 1)]


# ---------------------------------------------------------------------------- the engine's callback


SECRET = b"the cluster secret of these tests"


class Node:
    """A RedisEngine (not connected) over a real Broker with an SSMP and an MCCHAT member of
    TOPIC, the SSMP one also addressable (``s0``) for unicasts."""

    def __init__(self) -> None:
        self.broker = Broker()
        self.sessions = []
        for index, wire in enumerate((SSMP_WIRE, MCCHAT_WIRE)):
            session = RecordingSession(b"s%d" % index, wire)
            self.broker.attach(session)
            self.broker.subscribe(session, TOPIC)
            self.sessions.append(session)
        self.engine = RedisEngine(parse("redis://127.0.0.1:1"), Clock(), "node1", secrets=[SECRET])
        self.engine.broker = self.broker
        self.peer = Sealer([SECRET], b"P" * 8, 15.0)
        """Another node of the cluster: what it seals reaches the engine's decoders."""

    def deliver(self, name: bytes, data: bytes) -> None:
        """``data`` arriving on Redis channel ``name``, sealed by another node."""
        self.engine.received(name, self.peer.seal(name, data))

    def received(self) -> int:
        return sum(len(session.received) for session in self.sessions)


def node_channel_message(engine: RedisEngine) -> st.SearchStrategy[bytes]:
    return st.sampled_from([
        frames.unicast(OTHER_NODE, "ssmp", Message(UNICAST, b"s0", b"hi", "ssmp", b"bob")),
        frames.broadcast(OTHER_NODE, Message(BROADCAST, None, b"all", "ssmp", b"bob"), [TOPIC]),
        sharing.share_frame(OTHER_NODE, 1, (b"pool", b"room"), [Message(MULTICAST, TOPIC, b"hi", "ssmp", b"b")]),
        sharing.done_frame(OTHER_NODE, [(1, True)]),
    ])


CHANNELS = ["topic", "node", "control"]


@HOSTILE
@given(st.sampled_from(CHANNELS), st.data())
def test_nothing_escapes_the_engine_and_a_refused_message_delivers_nothing(where: str, data: Any) -> None:
    node = Node()
    engine = node.engine
    name, valid = {
        "topic": (channel(TOPIC), envelopes()),
        "node": (engine.node_channel, node_channel_message(engine)),
        "control": (CONTROL_CHANNEL, control_messages()),
    }[where]
    payload = data.draw(hostile(valid) | (control_shaped() if where == "control" else hostile(valid)))
    node.deliver(name, payload)
    if engine.stats.bad_envelopes:
        assert node.received() == 0
        assert engine.stats.messages_received == 0


@pytest.mark.parametrize("where", ["topic", "node"])
def test_an_unmutated_message_is_delivered_by_the_engine(where: str) -> None:
    node = Node()
    engine = node.engine
    if where == "topic":
        node.deliver(channel(TOPIC), envelope.encode(OTHER_NODE, [Message(MULTICAST, TOPIC, b"hi", "ssmp", b"b")]))
        assert node.received() == 2
    else:
        node.deliver(engine.node_channel,
                     frames.unicast(OTHER_NODE, "ssmp", Message(UNICAST, b"s0", b"hi", "ssmp", b"bob")))
        assert node.sessions[0].received and node.received() == 1
    assert engine.stats.bad_envelopes == 0


def test_the_engine_counts_and_survives_the_control_channel_attacks() -> None:
    node = Node()
    engine = node.engine
    for data in (b"[" * 200_000, control.encode(OTHER_ORIGIN, "n", control.STATE, addresses=[["ssmp"]])):
        node.deliver(CONTROL_CHANNEL, data)
    assert engine.stats.bad_envelopes == 2
    node.deliver(CONTROL_CHANNEL, control.encode(OTHER_ORIGIN, "node2", control.JOIN,
                                                 **control.member_fields(TOPIC, "ssmp", b"far", False)))
    assert [m.name for m, _ in engine.members(TOPIC)] == [b"far"]

"""Router.route(RemoteRun(...)): a run from another node is sent from its rendered sections only when
every local wire format of the topic is portable and carried, and the observer can log it from
the head; otherwise it is decoded and routed as before.  (End to end over Redis:
tests/integration/test_cluster_rendered.py.)"""
from __future__ import annotations

from typing import Any

from zope.interface import implementer

from brokerd.core.publication import RemoteRun
from brokerd.cluster.envelope import encode, open_run
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Message
from brokerd.interfaces import IWireFormat, WireFormat
from brokerd.protocols.mcchat.wire import MCCHAT_WIRE
from brokerd.protocols.ssmp.wire import SSMP_WIRE
from tests.support.sessions import RecordingSession as Session


@implementer(IWireFormat)
class NodeBound(WireFormat):
    """A format whose bytes depend on the node (not portable), like SMQP's."""

    protocol = "local"

    def render_message(self, message: Message) -> bytes:
        return b"<" + message.payload + b">"

    def render_presence(self, topic, member, joined, presence):
        return None


class Observer:
    def __init__(self, summarizes: bool) -> None:
        self.summarizes_runs = summarizes
        self.runs: list[tuple] = []
        self.summaries: list[tuple] = []

    def messages_routed(self, messages: list, recipients: int, dropped: int) -> None:
        self.runs.append(([m.payload for m in messages], recipients, dropped))

    def run_summary_routed(self, *fields: Any) -> None:
        self.summaries.append(fields)

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None  # the observer's other calls (logins, subscriptions)


RUN = [Message(MULTICAST, b"room", b"hi %d" % i, "ssmp", b"sam") for i in range(3)]


def envelope_of(formats: list[Any]) -> bytes:
    return encode(b"\x00" * 8, RUN, {fmt.protocol: fmt.render_run(RUN) or b"".join(fmt.render_message(m) for m in RUN)
                                     for fmt in formats})


def broker_with(*wires: Any, observer: Any = None) -> tuple[Broker, list[Session]]:
    broker = Broker(observer=observer)
    sessions = []
    for index, wire in enumerate(wires):
        session = Session(b"s%d" % index, wire)
        broker.attach(session)
        broker.subscribe(session, b"room")
        sessions.append(session)
    return broker, sessions


def test_all_portable_formats_carried_are_sent_without_decoding() -> None:
    observer = Observer(summarizes=True)
    broker, sessions = broker_with(SSMP_WIRE, MCCHAT_WIRE, SSMP_WIRE, observer=observer)
    run = open_run(envelope_of([SSMP_WIRE, MCCHAT_WIRE]))
    assert broker.route(RemoteRun(run)) == 9
    assert not run.decoded
    assert sessions[0].received == [SSMP_WIRE.render_run(RUN)] == sessions[2].received
    assert sessions[1].received == [b"".join(MCCHAT_WIRE.render_message(m) for m in RUN)]
    assert broker.stats.delivered == 9
    assert broker.stats.routed_by["ssmp"] == {SSMP_WIRE: 6, MCCHAT_WIRE: 3}
    assert observer.summaries == [("ssmp", b"sam", b"room", MULTICAST, 3, 12, 3, 0)] and observer.runs == []


def test_a_format_without_a_section_or_not_portable_decodes_the_run() -> None:
    for wires, carried in (((SSMP_WIRE, MCCHAT_WIRE), [SSMP_WIRE]), ((SSMP_WIRE, NodeBound()), [SSMP_WIRE])):
        observer = Observer(summarizes=True)
        broker, sessions = broker_with(*wires, observer=observer)
        run = open_run(envelope_of(carried))
        assert broker.route(RemoteRun(run)) == 6
        assert run.decoded
        assert sessions[0].received == [SSMP_WIRE.render_run(RUN)]
        assert sessions[1].received == [b"".join(wires[1].render_message(m) for m in RUN)]
        assert observer.runs == [([m.payload for m in RUN], 2, 0)] and observer.summaries == []


def test_an_observer_that_needs_the_messages_gets_them() -> None:
    observer = Observer(summarizes=False)
    broker, sessions = broker_with(SSMP_WIRE, observer=observer)
    run = open_run(envelope_of([SSMP_WIRE]))
    assert broker.route(RemoteRun(run)) == 3
    assert run.decoded and observer.runs == [([m.payload for m in RUN], 1, 0)]
    assert sessions[0].received == [SSMP_WIRE.render_run(RUN)]

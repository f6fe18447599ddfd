"""The connection lifecycle every front end shares (brokerd.protocols.lifecycle), on in-memory
transports and a Clock: admission and its refusal, TCP_NODELAY, the output limit pausing and
resuming the producer, timers cancelled at the end, the liveness sweep; and the one dispatch
style (brokerd.protocols.dispatch)."""
from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.abstract import FileDescriptor
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IPushProducer, ITCPTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from zope.interface import implementer

from brokerd.core.broker import Broker
from brokerd.protocols.dispatch import command_table, handler_name, verbs_of
from brokerd.protocols.lifecycle import ConnectionLifecycle, LivenessSweep

LOGIN_TIMEOUT = 5.0
OUTPUT_LIMIT = 100


@implementer(IPushProducer)
class Connection(ConnectionLifecycle, Protocol):
    """The smallest front end: refuses with ``full``, times the login out with ``late``."""

    detached = False

    def __init__(self) -> None:
        self.events: list[str] = []

    def connectionMade(self) -> None:
        if not self.open_connection(self.factory.output_limit):
            self.transport.write(b"full\n")
            self.transport.loseConnection()
            return
        self.register_producer()
        self.login_timer = self.call_later(LOGIN_TIMEOUT, self.login_timed_out)

    def login_timed_out(self) -> None:
        self.transport.write(b"late\n")
        self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if self.release_connection():
            self.detached = True

    def pauseProducing(self) -> None:
        self.events.append("pause")

    def resumeProducing(self) -> None:
        self.events.append("resume")

    def stopProducing(self) -> None:
        self.events.append("stop")


class ConnectionFactory(Factory):
    protocol = Connection

    def __init__(self, broker: Broker, clock: Clock, output_limit: int | None = OUTPUT_LIMIT) -> None:
        self.broker = broker
        self.clock = clock
        self.output_limit = output_limit


@implementer(ITCPTransport)
class TCPStringTransport(StringTransport):
    """A StringTransport that is a TCP transport, recording TCP_NODELAY."""

    no_delay = False

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled

    def getTcpNoDelay(self) -> bool:
        return self.no_delay


class QueueingTransport(FileDescriptor):
    """A FileDescriptor's real write queue and producer handling, writing nowhere until
    :meth:`drain`."""

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor=reactor)
        self.connected = True
        self.taking = False

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", 7000)

    def getPeer(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", 50000)

    def writeSomeData(self, data: bytes) -> int:
        return len(data) if self.taking else 0

    def drain(self) -> None:
        self.taking = True
        self.doWrite()


def connect(factory: ConnectionFactory, transport: Any = None) -> tuple[Connection, Any]:
    transport = transport if transport is not None else TCPStringTransport()
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(transport)
    return protocol, transport


def lose(protocol: Connection, transport: Any) -> None:
    protocol.connectionLost(None)


def test_a_connection_over_the_limit_is_refused_in_the_protocols_words_and_a_release_makes_room() -> None:
    broker = Broker(max_connections=1)
    factory = ConnectionFactory(broker, Clock())
    first, first_transport = connect(factory)
    assert first_transport.value() == b"" and not first_transport.disconnecting  # admitted
    assert broker.stats.connections == 1
    refused, refused_transport = connect(factory)
    assert refused_transport.value() == b"full\n" and refused_transport.disconnecting
    assert broker.stats.refused_connections == 1
    lose(refused, refused_transport)
    assert not refused.detached and broker.stats.connections == 1  # a refusal releases nothing
    lose(first, first_transport)
    assert first.detached and broker.stats.connections == 0
    lose(first, first_transport)  # a second end releases nothing more
    assert broker.stats.connections == 0
    again, again_transport = connect(factory)
    assert again_transport.value() == b"" and broker.stats.connections == 1


def test_the_not_logged_in_count_ends_with_the_login() -> None:
    broker = Broker(max_unauthenticated=1)
    factory = ConnectionFactory(broker, Clock())
    first, _ = connect(factory)
    _, refused = connect(factory)
    assert refused.value() == b"full\n"
    first.logged_in()
    _, admitted = connect(factory)
    assert admitted.value() == b"" and not admitted.disconnecting


def test_tcp_nodelay_is_set_on_an_admitted_tcp_connection_only() -> None:
    factory = ConnectionFactory(Broker(max_connections=1), Clock())
    _, admitted = connect(factory)
    _, refused = connect(factory)
    assert admitted.no_delay is True
    assert refused.no_delay is False


def test_the_connection_is_its_transports_streaming_producer_and_unregisters() -> None:
    factory = ConnectionFactory(Broker(), Clock())
    protocol, transport = connect(factory)
    assert transport.producer is protocol and transport.streaming
    assert transport.bufferSize == OUTPUT_LIMIT
    protocol.unregister_producer()
    assert transport.producer is None
    protocol.unregister_producer()  # only once


def test_output_past_the_limit_pauses_the_producer_and_a_drained_queue_resumes_it() -> None:
    factory = ConnectionFactory(Broker(), Clock())
    transport = QueueingTransport(MemoryReactorClock())
    protocol, _ = connect(factory, transport)
    transport.write(b"x" * OUTPUT_LIMIT)
    assert protocol.events == []  # at the limit: not over it
    transport.write(b"y")
    assert protocol.events == ["pause"]
    transport.drain()
    assert protocol.events == ["pause", "resume"]


def test_the_login_timer_answers_and_closes_when_it_runs_out() -> None:
    clock = Clock()
    protocol, transport = connect(ConnectionFactory(Broker(), clock))
    clock.advance(LOGIN_TIMEOUT - 0.001)
    assert transport.value() == b""
    clock.advance(0.001)
    assert transport.value() == b"late\n" and transport.disconnecting


def test_timers_pending_at_the_end_are_cancelled() -> None:
    clock = Clock()
    protocol, transport = connect(ConnectionFactory(Broker(), clock))
    protocol.call_later(60, protocol.transport.write, b"never\n")
    fired = protocol.call_later(1, protocol.transport.write, b"one\n")
    assert len(clock.getDelayedCalls()) == 3
    clock.advance(1)
    assert transport.value() == b"one\n" and not fired.active()
    lose(protocol, transport)
    assert clock.getDelayedCalls() == []
    clock.advance(100)
    assert transport.value() == b"one\n"


def test_a_fired_timer_is_not_kept() -> None:
    clock = Clock()
    protocol, _ = connect(ConnectionFactory(Broker(), clock))
    for _ in range(10):
        protocol.call_later(0.1, lambda: None)
        clock.advance(0.1)
    assert len(protocol._timers) == 2  # the login timer and the last one


class Peer:
    def __init__(self) -> None:
        self.heard = True
        self.last_heard = 0.0
        self.out: list[bytes] = []


class Sweeper:
    """A protocol's rule for silence: ``bye`` after 10 s."""

    def __init__(self, clock: Clock) -> None:
        self.sweep = LivenessSweep(clock, 1.0, self.visit)

    def visit(self, peer: Peer, now: float) -> None:
        if now - peer.last_heard >= 10:
            peer.out.append(b"bye")
            self.sweep.forget(peer)


def test_a_silent_connection_gets_the_protocols_answer_and_one_that_talks_does_not() -> None:
    clock = Clock()
    rule = Sweeper(clock)
    rule.sweep.start()
    silent, talking = Peer(), Peer()
    rule.sweep.watch(silent)
    rule.sweep.watch(talking)
    for _ in range(10):
        clock.advance(1)
        talking.heard = True
    assert silent.out == [] and talking.out == []
    clock.advance(1)
    assert silent.out == [b"bye"]  # silent since the sweep at 1 s
    assert talking.out == []
    assert list(rule.sweep.live) == [talking]
    clock.advance(30)
    assert talking.out == [b"bye"]


def test_a_stopped_sweep_leaves_no_delayed_call() -> None:
    clock = Clock()
    sweep = LivenessSweep(clock, 1.0, lambda peer, now: None)
    sweep.start()
    sweep.start()  # once
    assert len(clock.getDelayedCalls()) == 1
    sweep.stop()
    assert clock.getDelayedCalls() == []
    sweep.stop()


class Commands:
    def do_PING(self, request: Any) -> str:
        return "PONG"

    def do_SET_LOGIN_PASSWORD(self, request: Any) -> str:
        return "set"


def test_the_dispatch_table_maps_wire_verbs_to_do_methods() -> None:
    assert handler_name(b"PING") == "do_PING"
    assert handler_name("SET LOGIN PASSWORD") == "do_SET_LOGIN_PASSWORD"
    table = command_table(Commands, [b"PING"])
    assert table[b"PING"](Commands(), None) == "PONG"
    by_class = command_table(Commands, {int: "SET LOGIN PASSWORD"})
    assert by_class[int](Commands(), None) == "set"
    assert sorted(verbs_of(Commands)) == ["PING", "SET LOGIN PASSWORD"]


def test_a_verb_without_a_handler_fails_when_the_table_is_built() -> None:
    with pytest.raises(AttributeError):
        command_table(Commands, [b"PONG"])

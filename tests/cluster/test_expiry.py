"""A node's deadline, on a fake clock: another node is forgotten exactly ``node_timeout``
seconds after the last message heard from it (no sweep interval added), and each message
moves its deadline on."""
from __future__ import annotations

from twisted.internet.task import Clock

from brokerd.cluster import directory as control
from brokerd.cluster.address import parse
from brokerd.cluster.redis_engine import CONTROL_CHANNEL, RedisEngine
from brokerd.core.broker import Broker

OTHER = "0707070707070707"


def engine_on(clock: Clock) -> RedisEngine:
    engine = RedisEngine(parse("redis://127.0.0.1:1"), clock, "node1", heartbeat=5.0, node_timeout=15.0)
    engine.broker = Broker()
    return engine


def beat(engine: RedisEngine) -> None:
    engine.received(CONTROL_CHANNEL, control.encode(OTHER, "node2", control.BEAT))


def test_a_silent_node_is_forgotten_at_its_deadline_and_each_message_moves_it() -> None:
    clock = Clock()
    engine = engine_on(clock)
    gone: list[str] = []
    engine.node_listeners.append(gone.append)
    clock.advance(100.0)
    beat(engine)
    clock.advance(14.9)
    beat(engine)  # heard of again: the deadline is now 15 s from here
    clock.advance(14.9)
    assert engine.other_nodes() == {"node2"} and gone == []
    clock.advance(0.1)
    assert engine.other_nodes() == set() and gone == [OTHER]
    assert clock.getDelayedCalls() == []  # nothing left to watch


def test_a_stopped_engine_watches_no_more() -> None:
    clock = Clock()
    engine = engine_on(clock)
    beat(engine)
    assert len(clock.getDelayedCalls()) == 1
    engine.stop()
    assert [call for call in clock.getDelayedCalls() if call.active() and call.func == engine._expire] == []

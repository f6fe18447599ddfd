"""The router's one entry point and its stages: what a publication of each kind reaches, and
that a stage is in a path only when it is configured (the rest of the routing behaviour is
driven through the Broker in test_broker.py, test_broker_filters.py and tests/cluster)."""
from __future__ import annotations

import time

import pytest

from brokerd.admin.oplog import OperatorLog
from brokerd.core.access import Perm
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, UNICAST, Details, Message
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.core.publication import Multicast, RetainedReplay, Unicast, unicast_to
from brokerd.core.retained import RetainedMessages
from brokerd.core.retainedquota import RetainQuotas
from brokerd.core.router import Router
from brokerd.errors import Forbidden
from brokerd.events.log import NULL_EVENT_LOG
from tests.core.test_broker import Format, Observer, Policy, Session, attached, msg


class QuietObserver(Observer):
    """An observer that records sessions and subscriptions but no routed message."""

    records_messages = False

    def message_routed(self, message, recipients, dropped):
        raise AssertionError("the router called an observer that records no message")


def test_the_observer_stage_is_left_out_when_the_observer_records_no_message():
    broker = Broker()
    broker.observer = quiet = QuietObserver()
    a, b = attached(broker, Session("a", Format("f")), Session("b", Format("f")))
    broker.subscribe(b, b"t")
    assert broker.route(Multicast([msg(MULTICAST, b"t", b"hi")], a)) == 1
    assert broker.route(Unicast(b"b", "f", [msg(UNICAST, b"b", b"u")])) == 1
    assert b.got == [b"f|multicast|b't'|hi", b"f|unicast|b'b'|u"]
    assert ("subscribed", b"b", b"t") in quiet.events  # the other calls still reach it

    broker.observer = recording = Observer()  # one that records: the stage is back
    broker.route(Multicast([msg(MULTICAST, b"t", b"again")]))
    assert recording.events == [("routed", b"again", 1, 0)]


def test_the_operator_log_in_front_of_a_disabled_event_log_takes_the_observer_stage_out():
    broker = Broker()
    broker.observer = OperatorLog(NULL_EVENT_LOG)
    assert broker.router.observer is None and broker.observer is not None
    broker.observer = log = Observer()
    assert broker.router.observer is log


def test_a_unicast_names_its_recipient():
    with pytest.raises(ValueError):
        unicast_to([Message(UNICAST, None, b"x", "f", b"a")], "f")
    assert unicast_to([msg(UNICAST, b"b")], "f").target == b"b"


def test_a_sampler_stage_is_in_the_multicast_path_only_while_a_sampler_is_configured():
    broker = Broker()
    single = broker.router._paths[Multicast]
    broker.sampler = sampler = SamplerStub(broker)
    a, b = attached(broker, Session("a", Format("f")), Session("b", Format("f")))
    broker.subscribe(b, b"t")
    broker.sampling = True
    assert broker.route(Multicast([msg(MULTICAST, b"t", b"timed")])) == 1
    assert sampler.routed == [[b"timed"]] and b.got == [b"f|multicast|b't'|timed"]
    broker.sampler = None
    assert broker.router._paths[Multicast] == single
    broker.sampling = True  # no sampler: the flag is not even read
    assert broker.route(Multicast([msg(MULTICAST, b"t", b"plain")])) == 1
    assert sampler.routed == [[b"timed"]]


class SamplerStub:
    """Routes what it is handed as the real sampler does (through the router's timed fan-out)
    and remembers it."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.routed: list[list[bytes]] = []
        self.clock_ns = time.monotonic_ns

    def route(self, messages, exclude):
        self.routed.append([m.payload for m in messages])
        return self.broker.router.timed(messages, exclude, [])


class Sink:
    """A session's paged sender: queues what it can carry, and is full after ``room``."""

    def __init__(self, fmt: Format, room: int = 1000) -> None:
        self.fmt = fmt
        self.room = room
        self.queued: list[bytes] = []

    def send_retained(self, message):
        data = self.fmt.render_message(message)
        if data is None:
            return False
        self.queued.append(data)
        return True

    def full(self):
        return len(self.queued) >= self.room


def retained_msg(topic, payload, principal_name="a"):
    return Message(MULTICAST, topic, payload, "test", b"s", principal=Principal(principal_name, ACCOUNT),
                   details=Details(qos=0, retained=True))


def test_a_retained_replay_sends_only_what_the_access_list_lets_the_reader_read():
    broker = Broker()
    fmt = Format("f", refuse=b"uncarried")
    (reader,) = attached(broker, Session("r", fmt))
    broker.set_policy(Policy({("r", b"open/1"): Perm.SUBSCRIBE, ("r", b"open/2"): Perm.SUBSCRIBE}))
    broker.observer = observer = Observer()
    page = [retained_msg(b"open/1", b"allowed"), retained_msg(b"secret/1", b"refused"),
            retained_msg(b"open/2", b"uncarried")]
    sink = Sink(fmt)
    assert broker.route(RetainedReplay(reader, b"#", page, sink)) == 3
    assert sink.queued == [b"f|multicast|b'open/1'|allowed"]  # the refused topic: nothing
    assert observer.events == [("routed", b"allowed", 1, 0), ("routed", b"uncarried", 0, 1)]
    assert broker.stats.delivered == 1 and broker.stats.unrenderable == 1
    assert broker.stats.routed_by["test"][fmt] == 1


def test_a_retained_replay_stops_where_the_sink_fills_up():
    broker = Broker()
    fmt = Format("f")
    (reader,) = attached(broker, Session("r", fmt))
    page = [retained_msg(b"t/%d" % n, b"%d" % n) for n in range(5)]
    sink = Sink(fmt, room=2)
    assert broker.route(RetainedReplay(reader, b"t/+", page, sink)) == 2  # the rest waits
    assert sink.queued == [b"f|multicast|b't/0'|0", b"f|multicast|b't/1'|1"]


def test_the_retain_stage_keeps_what_is_retained_after_the_access_decision():
    broker = Broker()
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(b, b"t")
    broker.set_policy(Policy({("a", b"t"): Perm.PUBLISH, ("b", b"t"): Perm.SUBSCRIBE}))
    plain = msg(MULTICAST, b"t", b"live")
    assert broker.route(Multicast([retained_msg(b"t", b"kept"), plain])) == 2
    assert broker.retained.get(b"t").payload == b"kept" and len(broker.retained) == 1
    with pytest.raises(Forbidden):  # refused: neither delivered nor retained
        broker.route(Multicast([retained_msg(b"other", b"no")]))
    assert broker.retained.get(b"other") is None
    assert b.got == [b"f|multicast|b't'|keptf|multicast|b't'|live"]  # the run, in one send


def test_a_retain_over_the_quota_goes_out_live_only():
    broker = Broker()
    broker.retained = RetainedMessages(quotas=RetainQuotas(max_messages=1))
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(b, b"t2")
    broker.route(Multicast([retained_msg(b"t1", b"first")]))
    assert broker.route(Multicast([retained_msg(b"t2", b"second")])) == 1  # delivered
    assert broker.retained.get(b"t2") is None and broker.retained.get(b"t1").payload == b"first"
    assert broker.retained.quotas.refused["quota"] == 1


def test_the_retain_stage_is_absent_without_retained_messages():
    router = Broker().router
    plain = Router(router.stats, router.topics, router.filtered, router.addresses, router.joined)
    assert plain.retained is None and plain._paths[Multicast] == plain._multicast
    held = RetainedMessages()
    plain.install(retained=held)
    assert plain._paths[Multicast] == plain._multicast  # a single node's path retains inline
    plain.route(Multicast([retained_msg(b"t", b"kept")]))
    assert held.get(b"t").payload == b"kept"
    plain.install(retained=None)
    assert plain._paths[Multicast] == plain._multicast
    plain.route(Multicast([retained_msg(b"t", b"not kept")]))
    assert held.get(b"t").payload == b"kept"

"""The Broker core with fake sessions and wire formats: routing, fan-out, presence, limits."""
from __future__ import annotations

import pytest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from brokerd.core.publication import RemoteBroadcast, unicast_to
from brokerd.core.broker import Broker
from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Message
from brokerd.core.access import Perm
from brokerd.core.principal import ACCOUNT, BROKER, NOBODY, Principal
from brokerd.errors import AlreadySubscribed, BrokerError, Forbidden, NotSubscribed, SubscriptionLimit
from brokerd.interfaces import IBrokerObserver, ISubscriber, IWireFormat, WireFormat


@implementer(IWireFormat)
class Format(WireFormat):
    def __init__(self, protocol: str, refuse: bytes | None = None) -> None:
        self.protocol = protocol
        self.refuse = refuse
        self.rendered = 0

    def render_message(self, message):
        self.rendered += 1
        if message.payload == self.refuse:
            return None
        return f"{self.protocol}|{message.kind}|{message.target}|".encode() + message.payload

    def render_presence(self, topic, member, joined, presence):
        return b"%s %s %s%s" % (b"+" if joined else b"-", member.name, topic, b"!" if presence else b"")


@implementer(ISubscriber)
class Session:
    def __init__(self, name: str, fmt: Format, address: bool = True) -> None:
        self.protocol = fmt.protocol
        self.name = name.encode()
        self.address = self.name if address else None
        self.wire_format = fmt
        self.principal = Principal(name, ACCOUNT)
        self.got: list[bytes] = []
        self.was_replaced = False

    def send(self, data: bytes) -> None:
        self.got.append(data)

    def replaced(self) -> None:
        self.was_replaced = True


def msg(kind, target, payload=b"x", sender=b"s"):
    return Message(kind, target, payload, "test", sender)


@pytest.fixture
def broker():
    return Broker(max_subscriptions=3, max_connections=2)


def attached(broker, *sessions):
    for s in sessions:
        broker.attach(s)
    return sessions


def test_fakes_provide_the_interfaces():
    fmt = Format("a")
    verifyObject(IWireFormat, fmt)
    verifyObject(ISubscriber, Session("x", fmt))


def test_publish_renders_once_per_format_and_skips_the_excluded(broker):
    one, two = Format("one"), Format("two")
    a, b, c = attached(broker, Session("a", one), Session("b", one), Session("c", two))
    for s in (a, b, c):
        broker.subscribe(s, b"t")
    assert broker.publish(msg(MULTICAST, b"t", b"hi"), exclude=a) == 2
    assert one.rendered == 1 and two.rendered == 1
    assert a.got == []
    assert b.got == [b"one|multicast|b't'|hi"]
    assert c.got == [b"two|multicast|b't'|hi"]
    assert b.got[0] is not c.got[0]
    assert broker.stats.delivered == 2


def test_same_bytes_object_goes_to_every_recipient_of_a_format(broker):
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(a, b"t")
    broker.subscribe(b, b"t")
    broker.publish(msg(MULTICAST, b"t"))
    assert a.got[0] is b.got[0]


def test_publish_batch_keeps_order_and_writes_once(broker):
    fmt = Format("f", refuse=b"bad")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(a, b"t")
    broker.subscribe(b, b"t")
    messages = [msg(MULTICAST, b"t", p) for p in (b"1", b"bad", b"2")]
    assert broker.publish_batch(messages, exclude=a) == 2
    assert a.got == []
    assert b.got == [b"f|multicast|b't'|1f|multicast|b't'|2"]
    assert broker.stats.unrenderable == 1
    assert broker.stats.published == 3


class RunFormat(Format):
    """A format that renders some runs in one go (render_run) and leaves the rest."""

    def render_run(self, messages):
        if any(message.payload == b"single" for message in messages):
            return None
        return b"run:" + b",".join(message.payload for message in messages)


def test_publish_batch_takes_a_formats_rendering_of_the_whole_run(broker):
    fmt = RunFormat("r")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(b, b"t")
    assert broker.publish_batch([msg(MULTICAST, b"t", p) for p in (b"1", b"2", b"3")], exclude=a) == 3
    assert b.got == [b"run:1,2,3"] and fmt.rendered == 0
    assert broker.publish_batch([msg(MULTICAST, b"t", p) for p in (b"single", b"4")]) == 2
    assert b.got[1:] == [b"r|multicast|b't'|singler|multicast|b't'|4"] and fmt.rendered == 2
    assert broker.stats.delivered == 5


def test_publish_to_topic_without_members(broker):
    assert broker.publish(msg(MULTICAST, b"nobody")) == 0
    assert broker.publish_batch([msg(MULTICAST, b"nobody")]) == 0


def test_unicast(broker):
    fmt = Format("f", refuse=b"bad")
    (a,) = attached(broker, Session("a", fmt))
    assert broker.unicast(msg(UNICAST, b"a", b"hi"), "f")
    assert a.got == [b"f|unicast|b'a'|hi"]
    assert not broker.unicast(msg(UNICAST, b"nobody"), "f")
    assert broker.unicast(msg(UNICAST, b"a", b"bad"), "f")  # reachable, but not renderable: counted
    assert broker.stats.unrenderable == 1


def test_broadcast_each_peer_once_not_the_sender(broker):
    fmt = Format("f")
    a, b, c, d = attached(broker, *(Session(n, fmt) for n in "abcd"))
    for s in (a, b):
        broker.subscribe(s, b"t1")
        broker.subscribe(s, b"t2")
    broker.subscribe(c, b"t2")
    broker.subscribe(d, b"t3")
    assert broker.broadcast(msg(BROADCAST, None), a) == 2
    assert len(b.got) == len(c.got) == 1
    assert a.got == d.got == []


def test_presence_batch_then_changes(broker):
    fmt = Format("f")
    a, b, w = attached(broker, Session("a", fmt), Session("b", fmt), Session("w", fmt))
    broker.subscribe(a, b"t", presence=True)
    broker.subscribe(b, b"t")
    broker.subscribe(w, b"t", presence=True)
    assert w.got == [b"+ a t!", b"+ b t"]
    assert a.got == [b"+ b t", b"+ w t!"]
    broker.unsubscribe(b, b"t")
    assert w.got[-1] == a.got[-1] == b"- b t"
    assert b.got == []


def test_subscription_errors(broker):
    fmt = Format("f")
    (a,) = attached(broker, Session("a", fmt))
    broker.subscribe(a, b"t")
    with pytest.raises(AlreadySubscribed) as already:
        broker.subscribe(a, b"t")
    assert already.value.args == (b"t",)
    with pytest.raises(NotSubscribed):
        broker.unsubscribe(a, b"other")
    broker.subscribe(a, b"u")
    broker.subscribe(a, b"v")
    with pytest.raises(SubscriptionLimit) as limit:
        broker.subscribe(a, b"w")
    assert limit.value.args == (b"w",)
    assert broker.subscriptions(a) == [b"t", b"u", b"v"]
    stranger = Session("stranger", fmt)
    with pytest.raises(BrokerError, match="^a session must attach before it subscribes$"):
        broker.subscribe(stranger, b"t")
    assert broker.subscriptions(stranger) == [] and broker.peers_of(stranger) == []


def test_attach_with_same_address_replaces_and_detaches_the_older(broker):
    fmt = Format("f")
    w, old = attached(broker, Session("w", fmt), Session("a", fmt))
    broker.subscribe(w, b"t", presence=True)
    broker.subscribe(old, b"t")
    new = Session("a", fmt)
    broker.attach(new)
    assert old.was_replaced
    assert w.got[-1] == b"- a t"
    assert broker.session_for("f", b"a") is new
    broker.detach(old)  # the older connection's late detach changes nothing
    assert broker.session_for("f", b"a") is new
    assert broker.topics.get(b"t") is not None


def test_detach_leaves_everything_and_is_idempotent(broker):
    fmt = Format("f")
    (a,) = attached(broker, Session("a", fmt))
    broker.subscribe(a, b"t1")
    broker.subscribe(a, b"t2")
    broker.detach(a)
    broker.detach(a)
    assert broker.active_topics() == []
    assert broker.session_for("f", b"a") is None


def test_unaddressed_sessions_are_not_reachable(broker):
    fmt = Format("f")
    (anon,) = attached(broker, Session(".", fmt, address=False))
    assert broker.session_for("f", b".") is None
    broker.detach(anon)


def test_connection_limit(broker):
    first, second = broker.admit(), broker.admit()
    assert first and second
    assert not broker.admit()
    assert broker.stats.refused_connections == 1
    first.release()
    first.release()  # counts out once
    assert broker.admit()
    assert not broker.admit()


@implementer(IBrokerObserver)
class Observer:
    """Records what the broker tells its observer, runs by their payloads."""

    def __init__(self):
        self.events = []

    def message_routed(self, message, recipients, dropped):
        self.events.append(("routed", message.payload, recipients, dropped))

    def session_attached(self, session):
        self.events.append(("attached", session.name))

    def session_detached(self, session):
        self.events.append(("detached", session.name))

    def messages_routed(self, messages, recipients_each, dropped_each):
        self.events.append(("run", tuple(m.payload for m in messages), recipients_each, dropped_each))

    def subscribed(self, session, topic):
        self.events.append(("subscribed", session.name, topic))

    def unsubscribed(self, session, topic):
        self.events.append(("unsubscribed", session.name, topic))


def test_observer_sees_routing_and_sessions():
    observer = Observer()
    verifyObject(IBrokerObserver, observer)
    broker = Broker(observer=observer)
    fmt = Format("f", refuse=b"bad")
    a = Session("a", fmt)
    broker.attach(a)
    broker.subscribe(a, b"t")
    broker.publish(msg(MULTICAST, b"t", b"ok"))
    broker.publish(msg(MULTICAST, b"t", b"bad"))
    broker.publish_batch([msg(MULTICAST, b"t", b"1"), msg(MULTICAST, b"t", b"2")])
    broker.detach(a)
    assert observer.events == [
        ("attached", b"a"),
        ("subscribed", b"a", b"t"),
        ("routed", b"ok", 1, 0),
        ("routed", b"bad", 0, 1),
        ("run", (b"1", b"2"), 1, 0),
        ("unsubscribed", b"a", b"t"),
        ("detached", b"a"),
    ]


def test_observer_counts_each_message_of_a_mixed_run():
    """A run the other format cannot carry part of: each message is reported with the
    sessions it reached, so the event log's fan-out adds up to what was sent."""
    observer = Observer()
    broker = Broker(observer=observer)
    picky, plain = Format("picky", refuse=b"bad"), Format("plain")
    a, b, c = attached(broker, Session("a", picky), Session("b", plain), Session("c", plain))
    for session in (a, b, c):
        broker.subscribe(session, b"t")
    del observer.events[:]
    run = [msg(MULTICAST, b"t", p) for p in (b"1", b"bad", b"2", b"3")]
    assert broker.publish_batch(run, exclude=c) == 7  # a: 1, 2, 3; b: all four
    assert observer.events == [
        ("run", (b"1",), 2, 0),
        ("run", (b"bad",), 1, 1),
        ("run", (b"2", b"3"), 2, 0),
    ]
    assert len(a.got[0].split(b"picky|")) - 1 == 3 and len(b.got[0].split(b"plain|")) - 1 == 4
    broker.publish_batch(run[:1] + run[2:])  # carried by every format: one run, as before
    assert observer.events[-1] == ("run", (b"1", b"2", b"3"), 3, 0)


def test_every_route_is_counted_and_reported():
    """Stats and observer reports of each kind of routing add up, run after run, with two
    wire formats (the one that cannot carry b"bad" first in the fan-out)."""
    observer = Observer()
    broker = Broker(observer=observer)
    picky, plain = Format("picky", refuse=b"bad"), Format("plain")
    a, b, c, d = attached(broker, Session("a", picky), Session("b", plain), Session("c", plain), Session("d", plain))
    for session in (a, b, c):
        broker.subscribe(session, b"t")
    del observer.events[:]
    assert broker.publish(msg(MULTICAST, b"t", b"bad"), exclude=c) == 1  # b; a cannot carry it
    assert broker.publish(msg(MULTICAST, b"t", b"x"), exclude=d) == 3  # d is not a member
    assert broker.publish(msg(MULTICAST, b"t", b"y"), exclude=a) == 2
    assert broker.publish(msg(MULTICAST, b"empty", b"z")) == 0
    assert broker.publish_batch([msg(MULTICAST, b"t", b"1"), msg(MULTICAST, b"t", b"2")], exclude=d) == 6
    assert broker.unicast(msg(UNICAST, b"a", b"bad"), "picky") and broker.unicast(msg(UNICAST, b"b", b"hi"), "plain")
    assert broker.broadcast(msg(BROADCAST, None, b"bad"), a) == 2
    assert broker.broadcast(msg(BROADCAST, None, b"bad"), b) == 1  # a cannot carry it
    assert observer.events == [
        ("routed", b"bad", 1, 1),
        ("routed", b"x", 3, 0),
        ("routed", b"y", 2, 0),
        ("routed", b"z", 0, 0),
        ("run", (b"1", b"2"), 3, 0),
        ("routed", b"bad", 0, 1),
        ("routed", b"hi", 1, 0),
        ("routed", b"bad", 2, 0),
        ("routed", b"bad", 1, 1),
    ]
    assert broker.stats.as_dict() == {
        "published": 10, "delivered": 1 + 3 + 2 + 6 + 1 + 2 + 1, "unrenderable": 1 + 1 + 1,
        "slow_consumer_drops": 0, "connections": 0, "refused_connections": 0,
    }


def test_topic_fanout_cache_follows_membership(broker):
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(a, b"t")
    broker.publish(msg(MULTICAST, b"t", b"1"))
    broker.subscribe(b, b"t")
    broker.publish(msg(MULTICAST, b"t", b"2"))
    broker.unsubscribe(a, b"t")
    broker.publish(msg(MULTICAST, b"t", b"3"))
    assert [g[-1:] for g in a.got] == [b"1", b"2"]
    assert [g[-1:] for g in b.got] == [b"2", b"3"]


def test_topic_listeners_hear_activation_and_deactivation(broker):
    heard = []
    broker.topic_listeners.append(lambda name, active: heard.append((name, active)))
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(a, b"t")
    broker.subscribe(b, b"t")
    broker.unsubscribe(a, b"t")
    broker.detach(b)
    assert heard == [(b"t", True), (b"t", False)]


def test_protocols_have_separate_address_namespaces(broker):
    """A login in one protocol cannot replace another protocol's session of the same address."""
    mine, theirs = Session("a", Format("one")), Session("a", Format("two"))
    attached(broker, mine, theirs)
    assert not mine.was_replaced and not theirs.was_replaced
    assert broker.session_for("one", b"a") is mine
    assert broker.session_for("two", b"a") is theirs
    assert broker.unicast(msg(UNICAST, b"a", b"hi"), "two")
    assert (mine.got, theirs.got) == ([], [b"two|unicast|b'a'|hi"])


class Policy:
    """Allows what ``rules`` says: {(principal name, topic): Perm}; counts the questions."""

    def __init__(self, rules):
        self.rules = rules
        self.asked = 0

    def permissions(self, principal, topic):
        self.asked += 1
        return self.rules.get((principal.name, topic), Perm.NONE)


def test_the_policy_is_checked_on_subscribe_publish_and_unicast_and_cached(broker):
    fmt = Format("f")
    policy = Policy({("a", b"t"): Perm.SUBSCRIBE | Perm.PUBLISH, ("b", b"t"): Perm.SUBSCRIBE,
                     ("a", b"accounts/b"): Perm.PUBLISH})
    broker.set_policy(policy)
    a, b, c = attached(broker, Session("a", fmt), Session("b", fmt), Session("c", fmt))
    broker.subscribe(b, b"t")
    with pytest.raises(Forbidden):
        broker.subscribe(c, b"t")
    assert broker.may_publish(a.principal, b"t") and not broker.may_publish(b.principal, b"t")
    with pytest.raises(Forbidden):
        broker.publish(Message(MULTICAST, b"t", b"x", "f", b"b", principal=b.principal))
    broker.publish(Message(MULTICAST, b"t", b"ok", "f", b"a", principal=a.principal))
    assert b.got == [b"f|multicast|b't'|ok"]
    with pytest.raises(Forbidden):
        broker.unicast(Message(UNICAST, b"a", b"x", "f", b"b", principal=b.principal), "f")
    assert broker.unicast(Message(UNICAST, b"b", b"psst", "f", b"a", principal=a.principal), "f")
    asked = policy.asked
    broker.publish(Message(MULTICAST, b"t", b"again", "f", b"a", principal=a.principal))
    assert policy.asked == asked, "decisions are cached per (principal, topic)"


def test_a_new_policy_revokes_live_subscriptions_at_once(broker):
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe(a, b"t")
    broker.subscribe(b, b"t")
    revoked = []
    b.subscription_revoked = revoked.append
    assert broker.set_policy(Policy({("a", b"t"): Perm.SUBSCRIBE})) == 1
    assert revoked == [b"t"] and broker.subscriptions(b) == [] and broker.subscriptions(a) == [b"t"]
    broker.publish(Message(MULTICAST, b"t", b"after", "test", b"s", principal=BROKER))
    assert a.got == [b"f|multicast|b't'|after"] and b.got == []


def test_without_a_policy_the_broker_never_asks():
    broker = Broker()
    assert broker.access.policy is None
    session = Session("nobody", Format("f"))
    session.principal = NOBODY
    broker.attach(session)
    broker.subscribe(session, b"anything")
    assert broker.publish(Message(MULTICAST, b"anything", b"x", "f", b"n", principal=NOBODY)) == 1


class RunObserver:
    """Records what the broker reports routed, run by run."""

    def __init__(self) -> None:
        self.routed: list[tuple] = []

    def message_routed(self, message, recipients, dropped):
        self.routed.append(([message.payload], recipients, dropped))

    def messages_routed(self, messages, recipients_each, dropped_each):
        self.routed.append(([m.payload for m in messages], recipients_each, dropped_each))


def test_unicast_run_is_one_send_and_one_report_and_counts_every_message(broker):
    fmt = RunFormat("r")
    (a,) = attached(broker, Session("a", fmt))
    broker.observer = observer = RunObserver()
    assert broker.route(unicast_to([msg(UNICAST, b"a", p) for p in (b"1", b"2", b"3")], "r"))
    assert a.got == [b"run:1,2,3"] and fmt.rendered == 0
    assert observer.routed == [([b"1", b"2", b"3"], 1, 0)]
    assert (broker.stats.published, broker.stats.delivered) == (3, 3)
    assert not broker.route(unicast_to([msg(UNICAST, b"nobody", p) for p in (b"4", b"5")], "r"))
    assert broker.stats.published == 3, "nothing is accepted for an address nobody has"


def test_unicast_run_a_format_renders_message_by_message_is_still_one_send(broker):
    """Without render_run (or when it declines) each message is rendered on its own, what
    cannot be rendered is counted and reported as dropped, and the rest is one send."""
    fmt = RunFormat("r", refuse=b"bad")
    (a,) = attached(broker, Session("a", fmt))
    broker.observer = observer = RunObserver()
    assert broker.route(unicast_to([msg(UNICAST, b"a", p) for p in (b"single", b"bad", b"6")], "r"))
    assert a.got == [b"r|unicast|b'a'|singler|unicast|b'a'|6"]
    assert observer.routed == [([b"single"], 1, 0), ([b"bad"], 0, 1), ([b"6"], 1, 0)]
    assert (broker.stats.published, broker.stats.delivered, broker.stats.unrenderable) == (3, 2, 1)


def test_unicast_run_asks_the_policy_as_unicast_does(broker):
    fmt = Format("f")
    broker.set_policy(Policy({("a", b"accounts/b"): Perm.PUBLISH}))
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    with pytest.raises(Forbidden):
        broker.route(unicast_to([Message(UNICAST, b"a", b"x", "f", b"b", principal=b.principal)] * 2, "f"))
    assert a.got == [] and broker.stats.published == 0
    assert broker.route(unicast_to([Message(UNICAST, b"b", p, "f", b"a", principal=a.principal) for p in (b"1", b"2")], "f"))
    assert b.got == [b"f|unicast|b'b'|1f|unicast|b'b'|2"]

class RecordingEngine:
    """A shared engine that records the broadcasts the Broker hands it."""

    shared = True
    node_listeners: list = []

    def __init__(self):
        self.broadcasts = []

    def forward(self, messages):
        pass

    def broadcast(self, message, topics):
        self.broadcasts.append((message.payload, list(topics)))

    def member_changed(self, topic, session, joined, presence):
        pass

    def session_attached(self, session):
        pass

    def session_detached(self, session):
        pass


def test_a_broadcast_goes_to_the_engine_with_the_topics_the_sender_may_publish_to():
    broker = Broker()
    engine = broker.use_engine(RecordingEngine())
    broker.set_policy(Policy({("a", b"t1"): Perm.SUBSCRIBE | Perm.PUBLISH, ("a", b"t2"): Perm.SUBSCRIBE,
                              ("b", b"t1"): Perm.SUBSCRIBE, ("b", b"t2"): Perm.SUBSCRIBE}))
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    for session in (a, b):
        broker.subscribe(session, b"t1")
        broker.subscribe(session, b"t2")
    assert broker.broadcast(Message(BROADCAST, None, b"hi", "f", b"a", principal=a.principal), a) == 1
    assert engine.broadcasts == [(b"hi", [b"t1"])]  # not t2, which a may only read
    lone = attached(broker, Session("c", fmt))[0]
    assert broker.broadcast(Message(BROADCAST, None, b"alone", "f", b"c", principal=lone.principal), lone) == 0
    assert engine.broadcasts == [(b"hi", [b"t1"])]  # no topics: nothing for the other nodes


def test_a_broadcast_from_another_node_reaches_each_member_once_where_the_policy_allows():
    observer = Observer()
    broker = Broker(observer=observer)
    broker.set_policy(Policy({("a", b"t1"): Perm.PUBLISH, ("a", b"t2"): Perm.PUBLISH,
                              **{(n, t): Perm.SUBSCRIBE for n in "bcd" for t in (b"t1", b"t2", b"t3")}}))
    fmt = Format("f")
    b, c, d = attached(broker, *(Session(n, fmt) for n in "bcd"))
    broker.subscribe(b, b"t1")
    broker.subscribe(b, b"t2")
    broker.subscribe(c, b"t2")
    broker.subscribe(d, b"t3")
    del observer.events[:]
    sender = Principal("a", ACCOUNT)
    # t3 is named although a may not publish there (a node with another policy): refused here
    delivered = broker.route(RemoteBroadcast(Message(BROADCAST, None, b"hi", "f", b"a", principal=sender),
                                             [b"t1", b"t2", b"t3", b"gone"]))
    assert delivered == 2
    assert b.got == c.got == [b"f|broadcast|None|hi"] and d.got == []
    assert observer.events == [("routed", b"hi", 2, 0)]
    assert broker.stats.published == 0 and broker.stats.delivered == 2  # counted as published where sent


class UnicastEngine(RecordingEngine):
    """A shared engine whose other nodes hold the addresses in ``holders`` (with the principals
    their nodes announced), recording the unicasts the Broker hands it."""

    def __init__(self, holders):
        super().__init__()
        self.holders = holders
        self.unicasts = []

    def principal_of(self, namespace, address):
        return self.holders.get((namespace, address))

    def unicast(self, message, namespace):
        if (namespace, message.target) not in self.holders:
            return False
        self.unicasts.append(message.payload)
        return True


def test_a_unicast_run_to_another_node_asks_the_policy_as_a_single_unicast_does():
    broker = Broker()
    engine = broker.use_engine(UnicastEngine({("f", b"b"): Principal("b", ACCOUNT),
                                              ("f", b"c"): Principal("c", ACCOUNT)}))
    broker.set_policy(Policy({("a", b"accounts/b"): Perm.PUBLISH}))
    (a,) = attached(broker, Session("a", Format("f")))
    to_c = [Message(UNICAST, b"c", p, "f", b"a", principal=a.principal) for p in (b"1", b"2")]
    with pytest.raises(Forbidden):
        broker.route(unicast_to(to_c, "f"))
    with pytest.raises(Forbidden):
        broker.unicast(to_c[0], "f")
    assert engine.unicasts == [] and broker.stats.published == 0
    to_b = [Message(UNICAST, b"b", p, "f", b"a", principal=a.principal) for p in (b"1", b"2")]
    assert broker.route(unicast_to(to_b, "f")) and broker.unicast(to_b[0], "f")
    assert engine.unicasts == [b"1", b"2", b"1"] and broker.stats.published == 3
    assert not broker.route(unicast_to([Message(UNICAST, b"z", b"x", "f", b"a", principal=a.principal)], "f"))


def test_an_address_is_taken_over_by_the_decision_one_node_makes_whichever_node_has_it():
    """In an owned namespace only the holder's principal takes an address over, whether the
    holder is local or another node's; of two logins on two nodes the later one of one
    principal stays, and the earlier one of two principals (in any other namespace: the later)."""
    broker = Broker()
    alice, bob = Principal("alice", ACCOUNT), Principal("bob", ACCOUNT)
    broker.use_engine(UnicastEngine({("owned", b"remote"): alice}))
    broker.owned_namespaces.add("owned")
    local = attached(broker, Session("alice", Format("owned")))[0]
    for address in (b"alice", b"remote"):  # held here, and held by another node
        assert broker.may_take_address("owned", address, alice)
        assert not broker.may_take_address("owned", address, bob)
        assert not broker.may_take_address("owned", address, NOBODY)
    assert broker.may_take_address("owned", b"free", bob)
    assert broker.may_take_address("open", b"remote", bob)  # not an owned namespace

    assert not broker.replace_address("owned", b"alice", bob, later=True)  # another's later login
    assert not broker.replace_address("owned", b"alice", alice, later=False)  # her own earlier one
    assert not local.was_replaced and broker.session_for("owned", b"alice") is local
    assert broker.replace_address("owned", b"alice", alice, later=True)  # her own later login
    assert local.was_replaced and broker.session_for("owned", b"alice") is None

    intruder = attached(broker, Session("alice", Format("owned")))[0]
    intruder.principal = NOBODY  # let in on a node that had not heard of alice's login yet
    assert broker.replace_address("owned", b"alice", alice, later=False)  # hers was the earlier
    assert intruder.was_replaced

    ssmp = attached(broker, Session("carol", Format("open")))[0]
    assert not broker.replace_address("open", b"carol", bob, later=False)
    assert broker.replace_address("open", b"carol", bob, later=True) and ssmp.was_replaced

"""Subscriptions to topic filters in the Broker: routing, each session once, access per topic,
limits, detach, policy reloads, shared groups, and what a node of a cluster tells the others."""
from __future__ import annotations

import pytest

from brokerd.core.access import Perm
from brokerd.core.broker import Broker
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import BROKER
from brokerd.errors import (
    AlreadySubscribed,
    BrokerError,
    Forbidden,
    NotSubscribed,
    SubscriptionLimit,
)
from tests.core.test_broker import Format, Policy, Session, attached


def mcast(topic: bytes, payload: bytes = b"x", principal=BROKER) -> Message:
    return Message(MULTICAST, topic, payload, "test", b"s", principal=principal)


@pytest.fixture
def broker() -> Broker:
    return Broker(max_subscriptions=3)


def test_a_filter_gets_what_any_matching_topic_gets_and_nothing_else(broker):
    fmt = Format("f")
    plus, deep, exact = attached(broker, Session("plus", fmt), Session("deep", fmt), Session("exact", fmt))
    broker.subscribe_filter(plus, b"sensors/+/temp")
    broker.subscribe_filter(deep, b"sensors/#")
    broker.subscribe(exact, b"sensors/kitchen/temp")
    assert broker.publish(mcast(b"sensors/kitchen/temp", b"21")) == 3
    assert broker.publish(mcast(b"sensors/kitchen/humidity", b"40")) == 1
    assert broker.publish(mcast(b"sensors", b"root")) == 1  # '#' includes the parent level
    assert broker.publish(mcast(b"other/kitchen/temp", b"no")) == 0
    assert plus.got == [b"f|multicast|b'sensors/kitchen/temp'|21"]
    assert deep.got == [b"f|multicast|b'sensors/kitchen/temp'|21", b"f|multicast|b'sensors/kitchen/humidity'|40",
                        b"f|multicast|b'sensors'|root"]
    assert exact.got == [b"f|multicast|b'sensors/kitchen/temp'|21"]
    assert fmt.rendered == 3  # once per message and format, however many recipients


def test_a_session_reached_by_a_topic_and_filters_gets_each_message_once(broker):
    fmt = Format("f")
    (a,) = attached(broker, Session("a", fmt))
    broker.subscribe(a, b"a/b")
    broker.subscribe_filter(a, b"a/+")
    broker.subscribe_filter(a, b"#")
    assert broker.publish(mcast(b"a/b", b"once")) == 1
    assert a.got == [b"f|multicast|b'a/b'|once"]
    assert broker.subscriptions(a) == [b"a/b", b"a/+", b"#"]


def test_dollar_topics_are_not_reached_by_leading_wildcards(broker):
    fmt = Format("f")
    every, system = attached(broker, Session("every", fmt), Session("system", fmt))
    broker.subscribe_filter(every, b"#")
    broker.subscribe_filter(system, b"$SYS/#")
    broker.publish(mcast(b"$SYS/uptime", b"1"))
    broker.publish(mcast(b"plain", b"2"))
    assert every.got == [b"f|multicast|b'plain'|2"]
    assert system.got == [b"f|multicast|b'$SYS/uptime'|1"]


def test_the_publisher_excluded_and_a_run_written_once_per_recipient(broker):
    fmt = Format("f")
    sender, other = attached(broker, Session("sender", fmt), Session("other", fmt))
    broker.subscribe_filter(sender, b"t/#")
    broker.subscribe_filter(other, b"t/#")
    assert broker.publish(mcast(b"t/1", b"hi"), exclude=sender) == 1
    assert broker.publish_batch([mcast(b"t/2", b"a"), mcast(b"t/2", b"b")]) == 4
    assert sender.got == [b"f|multicast|b't/2'|af|multicast|b't/2'|b"]
    assert other.got == [b"f|multicast|b't/1'|hi", b"f|multicast|b't/2'|af|multicast|b't/2'|b"]


def test_membership_changes_are_seen_by_the_next_publish(broker):
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe_filter(a, b"t/+")
    assert broker.publish(mcast(b"t/x", b"1")) == 1
    broker.subscribe(b, b"t/x")  # the topic's own membership changes
    assert broker.publish(mcast(b"t/x", b"2")) == 2
    broker.unsubscribe(b, b"t/x")
    broker.unsubscribe_filter(a, b"t/+")
    assert broker.publish(mcast(b"t/x", b"3")) == 0
    broker.subscribe_filter(b, b"t/x")  # a filter without a wildcard is one topic
    assert broker.publish(mcast(b"t/x", b"4")) == 1
    assert a.got == [b"f|multicast|b't/x'|1", b"f|multicast|b't/x'|2"]
    assert b.got == [b"f|multicast|b't/x'|2", b"f|multicast|b't/x'|4"]


def test_bad_filters_duplicates_limits_and_unknown_unsubscribes(broker):
    (a,) = attached(broker, Session("a", Format("f")))
    for bad in (b"", b"a/#/b", b"a+", b"#a"):
        with pytest.raises(ValueError):
            broker.subscribe_filter(a, bad)
    broker.subscribe_filter(a, b"a/#")
    with pytest.raises(AlreadySubscribed):
        broker.subscribe_filter(a, b"a/#")
    broker.subscribe(a, b"t")
    broker.subscribe_filter(a, b"b/+")
    with pytest.raises(SubscriptionLimit):  # topics and filters count together (3)
        broker.subscribe_filter(a, b"c/+")
    with pytest.raises(SubscriptionLimit):
        broker.subscribe(a, b"u")
    with pytest.raises(NotSubscribed):
        broker.unsubscribe_filter(a, b"c/+")
    with pytest.raises(BrokerError):
        broker.subscribe_filter(Session("stranger", Format("f")), b"a/#")


def test_detach_drops_the_filters(broker):
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe_filter(a, b"#")
    broker.subscribe_filter(b, b"#")
    broker.detach(a)
    assert broker.publish(mcast(b"t", b"after")) == 1
    assert a.got == [] and b.got == [b"f|multicast|b't'|after"]
    broker.detach(b)
    assert len(broker.filtered) == 0 and broker.publish(mcast(b"t")) == 0


def test_access_is_asked_for_the_filter_and_for_each_topic_it_delivers(broker):
    fmt = Format("f")
    broker.set_policy(Policy({("a", b"room/#"): Perm.SUBSCRIBE, ("a", b"room/open"): Perm.SUBSCRIBE}))
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe_filter(a, b"room/#")
    with pytest.raises(Forbidden):
        broker.subscribe_filter(b, b"room/#")
    with pytest.raises(Forbidden):
        broker.subscribe_filter(a, b"#")
    assert broker.publish(mcast(b"room/secret", b"no")) == 0  # the filter covers it; the list does not
    assert broker.publish(mcast(b"room/open", b"yes")) == 1
    assert a.got == [b"f|multicast|b'room/open'|yes"] and b.got == []


def test_a_policy_reload_revokes_filters_and_what_they_deliver(broker):
    fmt = Format("f")
    a, b = attached(broker, Session("a", fmt), Session("b", fmt))
    broker.subscribe_filter(a, b"room/#")
    broker.subscribe_filter(b, b"room/#")
    assert broker.publish(mcast(b"room/1", b"before")) == 2
    revoked: list[bytes] = []
    b.subscription_revoked = revoked.append
    policy = Policy({("a", b"room/#"): Perm.SUBSCRIBE, ("a", b"room/1"): Perm.SUBSCRIBE})
    assert broker.set_policy(policy) == 1
    assert revoked == [b"room/#"] and broker.subscriptions(b) == []
    assert broker.publish(mcast(b"room/1", b"after")) == 1
    assert broker.publish(mcast(b"room/2", b"not-a")) == 0  # remembered fan-outs were forgotten
    assert a.got[-1] == b"f|multicast|b'room/1'|after" and len(a.got) == 2
    assert b.got == [b"f|multicast|b'room/1'|before"]


def test_a_node_of_a_cluster_tells_the_other_nodes_of_each_filter_s_first_and_last_subscription(broker):
    told = []

    class Engine:
        shared = True

        def start(self, broker):
            pass

        def forward(self, messages, rendered=None):
            pass

        def session_attached(self, session):
            pass

        def session_detached(self, session):
            pass

        def filter_changed(self, topic_filter, active):
            told.append((topic_filter, active))

        def shared_changed(self, key, members):
            told.append((key, members))

        def place_shared(self, messages):
            return None

    broker.use_engine(Engine())
    a, b = attached(broker, Session("a", Format("f")), Session("b", Format("f")))
    broker.subscribe_filter(a, b"a/#")
    broker.subscribe_filter(b, b"a/#")  # not the first: nothing to tell
    broker.subscribe_filter(b, b"jobs/+", share=b"g")
    assert told == [(b"a/#", True), ((b"g", b"jobs/+"), 1)]  # a group's members are told apart
    broker.unsubscribe_filter(a, b"a/#")
    assert told[2:] == []
    broker.detach(b)
    assert told[2:] == [(b"a/#", False), ((b"g", b"jobs/+"), 0)]


def test_a_shared_group_gives_each_message_to_one_member_in_turn(broker):
    fmt = Format("f")
    one, two, alone = attached(broker, Session("one", fmt), Session("two", fmt), Session("alone", fmt))
    broker.subscribe_filter(one, b"jobs/#", share=b"workers")
    broker.subscribe_filter(two, b"jobs/#", share=b"workers")
    broker.subscribe_filter(alone, b"jobs/+")
    for n in range(4):
        assert broker.publish(mcast(b"jobs/build", str(n).encode())) == 2  # the plain filter and one worker
    assert one.got == [b"f|multicast|b'jobs/build'|0", b"f|multicast|b'jobs/build'|2"]
    assert two.got == [b"f|multicast|b'jobs/build'|1", b"f|multicast|b'jobs/build'|3"]
    assert len(alone.got) == 4
    with pytest.raises(AlreadySubscribed):
        broker.subscribe_filter(one, b"jobs/#", share=b"workers")
    broker.subscribe_filter(one, b"jobs/#")  # its own subscription beside the group's
    # one's turn in the group: reached by its own filter too, it gets the message once
    assert broker.publish(mcast(b"jobs/build", b"4")) == 2
    assert broker.publish(mcast(b"jobs/build", b"5")) == 3  # two's turn: one (own filter), two, alone
    assert one.got[-2:] == [b"f|multicast|b'jobs/build'|4", b"f|multicast|b'jobs/build'|5"]
    assert two.got[-1] == b"f|multicast|b'jobs/build'|5"


def test_a_shared_group_member_that_leaves_gets_nothing_more_and_the_last_ends_the_group(broker):
    fmt = Format("f")
    one, two = attached(broker, Session("one", fmt), Session("two", fmt))
    broker.subscribe_filter(one, b"jobs/#", share=b"g")
    broker.subscribe_filter(two, b"jobs/#", share=b"g")
    broker.unsubscribe_filter(one, b"jobs/#", share=b"g")
    with pytest.raises(NotSubscribed):
        broker.unsubscribe_filter(one, b"jobs/#", share=b"g")
    assert [broker.publish(mcast(b"jobs/x", str(n).encode())) for n in range(3)] == [1, 1, 1]
    assert one.got == [] and len(two.got) == 3
    broker.detach(two)
    assert broker.publish(mcast(b"jobs/x", b"none")) == 0
    assert len(broker.filtered) == 0 and not broker.router.filtering


def test_a_shared_group_skips_a_member_the_access_list_does_not_let_read_the_topic():
    broker = Broker(policy=Policy({("reader", b"jobs/#"): Perm.SUBSCRIBE, ("reader", b"jobs/x"): Perm.SUBSCRIBE,
                                   ("blocked", b"jobs/#"): Perm.SUBSCRIBE}))
    fmt = Format("f")
    reader, blocked = attached(broker, Session("reader", fmt), Session("blocked", fmt))
    broker.subscribe_filter(blocked, b"jobs/#", share=b"g")
    broker.subscribe_filter(reader, b"jobs/#", share=b"g")
    assert [broker.publish(mcast(b"jobs/x", str(n).encode())) for n in range(3)] == [1, 1, 1]
    assert len(reader.got) == 3 and blocked.got == []

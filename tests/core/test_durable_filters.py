"""The core's durable FILTER subscriptions (MQTT's persistent sessions): a filter covers
every core topic it matches, stored topic or not; the owner named in the subscriber is asked
the access list at every delivery; SMQP's own subscribers are not stored for twice; a session
that ends settles what was pending for it."""
from __future__ import annotations

from brokerd.core import stored
from brokerd.core.access import Perm
from brokerd.core.subscriber import SubscriberId, owner_of
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import ACCOUNT, ANONYMOUS, BROKER, CERTIFICATE, Principal
from brokerd.core.publication import KEEP_FOR_FILTERS
from brokerd.core.subscriptions import FILTER
from brokerd.store.records import SubscriptionRecord, TopicRecord
from tests.core.test_durable import _result, core, keep  # noqa: F401 - core is the fixture

ALICE = Principal("alice", ACCOUNT)


def _pending(store, name: str) -> list[bytes]:
    return [stored.decode(delivery.data).payload for delivery in _result(store.pending(name, 100))]


def _mcast(topic: bytes, payload: bytes, protocol: str = "ssmp") -> Message:
    return Message(MULTICAST, topic, payload, protocol, b"sam")


def test_an_owned_name_holds_its_owner_and_never_reads_as_an_smqp_subscriber():
    for principal in (ALICE, Principal("CN=dev/1:x", CERTIFICATE), Principal("", ANONYMOUS)):
        name = SubscriberId(principal, "mqtt", "dev:7/a b", "1").encode()
        assert ":" not in name and name.startswith(SubscriberId.session_prefix(principal, "mqtt", "dev:7/a b"))
        assert owner_of(name) == principal
    assert owner_of("bob:1") == Principal("bob", ACCOUNT)
    # another client identifier's prefix is not a prefix of this one's
    assert not SubscriberId(ALICE, "mqtt", "dev10", "1").encode().startswith(SubscriberId.session_prefix(ALICE, "mqtt", "dev1"))


def test_a_filter_keeps_every_topic_it_matches_and_nothing_else(core):
    broker, durable, store = core
    name = SubscriberId(ALICE, "mqtt", "dev", "1").encode()
    _result(durable.subscribe(SubscriptionRecord(name, FILTER, "sensors/+/temp", ("ADD", "q1")), []))
    remembered = SubscriberId(ALICE, "mqtt", "other", "1").encode()
    _result(durable.subscribe(SubscriptionRecord(remembered, FILTER, "#", ("q0",)), []))  # QoS 0: no ADD
    assert keep(broker, [_mcast(b"sensors/kitchen/humidity", b"no")]) is None
    assert keep(broker, [Message(MULTICAST, b"$SYS/kitchen/temp", b"no", "ssmp", b"sam", principal=BROKER)]) is None
    _result(keep(broker, [_mcast(b"sensors/kitchen/temp", b"21")]))  # no stored topic needed
    _result(keep(broker, [_mcast(b"sensors/hall/temp", b"19", "mqtt")]))
    assert _pending(store, name) == [b"21", b"19"]
    assert _pending(store, remembered) == []
    assert [sub.record.topic for sub in durable.index.of(remembered)] == ["#"]  # found again at CONNECT


def test_the_owner_is_asked_at_every_delivery(core):
    broker, durable, store = core

    class Policy:
        allowed = True

        def permissions(self, principal, topic):
            if principal == ALICE and topic.startswith(b"secret/") and not self.allowed:
                return Perm(0)
            return Perm.SUBSCRIBE | Perm.PUBLISH

    policy = Policy()
    broker.set_policy(policy)
    name = SubscriberId(ALICE, "mqtt", "dev", "1").encode()
    _result(durable.subscribe(SubscriptionRecord(name, FILTER, "secret/#", ("ADD", "q1")), []))
    _result(keep(broker, [_mcast(b"secret/a", b"allowed")]))
    policy.allowed = False
    broker.set_policy(policy)  # a reload: the decisions cached so far are forgotten
    kept = keep(broker, [_mcast(b"secret/b", b"revoked")])
    if kept is not None:
        _result(kept)
    assert _pending(store, name) == [b"allowed"]


def test_smqp_subscribers_are_stored_for_once_and_filters_take_smqp_s_messages(core):
    broker, durable, store = core
    durable.topics.put([TopicRecord("news", "news")])
    _result(durable.subscribe(SubscriptionRecord("bob:1", "MESSAGE", "news", ("ADD",)), ["news"]))
    name = SubscriberId(ALICE, "mqtt", "dev", "1").encode()
    _result(durable.subscribe(SubscriptionRecord(name, FILTER, "news", ("ADD", "q1")), []))
    _result(keep(broker, [_mcast(b"news", b"from ssmp")]))
    # SMQP stores its own message for its subscribers; the core keeps it for the filters only
    _result(keep(broker, [_mcast(b"news", b"from smqp", "smqp")], keeping=KEEP_FOR_FILTERS))
    assert _pending(store, "bob:1") == [b"from ssmp"]
    assert _pending(store, name) == [b"from ssmp", b"from smqp"]
    assert keep(broker, [_mcast(b"elsewhere", b"x", "smqp")], keeping=KEEP_FOR_FILTERS) is None


def test_a_forgotten_subscriber_loses_its_subscriptions_and_pending_messages(core):
    broker, durable, store = core
    name = SubscriberId(ALICE, "mqtt", "dev", "1").encode()
    other = SubscriberId(ALICE, "mqtt", "dev", "2").encode()
    for subscriber in (name, other):
        _result(durable.subscribe(SubscriptionRecord(subscriber, FILTER, "a/#", ("ADD", "q1")), []))
    for n in range(5):
        _result(keep(broker, [_mcast(b"a/b", f"m{n}".encode())]))
    assert _result(durable.forget_subscriber(name, page=2)) == 5
    assert durable.index.of(name) == [] and _result(store.subscriptions_of(name)) == []
    assert _pending(store, name) == []
    assert len(_pending(store, other)) == 5  # the other incarnation keeps its own
    _result(keep(broker, [_mcast(b"a/b", b"after")]))
    assert _pending(store, name) == [] and _pending(store, other)[-1] == b"after"

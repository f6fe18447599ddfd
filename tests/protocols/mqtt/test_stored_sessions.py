"""What MQTTSessions does with the sessions it finds in the store, on a Clock: a CONNECT takes
its principal's session of that client identifier up (Session Present, its subscriptions made
again), a clean start ends it, and at a node's start the sessions no client came back to end
after ``--mqtt-max-session-expiry`` unless their client is back by then."""
from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.access import Perm
from brokerd.core.durable import DurableService
from brokerd.core.subscriber import SubscriberId
from brokerd.core.message import MULTICAST, Details, Message
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.core.subscriptions import FILTER
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311
from brokerd.protocols.mqtt.session import MQTTSession, SubscriptionOptions
from brokerd.protocols.mqtt.sessions import MQTTSessions
from brokerd.protocols.mqtt.stored import StoredDeliveries
from brokerd.protocols.mqtt.wire import wire_formats
from brokerd.store.memory import MemoryStore
from brokerd.store.records import Delivery, PacketFlow, SubscriptionRecord
from tests.core.test_durable import _result, keep

ALICE = Principal("alice", ACCOUNT)
MALLORY = Principal("mallory", ACCOUNT)


def _node(*stored: tuple[Principal, str]) -> tuple[MQTTSessions, DurableService, Clock, list[str]]:
    """A node whose store holds a session of each (principal, client id), as after a restart."""
    clock = Clock()
    clock.advance(1000)
    store = MemoryStore()
    store.open()
    names = []
    for principal, client_id in stored:
        name = SubscriberId(principal, "mqtt", client_id, "000000000001.0000.1").encode()
        _result(store.put_subscription(SubscriptionRecord(name, FILTER, "a/+", ("ADD", "q1", "nl"))))
        _result(store.put_subscription(SubscriptionRecord(name, FILTER, "b/#", ("q0",))))
        names.append(name)
    broker = Broker()
    durable = broker.use_durable(DurableService(store, clock))
    _result(durable.start())
    broker.startService()
    sessions = MQTTSessions(broker, Settings(mqtt_max_session_expiry=60), clock)
    return sessions, durable, clock, names


def test_a_connect_takes_its_own_stored_session_up_and_nobody_else_s():
    sessions, durable, _clock, [name] = _node((ALICE, "dev"))
    stranger, present = sessions.open("dev", MALLORY, MQTT_311, clean_start=False, expiry=300)
    assert stranger is not None and not present and stranger.durable_name != name
    sessions._end(stranger)
    assert [sub.record.topic for sub in durable.index.of(name)] == ["a/+", "b/#"]  # untouched

    session, present = sessions.open("dev", ALICE, MQTT_311, clean_start=False, expiry=300)
    assert present and session.durable_name == name
    assert session.kept == {"a/+"}  # QoS 1: from the store; QoS 0: live again
    assert session.subscriptions["a/+"].qos == 1 and session.subscriptions["a/+"].no_local
    assert sessions.broker.filtered.of(session) == [b"b/#"]  # the live one
    assert sessions.broker.subscriptions(session) == [b"b/#", b"a/+"]  # what the admin lists


def test_a_clean_start_ends_the_stored_session():
    sessions, durable, _clock, [name] = _node((ALICE, "dev"))
    session, present = sessions.open("dev", ALICE, MQTT_311, clean_start=True, expiry=0)
    assert not present and session.durable_name is None and session.subscriptions == {}
    assert durable.index.of(name) == [] and _result(durable.store.subscriptions_of(name)) == []


def test_at_start_unclaimed_stored_sessions_end_after_the_longest_expiry():
    sessions, durable, clock, [idle, back] = _node((ALICE, "idle"), (ALICE, "back"))
    sessions.time_stored_sessions()
    session, present = sessions.open("back", ALICE, MQTT_311, clean_start=False, expiry=300)
    assert present and session.durable_name == back
    clock.advance(59)
    assert durable.index.of(idle) and durable.index.of(back)
    clock.advance(1)
    assert durable.index.of(idle) == [] and _result(durable.store.subscriptions_of(idle)) == []
    assert durable.index.of(back), "a session whose client came back is not ended"


def test_a_stored_message_is_sent_at_its_qos_unless_it_expired():
    """v5 3.3.2.3.3: a stored copy whose Message Expiry Interval passed is not sent (the caller
    settles it); another protocol's message goes at QoS 1 (it was stored for the session)."""
    clock = Clock()
    clock.advance(1000)
    session = MQTTSession("dev", ALICE, wire_formats(clock.seconds)[MQTT_5], 10, 10)
    transport = StringTransport()
    session.bind(SimpleNamespace(transport=transport, write_now=transport.write, congested=False), 10, None)
    session.subscribed("a/+", SubscriptionOptions(2, matched=b"a/+"), kept=True)

    def stored(seq: int, payload: bytes, protocol: str, **details) -> tuple[Message, Delivery]:
        message = Message(MULTICAST, b"a/b", payload, protocol, b"pub", details=Details(**details))
        return message, Delivery(seq, "a/b", 1, "ADD", 0, "ALL", b"")

    out: list[bytes] = []
    assert session.send_stored(*stored(1, b"stale", "mqtt", qos=1, expires=1000.0), out) is None
    assert out == []
    assert session.send_stored(*stored(2, b"fresh", "mqtt", qos=1, expires=1010.0), out) == 1
    assert session.send_stored(*stored(3, b"from ssmp", "ssmp"), out) == 2
    sent = b"".join(out)
    assert b"fresh" in sent and b"from ssmp" in sent and b"stale" not in sent
    assert session.stored_in_flight() == {2, 3}
    assert [outgoing.qos for outgoing in session.inflight.values()] == [1, 1]


def test_a_session_taken_up_reads_its_qos2_exchanges_back_before_the_client_s_packets():
    """After a restart: PUBREL again for a message the client had released (never its
    PUBLISH), the PUBLISH again with DUP and its Packet Identifier for one it had not, the
    Packet Identifier of a PUBLISH received still awaiting PUBREL; the connection reads on
    once they are read.  One sent for a message no longer pending (expired meanwhile) ends
    once every pending delivery was read.  PUBCOMP settles the delivery and ends the exchange in the store; the
    session's end drops what is left."""
    sessions, durable, _clock, [name] = _node((ALICE, "dev"))
    _result(durable.subscribe(SubscriptionRecord(name, FILTER, "q/#", ("ADD", "q2")), []))
    for payload in (b"released", b"not released"):
        _result(durable.keep([Message(MULTICAST, b"q/x", payload, "mqtt", b"pub", details=Details(qos=2))]))
    first, second = [delivery.seq for delivery in _result(durable.store.pending(name, 10))]
    _result(durable.store.put_flows([PacketFlow(name, True, 7), PacketFlow(name, False, 3, first, released=True),
                                     PacketFlow(name, False, 4, second), PacketFlow(name, False, 5, second + 1)]))

    session, present = sessions.open("dev", ALICE, MQTT_5, clean_start=False, expiry=300)
    assert present
    transport = StringTransport()
    read_on: list[bool] = []
    session.bind(SimpleNamespace(transport=transport, write_now=transport.write, congested=False,
                                 hold_reading=lambda: lambda: read_on.append(True)), 10, None)
    sessions.connected(session)
    assert read_on == [True]
    assert session.received_qos2 == {7}
    assert session.reserved == set() and session.stored.resumed == {}
    sent = transport.value()
    assert sent.startswith(b"\x62\x02\x00\x03")  # PUBREL 3
    publish = sent[4:]
    assert publish[0] == 0x3C and b"\x00\x03q/x\x00\x04" in publish  # DUP, QoS 2, Packet Identifier 4
    assert publish.endswith(b"not released") and b"released" not in sent[:4] + publish[:-len(b"not released")]

    assert session.acknowledged(3)  # PUBCOMP
    assert [delivery.seq for delivery in _result(durable.store.pending(name, 10))] == [second]
    assert _result(durable.store.flows_of(name)) == [PacketFlow(name, True, 7), PacketFlow(name, False, 4, second)]
    sessions._end(session)
    assert _result(durable.store.flows_of(name)) == []


def test_a_reload_takes_back_what_waits_unsent_for_an_owner_it_no_longer_lets_read():
    """What waits in a connected session's outbox for its window is routed again when the
    access list changes (a StoredPage): a message the owner may no longer read is given up
    (gone from the store, never sent); the one it may still read waits on."""
    clock = Clock()
    store = MemoryStore()
    store.open()
    broker = Broker()
    durable = broker.use_durable(DurableService(store, clock))
    _result(durable.start())
    name = SubscriberId(ALICE, "mqtt", "dev", "1").encode()
    _result(durable.subscribe(SubscriptionRecord(name, FILTER, "a/#", ("ADD", "q1")), []))

    class Policy:
        secret_readable = True

        def permissions(self, principal, topic):
            if topic == b"a/secret" and not self.secret_readable:
                return Perm.PUBLISH
            return Perm.SUBSCRIBE | Perm.PUBLISH

    policy = Policy()
    broker.set_policy(policy)
    for topic in (b"a/secret", b"a/open"):
        _result(keep(broker, [Message(MULTICAST, topic, b"x", "ssmp", b"pub")]))
    session = SimpleNamespace(durable_name=name, wire_format=None, can_send_stored=lambda: False,
                              stored_in_flight=set)
    outbox = StoredDeliveries(session, durable, 1 << 20)
    outbox.open()
    assert [delivery.topic for delivery in outbox.waiting] == ["a/secret", "a/open"]  # both readable then

    policy.secret_readable = False
    broker.set_policy(policy)
    assert [delivery.topic for delivery in outbox.waiting] == ["a/open"]
    assert [delivery.topic for delivery in _result(store.pending(name, 10))] == ["a/open"]
    assert durable.stats["given_up"] == 1

"""What an MQTT bridge keeps for the other broker (brokerd.protocols.mqtt.bridgequeue), in
memory: the core's durable store holds its QoS 1 and 2 ``out`` messages, counted against
``max-queued`` and ``max-queued-bytes``; past them a new one is given up, and what the bridge
itself brought in is settled at once, never counted."""
from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock

from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService
from brokerd.core.message import MULTICAST, Message
from brokerd.core.subscriptions import ADD, FILTER
from brokerd.protocols.mqtt.bridgequeue import BridgeQueue
from brokerd.store.memory import MemoryStore
from brokerd.store.records import SubscriptionRecord
from tests.core.test_durable import _result, keep

NAME = "@1/bridge/service/sys%2Fbridge%2Fb/b/1"
OWN = b"sys/bridge/b"


def queue_of(max_count: int, max_bytes: int) -> tuple[Broker, BridgeQueue]:
    """A broker with a store, and a bridge's queue for ``t/#`` whose connection is away."""
    store = MemoryStore()
    store.open()
    broker = Broker()
    durable = broker.use_durable(DurableService(store, Clock()))
    _result(durable.start())
    _result(durable.subscribe(SubscriptionRecord(NAME, FILTER, "t/#", (ADD, "q1")), []))
    bridge = SimpleNamespace(durable_name=NAME, spec=SimpleNamespace(name="b"), wire_format=None,
                             for_remote=lambda message: message.sender_name != OWN,
                             can_send_stored=lambda: False, stored_in_flight=set)
    queue = BridgeQueue(bridge, durable, 1 << 20, max_count, max_bytes)
    queue.open()
    return broker, queue


def publish(broker: Broker, payload: bytes, sender: bytes = b"dev") -> None:
    _result(keep(broker, [Message(MULTICAST, b"t/x", payload, "mqtt", sender)]))


def pending(queue: BridgeQueue) -> list[int]:
    return [delivery.seq for delivery in _result(queue.durable.pending(NAME, 100, (), None, frozenset()))]


def test_past_max_queued_a_new_message_is_given_up() -> None:
    broker, queue = queue_of(max_count=2, max_bytes=1 << 20)
    for n in range(3):
        publish(broker, b"m%d" % n)
    assert (queue.queued, queue.dropped) == (2, 1)
    assert len(pending(queue)) == 2  # the third is no longer pending for the bridge


def test_past_max_queued_bytes_a_new_message_is_given_up() -> None:
    broker, queue = queue_of(max_count=100, max_bytes=2600)
    for _ in range(3):
        publish(broker, b"x" * 1000)  # each takes a little more than 1000 bytes in the store
    assert (queue.queued, queue.dropped) == (2, 1)
    assert 2000 < queue.counted_bytes <= 2600


def test_what_the_bridge_brought_in_is_settled_at_once() -> None:
    broker, queue = queue_of(max_count=1, max_bytes=1 << 20)
    publish(broker, b"echo", sender=OWN)
    assert (queue.queued, queue.dropped, pending(queue)) == (0, 0, [])
    publish(broker, b"local")  # room for the one a local client published
    assert (queue.queued, queue.dropped, len(pending(queue))) == (1, 0, 1)


def test_the_count_starts_from_what_the_store_holds() -> None:
    broker, queue = queue_of(max_count=2, max_bytes=1 << 20)
    publish(broker, b"a")
    queue.close()
    again = BridgeQueue(queue.session, queue.durable, 1 << 20, 2, 1 << 20)
    again.open()
    assert again.queued == 1
    publish(broker, b"b")
    publish(broker, b"c")
    assert (again.queued, again.dropped) == (2, 1)

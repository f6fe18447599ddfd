"""What an MQTT bridge keeps for the other broker: its QoS 1 and 2 ``out`` messages in the
core's store, bounded, and how the core hands it the rest.

The bridge's ``out`` patterns of QoS 1 and 2 are one durable FILTER subscription each
(:mod:`brokerd.core.durable`), as a persistent MQTT session's are: whatever any protocol
publishes to a matching topic is committed with a pending delivery for the bridge before its
publisher is answered, and settled once the other broker acknowledged it (PUBACK, PUBCOMP).
So what the bridge could not send while the other broker was away (or brokerd restarted) goes
out when it is back.  :class:`BridgeQueue` is that subscriber, as durable delivery sees it: it
stays attached while the bridge runs, so it sees every delivery committed on this node and
counts them; past the bridge's ``max-queued`` messages or ``max-queued-bytes`` bytes a new
one is given up at once (dropped, counted and logged, as Mosquitto drops past its
``max_queued_messages``).

:class:`BridgeWireFormat` renders a live message for the bridge as the message itself (the
bridge builds its own PUBLISH), for the QoS 0 patterns the core routes live.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from zope.interface import implementer

from brokerd.core import stored
from brokerd.core.durable import DurableService
from brokerd.core.message import MULTICAST, Message
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.mqtt.stored import StoredDeliveries
from brokerd.store.base import log_unless_outage
from brokerd.store.records import Delivery


class Carried(bytes):
    """What the core hands the bridge for a message or a run: no bytes, the messages in
    ``items``."""

    items: tuple[Message, ...]


def carried(messages: list[Message]) -> Carried:
    data = Carried()
    data.items = tuple(messages)
    return data


@implementer(IWireFormat)
class BridgeWireFormat(WireFormat):
    """Hands a bridge the core's messages themselves (multicasts only: MQTT has no other)."""

    protocol = "bridge"

    def render_message(self, message: Message) -> Carried | None:
        return carried([message]) if message.kind == MULTICAST else None

    def render_run(self, messages: list[Message]) -> Carried | None:
        return carried(messages) if messages[0].kind == MULTICAST else None

    def render_presence(self, topic: bytes, member: ISubscriber, joined: bool, presence: bool) -> None:
        return None


class BridgeQueue(StoredDeliveries):
    """The bridge's pending deliveries (see the module docstring).  ``session`` is the
    :class:`~brokerd.protocols.mqtt.bridge.Bridge`: it sends what its connection allows
    (``can_send_stored``, ``send_stored``) and says which messages are its own
    (``for_remote``)."""

    _log = Logger()

    def __init__(self, session: Any, durable: DurableService, page_bytes: int, max_count: int, max_bytes: int) -> None:
        super().__init__(session, durable, page_bytes)
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.counted: dict[int, int] = {}
        """Seq -> bytes of every pending delivery this queue knows of (at most max_count)."""
        self.counted_bytes = 0
        self.dropped = 0
        self._full = False

    @property
    def queued(self) -> int:
        return len(self.counted)

    def open(self, resumed: Callable[[], object] | None = None) -> None:
        """Attach, count what the store holds for the bridge (up to the bounds), then read
        the first page.  A bridge has no QoS 2 exchanges to take up: ``resumed`` is called at once."""
        self.durable.attach(self)
        d = self.durable.pending(self.name, self.max_count, (), self.max_bytes, frozenset())
        d.addCallbacks(self._counted, self._not_read)
        if resumed is not None:
            resumed()

    def _counted(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self._count(delivery)
        self.refresh()

    def _count(self, delivery: Delivery) -> bool:
        """Count ``delivery`` in; False when the bounds leave no room for it."""
        if delivery.seq in self.counted:
            return True
        size = len(delivery.data)
        if len(self.counted) >= self.max_count or self.counted_bytes + size > self.max_bytes:
            return False
        self.counted[delivery.seq] = size
        self.counted_bytes += size
        self._full = False
        return True

    def offer(self, delivery: Delivery) -> None:
        """A delivery committed for the bridge: settled at once when it is not for the other
        broker (the bridge's own, brought in from there), given up when the queue is full,
        else kept and sent in its turn."""
        if self.closed or delivery.seq in self.known:
            return
        try:
            message = stored.decode(delivery.data) if stored.is_stored_message(delivery.data) else None
        except ValueError:
            message = None
        if message is None or not self.session.for_remote(message):
            self.settle(delivery)
            return
        if not self._count(delivery):
            self._drop(delivery)
            return
        super().offer(delivery)

    def pump(self) -> None:
        """Hand the waiting deliveries to the bridge while its connection allows.  Unlike a
        client's session, the bridge's own MQTT client numbers its packets and answers the
        other broker's QoS 2 exchange itself, so nothing of that exchange is stored here: a
        delivery is settled once the other broker acknowledged it (PUBACK, PUBCOMP)."""
        session = self.session
        waiting = self.waiting
        while waiting and session.can_send_stored():
            delivery = waiting.popleft()
            message = self.message_of(delivery)
            if message is None or not session.send_stored(message, delivery):
                self.settle(delivery)
            else:
                self.durable.delivered(self, delivery)  # the event log's outcome
        if not waiting and self._behind and not self._reading:
            self.refresh()

    def _drop(self, delivery: Delivery) -> None:
        self.dropped += 1
        if not self._full:
            self._full = True
            self._log.warn("MQTT bridge {name}: {count} messages ({size} bytes) wait for the other broker, the "
                           "most max-queued and max-queued-bytes allow; new ones are dropped until it takes some",
                           name=self.session.spec.name, count=len(self.counted), size=self.counted_bytes)
        d = self.durable.give_up(self, delivery)
        d.addErrback(log_unless_outage, self._log, "Dropping a message of MQTT bridge {name}",
                     name=self.session.spec.name)

    def _read(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self._count(delivery)
        super()._read(deliveries)

    def settle(self, delivery: Delivery, packet_id: int | None = None) -> None:
        self._uncount(delivery)
        super().settle(delivery)

    def forbid(self, delivery: Delivery) -> None:
        self._uncount(delivery)
        super().forbid(delivery)

    def _uncount(self, delivery: Delivery) -> None:
        size = self.counted.pop(delivery.seq, None)
        if size is not None:
            self.counted_bytes -= size

    def forget(self, delivery: Delivery) -> None:
        """``delivery`` was sent and not acknowledged (the connection went): it is read from
        the store again, and sent again, once the bridge is back (:meth:`refresh`)."""
        self.known.discard(delivery.seq)

    def disconnected(self) -> None:
        """The connection went: what waits here is read again from the store when it is back."""
        for delivery in self.waiting:
            self.known.discard(delivery.seq)
        self.waiting.clear()

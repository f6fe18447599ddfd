"""What a front end (or another node of a cluster) asks the router to deliver: typed, frozen
values, one per way a message travels, taken by the one entry point
:meth:`brokerd.core.router.Router.route`.

Why values rather than one method per path: each path used to redo part of the access check,
the statistics and the observer calls, and a path that ran beside the main one could skip
them.  A publication says what is to be delivered and nothing else; the router decides which
stages it goes through.  They are frozen for the type checker (every field is ``Final``: mypy
refuses an assignment) rather than at run time: a frozen dataclass or a NamedTuple costs about
twice as much to make as a class with ``__slots__``, and one is made per read of every front
end (benchmarks/ssmp_cpu.py counted 2 % more instructions per SSMP message with NamedTuples).

A run (``messages``) is consecutive messages of one sender that a front end read in one go,
all to one topic (or one address), in order; a single message is a run of one.  A message its
publisher asked to retain starts a run: the router's retain stage looks at a run's first
message only, so that a run with none to retain pays one test.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from brokerd.core.message import Message

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from brokerd.core.principal import Principal
    from brokerd.interfaces import ISubscriber
    from brokerd.store.records import Delivery, PacketFlow


class _Publication:
    """What the publications share: a readable ``repr`` (they are compared by identity)."""

    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"


NEVER_KEEP: Final = 0
"""A :class:`Multicast` for live subscribers only: nothing is stored of it."""
KEEP_FOR_FILTERS: Final = 1
"""A :class:`Multicast` kept for the durable FILTER subscribers only."""
KEEP: Final = 2
"""A :class:`Multicast` kept for every durable subscriber its topic has (the default)."""


class Multicast(_Publication):
    """A run published to its topic: every member, matching filter and shared group gets it,
    except ``exclude`` (the sending session, for the protocols that do not echo).

    On a node with a store the router's durable stage keeps the run for the durable
    subscribers its topic has and leaves in ``kept`` the Deferred that fires once it is
    committed (None: nothing to keep): the publisher's acknowledgement waits for it, so nothing
    acknowledged is lost.  ``flows`` (store PacketFlows: an MQTT persistent session's QoS 2
    PUBLISHes received) are committed with it, or alone.  ``keeping`` says for whom: every
    durable subscriber (:data:`KEEP`), only the FILTER ones (:data:`KEEP_FOR_FILTERS`: a front
    end with a durable topic tree of its own stored the run for that tree's subscribers), or
    none (:data:`NEVER_KEEP`: its publisher asked that it not be stored).  ``kept`` is the one
    field the router writes."""

    __slots__ = ("messages", "exclude", "flows", "keeping", "kept")

    def __init__(self, messages: list[Message], exclude: ISubscriber | None = None,
                 flows: list[PacketFlow] | None = None, keeping: int = KEEP) -> None:
        self.messages: Final = messages
        self.exclude: Final = exclude
        self.flows: Final = flows
        self.keeping: Final = keeping
        self.kept: Deferred[object] | None = None


class Unicast(_Publication):
    """A run sent to one address: the session of protocol ``namespace`` at ``target`` (here,
    or on the node of a cluster that has it)."""

    __slots__ = ("target", "namespace", "messages")

    def __init__(self, target: bytes, namespace: str, messages: list[Message]) -> None:
        self.target: Final = target
        self.namespace: Final = namespace
        self.messages: Final = messages


class Broadcast(_Publication):
    """One message to every session sharing a topic with ``sender`` that the sender may
    publish to (SSMP's BCAST)."""

    __slots__ = ("message", "sender")

    def __init__(self, message: Message, sender: ISubscriber) -> None:
        self.message: Final = message
        self.sender: Final = sender


class RemoteMulticast(_Publication):
    """A multicast run another node accepted (it checked and counted it), for this node's
    members of the topic; the shared groups are served by the node the publisher chose
    (:class:`RemoteShare`)."""

    __slots__ = ("messages",)

    def __init__(self, messages: list[Message]) -> None:
        self.messages: Final = messages


class RemoteRun(_Publication):
    """A multicast run another node accepted, as its opened envelope
    (brokerd.cluster.envelope.Run): delivered from the bytes it carries when every local wire
    format of the topic can take them, else decoded as a :class:`RemoteMulticast`."""

    __slots__ = ("run",)

    def __init__(self, run: Any) -> None:
        self.run: Final = run


class RemoteShare(_Publication):
    """A multicast run another node chose this one to hand to one member of the shared group
    ``key`` (group name, filter)."""

    __slots__ = ("key", "messages")

    def __init__(self, key: tuple[bytes, bytes], messages: list[Message]) -> None:
        self.key: Final = key
        self.messages: Final = messages


class RemoteUnicast(_Publication):
    """A unicast another node accepted for this node's session of ``namespace`` at ``target``;
    the access list is asked here, where the recipient's principal is known."""

    __slots__ = ("target", "namespace", "message")

    def __init__(self, target: bytes, namespace: str, message: Message) -> None:
        self.target: Final = target
        self.namespace: Final = namespace
        self.message: Final = message


class RemoteBroadcast(_Publication):
    """A broadcast another node accepted, for this node's members of ``topics`` (its sender's
    topics there; the access list is asked again here, topic by topic)."""

    __slots__ = ("message", "topics")

    def __init__(self, message: Message, topics: Iterable[bytes]) -> None:
        self.message: Final = message
        self.topics: Final = topics


class ReplaySink(Protocol):
    """Where a :class:`RetainedReplay`'s messages go: the paged sender of one session (MQTT's
    brokerd.protocols.mqtt.retaining.RetainedDelivery), which queues each for its client."""

    def send_retained(self, message: Message) -> bool:
        """Queue ``message`` for the session; False when its wire format cannot carry it."""

    def full(self) -> bool:
        """Whether the session takes no more now (the rest of the page waits)."""


class RetainedReplay(_Publication):
    """The retained messages a new subscription of ``reader`` to ``topic_filter`` matches (a
    page of them, in topic order), for ``sink`` to queue: each only if the access list lets
    the reader's principal read its topic, as a live message to the reader would be."""

    __slots__ = ("reader", "topic_filter", "messages", "sink")

    def __init__(self, reader: ISubscriber, topic_filter: bytes, messages: list[Message], sink: ReplaySink) -> None:
        self.reader: Final = reader
        self.topic_filter: Final = topic_filter
        self.messages: Final = messages
        self.sink: Final = sink


class Unstored(_Publication):
    """A multicast its publisher asked the broker not to store (a guarantee of none), for the
    durable subscribers of its topic connected to this node and the ``explicit`` ones (by
    subscriber name: a login topic's owner), once each; nothing is kept for one that is
    offline.  The live subscribers of the other protocols get it as a :class:`Multicast`
    with ``keeping`` :data:`NEVER_KEEP`."""

    __slots__ = ("message", "explicit")

    def __init__(self, message: Message, explicit: Iterable[str] = ()) -> None:
        self.message: Final = message
        self.explicit: Final = explicit


class StoredSink(Protocol):
    """Where a :class:`StoredPage`'s deliveries go: the outbox of one durable subscriber's
    connected session (each front end with durable subscribers has its own, e.g. MQTT's
    brokerd.protocols.mqtt.stored.StoredDeliveries)."""

    def take(self, delivery: Delivery) -> None:
        """Queue ``delivery`` to be sent in its turn (the outbox's window and order)."""

    def forbid(self, delivery: Delivery) -> None:
        """The subscriber's owner may not read ``delivery``'s topic now: not to be sent (what
        becomes of it is the outbox's protocol's choice)."""


class StoredPage(_Publication):
    """Pending deliveries of the store for the durable subscriber owned by ``owner`` (a page
    read from the store, one just committed, or what waits unsent when the access list
    changed), for ``sink`` to queue: each only if the access list lets ``owner`` read its
    topic now, as a live message to its session would be.  ``owner`` None: a subscriber no
    principal owns (a relay between servers) takes what was stored for it."""

    __slots__ = ("owner", "deliveries", "sink")

    def __init__(self, owner: Principal | None, deliveries: Sequence[Delivery], sink: StoredSink) -> None:
        self.owner: Final = owner
        self.deliveries: Final = deliveries
        self.sink: Final = sink


Publication = (Multicast | Unicast | Broadcast | RemoteMulticast | RemoteRun | RemoteShare | RemoteUnicast
               | RemoteBroadcast | RetainedReplay | StoredPage | Unstored)
"""Everything :meth:`brokerd.core.router.Router.route` takes."""


def unicast_to(messages: list[Message], namespace: str) -> Unicast:
    """The :class:`Unicast` of ``messages`` (a run to one address) to the address their first
    names: front ends build their unicast messages with a target."""
    target = messages[0].target
    if target is None:
        raise ValueError("a unicast message names its recipient")
    return Unicast(target, namespace, messages)

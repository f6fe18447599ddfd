"""The in-memory engine: one node is the whole broker (the default).

Every route the Broker needs is in its own dictionaries, so this engine has nothing to do;
it exists so that the Broker always has an :class:`~brokerd.interfaces.IEngine` and the
cluster engines (brokerd.cluster) plug into the same place.  ``shared`` is False, which
lets the Broker skip the engine on its publish path altogether.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from zope.interface import implementer

from brokerd.core.message import Message
from brokerd.core.principal import Principal
from brokerd.interfaces import IEngine, ISubscriber


@implementer(IEngine)
class InMemoryEngine:
    """Routing inside this process only."""

    shared = False

    def start(self, broker: object) -> None:
        """Nothing to connect to."""

    def stop(self) -> None:
        """Nothing to disconnect."""

    def forward(self, messages: Sequence[Message], rendered: dict[str, bytes] | None = None) -> None:
        """There is no other node to send to."""

    def unicast(self, message: Message, namespace: str) -> bool:
        """No other node has the address."""
        return False

    node_listeners: tuple = ()
    """No other node can leave (a tuple: this engine is shared by every Broker)."""

    def broadcast(self, message: Message, topics: Sequence[bytes]) -> None:
        """There is no other node to send to."""

    def claim(self, namespace: str, name: bytes) -> None:
        """Nobody else to tell."""

    def release(self, namespace: str, name: bytes) -> None:
        """Nobody else to tell."""

    def owner(self, namespace: str, name: bytes) -> None:
        """No other node serves anything."""
        return None

    def principal_of(self, namespace: str, address: bytes) -> None:
        """No other node has sessions."""
        return None

    def serve(self, service: str, handler: Callable[[str, bytes], None]) -> None:
        """No other node sends anything."""

    def send(self, origin: str, service: str, data: bytes) -> bool:
        """No other node to send to."""
        return False

    def session_attached(self, session: ISubscriber) -> None:
        """Nobody else to tell."""

    def session_detached(self, session: ISubscriber) -> None:
        """Nobody else to tell."""

    def member_changed(self, topic: bytes, session: ISubscriber, joined: bool, presence: bool) -> None:
        """Nobody else to tell."""

    def filter_changed(self, topic_filter: bytes, active: bool) -> None:
        """Nobody else to tell."""

    def shared_changed(self, key: tuple[bytes, bytes], members: int) -> None:
        """Nobody else to tell."""

    def place_shared(self, messages: Sequence[Message]) -> None:
        """Every shared group is this node's own."""
        return None

    def durable_changed(self, tree: bool = False, subscribers: Iterable[str] = (), pending: Iterable[str] = ()) -> None:
        """No other node reads the store."""

    def members(self, topic: bytes) -> list:
        """No other node has members."""
        return []

    def topics(self) -> set[bytes]:
        """No other node has topics."""
        return set()

    def other_nodes(self) -> None:
        """No cluster."""
        return None

    def keep_out(self, principal: Principal, seconds: float) -> None:
        """No other node to tell."""


IN_MEMORY = InMemoryEngine()
"""The engine of every Broker that was given none (stateless, so shared)."""

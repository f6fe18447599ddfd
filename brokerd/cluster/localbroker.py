"""What the cluster engine needs of its node's Broker (brokerd.core.broker), as a Protocol.

The engine reaches into the Broker from the other side: it follows the topics and filters the
local members have, routes what other nodes accepted, and reports what the directory learns
(presence, addresses, keep-outs, durable state).  Naming those members here keeps the
seam visible to mypy, and lets the engine's tests stand in a Broker of their own.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from brokerd.core.filtered import FilterSubscriptions
from brokerd.core.principal import Principal
from brokerd.core.publication import Publication
from brokerd.core.topics import TopicRegistry
from brokerd.interfaces import ISubscriber


class LocalBroker(Protocol):
    """The Broker as the engine of its node sees it."""

    topics: TopicRegistry
    filtered: FilterSubscriptions
    topic_listeners: list[Callable[[bytes, bool], None]]
    route: Callable[[Publication], int]
    """The routing entry point: the engine hands it what other nodes accepted (RemoteRun,
    RemoteBroadcast, RemoteUnicast, RemoteShare)."""

    def session_for(self, namespace: str, address: bytes) -> ISubscriber | None: ...

    def replace_address(self, namespace: str, address: bytes, principal: Principal | None = None,
                        later: bool = True) -> bool: ...

    def tell_presence(self, name: bytes, member: ISubscriber, joined: bool, presence: bool) -> None: ...

    def remote_topics_changed(self) -> None: ...

    def keep_out_announced(self, principal: Principal, seconds: float) -> None: ...

    def durable_announced(self, tree: bool, subscribers: list[str], pending: list[str]) -> None: ...

    def durable_resync(self) -> None: ...

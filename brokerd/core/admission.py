"""Connection admission: who may open one more connection, counted four ways.

One shared count let any protocol's connections lock every other protocol out, and a client
that never logs in took a slot as surely as one that did.  So a new connection is weighed
against the connections of all listeners together, of its own listener, of its own source
address, and of every connection not yet logged in; it is refused when any of them is full.
Each admitted connection holds an :class:`Admission` that counts it out (once) when it goes and
moves it out of the not-logged-in count when its login succeeds.

Listeners and addresses are opaque keys chosen by the front ends (``None``: not counted that
way, e.g. a UNIX socket has no source address); a key whose count drops to zero is forgotten,
so the maps hold only live connections.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class ConnectionCounters(Protocol):
    """The Broker's counters the admissions keep (brokerd.core.broker.BrokerStats, whose
    module imports this one)."""

    connections: int
    refused_connections: int


class Admissions:
    """The counts and their limits; the Broker owns one and front ends reach it through
    ``Broker.admit``.  The limits are plain attributes (tests and operators may change them
    on a running broker)."""

    def __init__(
        self,
        stats: ConnectionCounters,
        *,
        max_connections: int,
        max_listener_connections: int,
        max_connections_per_address: int,
        max_unauthenticated: int,
    ) -> None:
        self.stats = stats
        self.max_connections = max_connections
        self.max_listener_connections = max_listener_connections
        self.max_connections_per_address = max_connections_per_address
        self.max_unauthenticated = max_unauthenticated
        self.unauthenticated = 0
        self.per_listener: dict[Hashable, int] = {}
        self.per_address: dict[Hashable, int] = {}

    def admit(self, listener: Hashable | None, address: Hashable | None) -> Admission | None:
        """Count a new connection in, or return None (counted as refused) if any limit is full."""
        stats = self.stats
        if (
            stats.connections >= self.max_connections
            or self.unauthenticated >= self.max_unauthenticated
            or (listener is not None and self.per_listener.get(listener, 0) >= self.max_listener_connections)
            or (address is not None and self.per_address.get(address, 0) >= self.max_connections_per_address)
        ):
            stats.refused_connections += 1
            return None
        stats.connections += 1
        self.unauthenticated += 1
        if listener is not None:
            self.per_listener[listener] = self.per_listener.get(listener, 0) + 1
        if address is not None:
            self.per_address[address] = self.per_address.get(address, 0) + 1
        return Admission(self, listener, address)

    def _count_out(self, counts: dict[Hashable, int], key: Hashable | None) -> None:
        if key is None:
            return
        left = counts[key] - 1
        if left:
            counts[key] = left
        else:
            del counts[key]

    def _release(self, admission: Admission) -> None:
        self.stats.connections -= 1
        if not admission.logged_in:
            self.unauthenticated -= 1
        self._count_out(self.per_listener, admission.listener)
        self._count_out(self.per_address, admission.address)


class Admission:
    """One admitted connection.  ``login()`` and ``release()`` may be called any number of
    times (a connection that logs in twice, or is released by two owners, counts once)."""

    __slots__ = ("_admissions", "listener", "address", "logged_in")

    def __init__(self, admissions: Admissions, listener: Hashable | None, address: Hashable | None) -> None:
        self._admissions: Admissions | None = admissions
        self.listener = listener
        self.address = address
        self.logged_in = False

    def login(self) -> None:
        """The connection proved who it is: it no longer counts as not logged in."""
        admissions = self._admissions
        if admissions is not None and not self.logged_in:
            self.logged_in = True
            admissions.unauthenticated -= 1

    def release(self) -> None:
        """The connection is gone: count it out."""
        admissions, self._admissions = self._admissions, None
        if admissions is not None:
            admissions._release(self)

"""Connections per listener, counted and logged without touching the front ends.

:class:`ConnectionLog` stands between a listening endpoint and a front end's factory: it
builds each connection's protocol with the real factory, logs the new connection, counts it
for its protocol, and wraps that one protocol object's ``connectionLost`` to log and count
the end.  Reads and writes go straight to the front end's protocol as before: the only cost
is per connection, never per message.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IProtocolFactory
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.events.log import peer_text

_log = Logger(namespace="brokerd")
"""Module-level, as brokerd.admin.oplog's is (why: there)."""


class ConnectionCounts:
    """Open connections and connections made so far, by protocol (shared by every listener)."""

    def __init__(self) -> None:
        self.open: Counter[str] = Counter()
        self.made: Counter[str] = Counter()


class ConnectionLog(Factory):
    """A factory in front of ``factory`` (a front end's) that logs and counts connections."""


    def __init__(self, protocol: str, factory: IProtocolFactory, counts: ConnectionCounts) -> None:
        self.protocol_name = protocol
        self.wrapped = factory
        self.counts = counts

    def logPrefix(self) -> str:
        prefix = getattr(self.wrapped, "logPrefix", None)
        return prefix() if prefix is not None else self.protocol_name

    def doStart(self) -> None:
        self.wrapped.doStart()

    def doStop(self) -> None:
        self.wrapped.doStop()

    def buildProtocol(self, addr: Any) -> Any:  # Factory's (IAddress | None, a private Protocol type) and the
        # wrapped IProtocolFactory's (IAddress, IProtocol) do not meet
        built = self.wrapped.buildProtocol(addr)
        if built is None:
            return None
        name = self.protocol_name
        source = peer_text(addr) or "-"
        self.counts.open[name] += 1
        self.counts.made[name] += 1
        _log.info("{protocol}: connection from {source}", protocol=name, source=source)
        lost: Callable[[Failure | None], None] = getattr(built, "connectionLost")  # noqa: B009 (typed as it is called: no reason is None)

        def connection_lost(reason: Failure | None = None) -> None:
            self.counts.open[name] -= 1
            why = reason.getErrorMessage() if reason is not None and hasattr(reason, "getErrorMessage") else "closed"
            _log.info("{protocol}: connection from {source} closed: {why}", protocol=name, source=source, why=why)
            vars(built).pop("connectionLost", None)  # no cycle left behind
            lost(reason)

        setattr(built, "connectionLost", connection_lost)  # noqa: B010 (this instance's only)
        return built

"""The end of a connection as brokerd's Twisted clients (SSMP, MCCHAT, SMQP) handle it: who
waits for it, and how a client drops a connection it no longer trusts.

Shared here because the front ends never import each other.
"""
from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import ITransport


class ClosedNotifier:
    """Mixin for a client Protocol: :meth:`when_closed` Deferreds for the end of the connection.

    The class using it sets ``_lost = None`` and ``_lost_waiters = []`` in ``__init__``.  Its
    ``connectionLost`` sets ``_lost`` to the reason (an exception) first, so that whatever
    it fails meanwhile sees the connection as gone, and calls :meth:`_notify_closed` last.
    """

    _lost: BaseException | None
    _lost_waiters: list[Deferred]
    transport: ITransport | None

    def _made(self) -> ITransport:
        """The transport, for what runs only once the connection was made (it is None before)."""
        transport = self.transport
        assert transport is not None
        return transport

    def when_closed(self) -> Deferred:
        """Fires with the reason (an exception) once the connection is gone."""
        if self._lost is not None:
            return succeed(self._lost)
        d: Deferred = Deferred()
        self._lost_waiters.append(d)
        return d

    def _notify_closed(self) -> None:
        """Fire every :meth:`when_closed` Deferred waiting so far with ``_lost``."""
        waiters, self._lost_waiters = self._lost_waiters, []
        for d in waiters:
            d.callback(self._lost)


def abort_connection(transport: Any) -> None:
    """Drop the connection now, without waiting for buffered output; a transport that cannot
    abort is closed as usual."""
    abort = getattr(transport, "abortConnection", None)
    if abort is not None:
        abort()
    else:
        transport.loseConnection()

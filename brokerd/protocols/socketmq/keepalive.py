"""socket.mq's WebSocket keep-alive, on the front end's clock.

A session silent for ``--ping-interval`` seconds gets a WebSocket ping (an empty ping frame,
RFC 6455 section 5.5.2); one that then stays silent for ``--pong-timeout`` seconds is dropped
(aborted, as a dead peer's connection is: a close frame would only wait for the close
handshake's timeout).  Any message, pong or ping from the client counts as life.

Why not Autobahn's auto-ping (``autoPingInterval``): it schedules on txaio's global reactor,
not on the clock the front end is given (``Hub.reactor``; a ``task.Clock`` in tests), and it
moves a timer per message.  Here, as for SSMP (brokerd.protocols.lifecycle), a read only sets
``heard``; one :class:`~brokerd.protocols.lifecycle.LivenessSweep` per listener, a quarter of
the shorter of both periods apart, turns that into ``last_heard`` and pings or drops the
silent.  The sweep runs only while the listener has open sessions.
"""
from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from brokerd.protocols.lifecycle import LivenessSweep


class Pingable(Protocol):
    """What :class:`KeepAlive` reads and calls on a session (Autobahn's public API)."""

    heard: bool
    last_heard: float
    pinged_at: float | None
    """When the sweep pinged the session; older than ``last_heard`` once it answered."""

    def sendPing(self, payload: bytes | None = None) -> None: ...

    def onAutoPingTimeout(self) -> None: ...


class KeepAlive:
    """The pings of one listener's WebSocket sessions, on ``clock`` (see the module docstring)."""

    def __init__(self, clock: IReactorTime, ping_interval: float, pong_timeout: float) -> None:
        self.ping_interval = ping_interval
        self.pong_timeout = pong_timeout
        self.sweep = LivenessSweep(clock, min(ping_interval, pong_timeout) / 4, self._silent)

    def watch(self, session: Pingable) -> None:
        """Watch an open session; its silence counts from now."""
        self.sweep.watch(session)
        self.sweep.start()

    def forget(self, session: Pingable) -> None:
        """The session ended (harmless if it was never watched); the last one stops the sweep,
        so that an idle listener leaves no timer behind."""
        sweep = self.sweep
        sweep.forget(session)
        if not sweep.live:
            sweep.stop()

    def _silent(self, session: Pingable, now: float) -> None:
        """Ping a session silent for ``ping_interval``; drop one still silent ``pong_timeout``
        after its ping, through Autobahn's public hook for exactly that (it logs the reason
        and aborts the connection)."""
        pinged = session.pinged_at
        if pinged is None or pinged < session.last_heard:
            if now - session.last_heard >= self.ping_interval:
                session.pinged_at = now
                session.sendPing()
        elif now - pinged >= self.pong_timeout:
            self.forget(session)  # once: the connection ends on a later turn of the reactor
            session.onAutoPingTimeout()

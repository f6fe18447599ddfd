"""The timers of brokerd's WebSockets (socket.mq, MQTT over WebSocket) on the front end's clock.

Autobahn's own timers (the opening and closing handshakes' timeouts, auto-ping) schedule on
txaio's global reactor, not on the clock the front end is given (a ``task.Clock`` in tests), so
no test could drive them and a test's connection left them behind on the real reactor.  A
:class:`ClockedServerFactory` therefore turns them all off, and what they did is done on its
``clock``:

- the closing handshake the server began: a :class:`ClockedServerProtocol` drops a peer that
  does not answer the server's close frame within :data:`CLOSE_HANDSHAKE_TIMEOUT`;
- the opening handshake: the HTTP connection's deadline (``--socketmq-handshake-timeout``, on
  the socket.mq listener's clock).  The whole upgrade request has arrived before Autobahn sees
  it (Autobahn's WebSocketResource replays the parsed request), and Autobahn answers it at
  once, so its own timer never had anything left to bound;
- pings: socket.mq's keep-alive (brokerd.protocols.socketmq.keepalive); MQTT has its own
  (PINGREQ, the MQTT factory's sweep) and sends no WebSocket pings.

Shared here because the front ends never import each other.
"""
from __future__ import annotations

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure

CLOSE_HANDSHAKE_TIMEOUT = 5.0
"""Seconds the server waits for the peer's answer to its close frame before dropping."""


class ClockedServerFactory(WebSocketServerFactory):
    """A WebSocket server factory whose protocols' timers are on ``clock`` (the front end's:
    the reactor, or a ``task.Clock`` in tests), none on Autobahn's."""

    def __init__(self, clock: IReactorTime) -> None:
        super().__init__()
        self.clock = clock
        self.setProtocolOptions(openHandshakeTimeout=0, closeHandshakeTimeout=0,
                                autoPingInterval=0, autoPingTimeout=0)


class ClockedServerProtocol(WebSocketServerProtocol):
    """A WebSocket server protocol of a :class:`ClockedServerFactory`: the timeout of the close
    handshake it begins is on the factory's clock.  When it fires, Autobahn's public hook for
    exactly that (``onCloseHandshakeTimeout``) logs the reason and aborts the connection,
    unless it has already ended; when the connection ends first, it is cancelled."""

    factory: ClockedServerFactory
    _close_handshake: IDelayedCall | None = None

    def sendCloseFrame(self, code: int | None = None, reasonUtf8: bytes | None = None, isReply: bool = False) -> None:
        began = self.state == self.STATE_OPEN and not isReply
        super().sendCloseFrame(code, reasonUtf8, isReply)
        if began:
            self._close_handshake = self.factory.clock.callLater(CLOSE_HANDSHAKE_TIMEOUT, self._close_handshake_timed_out)

    def _close_handshake_timed_out(self) -> None:
        self._close_handshake = None
        self.onCloseHandshakeTimeout()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        call, self._close_handshake = self._close_handshake, None
        if call is not None and call.active():
            call.cancel()
        super().connectionLost(reason)

"""A bound on how a WebSocket message may be fragmented, which Autobahn's options do not give.

Autobahn's ``maxMessagePayloadSize`` counts payload bytes only, so a message of endless empty
continuation frames never reaches it, while Autobahn keeps one list entry per frame until the
message ends: memory grows without bound at zero payload.  :class:`FragmentBudget` counts the
frames of each incoming message and charges every frame after the first FRAME_COST bytes of the
message budget (``MAX_WS_MESSAGE``), so both the frame count and the memory one message can hold
are bounded.  Past either limit the connection is closed with 1009 (message too big), and
nothing more of any message is buffered while the closing handshake runs.

It works through the frame hooks of Autobahn's public IWebSocketChannel interface
(``onMessageBegin``, ``onMessageFrameBegin``, ``onMessageFrame``, ``onMessageEnd``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from brokerd.protocols.socketmq import limits

if TYPE_CHECKING:
    from autobahn.twisted.websocket import WebSocketServerProtocol

CLOSE_TOO_BIG = 1009
FRAME_COST = 64
"""Bytes of the message budget each frame after the first costs: a generous bound on what
Autobahn holds per frame (a list slot and a bytes object) and on its wire header (2-14 bytes)."""


class FrameLimit(Protocol):
    @property
    def max_frames(self) -> int: ...


class HubFactory(Protocol):
    """A WebSocket factory with a ``hub`` that says how many frames a message may have."""

    @property
    def hub(self) -> FrameLimit: ...


if TYPE_CHECKING:
    ProtocolBase = WebSocketServerProtocol
else:
    ProtocolBase = object
"""The mixin's base: the Autobahn protocol it is mixed into for the type checker (so its
``super()`` calls reach Autobahn's frame hooks), ``object`` at run time."""


class FragmentBudget(ProtocolBase):
    """Mixin for a WebSocketServerProtocol whose factory has a ``hub`` (``hub.max_frames``)."""

    factory: HubFactory
    _frames = 0
    _charged = 0
    _over_budget = False
    """Sticky: once a message broke the budget, no later message is buffered either."""

    def onMessageBegin(self, isBinary: bool) -> None:
        self._frames = 0
        self._charged = -FRAME_COST  # an unfragmented message may use the whole budget
        super().onMessageBegin(isBinary)

    def onMessageFrameBegin(self, length: int) -> None:
        super().onMessageFrameBegin(length)  # Autobahn's payload limits
        if self._over_budget:
            return
        self._frames += 1
        self._charged += length + FRAME_COST
        max_frames = self.factory.hub.max_frames
        if self._frames > max_frames:
            self._refuse_message(f"a message may have at most {max_frames} frames")
        elif self._charged > limits.MAX_WS_MESSAGE:
            self._refuse_message(
                f"a message may take at most {limits.MAX_WS_MESSAGE} bytes, "
                f"{FRAME_COST} per frame after the first included"
            )

    def onMessageFrame(self, payload: bytes) -> None:
        if not self._over_budget:
            super().onMessageFrame(payload)

    def onMessageEnd(self) -> None:
        if not self._over_budget:
            super().onMessageEnd()

    def _refuse_message(self, reason: str) -> None:
        self._over_budget = True
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(CLOSE_TOO_BIG, reason.encode("utf-8")[:120])

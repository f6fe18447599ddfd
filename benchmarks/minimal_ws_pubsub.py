"""A minimal Autobahn WebSocket pub/sub server: the floor socket.mq's fan-out is compared with.

Every connection is a subscriber; a text message from one is sent to all the others, prepared
once (prepareMessage) and sent with sendPreparedMessage.  No topics, authentication, limits or
flow control: a floor for Python, not a design to copy.

    python benchmarks/minimal_ws_pubsub.py PORT
"""
from __future__ import annotations

import sys

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import reactor


class PubSub(WebSocketServerProtocol):
    def onConnect(self, request: object) -> str | None:
        offered = getattr(request, "protocols", [])
        return offered[0] if offered else None

    def onOpen(self) -> None:
        self.factory.members.add(self)

    def onClose(self, wasClean: bool, code: object, reason: object) -> None:
        self.factory.members.discard(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        prepared = self.factory.prepareMessage(payload, isBinary)
        for member in self.factory.members:
            if member is not self:
                member.sendPreparedMessage(prepared)


class PubSubFactory(WebSocketServerFactory):
    protocol = PubSub

    def __init__(self) -> None:
        super().__init__()
        self.members: set[PubSub] = set()


def main() -> None:
    reactor.listenTCP(int(sys.argv[1]), PubSubFactory(), interface="127.0.0.1")
    reactor.run()


if __name__ == "__main__":
    main()

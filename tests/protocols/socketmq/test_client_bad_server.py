"""The socket.mq client facing a server that sends something that is not a socket.mq message,
on a real loopback WebSocket: the client closes with the code the codec names (1007 for bytes
that are not JSON) and nothing is raised into the reactor.  The positive control is the same
server's close handshake completing with that code."""
from __future__ import annotations

from typing import Any

import pytest_twisted
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.logger import globalLogPublisher

from brokerd.protocols.socketmq import limits
from brokerd.protocols.socketmq.api import Client
from tests.support.live import TIMEOUT


class NotSocketMQ(WebSocketServerProtocol):
    """Accepts the socket.mq subprotocol, then sends a text message that is not JSON."""

    def onConnect(self, request: Any) -> str:
        return limits.SUBPROTOCOL

    def onOpen(self) -> None:
        self.sendMessage(b"this is not json", isBinary=False)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if not self.factory.closed.called:
            self.factory.closed.callback(code)


@pytest_twisted.ensureDeferred
async def test_a_message_that_is_not_socketmq_closes_the_connection_with_its_code() -> None:
    factory = WebSocketServerFactory()
    factory.protocol = NotSocketMQ
    factory.closed = Deferred()
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    failures: list[dict] = []

    def observe(event: dict) -> None:
        if event.get("log_failure") is not None or event.get("isError"):
            failures.append(event)

    globalLogPublisher.addObserver(observe)
    client = Client(f"http://127.0.0.1:{port.getHost().port}")
    try:
        connecting = client.connect()
        connecting.addErrback(lambda _: None)  # no hello ever comes: the connection closes first
        assert await factory.closed.addTimeout(TIMEOUT, reactor) == 1007
    finally:
        globalLogPublisher.removeObserver(observe)
        await client.close().addErrback(lambda _: None)
        await port.stopListening()
    assert failures == []

"""socket.mq fan-out on real sockets: every event is prepared once (Autobahn's prepareMessage)
and sent to each subscriber through sendPreparedMessage, or, on a checked Autobahn release and
without compression, as the same bytes written directly (session.FAST_FANOUT); both paths put
the exact RFC 6455 frames on the wire.  With ``socketmq_deflate`` a client offering
permessage-deflate gets compressed events; without it the same offer is declined."""
from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketClientFactory
from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateResponseAccept
from twisted.internet import endpoints
from twisted.internet.defer import Deferred

from brokerd.protocols.socketmq import session as session_module
from brokerd.protocols.socketmq.codec import frame
from brokerd.protocols.socketmq.wire import SOCKETMQ_WIRE
from tests.integration.test_socketmq_pubsub import RawWebSocket
from tests.support.live import TIMEOUT, reactor
from tests.support.socketmq import LiveBrokerd

SUBSCRIBE = b'{"type":"subscribe","id":1,"event":"fan/out"}'


class RecordingWebSocket(RawWebSocket):
    """Also keeps every byte that arrived and the extensions the server accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.wire = bytearray()
        self.extensions: list[Any] = []

    def onConnect(self, response: Any) -> None:
        self.extensions = list(response.extensions)

    def dataReceived(self, data: bytes) -> None:
        self.wire += data
        super().dataReceived(data)


async def subscriber(brokerd: LiveBrokerd, deflate: bool = False) -> RecordingWebSocket:
    port = brokerd.http_port.getHost().port
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/socket.mq/ws", protocols=["socketmq.v1"])
    factory.protocol = RecordingWebSocket
    options: dict[str, Any] = {}
    if deflate:
        options["perMessageCompressionOffers"] = [PerMessageDeflateOffer()]
        options["perMessageCompressionAccept"] = lambda response: PerMessageDeflateResponseAccept(response)
    factory.setProtocolOptions(**options)
    ws: RecordingWebSocket = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port).connect(factory)
    await ws.opened.addTimeout(TIMEOUT, reactor())
    await ws.messages.count(1)  # hello
    ws.sendMessage(SUBSCRIBE)
    (_hello, (result, _binary)) = await ws.messages.count(2)
    assert b'"status":200' in result
    del ws.wire[:]
    return ws


async def live(tmp_path: Any, **settings: Any) -> LiveBrokerd:
    return await LiveBrokerd(tmp_path, **settings).start()


def event(data: str) -> bytes:
    return b'{"type":"event","event":"fan/out","from":"sam","protocol":"ssmp","data":"' + data.encode() + b'"}'


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "send-prepared-message"])
@pytest_twisted.ensureDeferred
async def test_each_subscriber_gets_the_exact_frames(tmp_path: Any, monkeypatch: Any, fast: bool) -> None:
    monkeypatch.setattr(session_module, "FAST_FANOUT", fast and session_module.FAST_FANOUT)
    brokerd = await live(tmp_path)
    try:
        subscribers = [await subscriber(brokerd) for _ in range(3)]
        sam = await brokerd.ssmp(b"sam")
        sam.send(b"MCAST fan/out one")  # one message: render_message
        for ws in subscribers:
            await ws.messages.count(3)
        sam.transport.write(b"MCAST fan/out two\nMCAST fan/out three\n")  # one read: a run
        expected = frame(event("one"), False) + frame(event("two"), False) + frame(event("three"), False)
        for ws in subscribers:
            items = await ws.messages.count(5)
            assert [payload for payload, _ in items[2:]] == [event("one"), event("two"), event("three")]
            assert bytes(ws.wire) == expected
    finally:
        await brokerd.stop()


@pytest_twisted.ensureDeferred
async def test_deflate_option_compresses_events_for_clients_that_offer_it(tmp_path: Any) -> None:
    brokerd = await live(tmp_path, socketmq_deflate=True)
    try:
        assert SOCKETMQ_WIRE.portable
        compressed = await subscriber(brokerd, deflate=True)
        plain = await subscriber(brokerd)  # no offer: the same event, uncompressed
        assert [extension.EXTENSION_NAME for extension in compressed.extensions] == ["permessage-deflate"]
        # A cluster node with a compressing session takes no frames rendered by other nodes.
        assert SOCKETMQ_WIRE.compressing == 1 and not SOCKETMQ_WIRE.portable
        assert plain.extensions == []
        data = "socket.mq" * 60
        sam = await brokerd.ssmp(b"sam")
        sam.send(b"MCAST fan/out " + data.encode())
        (payload, binary) = (await compressed.messages.count(3))[2]
        assert (payload, binary) == (event(data), False)
        assert len(compressed.wire) < len(payload) // 4 and b"socket.mqsocket.mq" not in compressed.wire
        assert compressed.wire[0] & 0x40  # RSV1: a compressed message (RFC 7692 section 6)
        (payload, _binary) = (await plain.messages.count(3))[2]
        assert payload == event(data) and bytes(plain.wire) == frame(event(data), False)
    finally:
        await brokerd.stop()
    assert SOCKETMQ_WIRE.compressing == 0 and SOCKETMQ_WIRE.portable


@pytest_twisted.ensureDeferred
async def test_deflate_offers_are_declined_by_default(tmp_path: Any) -> None:
    brokerd = await live(tmp_path)
    try:
        ws = await subscriber(brokerd, deflate=True)
        assert ws.extensions == []
        sam = await brokerd.ssmp(b"sam")
        sam.send(b"MCAST fan/out " + b"z" * 300)
        (payload, _binary) = (await ws.messages.count(3))[2]
        assert payload == event("z" * 300) and bytes(ws.wire) == frame(payload, False)
    finally:
        await brokerd.stop()


def test_fast_path_is_taken_only_on_a_checked_autobahn() -> None:
    """Fails the day Autobahn changes release: check that its sendPreparedMessage still writes
    ``payloadHybi`` through sendData to the transport when nothing is compressed or queued,
    then add the release to CHECKED_AUTOBAHN (docs/performance-history.md, docs/socketmq.md)."""
    assert session_module.autobahn_release() in session_module.CHECKED_AUTOBAHN
    assert session_module.FAST_FANOUT

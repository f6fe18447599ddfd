"""The socket.mq IWireFormat: one complete WebSocket frame per message, text when the payload
is text, binary (intact) otherwise, None for what socket.mq cannot carry."""
from __future__ import annotations

import json

from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Message
from brokerd.protocols.socketmq.wire import SOCKETMQ_WIRE


def test_text_message_is_one_text_frame() -> None:
    data = SOCKETMQ_WIRE.render_message(Message(MULTICAST, b"a/b", b"hello", "ssmp", b"sam"))
    assert data is not None and data[0] == 0x81 and data[1] == len(data) - 2
    assert json.loads(data[2:]) == {"type": "event", "event": "a/b", "from": "sam", "protocol": "ssmp", "data": "hello"}


def test_binary_and_non_utf8_payloads_are_binary_frames() -> None:
    for binary in (True, False):
        data = SOCKETMQ_WIRE.render_message(Message(MULTICAST, b"t", b"\xff\x00\n", "mcchat", b"m", binary))
        assert data is not None and data[0] == 0x82
        header, _, payload = data[2:].partition(b"\n")
        assert json.loads(header)["event"] == "t" and payload == b"\xff\x00\n"


def test_large_payload_uses_extended_length() -> None:
    data = SOCKETMQ_WIRE.render_message(Message(MULTICAST, b"t", b"x" * 70000, "smqp", b"s"))
    assert data is not None and data[1] == 127 and int.from_bytes(data[2:10], "big") == len(data) - 10


def test_unrepresentable_messages() -> None:
    before = SOCKETMQ_WIRE.unrepresentable
    assert SOCKETMQ_WIRE.render_message(Message(UNICAST, b"peer", b"x", "ssmp", b"s")) is None
    assert SOCKETMQ_WIRE.render_message(Message(BROADCAST, None, b"x", "ssmp", b"s")) is None
    assert SOCKETMQ_WIRE.render_message(Message(MULTICAST, b"\xff", b"x", "ssmp", b"s")) is None
    assert SOCKETMQ_WIRE.render_message(Message(MULTICAST, b"a\nb", b"x", "ssmp", b"s")) is None
    assert SOCKETMQ_WIRE.unrepresentable == before + 4
    assert SOCKETMQ_WIRE.render_presence(b"t", object(), True, False) is None


def test_frames_are_the_bytes_autobahns_prepared_messages_carry() -> None:
    """The replies socket.mq frames itself (codec.frame) are the frames Autobahn's public
    prepareMessage makes for events; this fails the day Autobahn frames a message differently."""
    from autobahn.twisted.websocket import WebSocketServerFactory

    from brokerd.protocols.socketmq.codec import frame

    factory = WebSocketServerFactory()
    for size in (0, 1, 125, 126, 65535, 65536, 70000):
        for binary in (False, True):
            payload = (b"\xff" if binary else b"x") * size
            assert frame(payload, binary) == factory.prepareMessage(payload, binary).payloadHybi


def test_a_run_is_the_joined_frames_with_every_prepared_message() -> None:
    """render_run must equal the joined render_message results (IWireFormat), and carry the
    prepared messages in order for sessions that send them through Autobahn."""
    run = [Message(MULTICAST, b"t", payload, "ssmp", b"s") for payload in (b"one", b"\xff\x00", b"three")]
    rendered = SOCKETMQ_WIRE.render_run(run)
    singles = [SOCKETMQ_WIRE.render_message(message) for message in run]
    assert rendered == b"".join(singles)
    assert [prepared.payloadHybi for prepared in rendered.prepared] == singles
    before = SOCKETMQ_WIRE.unrepresentable
    assert SOCKETMQ_WIRE.render_run([Message(MULTICAST, b"a\nb", b"x", "ssmp", b"s")]) is None
    assert SOCKETMQ_WIRE.unrepresentable == before  # the core's fallback counts it

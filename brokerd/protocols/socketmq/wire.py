"""How broker events look to socket.mq subscribers (the socket.mq IWireFormat).

One instance is shared by every socket.mq WebSocket session, so the core renders each message
once for all of them: the result is a complete WebSocket frame, which each session writes to
its transport unchanged.  Messages of every protocol become ``event`` messages; a payload that
is text (valid UTF-8, not marked binary) travels as a JSON string in a text frame, anything
else intact in a binary frame.
"""
from __future__ import annotations

from zope.interface import implementer

from brokerd.core.message import MULTICAST, Message
from brokerd.interfaces import ISubscriber, IWireFormat
from brokerd.protocols.socketmq.codec import encode, frame, is_event_name
from brokerd.protocols.socketmq.events import Event


@implementer(IWireFormat)
class SocketMQWireFormat:
    protocol = "socketmq"

    def __init__(self) -> None:
        self.unrepresentable = 0
        """Messages socket.mq cannot carry (not to a topic, or a topic that is no event name)."""

    def render_message(self, message: Message) -> bytes | None:
        if message.kind != MULTICAST:
            self.unrepresentable += 1
            return None
        try:
            name = message.target.decode("utf-8")  # type: ignore[union-attr]
        except UnicodeDecodeError:
            name = ""
        if not is_event_name(name):
            self.unrepresentable += 1
            return None
        sender = message.sender_name.decode("utf-8", "replace")
        event = Event(name, message.payload, message.binary, sender, message.protocol)
        return frame(*encode(event))

    def render_presence(
        self, topic: bytes, member: ISubscriber, joined: bool, presence: bool
    ) -> bytes | None:
        """socket.mq has no presence events."""
        return None


SOCKETMQ_WIRE = SocketMQWireFormat()

"""How broker events look to socket.mq subscribers (the socket.mq IWireFormat).

One instance is shared by every socket.mq WebSocket session, so the core renders each message
once for all of them through Autobahn's public ``prepareMessage``: the result is a
:class:`PreparedFrames`, the bytes of the unmasked WebSocket frame(s) carrying the Autobahn
``PreparedMessage`` objects they came from.  Each session hands those to Autobahn's
``sendPreparedMessage`` (which compresses per connection when permessage-deflate was
negotiated), or, on a checked Autobahn release and without compression, writes the bytes
themselves (session.py, ``fast_fanout``).  Messages of every protocol become ``event``
messages; a payload that is text (valid UTF-8, not marked binary) travels as a JSON string in a
text frame, anything else intact in a binary frame.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from autobahn.websocket.protocol import PreparedMessage
from zope.interface import implementer

from brokerd.core.message import MULTICAST, PLAIN, Details, Message
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.socketmq.codec import encode, is_event_name
from brokerd.protocols.socketmq.events import Event


def _prepare(payload: bytes, binary: bool) -> PreparedMessage:
    """What ``WebSocketServerFactory.prepareMessage`` makes (a server's frames are unmasked; the
    message, not a factory, is what every session sends), without a factory: Autobahn's imports
    the global reactor when it is made, and brokerd's modules must import none (twistd installs
    the reactor ``--reactor`` names after it imported the plugins that import them)."""
    return PreparedMessage(payload, binary, False, False)


class PreparedFrames(bytes):
    """The frames of one event, or of a run of events, as one bytes object (what a session
    without compression writes), with ``prepared``: the Autobahn PreparedMessages, in order.

    A bytes subclass so the core can hand it to every session unchanged, and join the frames
    of a run as it does for every wire format."""

    prepared: tuple[Any, ...]

    @classmethod
    def of(cls, prepared: Sequence[Any]) -> PreparedFrames:
        frames = cls(b"".join([message.payloadHybi for message in prepared]))
        frames.prepared = tuple(prepared)
        return frames


def _with_properties(event: Event, details: Details) -> Event:
    """``event`` with the message properties socket.mq has a place for (docs/socketmq.md):
    a response topic that is no event name is left out."""
    response_topic = details.response_topic
    if response_topic is not None and not is_event_name(response_topic):
        response_topic = None
    return replace(event, content_type=details.content_type, response_topic=response_topic,
                   correlation=details.correlation, user_properties=details.user_properties)


@implementer(IWireFormat)
class SocketMQWireFormat(WireFormat):
    protocol = "socketmq"

    def __init__(self) -> None:
        self.unrepresentable = 0
        """Messages socket.mq cannot carry (not to a topic, or a topic that is no event name)."""
        self.compressing = 0
        """Open sessions of this process that negotiated permessage-deflate (session.py)."""

    @property
    def portable(self) -> bool:  # type: ignore[override]  # WireFormat's is a constant; this one follows the sessions
        """Whether a cluster may ship the frames rendered on one node to another, which writes
        them as they are: true while no session here compresses (the frames are uncompressed
        and carry no PreparedMessage for Autobahn to compress)."""
        return self.compressing == 0

    def render_message(self, message: Message) -> PreparedFrames | None:
        target = message.target
        if message.kind != MULTICAST or target is None:  # a multicast always has its topic
            self.unrepresentable += 1
            return None
        try:
            name = target.decode("utf-8")
        except UnicodeDecodeError:
            name = ""
        if not is_event_name(name):
            self.unrepresentable += 1
            return None
        sender = message.sender_name.decode("utf-8", "replace")
        details = message.details
        if details is PLAIN or (details.content_type is None and not details.has_properties()):
            event = Event(name, message.payload, message.binary, sender, message.protocol)
        else:
            event = _with_properties(Event(name, message.payload, message.binary, sender, message.protocol), details)
        prepared = _prepare(*encode(event))
        frames = PreparedFrames(prepared.payloadHybi)
        frames.prepared = (prepared,)
        return frames

    def render_run(self, messages: list[Message]) -> PreparedFrames | None:
        """A run of messages (one topic) as one PreparedFrames; None if one cannot be carried
        (the core then renders them one by one and counts what it drops)."""
        prepared = []
        for message in messages:
            rendered = self.render_message(message)
            if rendered is None:
                self.unrepresentable -= 1  # the core's per-message fallback counts it again
                return None
            prepared.append(rendered.prepared[0])
        return PreparedFrames.of(prepared)

    def render_presence(
        self, topic: bytes, member: ISubscriber, joined: bool, presence: bool
    ) -> bytes | None:
        """socket.mq has no presence events."""
        return None


SOCKETMQ_WIRE = SocketMQWireFormat()

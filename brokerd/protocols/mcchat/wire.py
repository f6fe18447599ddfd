"""How broker events look to MCCHAT recipients (the MCCHAT IWireFormat).

One instance, shared by every MCCHAT connection, so the core renders each message once for
all MCCHAT recipients and writes the same bytes to each.

The mapping (docs/mcchat.md has the full story):

* An MCCHAT message travels through the core with ``sender_name`` = the sending session's name
  (its transport id, ``ip:port``) and its username as ``display_name``; MCCHAT recipients get
  the MSG packet as sent.
* Every message becomes ``MSG topic, username, payload`` where the username is the message's
  ``display_name`` when it has one, else ``<protocol>:<sender>`` (an SSMP sender ``alice``
  shows as ``ssmp:alice``).
* What MCCHAT cannot carry is dropped and counted here (and, per recipient, by the core as
  ``unrenderable``): unicast and broadcast messages (MCCHAT only has topics), a payload that
  holds a NUL byte or is not UTF-8 (an MCCHAT message is a NUL-terminated UTF-8 string), a
  payload over :data:`~brokerd.protocols.mcchat.codec.MAX_MESSAGE` bytes, and a topic MCCHAT
  cannot name (empty, over 256 bytes, holding 0x04, not UTF-8).
* MCCHAT has no presence packets: presence events render as nothing.
"""
from __future__ import annotations

from typing import Any

from zope.interface import implementer

from brokerd.core.message import MULTICAST, Message
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.mcchat.codec import MAX_MESSAGE, MAX_USERNAME, is_utf8, topic_problem

RESERVED_TOPIC = b""
"""The discovery topic (spec section 4): only MCCHAT sessions join it, and the server
announces topics there."""
SERVER_USERNAME = b""
"""The sender (name and username) of the server's announcements."""

_NUL = b"\x00"
_NUL_VALUE = 0
"""NUL as an int, for ``in`` tests (a bytes needle costs CPython a TypeError raised and cleared)."""
_KNOWN_TOPICS: dict[bytes, None] = {}
_KNOWN_TOPICS_LIMIT = 65_536


def is_mcchat_topic(topic: bytes) -> bool:
    """True when ``topic`` is a topic an MCCHAT client can subscribe to and be sent (never the
    reserved discovery topic ``""``).  Valid names are remembered, in a dict bounded to 65,536
    entries (emptied when full): a lookup is cheaper than the checks on every message."""
    if topic in _KNOWN_TOPICS:
        return True
    if not topic or topic_problem(topic) is not None:
        return False
    if len(_KNOWN_TOPICS) >= _KNOWN_TOPICS_LIMIT:
        _KNOWN_TOPICS.clear()
    _KNOWN_TOPICS[topic] = None
    return True


def is_announcement(message: Message) -> bool:
    """Whether ``message`` is the server's announcement of a topic on the discovery topic,
    the only message that topic carries."""
    return (message.target == RESERVED_TOPIC and message.sender_name == SERVER_USERNAME
            and message.display_name == SERVER_USERNAME)


def display_name(value: bytes | str) -> bytes:
    """``value`` (bytes or str) as an MCCHAT username: invalid UTF-8 replaced, NUL bytes
    turned into ``_``, cut to 256 bytes on a character boundary."""
    if isinstance(value, str):
        data = value.encode("utf-8", "replace")
    else:
        data = bytes(value)
    if data.isascii() and len(data) <= MAX_USERNAME and _NUL_VALUE not in data:
        return data
    text = data.decode("utf-8", "replace").replace("\x00", "_")
    data = text.encode("utf-8", "replace")
    if len(data) > MAX_USERNAME:
        data = data[:MAX_USERNAME].decode("utf-8", "ignore").encode("utf-8")
    return data


_FOREIGN_NAMES: dict[tuple[str, bytes], bytes] = {}
_FOREIGN_NAMES_LIMIT = 65_536


def foreign_username(message: Message) -> bytes:
    """The username MCCHAT shows for a message from another protocol.  ``<protocol>:<name>``
    is remembered per sender (a dict bounded to 65,536 entries, emptied when full): the same
    few senders publish most messages."""
    name = message.display_name
    if name is not None:
        return display_name(name)
    key = (message.protocol, message.sender_name)
    username = _FOREIGN_NAMES.get(key)
    if username is None:
        if len(_FOREIGN_NAMES) >= _FOREIGN_NAMES_LIMIT:
            _FOREIGN_NAMES.clear()
        username = _FOREIGN_NAMES[key] = display_name(
            message.protocol.encode("ascii", "replace") + b":" + message.sender_name
        )
    return username


@implementer(IWireFormat)
class MCChatWireFormat(WireFormat):
    """Renders messages as MSG packets; counts, by reason, the messages MCCHAT cannot carry."""

    protocol = "mcchat"
    portable = True
    """The bytes depend on the message only: another node of a cluster may send them as they
    are (brokerd.cluster.envelope, rendered sections)."""
    writes_after_read = True
    """A session holds what a read sends it until the read is handled (brokerd.protocols.flow):
    the delivery-latency sampler times that write (brokerd.core.sampling)."""

    def __init__(self) -> None:
        self.not_multicast = 0
        """Unicast and broadcast messages (MCCHAT has topics only)."""
        self.bad_topic = 0
        """Messages to a topic MCCHAT cannot name."""
        self.not_text = 0
        """Payloads with a NUL byte or invalid UTF-8 (e.g. most SSMP binary payloads)."""
        self.too_long = 0
        """Payloads over MAX_MESSAGE bytes."""

    @property
    def unrepresentable(self) -> int:
        """Every message this format could not render."""
        return self.not_multicast + self.bad_topic + self.not_text + self.too_long

    def counts(self) -> dict[str, int]:
        return {
            "not_multicast": self.not_multicast,
            "bad_topic": self.bad_topic,
            "not_text": self.not_text,
            "too_long": self.too_long,
        }

    def render_message(self, message: Message) -> bytes | None:
        if message.kind != MULTICAST:
            self.not_multicast += 1
            return None
        topic = message.target or b""  # set for a multicast (None for a broadcast)
        if topic not in _KNOWN_TOPICS and not is_mcchat_topic(topic) and not is_announcement(message):
            self.bad_topic += 1
            return None
        payload = message.payload
        if len(payload) > MAX_MESSAGE:
            self.too_long += 1
            return None
        if _NUL_VALUE in payload or not is_utf8(payload):
            self.not_text += 1
            return None
        username = foreign_username(message)
        return b"".join((b"\x03", topic, _NUL, username, _NUL, payload, b"\x00"))

    def render_presence(
        self, topic: bytes, member: ISubscriber, joined: bool, presence: bool
    ) -> bytes | None:
        """MCCHAT has no way to say who joined or left a topic."""
        return None


MCCHAT_WIRE = MCChatWireFormat()

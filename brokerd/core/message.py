"""The protocol-neutral message the core routes.

A Message is created once by the front end that accepted it and then only read: each wire
format renders it (once per format) for its recipients, and the durable service stores it
(:mod:`brokerd.core.stored`) for the durable subscribers of its topic.  It holds content and
typed metadata, never a wire encoding and never a protocol's own objects, so a renderer
decides from the fields alone how to show it.  It uses ``__slots__`` because one is made for
every publish on the hot path.
"""
from __future__ import annotations

from operator import attrgetter

from brokerd.core.principal import Principal

MULTICAST = "multicast"
"""Sent to a topic; ``target`` is the topic name."""
UNICAST = "unicast"
"""Sent to one session; ``target`` is its address."""
BROADCAST = "broadcast"
"""Sent to every session sharing a topic with the sender; ``target`` is None."""

DEFAULT_PRIORITY = 1
"""The priority of a message that names none (the lowest; higher is delivered first)."""

Attributes = tuple[tuple[str, str], ...]


class Part:
    """One part of a multi-part message (a body's section): its content type, its
    own attributes (``Content-Type`` included, in the order given) and its data."""

    __slots__ = ("content_type", "attributes", "data")

    def __init__(self, content_type: str, attributes: Attributes, data: bytes) -> None:
        self.content_type = content_type
        self.attributes = attributes
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Part) and (self.content_type, self.attributes, self.data) == (
            other.content_type, other.attributes, other.data)

    def __repr__(self) -> str:
        return f"<Part {self.content_type} {len(self.data)} bytes>"


class Details:
    """What a message carries beyond its sender and content: the metadata a durable or
    richer protocol needs.  Most messages (every SSMP, MCCHAT and socket.mq publish) have
    none and share :data:`PLAIN`, so making a Message on the hot path costs no more than
    one slot for all of it.

    ``content_type`` is the payload's MIME type when the sender named one (None: text, or
    binary when the Message says ``binary``); ``message_id`` the broker's id of a stored
    message (None for one that was never stored); ``created`` and ``expires`` POSIX seconds
    (None: not given, the topic's default); ``priority`` higher first; ``attributes`` header
    attributes no typed field covers, in order (a header, kept so that a subscriber
    of the publisher's protocol gets it back whole); ``parts`` every part of a multi-part message, one of which
    is the Message's ``payload`` (empty for a single-part message); ``qos`` the delivery
    guarantee its publisher asked for, in MQTT's terms (0 at most once, 1 at least once, 2
    exactly once): a subscriber that asked for more gets it at this level, never above;
    ``retained`` that its publisher asked the broker to keep it as the topic's retained message
    (brokerd.core.retained), which MQTT's Retain As Published shows its subscribers.

    The message properties a request/response exchange needs (MQTT 5's, which other protocols
    map onto where they have a place; docs/architecture.md): ``response_topic`` the topic a
    reply is wanted on, ``correlation`` the bytes the reply carries back to tell which request
    it answers, ``payload_format`` 1 when the sender declared the payload UTF-8 text, 0 when it
    declared it unspecified bytes (None: said nothing), and ``user_properties`` the sender's
    own name/value pairs, in order, a name possibly repeated.  :func:`property_problem` bounds
    them.
    """

    __slots__ = ("content_type", "message_id", "created", "priority", "expires", "attributes", "parts", "qos",
                 "retained", "response_topic", "correlation", "payload_format", "user_properties")

    def __init__(
        self,
        *,
        content_type: str | None = None,
        message_id: str | None = None,
        created: float | None = None,
        priority: int = DEFAULT_PRIORITY,
        expires: float | None = None,
        attributes: Attributes = (),
        parts: tuple[Part, ...] = (),
        qos: int = 0,
        retained: bool = False,
        response_topic: str | None = None,
        correlation: bytes | None = None,
        payload_format: int | None = None,
        user_properties: Attributes = (),
    ) -> None:
        self.content_type = content_type
        self.message_id = message_id
        self.created = created
        self.priority = priority
        self.expires = expires
        self.attributes = attributes
        self.parts = parts
        self.qos = qos
        self.retained = retained
        self.response_topic = response_topic
        self.correlation = correlation
        self.payload_format = payload_format
        self.user_properties = user_properties

    def has_properties(self) -> bool:
        """Whether it carries any of the request/response properties (a renderer that shows
        them skips the work for the many messages that carry none)."""
        return (self.response_topic is not None or self.correlation is not None
                or self.payload_format is not None or bool(self.user_properties))

    def replace(self, **changes: object) -> Details:
        """A copy with ``changes`` (Details are shared, so never changed in place)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Details(**fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Details) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        return f"<Details id={self.message_id!r} priority={self.priority}>"


PLAIN = Details()
"""The Details of a message that has none (shared; never changed)."""


def property_bytes(details: Details) -> int:
    """The bytes of a message's properties as a limit counts them: its content type, response
    topic, correlation data and every user property's name and value (UTF-8)."""
    total = len(details.correlation or b"")
    for text in (details.content_type, details.response_topic):
        if text is not None:
            total += len(text.encode("utf-8"))
    for name, value in details.user_properties:
        total += len(name.encode("utf-8")) + len(value.encode("utf-8"))
    return total


def property_problem(details: Details, max_user_properties: int, max_property_bytes: int) -> str | None:
    """Why a message's properties are over the limits (``--max-user-properties``,
    ``--max-property-bytes``), or None: every front end that accepts properties checks them
    before the core takes the message, and refuses it in its own protocol's way."""
    if details is PLAIN:
        return None
    count = len(details.user_properties)
    if count > max_user_properties:
        return f"{count} user properties, more than the {max_user_properties} allowed"
    size = property_bytes(details)
    if size > max_property_bytes:
        return f"{size} bytes of message properties, more than the {max_property_bytes} allowed"
    return None


def _detail(name: str) -> property:
    """A read-only Message property for the field ``name`` of its Details."""
    return property(attrgetter(f"details.{name}"), doc=f"``details.{name}``")


class Message:
    """One message on its way through the broker.

    Who sent it: ``protocol`` and ``sender_name`` (the sending session's name in its own
    protocol; each protocol's addresses form their own namespace), ``display_name`` the
    name a person chose to be shown under (MCCHAT's username), when there is one.

    What it is: ``payload`` is the content, never a wire encoding of it (an SSMP binary
    payload arrives here without its two length bytes).  ``binary`` records that the sender
    marked the content as binary.  ``details`` holds the rest (:class:`Details`: content
    type, id, times, priority, header attributes, parts), also readable as properties of the
    Message.  ``principal`` is who sent it (the access policy checks it, when there is one);
    the broker's own publishers say BROKER (trusted), and None, a program embedding the
    broker that named no one, is checked as the anonymous login.  See docs/architecture.md for how each protocol maps onto these fields.
    """

    __slots__ = ("kind", "target", "payload", "binary", "protocol", "sender_name", "display_name", "details",
                 "principal")

    def __init__(
        self,
        kind: str,
        target: bytes | None,
        payload: bytes,
        protocol: str,
        sender_name: bytes,
        binary: bool = False,
        display_name: bytes | None = None,
        details: Details = PLAIN,
        principal: Principal | None = None,
    ) -> None:
        # Not keyword-only: that makes every call on the hot path a little slower.
        self.kind = kind
        self.target = target
        self.payload = payload
        self.binary = binary
        self.protocol = protocol
        self.sender_name = sender_name
        self.display_name = display_name
        self.details = details
        self.principal = principal

    # The Details, readable as the Message's own fields (``message.priority``).
    content_type = _detail("content_type")
    message_id = _detail("message_id")
    created = _detail("created")
    priority = _detail("priority")
    expires = _detail("expires")
    attributes = _detail("attributes")
    parts = _detail("parts")
    qos = _detail("qos")
    retained = _detail("retained")
    response_topic = _detail("response_topic")
    correlation = _detail("correlation")
    payload_format = _detail("payload_format")
    user_properties = _detail("user_properties")

    def __repr__(self) -> str:
        return (
            f"<Message {self.kind} to {self.target!r} from {self.protocol}:{self.sender_name!r} "
            f"{len(self.payload)} bytes>"
        )

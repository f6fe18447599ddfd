"""How an SMQP message maps onto the core's protocol-neutral Message, and back.

SMQP -> Message (what :func:`to_message` does with a stored body):

* the header attributes, as the server stored them (``Created``, ``Smuid``, ``Cmuid`` and the
  client's others, in order), become ``attributes``; ``Created``, the Smuid, ``Priority`` and
  the expiry are also set as the typed fields ``created``, ``message_id``, ``priority`` and
  ``expires``;
* every data section becomes a :class:`~brokerd.core.message.Part` (its attributes and data);
* the *main part*, the one the other protocols carry as ``payload``, is the first ``text/*``
  section, else the first section; ``content_type`` is its type and ``binary`` is set when it
  is not text;
* the extension attributes (the draft's ``X-`` ones, "not a part of the SMQP specifications")
  are also the message's ``user_properties``, ``X-name: value`` as ``(name, value)``, in order:
  what MQTT 5 shows as User Properties.  SMQP has no place for a response topic or correlation
  data (its replies go to the publisher's own topic, ``PUBLISH MESSAGE REPLY``).

Message -> SMQP (what :func:`to_body` does, for delivery to an SMQP subscriber): a message
that carries ``attributes`` or ``parts`` (one an SMQP client published) becomes that header and
those sections again, byte for byte.  Any other message (SSMP, MCCHAT, socket.mq) gets the
REQUIRED attributes from its fields: ``Created``, its ``Smuid`` (the stored message's id, or a
number of the server's own for a message that was never stored, then with ``Guarantee: NO``),
a ``Cmuid`` naming its sender ``<protocol>:<name>@<domain>`` and an ``X-name: value`` line for
each of its user properties that an attribute line can hold (a name of letters, digits, ``_``
and ``-``, a printable value without surrounding space; the others are left out); its payload is one section
of its ``content_type``, else ``application/octet-stream`` for binary content or content that
is not UTF-8, else ``text/plain; charset=utf-8``.

Stored rows written before the durable service existed hold the SMQP body itself;
:func:`stored_body` reads both.
"""
from __future__ import annotations

from brokerd.core import stored
from brokerd.core.message import MULTICAST, Details, Message, Part
from brokerd.core.principal import Principal
from brokerd.protocols.smqp.codec import decode_body, encode_attribute, format_datetime
from brokerd.protocols.smqp.events import Body, Section

_NAME_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _safe(name: bytes) -> str:
    text = name.decode("utf-8", "replace")
    return "".join(c if c in _NAME_SAFE else "_" for c in text)[:64] or "_"


EXTENSION = "X-"
"""The prefix of the attributes that are user properties (the draft's extended attributes)."""


def user_properties_of(attributes: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The user properties of an SMQP header: its ``X-`` attributes without the prefix."""
    return tuple((name[2:], value) for name, value in attributes
                 if len(name) > 2 and name[1] == "-" and name[0] in "Xx")


def extension_attributes(user_properties: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The ``X-`` attribute lines of user properties, those an attribute line can hold."""
    lines = []
    for name, value in user_properties:
        attribute = EXTENSION + name
        try:
            encode_attribute(attribute, value)
        except ValueError:
            continue
        lines.append((attribute, value))
    return tuple(lines)


def main_section(body: Body) -> int | None:
    """The index of the section other protocols carry: the first ``text/*``, else the
    first; None for a body without sections."""
    for index, section in enumerate(body.sections):
        if section.content_type.strip().lower().startswith("text/"):
            return index
    return 0 if body.sections else None


def to_message(body: Body, key: str, publisher: str, *, message_id: str | None, created: float | None,
               priority: int, expires: float | None, principal: Principal) -> Message:
    """The neutral Message of SMQP ``body`` published to topic ``key`` by ``publisher``
    (``account:channel``), whose login proved ``principal`` (the core checks it again when
    the message reaches the other protocols; BROKER for what a linked server relays)."""
    parts = tuple(Part(section.content_type, section.attributes, section.data) for section in body.sections)
    index = main_section(body)
    if index is None:
        payload, content_type, binary = b"", None, False
    else:
        main = parts[index]
        payload, content_type = main.data, main.content_type
        binary = not content_type.strip().lower().startswith("text/")
    details = Details(content_type=content_type, message_id=message_id, created=created, priority=priority,
                      expires=expires, attributes=body.attributes, parts=parts,
                      user_properties=user_properties_of(body.attributes))
    return Message(MULTICAST, key.encode("utf-8"), payload, "smqp", publisher.encode("utf-8"), binary,
                   details=details, principal=principal)


def to_body(message: Message, domain: str, now: float = 0.0, volatile_id: str | None = None) -> Body:
    """The SMQP body of ``message`` (see the module docstring).  ``now`` stands in for the
    ``created`` of a message that has none; ``volatile_id`` is the Smuid of a message that
    was never stored (it then says ``Guarantee: NO``)."""
    if message.attributes or message.parts:
        sections = tuple(Section(part.attributes, part.data) for part in message.parts)
        return Body(message.attributes, sections)
    stamp = format_datetime(message.created if message.created is not None else now)
    smuid = volatile_id if volatile_id is not None else message.message_id or ""
    number = smuid.rpartition("/")[2].partition("(")[0].lstrip("x")
    sender = f"{message.protocol}:{_safe(message.sender_name)}@{domain}"
    attributes: tuple[tuple[str, str], ...] = (
        ("Created", stamp),
        ("Smuid", smuid),
        ("Cmuid", f"{sender}/{number}({stamp})"),
    )
    if volatile_id is not None:
        attributes += (("Guarantee", "NO"),)
    if message.user_properties:
        attributes += extension_attributes(message.user_properties)
    return Body(attributes, (Section((("Content-Type", content_type_of(message)),), message.payload),))


def content_type_of(message: Message) -> str:
    """The Content-Type SMQP shows for a single-part message."""
    if message.content_type:
        return message.content_type
    if message.binary:
        return "application/octet-stream"
    try:
        message.payload.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    return "text/plain; charset=utf-8"


def stored_body(data: bytes, domain: str) -> Body:
    """The SMQP body of a stored row: a stored Message (:mod:`brokerd.core.stored`), or an
    SMQP body stored before the durable service existed.  ValueError when it is neither."""
    if stored.is_stored_message(data):
        found = stored.sections_or_message(data)
        if isinstance(found, Message):
            return to_body(found, domain)
        attributes, parts = found  # what to_body renders of a message with attributes or parts
        return Body(attributes, tuple(Section(part_attributes, part_data) for part_attributes, part_data in parts))
    return decode_body(data)


def published_over_smqp(data: bytes) -> bool:
    """Whether a stored message (``MessageRecord.data``) was published by an SMQP client.
    Another protocol's message is stored as ``<protocol>:<name>``, which an SMQP account of
    that protocol's name would otherwise read as its own ``account:channel``."""
    return not stored.is_stored_message(data) or stored.decode(data).protocol == "smqp"

"""The rows the store keeps, as frozen dataclasses (the store's whole vocabulary).

MessageRecord and Delivery, made once per durable publish and once or twice per delivery,
write their own ``__init__``, which fills the fields into the instance's dict in one update:
the one a frozen dataclass is given sets each field through ``object.__setattr__`` (2.9 µs
for a MessageRecord, 1.7 µs for a Delivery here, against 1.0 µs for either).  They are frozen
dataclasses otherwise (equality, hash, ``dataclasses.replace``); tests/store/test_records.py
holds each ``__init__`` to the dataclass's fields and defaults.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TopicRecord:
    """One SMQP topic.

    ``key`` is the lower-case path without the leading slash (``stocks/ibm``); the root is
    never stored.  ``name`` is the leaf as it was created (``IBM``).  ``link`` is the key of
    the target of a virtual topic.  ``system`` marks topics the server manages (the login
    topics under ``/accounts``).  ``timeout`` is the topic's default message timeout in
    seconds (SET TOPIC TIMEOUT): None when the topic sets none (it inherits), ``math.inf``
    for INFINITE.
    """

    key: str
    name: str
    keywords: tuple[str, ...] = ()
    delivery: str = "ALL"
    link: str | None = None
    owner: str = ""
    created: float = 0.0
    system: bool = False
    timeout: float | None = None


@dataclass(frozen=True, init=False)
class MessageRecord:
    """A retained message.  ``data`` is the message as the front end encoded it (opaque to
    the store); ``seq`` orders messages: given by the front end to :meth:`IStore.publish`
    (it is part of the message id), or assigned by :meth:`IStore.add_message` when 0.
    ``message_id`` is the server's id of the message (SMQP's Smuid; the store's ``smuid``
    column), ``client_message_id`` the id its publisher gave it, if any (SMQP's Cmuid).

    ``mode`` is the effective delivery (``ALL`` or ``ONE``: one subscriber's acknowledgement
    settles it for everybody); ``receipt`` is ``NONE``, ``ONE`` or ``ALL``; ``trashed`` is
    when the message went to its topic's Trash (its ``topic`` is then ``<key>/trash``).
    """

    message_id: str
    topic: str
    publisher: str
    client_message_id: str
    received: float
    expires: float | None
    priority: int
    data: bytes
    seq: int = 0
    mode: str = "ALL"
    receipt: str = "NONE"
    trashed: float | None = None

    def __init__(self, message_id: str, topic: str, publisher: str, client_message_id: str, received: float,
                 expires: float | None, priority: int, data: bytes, seq: int = 0, mode: str = "ALL",
                 receipt: str = "NONE", trashed: float | None = None) -> None:
        # One per durable publish: see the module docstring.
        self.__dict__.update(message_id=message_id, topic=topic, publisher=publisher,
                             client_message_id=client_message_id, received=received,
                             expires=expires, priority=priority, data=data, seq=seq, mode=mode,
                             receipt=receipt, trashed=trashed)


PENDING, ACKED, DEAD = 0, 2, 3
"""Delivery states: not yet acknowledged; acknowledged (never sent again); given up after
the maximum number of attempts."""


@dataclass(frozen=True, init=False)
class Delivery:
    """One message a subscriber still has to acknowledge, as :meth:`IStore.pending` returns
    it: enough to send it without another read."""

    seq: int
    topic: str
    priority: int
    change: str
    attempts: int
    mode: str
    data: bytes

    def __init__(self, seq: int, topic: str, priority: int, change: str, attempts: int, mode: str,
                 data: bytes) -> None:
        # One or two per delivery: see the module docstring.
        self.__dict__.update(seq=seq, topic=topic, priority=priority, change=change, attempts=attempts,
                             mode=mode, data=data)


def fitting(sizes: Iterable[int], max_bytes: int | None) -> int:
    """How many of the leading messages of ``sizes`` bytes fit in ``max_bytes`` (None: all),
    at least one: what :meth:`IStore.pending` returns under a byte budget."""
    count = total = 0
    for size in sizes:
        total += size
        if max_bytes is not None and count and total > max_bytes:
            break
        count += 1
    return count


@dataclass(frozen=True)
class PacketFlow:
    """A QoS 2 exchange of a durable subscriber's session under way (MQTT 4.3.3), kept with
    the session so that a restart neither loses nor repeats its message.  ``inbound``: a
    PUBLISH the client sent with ``packet_id`` was committed and answered PUBREC, and waits
    for its PUBREL (``seq`` 0).  Outbound: pending message ``seq`` was sent with
    ``packet_id``, ``released`` once the client's PUBREC came (PUBREL was sent, PUBCOMP ends
    it).  One per (subscriber, direction, Packet Identifier): at most 65,535 each way."""

    subscriber: str
    inbound: bool
    packet_id: int
    seq: int = 0
    released: bool = False


@dataclass(frozen=True)
class ReceiptDue:
    """A publisher asked for a receipt and it is due now: ``acked`` of ``total`` subscribers
    acknowledged message ``seq`` (the store marks the receipt as given, so it is due once)."""

    seq: int
    topic: str
    publisher: str
    cmuid: str
    data: bytes
    acked: int
    total: int


@dataclass(frozen=True)
class Settled:
    """What an acknowledgement, a give-up or an expiry changed: ``receipt`` when one became
    due, ``released`` the other subscribers whose pending delivery of the message was
    dropped (a ONE message acknowledged by someone, a message that went to the Trash),
    ``trashed`` whether the message went to the Trash."""

    seq: int
    topic: str
    receipt: ReceiptDue | None = None
    released: tuple[str, ...] = ()
    trashed: bool = False


@dataclass(frozen=True)
class SubscriptionRecord:
    """A durable subscription of one ``account:channel`` to one topic (key) and resource
    (``MESSAGE``, ``TOPIC`` or ``SUBSCRIBERS``); ``changes`` are the notification types."""

    subscriber: str
    kind: str
    topic: str
    changes: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True)
class Contact:
    """SET LOGIN CONTACT data of one account, stored as given."""

    mime: str
    data: bytes


def trash_key(topic: str) -> str:
    """The queue key of a topic's Trash (``a/b`` -> ``a/b/trash``; the root's: ``trash``)."""
    return f"{topic}/trash" if topic else "trash"


def trash_owner(key: str) -> str | None:
    """The topic whose Trash queue ``key`` is (the inverse of :func:`trash_key`), or None
    when ``key`` is not a Trash."""
    if key == "trash":
        return ""
    return key[: -len("/trash")] if key.endswith("/trash") else None


def receipt_due(receipt: str, acked: int, total: int, final: bool) -> bool:
    """Whether a receipt (``ONE`` or ``ALL``) is due: ONE at the first acknowledgement, ALL
    once every subscriber acknowledged, and either when the message leaves its queue
    (``final``: expiry or Trash) with whatever was reached (the draft's "X/Y" receipt)."""
    if receipt not in ("ONE", "ALL"):
        return False
    if final:
        return True
    if receipt == "ONE":
        return acked >= 1
    return total > 0 and acked >= total

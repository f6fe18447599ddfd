"""The rows the store keeps, as frozen dataclasses (the store's whole vocabulary)."""
from __future__ import annotations

from dataclasses import dataclass

DELIVERY_MODES = ("ALL", "ONE", "NONE")


@dataclass(frozen=True)
class TopicRecord:
    """One SMQP topic.

    ``key`` is the lower-case path without the leading slash (``stocks/ibm``); the root is
    never stored.  ``name`` is the leaf as it was created (``IBM``).  ``link`` is the key of
    the target of a virtual topic.  ``system`` marks topics the server manages (the login
    topics under ``/accounts``).
    """

    key: str
    name: str
    keywords: tuple[str, ...] = ()
    delivery: str = "ALL"
    link: str | None = None
    owner: str = ""
    created: float = 0.0
    system: bool = False


@dataclass(frozen=True)
class MessageRecord:
    """A retained message.  ``data`` is the message as the front end encoded it (opaque to
    the store); ``seq`` orders messages and is assigned by the store on insert."""

    smuid: str
    topic: str
    publisher: str
    cmuid: str
    received: float
    expires: float | None
    priority: int
    data: bytes
    seq: int = 0


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

"""Who a durable subscriber is: a typed identity, and the one place it meets the store's text.

The store keys pending deliveries, subscriptions and packet flows by a subscriber's name (one
text column).  Three kinds of name share that column, told apart by their form alone, so that
any node reading any store knows whom a name belongs to without asking the front end that
wrote it:

- a session that a principal owns (:class:`SubscriberId`: an MQTT client identifier, an MQTT
  bridge), written ``@1/<protocol>/<realm>/<name>/<session>/<incarnation>``, each part
  percent-encoded.  ``@1/`` is the version of the encoding: a later one gets a new tag and the
  store a migration (the store's migration 6 tagged the names written before the tag existed);
- a channel of an account, ``account:channel`` (the names subscribers choose on the wire);
  a channel whose name starts with :data:`RELAY_CHANNEL_PREFIX` relays to another server and
  takes only the messages published for it to forward;
- an outgoing queue of a linked server, ``~<domain>`` (:data:`QUEUE_PREFIX`): no principal
  reads it, the access policy was asked when its messages were published.

Owned names have no ``:`` (it is percent-encoded), so no channel name is ever one of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from brokerd.core.principal import Principal, account_principal

__all__ = ["OWNED_TAG", "QUEUE_PREFIX", "RELAY_CHANNEL_PREFIX", "SubscriberId", "owner_of",
           "protocol_prefix", "takes_core_publishes"]

OWNED_TAG = "@1/"
"""The head of every owned subscriber's name: the encoding and its version."""
RELAY_CHANNEL_PREFIX = "link_"
"""A channel ``account:link_<domain>`` relays to another server: it takes only the messages
published for forwarding, never the core's publishes."""
QUEUE_PREFIX = "~"
"""The head of an outgoing queue's name (a name no account can have)."""
OWNER_CACHE = 4096
"""Names whose owner :func:`owner_of` remembers (the access policy asks at every delivery)."""


def _part(text: str) -> str:
    return quote(text, safe="")


@dataclass(frozen=True, slots=True)
class SubscriberId:
    """A durable subscriber that ``owner`` owns: ``protocol``'s session ``session`` (an MQTT
    client identifier, a bridge's name) in its ``incarnation``.  A session that ends and starts
    again is another incarnation, so nothing kept for the old one reaches the new one; the
    owner is part of the identity, so one principal's stored session is never another's."""

    owner: Principal
    protocol: str
    session: str
    incarnation: str = ""

    def encode(self) -> str:
        """The store's name of this subscriber (the module docstring's first form)."""
        return f"{self.session_prefix(self.owner, self.protocol, self.session)}{_part(self.incarnation)}"

    @staticmethod
    def session_prefix(owner: Principal, protocol: str, session: str) -> str:
        """What the names of every incarnation of ``protocol``'s ``session`` of ``owner`` start
        with (a session taken up finds its stored incarnations by it)."""
        return (f"{protocol_prefix(protocol)}{_part(owner.realm)}/{_part(owner.name)}/"
                f"{_part(session)}/")

    @classmethod
    def decode(cls, name: str) -> SubscriberId | None:
        """The identity an owned subscriber's name encodes; None for a name of another kind
        (a channel, a queue) or one this version cannot read."""
        if not name.startswith(OWNED_TAG):
            return None
        parts = name[len(OWNED_TAG):].split("/")
        if len(parts) != 5:
            return None
        protocol, realm, owner, session, incarnation = (unquote(part) for part in parts)
        return cls(Principal(owner, realm), protocol, session, incarnation)


def protocol_prefix(protocol: str) -> str:
    """What the names of every owned subscriber of ``protocol`` start with."""
    return f"{OWNED_TAG}{_part(protocol)}/"


@lru_cache(maxsize=OWNER_CACHE)
def owner_of(name: str) -> Principal | None:
    """The principal whose permissions durable subscriber ``name`` reads with: an owned
    session's owner, a channel's account; None for an outgoing queue (nobody reads it)."""
    if name.startswith(QUEUE_PREFIX):
        return None
    owned = SubscriberId.decode(name)
    if owned is not None:
        return owned.owner
    return account_principal(name.partition(":")[0])


def takes_core_publishes(name: str) -> bool:
    """Whether durable subscriber ``name`` takes what any protocol publishes to its topics
    (every subscriber but a relay channel)."""
    return not name.partition(":")[2].startswith(RELAY_CHANNEL_PREFIX)

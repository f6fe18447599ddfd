"""SMQP between servers (draft section 2.3): which subscribers are server links, and storing
a message a link brought from another domain.

A link is a login of another server: it subscribes here, like any client, to the topics its
own clients want from this domain, and its channel names its domain
(``link_<domain>``, see :func:`link_channel`).  So a message reaches a link only
when the link's server has a subscriber for it, and the link is a durable subscriber: the
message stays pending here until that server acknowledged it, which it does only once the
message is stored there.

What a link may receive is decided at publish time by :func:`recipients_for`: nothing at
``Depth`` 0 (or absent), nothing for a domain already in ``Hops``; the accepting server's
UAL decides which topics a link may subscribe to at all (it logs in as an account).

The receiving side (:func:`store_forwarded`) keeps the message under
``/<remote domain>/<topic>`` (the draft: "messages that are passed to other domains will
have their topic pre-pended with the server's domain"), appends the sending server's domain
to ``Hops``, counts ``Depth`` down (-1 stays -1), and drops a message whose first SMUID it
has already stored (the same message by another route), whose ``Hops`` name this server, or
that came with Depth 0 (a retained message the other server added when the link subscribed).
A topic that is not an absolute path (``_payroll``, ``//x``) is dropped (:func:`mirror_key`):
another server only ever writes below its own ``/<domain leaf>/``.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from brokerd.core.subscriber import QUEUE_PREFIX, RELAY_CHANNEL_PREFIX
from brokerd.core.principal import BROKER
from brokerd.core.stored import encode as encode_message
from brokerd.protocols.smqp.codec import format_datetime
from brokerd.protocols.smqp.delivery import MessageService
from brokerd.protocols.smqp.events import Body
from brokerd.protocols.smqp.mapping import to_message
from brokerd.protocols.smqp.messages import Missing, Publication, stored_body
from brokerd.protocols.smqp.topictree import TopicTree
from brokerd.store.records import MessageRecord

MAX_SEEN = 65_536
"""Origin SMUIDs remembered to drop a message arriving again by another route."""


def domain_leaf(domain: str) -> str:
    """A domain as one topic or channel name: lower case, every character that is not a
    letter, digit or ``_`` replaced by ``_`` (``alpha.example`` -> ``alpha_example``)."""
    leaf = re.sub(r"[^a-z0-9_]", "_", domain.lower())
    return leaf if leaf[:1].isalpha() else "d" + leaf


def link_channel(domain: str) -> str:
    """The channel a server of ``domain`` logs in with over its links."""
    return RELAY_CHANNEL_PREFIX + domain_leaf(domain)


def link_domain_leaf(subscriber: str) -> str | None:
    """The domain leaf of a link subscriber (``account:link_<leaf>``), None for a client."""
    _account, _colon, channel = subscriber.partition(":")
    if channel.startswith(RELAY_CHANNEL_PREFIX):
        return channel[len(RELAY_CHANNEL_PREFIX):]
    return None


OUT_PREFIX = QUEUE_PREFIX
"""Outgoing point-to-point messages of a linked domain wait in ``accounts/~<domain>/...`` for
the subscriber ``~<domain>:out`` (a ``~`` name no login can have), which the link is.  Channels
starting with RELAY_CHANNEL_PREFIX are server links (docs/smqp.md: reserved for them); both
names are the core's (brokerd.core.durable), which keeps the core's publishes from links."""


def out_subscriber(domain: str) -> str:
    """The durable subscriber that holds a linked domain's outgoing messages."""
    return f"{OUT_PREFIX}{domain_leaf(domain)}:out"


def outgoing_key(domain: str, account: str, channel: str | None) -> str:
    """Where a message to ``account[:channel]@domain`` of a linked domain is kept."""
    key = f"accounts/{OUT_PREFIX}{domain_leaf(domain)}/{account}"
    return f"{key}/{channel}" if channel else key


def is_outgoing(key: str) -> bool:
    return key.startswith(f"accounts/{OUT_PREFIX}")


def recipient_of(key: str, domain: str) -> str:
    """``account[:channel]@domain`` of an outgoing key."""
    parts = key.split("/")[2:]
    who = ":".join(parts[:2])
    return f"{who}@{domain}"


def recipients_for(subscribers: Iterable[str], publication: Publication) -> list[str]:
    """``subscribers`` without the links that may not get this stored message: all of them
    at Depth 0, and those whose domain is in Hops.  (A message never stored reaches no link:
    brokerd.core.durable.DurableService.offer_unstored.)"""
    hops = {domain_leaf(hop) for hop in publication.hops}
    kept = []
    for name in subscribers:
        leaf = link_domain_leaf(name)
        if leaf is not None and (publication.depth == 0 or leaf in hops):
            continue
        kept.append(name)
    return kept


def mirror_key(remote: str, topic: str) -> str | None:
    """The local key of domain ``remote``'s topic ``topic`` (``/news`` ->
    ``alpha_example/news``), or None when ``topic`` is not an absolute path of whole names:
    a link writes below ``/<domain leaf>/`` and nowhere else, whatever the other server sends
    (``_payroll`` must not become ``alpha_example_payroll``, nor ``/../x`` escape)."""
    if not topic.startswith("/") or len(topic) < 2:
        return None
    names = topic[1:].lower().split("/")
    if any(name in ("", ".", "..") for name in names):
        return None
    return domain_leaf(remote) + "/" + "/".join(names)


def _forwarded_body(body: Body, depth: int, hops: tuple[str, ...]) -> Body:
    """``body`` with Depth and Hops replaced, and its last Cmuid taken out (stored_body
    appends it again after the Smuid history)."""
    attributes = [(n, v) for n, v in body.attributes if n.lower() not in ("depth", "hops")]
    cmuids = [i for i, (n, _v) in enumerate(attributes) if n.lower() == "cmuid"]
    if cmuids:
        del attributes[cmuids[-1]]
    attributes.append(("Depth", str(depth)))
    attributes.append(("Hops", ",".join(hops)))
    return Body(tuple(attributes), body.sections)


class ForwardingHost(Protocol):
    """The SMQP factory as :class:`Forwarded` sees it (brokerd.protocols.smqp.factory, which
    imports this module): the domain, the topic tree and the message service it stores into."""

    @property
    def domain(self) -> str: ...

    @property
    def tree(self) -> TopicTree: ...

    @property
    def service(self) -> MessageService: ...

    @property
    def clock(self) -> IReactorTime: ...

    def message_timeout_for(self, key: str) -> float | None: ...


class Forwarded:
    """Stores messages that links bring in (one per SMQP factory); remembers their origin
    SMUIDs (at most :data:`MAX_SEEN`, oldest forgotten first)."""

    def __init__(self, factory: ForwardingHost) -> None:
        self.factory = factory
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.counts = {"stored": 0, "duplicate": 0, "looped": 0, "no_topic": 0, "local_only": 0,
                       "outside_mirror": 0}

    def store(self, remote: str, topic: str, body: Body, publication: Publication) -> Deferred:
        """Keep a message from domain ``remote``'s topic ``topic`` (``/news``) here; fires
        once committed (or at once when it is dropped: a duplicate, a loop, no such topic)."""
        factory = self.factory
        own = factory.domain.lower()
        origin = publication.smuids[0] if publication.smuids else None
        if own in publication.hops or domain_leaf(own) in {domain_leaf(h) for h in publication.hops}:
            self.counts["looped"] += 1
            return succeed(None)
        if publication.depth == 0:
            # a retained message the other server had when the link subscribed (its backfill
            # does not look at Depth): local to that server
            self.counts["local_only"] += 1
            return succeed(None)
        if origin is not None and origin in self.seen:
            self.counts["duplicate"] += 1
            return succeed(None)
        key = mirror_key(remote, topic)
        if key is None:
            self.counts["outside_mirror"] += 1
            return succeed(None)
        node = factory.tree.get(key)
        if node is None:
            self.counts["no_topic"] += 1
            return succeed(None)
        depth = publication.depth - 1 if publication.depth > 0 else publication.depth
        hops = publication.hops + (remote.lower(),)
        service = factory.service
        now = factory.clock.seconds()
        stamp = format_datetime(now)
        seq = service.next_seq()
        smuid = service.smuid(seq, stamp)
        cmuid = publication.cmuids[-1] if publication.cmuids else f"{remote}/{smuid}"
        stored = stored_body(_forwarded_body(body, depth, hops), smuid, cmuid, history=True)
        forwarded = Publication(created=publication.created, priority=publication.priority, depth=depth, hops=hops)
        subscribers = recipients_for(service.recipients(key, "ADD", now), forwarded)
        timeout = publication.timeout
        if isinstance(timeout, Missing):  # ABSENT
            timeout = factory.message_timeout_for(key)
        expires = None if timeout is None else now + timeout
        mode = "ONE" if "ONE" in (node.delivery, publication.delivery) else "ALL"
        publisher = f"{domain_leaf(remote)}:link"
        message = to_message(stored, key, publisher, message_id=smuid, created=publication.created,
                             priority=publication.priority, expires=expires, principal=BROKER)
        record = MessageRecord(smuid, key, publisher, cmuid, now, expires, publication.priority,
                               encode_message(message), seq, mode, "NONE")
        if origin is not None:  # seen from now on: a copy arriving while this one is stored is dropped
            self.seen[origin] = None
            if len(self.seen) > MAX_SEEN:
                self.seen.popitem(last=False)
        d = service.publish(record, [(name, "ADD") for name in subscribers], message, stored.size)

        def committed(_seq: int) -> None:
            self.counts["stored"] += 1

        def failed(failure: Failure) -> Failure:
            if origin is not None:
                self.seen.pop(origin, None)  # not stored: the next copy must not be dropped
            return failure

        return d.addCallbacks(committed, failed)

"""Retained messages: the last retained message of each topic, for each new subscriber.

MQTT lets a publisher mark a message *retained* (MQTT 5.0 and 3.1.1, section 3.3.1.3): it
replaces the topic's retained message (an empty payload deletes it), and every later
subscription gets the retained message of each topic its filter matches.  They are kept here,
in the core, and in the core's store, not in the MQTT front end: they must survive a restart,
the filter rules that pick them are the core's (:mod:`brokerd.core.filters`), and any front end
that learns to retain or to hand retained messages out uses the same ones.

Who writes: the router's retain stage (:mod:`brokerd.core.router`, installed when the broker
has retained messages) calls :meth:`RetainedMessages.retain` with each message a publisher
asked to retain, after the access decision; a front end that must refuse a publish whose
retain would be refused asks :meth:`RetainedMessages.check` first.  A front end answering a new
subscription reads :meth:`RetainedMessages.page` and routes what it found as a
:class:`brokerd.core.publication.RetainedReplay`, which the access list filters.  Whoever assembles the broker gives it
the node's store once (:meth:`RetainedMessages.use_store`), which loads what the store holds;
every change is written through from then on, in the stored form of
:mod:`brokerd.core.stored`, keyed by the topic decoded as UTF-8.

The messages are held in memory (a dict by topic, beside the topics in order), bounded in
number and in bytes (a topic's name counts with its message), broker-wide and per owner
(:mod:`brokerd.core.retainedquota`: one client cannot take the bounds from everyone else): a
retain past a bound is refused with :class:`RetainRefused`.  The store is written, not read,
after the start; when a write fails the value held here stays (it is served until the next
restart), and the failure is logged once until a write succeeds again.  A stored row names the
message's owner before the message (:data:`OWNED`), so the quotas hold across a restart.
"""
from __future__ import annotations

import builtins
import json
from bisect import bisect_left, bisect_right, insort
from itertools import takewhile

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.config import Settings
from brokerd.core import stored
from brokerd.core.filters import (
    ANY_LEVELS,
    ONE_LEVEL,
    SEPARATOR,
    filter_problem,
    has_wildcard,
    matches,
)
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import Principal
from brokerd.core.retainedquota import FULL, QUOTA, UNKEYABLE, RetainQuotas, quota_owner
from brokerd.errors import BrokerError
from brokerd.store.base import IStore, is_outage

DEFAULT_MAX_MESSAGES = Settings.mqtt_max_retained
"""Topics with a retained message at most."""
DEFAULT_MAX_BYTES = Settings.mqtt_max_retained_bytes
"""Bytes of retained data (:func:`size`) at most."""
OWNED = b"\x00brokerd-retained-owner/1\n"
"""A stored row that starts with this names its owner, ``[realm, name]`` as a JSON line, then
holds the message in :mod:`brokerd.core.stored`'s form (a row without it: owner unknown)."""

_AFTER_SEPARATOR = bytes([SEPARATOR[0] + 1])
"""The byte after ``/``: the names below ``a`` sort from ``a/`` up to (without) ``a0``."""


class RetainRefused(BrokerError):
    """The retained messages cannot take this one: a bound is reached (``max_messages``
    topics, ``max_bytes`` bytes, broker-wide or the publisher's quota), or its topic is not
    UTF-8 without NUL (the stores key retained messages by text); ``reason`` says which
    (brokerd.core.retainedquota: FULL, QUOTA, UNKEYABLE).  Nothing changed: the topic keeps
    the retained message it had.  The caller answers its client as its protocol says (MQTT
    5.0: Quota exceeded)."""

    def __init__(self, why: str, reason: str = FULL) -> None:
        super().__init__(why)
        self.reason = reason


def size(message: Message) -> int:
    """The bytes ``message`` counts against the byte bounds: its topic's name (a long name
    costs memory as a payload does), its payload and the data of its other parts (a
    multi-part message's)."""
    payload = message.payload
    topic = message.target
    return (0 if topic is None else len(topic)) + len(payload) + sum(
        len(part.data) for part in message.parts if part.data is not payload)


class RetainedMessages:
    """The last retained message of each topic (bytes -> Message), in memory and written
    through to a store; see the module's docstring.

    ``max_messages`` and ``max_bytes`` bound how many topics have a retained message and the
    bytes they hold together (:func:`size`); ``quotas`` what each owner holds.
    """

    _log = Logger()

    def __init__(self, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES,
                 quotas: RetainQuotas | None = None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.quotas = RetainQuotas() if quotas is None else quotas
        self._messages: dict[builtins.bytes, Message] = {}
        self._topics: list[builtins.bytes] = []
        """The keys of ``_messages`` in order (bytes order, which is the store's order)."""
        self._size = 0
        self._store: IStore | None = None
        self._loading: set[builtins.bytes] | None = None
        """While the store's messages are read: the topics changed since (the read, asked
        before those changes, must not bring back what they replaced)."""
        self._failing = False
        """A store write failed and none succeeded since (the failure was logged)."""

    def __len__(self) -> int:
        """Topics with a retained message."""
        return len(self._messages)

    @property
    def bytes(self) -> int:
        """The bytes held (:func:`size` of every retained message)."""
        return self._size

    def get(self, topic: builtins.bytes) -> Message | None:
        """The retained message of ``topic``, or None."""
        return self._messages.get(topic)

    def matching(self, topic_filter: builtins.bytes) -> list[Message]:
        """The retained message of every topic ``topic_filter`` matches, in topic order (what
        a new subscription to ``topic_filter`` gets), at once: :meth:`page` with no bound.
        ValueError for an invalid filter."""
        everything = len(self._topics) + 1
        return self.page(topic_filter, None, everything, everything)[0]

    def page(self, topic_filter: builtins.bytes, after: builtins.bytes | None, limit: int,
             scan: int) -> tuple[list[Message], builtins.bytes | None]:
        """The retained messages ``topic_filter`` matches of the topics after ``after`` (None:
        from the first), in topic order: at most ``limit`` of them, and at most ``scan``
        topics examined; with the topic to go on after, None when the filter's topics are
        all done.  A front end sends a subscription's retained messages a page at a time, so
        that ``#`` over many topics neither holds the reactor nor its output buffer; each
        page costs a bisection and ``scan`` tests, whatever the number held.  Topics retained
        or cleared between pages are found or not as their place in the order says.
        ValueError for an invalid filter.

        A filter without wildcards is its topic: one lookup.  Otherwise the candidates are
        the topics below the filter's levels before its first wildcard (all topics when it
        starts with one), each tested with :func:`brokerd.core.filters.matches`."""
        problem = filter_problem(topic_filter)
        if problem is not None:
            raise ValueError(f"{topic_filter!r}: {problem}")
        messages = self._messages
        if not has_wildcard(topic_filter):
            found = messages.get(topic_filter) if after is None else None
            return ([] if found is None else [found]), None
        topics = self._topics
        start, end = 0, len(topics)
        picked: list[Message] = []
        resume = after  # where the next page starts when this one examines no topic
        fixed = list(takewhile(lambda level: level not in (ONE_LEVEL, ANY_LEVELS), topic_filter.split(SEPARATOR)))
        if fixed:
            # A matching topic has those levels: it is the prefix itself ('a/#' matches 'a')
            # or a name below it, and the names below it are one run of the sorted topics.
            prefix = SEPARATOR.join(fixed)
            start = bisect_left(topics, prefix + SEPARATOR)
            end = bisect_left(topics, prefix + _AFTER_SEPARATOR, start)
            if after is None:
                resume = prefix  # sorts before every name below it
                if prefix in messages and matches(topic_filter, prefix):
                    picked.append(messages[prefix])
        if after is not None:
            start = max(start, bisect_right(topics, after))
        index = start
        stop = min(end, start + scan)
        while index < stop and len(picked) < limit:
            topic = topics[index]
            if matches(topic_filter, topic):
                picked.append(messages[topic])
            index += 1
        if index >= end:
            return picked, None
        return picked, (topics[index - 1] if index > start else resume)

    # ------------------------------------------------------------------ changes

    def retain(self, message: Message) -> Deferred | None:
        """``message`` (a publish to a topic) becomes its topic's retained message; with an
        empty payload it deletes the topic's retained message instead.

        Raises :class:`RetainRefused` when it cannot be taken (a bound, a topic no store can
        key; deleting is never refused for a bound) and ValueError for a message that is not
        sent to a topic.  Returns None without a store; with one, the Deferred of the store's
        write, which fires with True once the change is durable, or with False when the
        write failed (logged here; the value held in memory stays and is served): it never
        fails, and nobody has to wait for it."""
        topic, key = self._topic_key(message)
        old = self._messages.get(topic)
        data: builtins.bytes | None = None
        if not message.payload:
            if old is not None:
                self._remove(topic, old)
        else:
            owner = quota_owner(message.principal)
            new_size = size(message)
            grown = new_size - (size(old) if old is not None else 0)
            refusal = self._refusal(topic, old, owner, new_size, grown)
            if refusal is not None:
                self._refuse(*refusal)
            data = _owned(owner, message)
            self._put(topic, message, grown, old is None)
            self.quotas.take(topic, owner, new_size)
        if self._loading is not None:
            self._loading.add(topic)
        store = self._store
        if store is None:
            return None
        return self._write(store, key, data)

    def check(self, message: Message) -> None:
        """Raise :class:`RetainRefused` (counted and logged as a refused retain) when
        :meth:`retain` would refuse ``message`` now; change nothing.  For a front end that must
        refuse the whole publish when its retain is refused (MQTT 5's QoS 1 and 2, 0x97): it
        asks here before it routes, and the router's retain stage keeps the message (the
        check and the retain run in one reactor turn, with nothing retained between)."""
        topic, _key_text = self._topic_key(message)
        if not message.payload:
            return  # deleting is never refused
        old = self._messages.get(topic)
        new_size = size(message)
        grown = new_size - (size(old) if old is not None else 0)
        refusal = self._refusal(topic, old, quota_owner(message.principal), new_size, grown)
        if refusal is not None:
            self._refuse(*refusal)

    def use_store(self, store: IStore) -> Deferred[int]:
        """Load the retained messages ``store`` (brokerd.store.base.IStore) holds and write
        every change through to it from now on; once only.  Deferred[int]: how many were
        loaded, once they are all here (serve subscriptions after that); it fails as the
        store's read does.

        Messages retained before (without a store) are newer than the store's: they stay and
        are written to it.  A stored row that is not a retained message (it does not decode,
        or names another topic) is left out and logged.  Loaded messages past the bounds are
        all kept (the bounds may have been lowered since); new topics are refused until
        deletions bring them back under."""
        if self._store is not None:
            raise RuntimeError("the retained messages have a store already")
        self._store = store
        changed = self._loading = set(self._messages)
        loading = maybeDeferred(store.load_retained)
        for topic, message in self._messages.items():
            self._write(store, _key(topic), _owned(self.quotas.owner(topic), message))
        return loading.addBoth(self._loaded, changed)

    # ------------------------------------------------------------------ inside

    def _topic_key(self, message: Message) -> tuple[builtins.bytes, str]:
        """``message``'s topic and the store's key for it; ValueError for a message not sent to
        a topic, RetainRefused (counted) for a topic no store can key."""
        topic = message.target
        if message.kind != MULTICAST or topic is None:
            raise ValueError(f"{message!r} is not sent to a topic: only a publish is retained")
        try:
            return topic, _key(topic)
        except RetainRefused as refused:
            self.quotas.count_refusal(UNKEYABLE, str(refused))
            raise

    def _refusal(self, topic: builtins.bytes, old: Message | None, owner: Principal, new_size: int,
                 grown: int) -> tuple[str, str] | None:
        """Why ``owner`` may not make ``topic``'s retained message one of ``new_size`` bytes
        (``grown`` more than ``old``), as (reason, why); None: it may."""
        if old is None and len(self._messages) >= self.max_messages:
            return FULL, f"{self.max_messages} topics have a retained message already"
        if grown > 0 and self._size + grown > self.max_bytes:
            return FULL, f"retained messages would hold more than {self.max_bytes} bytes"
        over = self.quotas.exceeds(owner, topic, new_size)
        return None if over is None else (QUOTA, over)

    def _refuse(self, reason: str, why: str) -> None:
        self.quotas.count_refusal(reason, why)
        raise RetainRefused(why, reason)

    def _put(self, topic: builtins.bytes, message: Message, grown: int, new: bool) -> None:
        self._messages[topic] = message
        self._size += grown
        if new:
            insort(self._topics, topic)

    def _remove(self, topic: builtins.bytes, old: Message) -> None:
        del self._messages[topic]
        self.quotas.release(topic)
        self._size -= size(old)
        index = bisect_left(self._topics, topic)
        del self._topics[index]

    def _loaded(self, rows: list[tuple[str, builtins.bytes]] | Failure, changed: set[builtins.bytes]) -> int | Failure:
        if self._loading is changed:
            self._loading = None
        if isinstance(rows, Failure):
            return rows
        skipped: list[str] = []
        count = 0
        for key, data in rows:
            topic = key.encode("utf-8")
            if topic in changed:
                continue
            try:
                owner, message = _unowned(data)
            except ValueError:
                owner, message = None, None
            if message is None or message.target != topic or not message.payload or message.kind != MULTICAST:
                skipped.append(key)
                continue
            self._messages[topic] = message  # not held yet: whatever was is in ``changed``
            message_size = size(message)
            self._size += message_size
            self.quotas.take(topic, owner, message_size)
            count += 1
        self._topics = sorted(self._messages)
        if skipped:
            self._log.warn("{count} stored retained messages are unreadable and left out (the first: {topic!r})",
                           count=len(skipped), topic=skipped[0])
        if len(self._messages) > self.max_messages or self._size > self.max_bytes:
            self._log.warn(
                "The store holds {count} retained messages ({size} bytes), more than the bounds"
                " ({max_messages} messages, {max_bytes} bytes): retains to new topics are refused"
                " until deletions bring them under", count=len(self._messages), size=self._size,
                max_messages=self.max_messages, max_bytes=self.max_bytes)
        return count

    def _write(self, store: IStore, key: str, data: builtins.bytes | None) -> Deferred:
        d = maybeDeferred(store.put_retained, key, data)
        return d.addCallbacks(self._written, self._write_failed, errbackArgs=(key,))

    def _written(self, _result: object) -> bool:
        if self._failing:
            self._failing = False
            self._log.info("Retained messages are written to the store again")
        return True

    def _write_failed(self, failure: Failure, key: str) -> bool:
        if not self._failing:
            self._failing = True
            if is_outage(failure):  # the store logged its outage: one line here, no traceback
                self._log.warn("Writing the retained message of {topic!r} to the store failed ({reason});"
                               " it is kept in memory, logged once until a write succeeds",
                               topic=key, reason=str(failure.value))
            else:
                self._log.failure("Writing the retained message of {topic!r} to the store failed; it is"
                                  " kept in memory, logged once until a write succeeds", failure, topic=key)
        return False


def _owned(owner: Principal | None, message: Message) -> builtins.bytes:
    """The stored row of ``message`` retained by ``owner`` (None: unknown, no owner line)."""
    data = stored.encode(message)
    if owner is None:
        return data
    return OWNED + json.dumps([owner.realm, owner.name]).encode("utf-8") + b"\n" + data


def _unowned(data: builtins.bytes) -> tuple[Principal | None, Message]:
    """(owner, message) of a stored row (:func:`_owned`); ValueError when it is none."""
    if not data.startswith(OWNED):
        return None, stored.decode(data)
    end = data.find(b"\n", len(OWNED))
    if end < 0:
        raise ValueError("an owner line without its end")
    try:
        realm, name = json.loads(data[len(OWNED):end])
    except (TypeError, ValueError) as exc:  # json's errors are ValueErrors; a bad shape, TypeError
        raise ValueError(f"bad owner line: {exc}") from None
    if not isinstance(realm, str) or not isinstance(name, str):
        raise ValueError("bad owner line")
    return Principal(name, realm), stored.decode(data[end + 1:])


def _key(topic: builtins.bytes) -> str:
    """The stores' key of ``topic``; RetainRefused when it has none."""
    try:
        key = topic.decode("utf-8")
    except UnicodeDecodeError:
        raise RetainRefused(f"topic {topic!r} is not UTF-8: no store can keep its retained message") from None
    if "\x00" in key:
        raise RetainRefused(f"topic {topic!r} holds a NUL: no store can keep its retained message")
    return key

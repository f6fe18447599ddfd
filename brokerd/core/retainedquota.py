"""Who owns each retained message, and how much each owner may retain.

The broker-wide bounds of :mod:`brokerd.core.retained` keep the process's memory bounded, but
alone they let one client fill them: every other client's retain was then refused, for good
(the messages are stored and loaded again at a restart).  So each retained message has an
owner, the principal whose publish made it, and each owner may hold at most
``max_messages`` topics and ``max_bytes`` bytes (:func:`brokerd.core.retained.size`, the
topic's bytes included).  An owner over its quota is refused; nobody else is.

The owner is who the login proved (:func:`quota_owner`): every principal of a realm whose
names are only claimed (anonymous, SSMP ``open`` and ``secret``) is one owner per realm, so a
client cannot multiply its quota by logging in again under new names or client identifiers;
the broker's own publishers (realm ``service``) have no quota.  A retain that replaces another
owner's message moves the topic to the new owner; a deletion gives the topic back to whoever
owned it.  Refusals are counted by reason and logged at most once per ``log_interval``.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.principal import ANONYMOUS, NOBODY, OPEN, SECRET, SERVICE, Principal
from brokerd.core.throttled import ThrottledWarning

DEFAULT_MAX_MESSAGES_PER_OWNER = Settings.mqtt_max_retained_per_principal
"""Topics one owner may have a retained message in."""
DEFAULT_MAX_BYTES_PER_OWNER = Settings.mqtt_max_retained_bytes_per_principal
"""Bytes of retained messages (topic included) one owner may hold."""
LOG_INTERVAL = 60.0
"""Seconds between two log lines about refused retains at most."""

FULL = "full"
"""Refused: the broker-wide bound (topics or bytes) is reached."""
QUOTA = "quota"
"""Refused: the publisher's own quota is reached."""
UNKEYABLE = "topic"
"""Refused: the topic is no key a store can keep (not UTF-8, or a NUL)."""
REASONS = (FULL, QUOTA, UNKEYABLE)

_CLAIMED_REALMS = frozenset({ANONYMOUS, OPEN, SECRET})
"""Realms whose names prove nothing: one owner per realm."""


def quota_owner(principal: Principal | None) -> Principal:
    """The owner a retain of ``principal`` counts against (None, a program that named no
    publisher, is the anonymous login, as the access check takes it)."""
    if principal is None:
        return NOBODY
    if principal.realm in _CLAIMED_REALMS:
        return NOBODY if principal.realm == ANONYMOUS else Principal("", principal.realm)
    return principal


class RetainQuotas:
    """The owner of each retained topic and what each owner holds (topics, bytes)."""

    _log = Logger()

    def __init__(self, max_messages: int = DEFAULT_MAX_MESSAGES_PER_OWNER,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_OWNER, log_interval: float = LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._owners: dict[bytes, tuple[Principal | None, int]] = {}
        """topic -> (owner, the bytes its message counts); None: an owner nobody recorded
        (a row stored before owners were), which counts against the broker-wide bounds only."""
        self._usage: dict[Principal, list[int]] = {}
        """owner -> [topics, bytes]."""
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)
        """Retains refused since the start, by reason (the metrics show them)."""
        self._warning = ThrottledWarning(
            self._log, clock, "{count} retain(s) refused (one such line per {interval:.0f} s at most; reasons: full ="
            " broker-wide bound, quota = the publisher's own, topic = no store can key it), the latest for {reason}:"
            " {why}", log_interval)

    def usage(self, owner: Principal) -> tuple[int, int]:
        """(topics, bytes) ``owner`` holds."""
        held = self._usage.get(owner)
        return (0, 0) if held is None else (held[0], held[1])

    def owner(self, topic: bytes) -> Principal | None:
        """The owner of ``topic``'s retained message (None: unknown, or none retained)."""
        found = self._owners.get(topic)
        return None if found is None else found[0]

    def exceeds(self, owner: Principal, topic: bytes, new_size: int) -> str | None:
        """Why ``owner`` may not make ``topic``'s retained message one of ``new_size`` bytes
        (None: it may).  Only growth is refused: after a quota was lowered an owner over it
        may still replace a message by a smaller one, and delete."""
        if owner.realm == SERVICE:
            return None
        topics, held = self.usage(owner)
        previous = self._owners.get(topic)
        if previous is not None and previous[0] == owner:
            new_topics, new_bytes = topics, held - previous[1] + new_size
        else:
            new_topics, new_bytes = topics + 1, held + new_size
        if new_topics > topics and new_topics > self.max_messages:
            return f"{owner} has a retained message in {self.max_messages} topics already"
        if new_bytes > held and new_bytes > self.max_bytes:
            return f"{owner} would hold more than {self.max_bytes} bytes of retained messages"
        return None

    def take(self, topic: bytes, owner: Principal | None, message_size: int) -> None:
        """``owner`` holds ``topic``'s retained message now (of ``message_size`` bytes)."""
        self.release(topic)
        self._owners[topic] = (owner, message_size)
        if owner is not None:
            held = self._usage.setdefault(owner, [0, 0])
            held[0] += 1
            held[1] += message_size

    def release(self, topic: bytes) -> None:
        """``topic`` has no retained message any more (or is about to get another)."""
        owner, message_size = self._owners.pop(topic, (None, 0))
        if owner is None:
            return
        held = self._usage[owner]
        held[0] -= 1
        held[1] -= message_size
        if held[0] <= 0:
            del self._usage[owner]

    def count_refusal(self, reason: str, why: str) -> None:
        """One retain refused for ``reason``: counted, and logged unless a line was written
        less than ``log_interval`` ago (that line's successor says how many came between)."""
        self.refused[reason] += 1
        self._warning.happened(reason=reason, why=why)

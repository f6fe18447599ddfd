"""What persistent MQTT sessions may cost: the operator's quotas, counted and reported.

A persistent session outlives its connection, so the connection limits do not bound it: each
one holds memory, its subscriptions and (on a node with a store) what is stored for it, and
a node re-arms the stored ones at its start.  Without a quota one client looping CONNECT with
new client identifiers fills the memory and the store, and every protocol's stored publishes
are refused once the disk reaches ``--disk-free-limit``.  So the node counts its persistent
sessions by owner (:class:`SessionQuotas`): ``--mqtt-max-sessions`` in all,
``--mqtt-max-sessions-per-principal`` for a logged-in principal, ``--mqtt-anonymous-sessions``
for the anonymous principal (none by default), and ``--mqtt-max-session-subscriptions`` per
session.  A refusal is counted by quota (``brokerd_mqtt_quota_refusals_total``) and logged
once per minute at most (:class:`~brokerd.core.throttled.ThrottledWarning`), so a flood of
refusals cannot flood the log.
"""
from __future__ import annotations

from collections import Counter
from typing import TypedDict

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.subscriber import SubscriberId
from brokerd.core.principal import ANONYMOUS, Principal
from brokerd.core.throttled import ThrottledWarning
from brokerd.protocols.mqtt.session import MQTTSession

SESSIONS = "sessions"
"""The quota of a refusal for ``--mqtt-max-sessions``."""
PER_PRINCIPAL = "sessions_per_principal"
"""``--mqtt-max-sessions-per-principal``."""
ANONYMOUS_SESSIONS = "anonymous_sessions"
"""``--mqtt-anonymous-sessions``."""
SUBSCRIPTIONS = "session_subscriptions"
"""``--mqtt-max-session-subscriptions``."""
QUOTAS = (SESSIONS, PER_PRINCIPAL, ANONYMOUS_SESSIONS, SUBSCRIPTIONS)

Owner = tuple[Principal, str]
"""A persistent session as the quotas know it: its principal and its client identifier."""


def stored_owner(name: str) -> Owner | None:
    """The principal and client identifier of a stored MQTT session's durable subscriber
    name; None for another kind of name."""
    identity = SubscriberId.decode(name)
    if identity is None or identity.protocol != "mqtt":
        return None
    return identity.owner, identity.session


class QuotaFigures(TypedDict):
    """What /metrics and the JSON API show of the MQTT quotas."""

    persistent_sessions: int
    refused: dict[str, int]


class SessionQuotas:
    """The persistent sessions of the node by owner, and the refusals of the quotas."""

    _log = Logger()

    def __init__(self, settings: Settings, clock: IReactorTime) -> None:
        self.settings = settings
        self.clock = clock
        self.owners: dict[Owner, None] = {}
        self.per_principal: Counter[Principal] = Counter()
        self.refused: Counter[str] = Counter()
        """Refusals by quota since the start (what /metrics shows)."""
        self._warning = ThrottledWarning(self._log, clock, "MQTT quotas refused {count} time(s) "
                                         "(one such line per {interval:.0f} s at most), the latest: {quota}")

    def principal_quota(self, principal: Principal) -> int:
        if principal.realm == ANONYMOUS:
            return self.settings.mqtt_anonymous_sessions
        return self.settings.mqtt_max_sessions_per_principal

    def refusal(self, owner: Owner) -> str | None:
        """Whether ``owner`` may have a persistent session: None when it has one already or
        one more is within the quotas, else the quota it would exceed."""
        if owner in self.owners:
            return None
        principal = owner[0]
        if self.per_principal[principal] >= self.principal_quota(principal):
            return ANONYMOUS_SESSIONS if principal.realm == ANONYMOUS else PER_PRINCIPAL
        if len(self.owners) >= self.settings.mqtt_max_sessions:
            return SESSIONS
        return None

    def add(self, owner: Owner) -> None:
        """``owner`` has a persistent session (admitted by :meth:`refusal`, or re-armed)."""
        if owner not in self.owners:
            self.owners[owner] = None
            self.per_principal[owner[0]] += 1

    def remove(self, owner: Owner) -> None:
        """``owner``'s persistent session ended (or became one that ends with its connection)."""
        if self.owners.pop(owner, False) is None:
            self.per_principal[owner[0]] -= 1
            if not self.per_principal[owner[0]]:
                del self.per_principal[owner[0]]

    def admit_stored(self, names: list[str]) -> list[str]:
        """At the node's start: take up the stored sessions of ``names`` within the quotas,
        the oldest first (an incarnation starts with its creation time); the names of the
        others, which the caller ends, so a restart re-arms no more than the quotas allow."""
        beyond = []
        stored = [(identity, name) for name in names
                  if (identity := SubscriberId.decode(name)) is not None and identity.protocol == "mqtt"]
        for identity, name in sorted(stored, key=lambda pair: pair[0].incarnation):
            owner = (identity.owner, identity.session)
            quota = self.refusal(owner)
            if quota is None:
                self.add(owner)
            else:
                self.count(quota)
                beyond.append(name)
        return beyond

    def subscriptions_exceeded(self, session: MQTTSession, topic_filter: str) -> bool:
        """Whether a new subscription ``topic_filter`` would take persistent ``session``
        past ``--mqtt-max-session-subscriptions`` (counted when it would)."""
        if session.expiry <= 0 or topic_filter in session.subscriptions:
            return False
        if len(session.subscriptions) < self.settings.mqtt_max_session_subscriptions:
            return False
        self.count(SUBSCRIPTIONS)
        return True

    # ------------------------------------------------------------------ reporting

    def count(self, quota: str) -> None:
        """One refusal of ``quota``: counted, and logged unless a line was logged recently."""
        self.refused[quota] += 1
        self._warning.happened(quota=quota)

    def figures(self) -> QuotaFigures:
        """What /metrics shows: the persistent sessions and the refusals by quota."""
        return {"persistent_sessions": len(self.owners),
                "refused": {quota: self.refused[quota] for quota in QUOTAS}}

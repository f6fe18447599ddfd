"""The operator log: logins, logouts and refused logins as twisted.logger lines, and the
counters behind them.

The event log is for the data pipeline; an operator reading ``twistd.log`` (or its JSON form)
needs to see who logged in from where, and who was refused.  :class:`OperatorLog` sits in
front of the event log as the Broker's observer and the front ends' event recorder: the
per-message calls (``message_routed``, ``messages_routed``, ``delivery``) are the event log's
own bound methods, so the hot path costs what it did; the rare calls (sessions, refusals,
drops) are logged and counted here, then passed on.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any, Protocol, Unpack

from twisted.logger import Logger
from zope.interface import implementer

from brokerd.events.log import DeliveryFields, EventLog, IEventRecorder, NullEventLog, peer_text, transport_source
from brokerd.events.schema import DROPPED, SLOW_CONSUMER, text
from brokerd.interfaces import IBrokerObserver, ISubscriber

_log = Logger(namespace="brokerd")
"""Module-level, not a class attribute: a Logger that is a class attribute takes its class's
name as its namespace (Logger.__get__), which the log's ``source`` would then show."""

class WallClock(Protocol):
    """What reads the wall clock: the time module, or a test's Clock."""

    def time(self) -> float: ...


RECENT_AUTH_FAILURES = 50
"""Refused logins the admin API and the dashboard can show (the newest ones)."""


def _text(value: bytes | str | None) -> str:
    """A name, address or reason for a log line ("-" when there is none)."""
    return text(value) or "-"


@implementer(IBrokerObserver, IEventRecorder)
class OperatorLog:
    """Logs and counts sessions and refusals, then hands every call to ``events`` (the event
    log, or brokerd.events.log.NULL_EVENT_LOG when it is off)."""


    def __init__(self, events: EventLog | NullEventLog, clock: WallClock = time) -> None:
        self.events = events
        self._clock = clock
        self.message_routed = events.message_routed
        self.messages_routed = events.messages_routed
        if hasattr(events, "run_summary_routed"):
            self.run_summary_routed = events.run_summary_routed
        self.subscribed = events.subscribed
        self.unsubscribed = events.unsubscribed
        self.logins: Counter[str] = Counter()
        """Logins accepted, by protocol."""
        self.auth_failures: Counter[str] = Counter()
        """Logins refused, by protocol."""
        self.drops: Counter[str] = Counter()
        """Messages not delivered, by reason, as the front ends report them (slow-consumer
        drops are reported per congestion episode; see :attr:`slow_consumer_episodes`)."""
        self.slow_consumer_episodes = 0
        self.recent_auth_failures: deque[dict[str, Any]] = deque(maxlen=RECENT_AUTH_FAILURES)

    def __getattr__(self, name: str) -> Any:  # whatever the event log's attribute is
        """Everything else is the event log's (``stats()``, ``writer``, ``flush()``...), so
        code that took the Broker's observer for the event log keeps working."""
        if name == "events":
            raise AttributeError(name)
        return getattr(self.events, name)

    # ------------------------------------------------------------------ IBrokerObserver

    def session_attached(self, session: ISubscriber) -> None:
        self.logins[session.protocol] += 1
        self._log_session("login", session)
        self.events.session_attached(session)

    def session_detached(self, session: ISubscriber) -> None:
        self._log_session("logout", session)
        self.events.session_detached(session)

    def _log_session(self, what: str, session: ISubscriber) -> None:
        _log.info(
            "{protocol}: {what} {name} from {source}",
            what=what,
            protocol=session.protocol,
            name=_text(session.name),
            source=_text(transport_source(getattr(session, "transport", None))),
        )

    # ------------------------------------------------------------------ IEventRecorder

    def record(self, kind: str, protocol: str, **fields: Any) -> None:  # schema fields, handed on
        if kind == DROPPED:
            self._count_drop(fields.get("reason"), fields.get("dropped"))
        self.events.record(kind, protocol, **fields)

    def delivery(self, kind: str, session: ISubscriber, **fields: Unpack[DeliveryFields]) -> None:
        if kind == DROPPED:
            self._count_drop(fields.get("reason"), None)
        self.events.delivery(kind, session, **fields)

    def auth_failure(
        self,
        protocol: str,
        identity: bytes | str | None,
        source: str | None = None,
        scheme: bytes | str | None = None,
        reason: str | None = None,
    ) -> None:
        self.auth_failures[protocol] += 1
        self.recent_auth_failures.append(
            {
                "time": self._clock.time(),
                "protocol": protocol,
                "identity": text(identity),
                "source": source,
                "scheme": text(scheme),
                "reason": reason,
            }
        )
        _log.warn(
            "{protocol}: login refused for {identity} from {source} ({scheme}): {reason}",
            protocol=protocol,
            identity=_text(identity),
            source=_text(source),
            scheme=_text(scheme),
            reason=_text(reason),
        )
        self.events.auth_failure(protocol, identity, source=source, scheme=scheme, reason=reason)

    def _count_drop(self, reason: str | None, count: int | None) -> None:
        reason = reason or "unknown"
        if reason == SLOW_CONSUMER:
            self.slow_consumer_episodes += 1
            return  # the Broker counts each dropped write as it happens
        self.drops[reason] += count if isinstance(count, int) else 1

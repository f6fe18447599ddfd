"""Principals an operator keeps out for a while (``brokerd-ctl close ID --for SECONDS``).

Closing a session alone is undone at once: its client reconnects.  A principal kept out is
refused at its next logins, in every protocol that logs in through the realm (brokerd.auth
.realm asks :meth:`KeptOut.refuses`), until its time is over; on a cluster the Broker tells
the other nodes through its engine, each of which keeps it out for the same number of
seconds from when it heard (no shared clock is assumed).

The registry is bounded: at most ``limit`` principals at once; past it, the one whose time
ends first gives way (an operator keeps out a few identities, not a population).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from brokerd.core.principal import Principal

MAX_KEPT_OUT = 10_000
"""Principals kept out at once (the oldest-ending one gives way past it)."""
MAX_SECONDS = 366 * 86400
"""The longest time a principal can be kept out for (a year and a day)."""


class KeptOut:
    """Principal -> the clock time its exclusion ends."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, limit: int = MAX_KEPT_OUT) -> None:
        self._clock = clock
        self._until: dict[Principal, float] = {}
        self.limit = limit

    def add(self, principal: Principal, seconds: float) -> None:
        """Keep ``principal`` out for ``seconds`` from now (0 or less: let it in again)."""
        if seconds <= 0:
            self._until.pop(principal, None)
            return
        now = self._clock()
        self._expire(now)
        until = now + min(seconds, MAX_SECONDS)
        self._until[principal] = max(until, self._until.get(principal, 0.0))
        while len(self._until) > self.limit:
            del self._until[min(self._until, key=self._until.__getitem__)]

    def refuses(self, principal: Principal) -> float | None:
        """Seconds ``principal`` stays out, or None when it may log in."""
        until = self._until.get(principal)
        if until is None:
            return None
        left = until - self._clock()
        if left <= 0:
            del self._until[principal]
            return None
        return left

    def listing(self) -> list[tuple[Principal, float]]:
        """Every principal kept out now, with its seconds left."""
        now = self._clock()
        self._expire(now)
        return sorted(((p, until - now) for p, until in self._until.items()), key=lambda item: str(item[0]))

    def _expire(self, now: float) -> None:
        for principal in [p for p, until in self._until.items() if until <= now]:
            del self._until[principal]

"""Counting and reporting the damaged messages a node drops, without letting them flood the log.

Any client of the cluster's Redis can write on the channels the nodes read, so a damaged
message is not a node's bug to trace but input to refuse: the engine drops it, counts it
(``brokerd_cluster_bad_envelopes_total``) and tells :class:`DamagedLog`, which logs the first
one at once and then at most one line per ``interval`` seconds with the number dropped since
and the latest reason.  A flood of garbage costs one log line per interval, whatever its rate.
"""
from __future__ import annotations

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from brokerd.core.throttled import ThrottledWarning

_log = Logger()

INTERVAL = 10.0
"""Seconds between two lines about damaged messages."""


class DamagedLog:
    """One warning line per ``interval`` seconds about the damaged messages dropped."""

    def __init__(self, clock: IReactorTime, interval: float = INTERVAL) -> None:
        self._warning = ThrottledWarning(
            _log, clock, "Cluster: dropped {count} damaged message(s) (one such line per {interval:.0f} s at most); "
            "the latest, on {where}: {error}", interval)

    def dropped(self, where: str, error: str) -> None:
        """A damaged message was dropped (``where``: its channel, ``error``: why)."""
        self._warning.happened(where=where, error=error[:200])

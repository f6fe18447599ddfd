"""A latency histogram of plain numbers: what the store's writer thread can afford per commit.

Observed on the writer thread, read by the admin listener on the reactor thread at scrape
time; each update is a few integer operations under the GIL, so a reader sees a consistent
enough picture without a lock (a scrape may miss the commit happening at that instant).
"""
from __future__ import annotations

from bisect import bisect_left

COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds in seconds (Prometheus ``le``); a +Inf bucket follows."""


class Latencies:
    """Counts of observations per bucket (not cumulative), their sum and their number."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: tuple[float, ...] = COMMIT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, +Inf last."""
        running = 0
        buckets = []
        for bound, count in zip((*self.bounds, float("inf")), list(self.counts)):
            running += count
            buckets.append((bound, running))
        return buckets

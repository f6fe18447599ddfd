"""The rate history is a bounded ring: one sample a second of the broker's clock, at most an
hour of them, each the rates since the sample before."""
from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock

from brokerd.admin.history import HISTORY_SECONDS, RateHistory


class Counting:
    """Figures with counters a test moves and an uptime from a Clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.broker = SimpleNamespace(stats=SimpleNamespace(published=0, delivered=0))

    def uptime(self) -> float:
        return self.clock.seconds()


def test_an_hour_of_per_second_rates_and_no_more() -> None:
    clock = Clock()
    figures = Counting(clock)
    history = RateHistory(figures, clock)
    history.startService()
    for second in range(HISTORY_SECONDS + 500):
        figures.broker.stats.published += 3
        figures.broker.stats.delivered += second % 2 * 6
        clock.advance(1)
    samples = history.view()["samples"]
    assert len(samples) == HISTORY_SECONDS  # the oldest gave way
    assert samples[-1] == {"t": HISTORY_SECONDS + 500, "accepted": 3.0, "delivered": 6.0 * ((HISTORY_SECONDS + 499) % 2)}
    assert samples[0]["t"] == 501 and {s["accepted"] for s in samples} == {3.0}
    history.stopService()
    clock.advance(10)
    assert history.view()["samples"] == samples  # stopped: nothing more

"""PendingQuota: what DurableService.keep stores for each bounded subscriber, at most."""
from __future__ import annotations

from twisted.internet.task import Clock

from brokerd.core.pending import PendingQuota

A, B, SMQP = "mqtt/account/a/1/i", "mqtt/account/b/1/i", "bob:c1"


def test_a_run_gives_each_bounded_subscriber_the_first_messages_its_room_allows() -> None:
    quota = PendingQuota("mqtt/", 3, Clock())
    quota.loaded({A: 1})
    wanted = [(A, "ADD"), (B, "ADD"), (SMQP, "ADD")]
    runs = quota.reserve(wanted, 4)
    assert runs == [wanted, wanted, [(B, "ADD"), (SMQP, "ADD")], [(SMQP, "ADD")]]
    assert quota.counts == {A: 3, B: 3} and quota.dropped == 3
    assert quota.reserve([(A, "ADD"), (SMQP, "ADD")], 1) == [[(SMQP, "ADD")]], "the unbounded one still gets it"
    quota.settled(A)
    assert quota.reserve([(A, "ADD")], 2) == [[(A, "ADD")], []], "a settled delivery frees one place"
    quota.release([(A, "ADD"), (SMQP, "ADD")])  # not stored after all
    assert quota.counts[A] == 2 and SMQP not in quota.counts
    quota.forget(B)
    assert B not in quota.counts


class Lines:
    """A Logger's stand-in: the ``count`` of each warning line."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def warn(self, text: str, **fields: object) -> None:
        self.counts.append(fields["count"])  # type: ignore[arg-type]


def test_drops_are_logged_once_per_interval() -> None:
    clock = Clock()
    quota = PendingQuota("mqtt/", 0, clock)
    lines = quota._warning.log = Lines()  # type: ignore[assignment]
    for _ in range(5):
        quota.reserve([(A, "ADD")], 2)
    clock.advance(61)
    quota.reserve([(A, "ADD")], 1)
    assert lines.counts == [2, 9] and quota.dropped == 11

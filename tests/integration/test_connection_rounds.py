"""Rounds of many logged-in connections over the four protocols leave nothing behind.

The broker runs in this process (``makeService`` on the test's reactor) so that what it
keeps can be counted exactly: after each round closed its connections and the broker has
detached them all, a full garbage collection, then the live objects the collector tracks:
those of brokerd's own classes (exactly as many as after the round before: a leaked
session, outbox or admission shows at once), and all of them (the last round within :data:`TOLERANCE` of the first:
a leak of one object per connection would be 500 more each round).  The clients are tests/support/rounds.py (the same as
benchmarks/connection_rounds.py, which measures RSS over 5,000-connection rounds), run in a
thread with blocking sockets whose every read and connect has a timeout (and the thread
itself one, :func:`tests.support.innocent.in_thread`), so a round that does not finish
fails instead of hanging.
"""
from __future__ import annotations

import gc

import pytest
import pytest_twisted
from twisted.internet import reactor

from brokerd.config import Settings
from brokerd.tap import makeService
from tests.support.broker import free_port
from tests.support.collect import eventually
from tests.support.innocent import in_thread
from tests.support.rounds import PROTOCOLS, SMQP_PER_ROUND, one_round

CONNECTIONS = 500
ROUNDS = 3
TOLERANCE = 500
"""Live objects the last round may hold beyond the first.  Measured over six rounds: 0 of
brokerd's classes each time; of all objects -200 to +360 from round to round (the larger
figure in a whole-suite run), Twisted's cancelled DelayedCalls (the reactor drops them from
its timer heap in batches, not at once) and weak references, going down again in later
rounds.  A leak of one object per connection would be 2 x 500 = 1,000 between the first
round and the third."""


def live_objects() -> tuple[int, int]:
    """(objects of brokerd's classes, all objects), after a full collection."""
    gc.collect()
    gc.collect()
    everything = gc.get_objects()
    ours = sum(1 for o in everything if str(type(o).__module__).startswith("brokerd."))
    return ours, len(everything)


def expected_logins() -> dict[str, int]:
    """How one_round spreads CONNECTIONS over the protocols (SMQP capped, the rest SSMP)."""
    counts = dict.fromkeys(PROTOCOLS, 0)
    for i in range(CONNECTIONS):
        protocol = PROTOCOLS[i % 4]
        if protocol == "smqp" and i // 4 >= SMQP_PER_ROUND:
            protocol = "ssmp"
        counts[protocol] += 1
    return counts


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_rounds_of_connections_leave_no_objects_behind(tmp_path):
    ports = {protocol: free_port() for protocol in PROTOCOLS}
    settings = Settings(
        listeners={protocol: [f"tcp:{port}:interface=127.0.0.1"] for protocol, port in ports.items()},
        data_dir=tmp_path / "data", open_login=True, event_log=False,
        max_connections=10_000, max_listener_connections=10_000,
        max_connections_per_address=10_000, max_unauthenticated=10_000,
    )
    service = makeService(settings, reactor)
    service.startService()
    try:
        broker = service.runtime.broker
        operator_log = service.runtime.event_log
        await in_thread(one_round, ports, 40, "warm")  # the broker serves every protocol
        counts = []
        for number in range(ROUNDS):
            before = dict(operator_log.logins)
            await in_thread(one_round, ports, CONNECTIONS, f"r{number}")
            # every connection logged in: the broker counted each protocol's logins
            logins = {p: operator_log.logins[p] - before.get(p, 0) for p in PROTOCOLS}
            assert logins == expected_logins(), logins
            await eventually(lambda: not broker.sessions() and broker.stats.connections == 0,
                             "the broker to detach every connection")
            counts.append(live_objects())
        for (ours_before, _), (ours, _) in zip(counts, counts[1:]):
            assert ours <= ours_before, counts
        assert counts[-1][1] <= counts[0][1] + TOLERANCE, counts
    finally:
        await service.stopService()

"""An SMQP durable subscriber's outbox whose read of pending notifications fails: while the
store is away (StoreUnavailable, which the store logs once per change of state) it logs
nothing and reads again later; any other failure is logged with its traceback (the positive
control).  End to end, the fault-injection run (tests/faults) restarts PostgreSQL under SMQP
logins and checks the nodes' logs."""
from __future__ import annotations

from types import SimpleNamespace

from twisted.logger import LogLevel, capturedLogs
from twisted.python.failure import Failure

from brokerd.config import Settings
from brokerd.protocols.smqp.outbox import Outbox
from brokerd.store.base import StoreUnavailable


def outbox() -> Outbox:
    session = SimpleNamespace(subscriber="bob:durable")
    service = SimpleNamespace(durable=SimpleNamespace(store=None), max_queued_bytes=Settings.smqp_max_queued_bytes,
                              max_one_held=Settings.smqp_max_one_held)
    return Outbox(session, service)  # type: ignore[arg-type]


def test_a_store_outage_is_not_logged_per_read_and_the_read_is_retried() -> None:
    box = outbox()
    box.loading = True
    with capturedLogs() as events:
        box._load_failed(Failure(StoreUnavailable("the PostgreSQL server cannot be reached")))
    assert events == []
    assert box.stale and not box.loading


def test_any_other_failure_of_the_read_is_logged_with_its_traceback() -> None:
    box = outbox()
    box.loading = True
    with capturedLogs() as events:
        box._load_failed(Failure(RuntimeError("a bug")))
    assert [(event["log_level"], event["name"]) for event in events] == [(LogLevel.critical, "bob:durable")]
    assert events[0]["log_failure"].check(RuntimeError)
    assert box.stale and not box.loading

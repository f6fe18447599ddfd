"""The SMQP queue figures and the commit-latency histogram the admin listener reads from the
SQLite store, and how /metrics renders them."""
from __future__ import annotations

from pathlib import Path

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor

from brokerd.admin.metrics import exposition
from brokerd.store.latency import Latencies
from brokerd.store.records import MessageRecord
from brokerd.store.sqlite import FILENAME, SQLiteStore


def _record(seq: int, topic: str) -> MessageRecord:
    return MessageRecord(f"h/{seq}", topic, "alice:c1", f"C{seq}", 1.0, None, 1, b"d", seq)


@pytest_twisted.ensureDeferred
async def test_queue_figures_count_pending_unacknowledged_and_trash(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / FILENAME, reactor)
    await store.open()
    try:
        assert await store.queue_figures() == {"pending": 0, "unacknowledged": 0, "trash": {},
                                               "trash_total": 0, "trash_queues": 0}
        seq = await store.next_seq()
        await store.publish(_record(seq, "news"), [("bob:c1", "ADD"), ("eve:c1", "ADD")])
        await store.publish(_record(seq + 1, "jobs"), [("bob:c1", "ADD")])
        await store.publish(_record(seq + 2, "jobs"), [("bob:c1", "ADD")])
        assert await store.attempt("eve:c1", seq) == 1  # sent once, not acknowledged
        await store.acknowledge("bob:c1", seq)
        await store.trash_message(seq + 2, 5.0)
        assert await store.queue_figures() == {"pending": 1, "unacknowledged": 1, "trash": {"jobs/trash": 1},
                                               "trash_total": 1, "trash_queues": 1}
        assert (await store.queue_figures(0))["trash"] == {}  # only the fullest queues are named
        latency = store.commit_latency
        assert latency.count == store.batches - 1  # every transaction but the connect
        assert latency.cumulative()[-1] == (float("inf"), latency.count)
    finally:
        await store.close()


def test_latencies_buckets_are_cumulative() -> None:
    latencies = Latencies((0.01, 0.1))
    for seconds in (0.001, 0.01, 0.05, 3.0):
        latencies.observe(seconds)
    assert latencies.cumulative() == [(0.01, 2), (0.1, 3), (float("inf"), 4)]
    assert latencies.count == 4 and abs(latencies.total - 3.061) < 1e-9


def test_metrics_render_queues_and_the_commit_histogram() -> None:
    snapshot = {
        "version": "1.0", "uptime_seconds": 1.0,
        "connections": {"open": 0, "refused": 0, "by_protocol": {}, "made": {}},
        "sessions": {}, "logins": {}, "auth_failures": {},
        "messages": {"accepted": 0, "delivered": 0, "accepted_by_protocol": {}, "delivered_by_protocol": {},
                     "routed": {}},
        "dropped": {"slow_consumer": 0}, "slow_consumers": 0, "slow_consumer_episodes": 0, "topics": 0,
        "subscriptions": 0, "retained": {"messages": 0, "bytes": 0, "refused": {}}, "event_log": None, "thread_pools": {"store": 2},
        "store": {"commits": 3, "commit_seconds_sum": 0.5,
                  "commit_seconds_buckets": [[0.01, 1], [0.1, 2], [float("inf"), 3]]},
        "process": {"resident_memory_bytes": 1, "open_fds": 1, "max_fds": 2},
    }
    text = exposition(snapshot, {"pending": 4, "unacknowledged": 2, "trash": {"jobs/trash": 7}}).decode()
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(text) for s in family.samples}
    assert values["brokerd_smqp_pending_messages", ()] == 4
    assert values["brokerd_smqp_unacknowledged_messages", ()] == 2
    assert values["brokerd_smqp_trash_messages", (("queue", "jobs/trash"),)] == 7
    assert values["brokerd_store_commit_seconds_bucket", (("le", "0.1"),)] == 2
    assert values["brokerd_store_commit_seconds_count", ()] == 3
    assert values["brokerd_store_commit_seconds_sum", ()] == 0.5
    assert values["brokerd_thread_pool_queue", (("pool", "store"),)] == 2

"""What the PostgreSQL store adds to the store contract (tests/store/test_store.py runs that):
two stores on one database, as two brokerd nodes, racing for the same messages; the reactor
running while a row lock is held elsewhere; durability across reopening; an outage of the
server and the recovery after it."""
from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from twisted.internet.task import deferLater

from brokerd.store.memory import StoreClosed
from brokerd.store.pg_writer import StoreUnavailable, connection_info, redacted
from brokerd.store.postgresql import SCHEMA_VERSION, SEQ_BLOCK, PostgreSQLStore
from brokerd.store.records import MessageRecord, TopicRecord
from tests.support.secrets import write_private

MESSAGES = 150


def numbered(seq: int, topic: str, mode: str = "ALL", expires: float | None = None) -> MessageRecord:
    return MessageRecord(f"h/{seq}", topic, "alice:c1", f"C{seq}", 1.0, expires, 1, b"d", seq, mode)


async def opened(url: str) -> PostgreSQLStore:
    store = PostgreSQLStore(url, connection_info(url), reactor)
    await store.open()
    return store


@pytest_twisted.async_yield_fixture
async def two_nodes(postgres_url):
    first, second = await opened(postgres_url), await opened(postgres_url)
    yield first, second
    await gatherResults([first.close(), second.close()])


@pytest_twisted.ensureDeferred
async def test_two_nodes_number_messages_apart_and_publish_together(two_nodes):
    one, two = two_nodes
    a, b = await one.next_seq(), await two.next_seq()
    assert abs(a - b) >= SEQ_BLOCK  # a block each: the nodes never pick the same number
    calls = [one.publish(numbered(a + i, "news"), [("s:1", "ADD")]) for i in range(MESSAGES)]
    calls += [two.publish(numbered(b + i, "news"), [("s:1", "ADD")]) for i in range(MESSAGES)]
    await gatherResults(calls)
    assert await one.count_messages(["news"]) == 2 * MESSAGES
    assert await two.next_seq() == b + MESSAGES and await one.next_seq() == a + MESSAGES


@pytest_twisted.ensureDeferred
async def test_racing_acknowledgements_of_one_messages_settle_each_exactly_once(two_nodes):
    """Subscriber a:1 on node one and b:1 on node two acknowledge every ONE message at once
    (in opposite orders, so the nodes' transactions also wait for each other's locks): each
    message is settled by exactly one of them, the other gets None, and nothing settled is
    pending or acknowledgeable again anywhere."""
    one, two = two_nodes
    first = await one.next_seq()
    seqs = [first + i for i in range(MESSAGES)]
    await gatherResults([one.publish(numbered(seq, "jobs", mode="ONE"), [("a:1", "ADD"), ("b:1", "ADD")])
                         for seq in seqs])
    assert len(await two.pending("b:1", 1000)) == MESSAGES  # both were offered every message
    calls: list = []
    for low, high in zip(seqs, reversed(seqs)):  # interleaved: the two nodes' batches overlap
        calls.append(one.acknowledge("a:1", low))
        calls.append(two.acknowledge("b:1", high))
    results = await gatherResults(calls)
    winners: dict[int, list[str]] = {}
    for call_index, settled in enumerate(results):
        if settled is not None:
            winners.setdefault(settled.seq, []).append("a:1" if call_index % 2 == 0 else "b:1")
            assert settled.released in ((), ("a:1",), ("b:1",))
    assert sorted(winners) == seqs
    assert all(len(names) == 1 for names in winners.values()), winners
    assert {names[0] for names in winners.values()} <= {"a:1", "b:1"}
    for store, name in ((one, "a:1"), (two, "b:1"), (one, "b:1"), (two, "a:1")):
        assert await store.pending(name, 1000) == []
    again = await gatherResults([one.acknowledge("b:1", seq) for seq in seqs] +
                                [two.acknowledge("a:1", seq) for seq in seqs])
    assert again == [None] * (2 * MESSAGES)
    assert two.commit_latency.count > 0 and one.batches > 0


@pytest_twisted.ensureDeferred
async def test_one_subscriber_acknowledging_through_two_nodes_counts_once(two_nodes):
    """A login replaced on another node may acknowledge the same delivery twice at once."""
    one, two = two_nodes
    first = await one.next_seq()
    seqs = [first + i for i in range(MESSAGES)]
    await gatherResults([one.publish(numbered(seq, "all"), [("s:1", "ADD"), ("t:1", "ADD")]) for seq in seqs])
    results = await gatherResults([store.acknowledge("s:1", seq) for seq in seqs for store in (one, two)])
    assert sorted(r.seq for r in results if r is not None) == seqs
    assert await two.pending("s:1", 1000) == []
    assert [d.seq for d in await two.pending("t:1", 1000)] == seqs  # the other subscriber still has them


@pytest_twisted.ensureDeferred
async def test_two_nodes_sweeping_expire_each_message_once(two_nodes):
    one, two = two_nodes
    first = await one.next_seq()
    seqs = [first + i for i in range(MESSAGES)]
    await gatherResults([one.publish(numbered(seq, "news", expires=5.0), [("s:1", "ADD")]) for seq in seqs])
    swept = await gatherResults([store.expire(10.0, 40) for _ in range(3) for store in (one, two)])
    moved = sorted(settled.seq for found in swept for settled in found)
    assert len(moved) == len(set(moved)) > 0  # no message was trashed (and reported) twice
    rest = await one.expire(10.0, 1000)
    assert sorted(moved + [s.seq for s in rest]) == seqs
    assert await two.count_messages(["news/trash"]) == MESSAGES
    figures = await two.queue_figures(0)  # the fullest Trash queues only (none here), and all of them summed
    assert (figures["trash"], figures["trash_total"], figures["trash_queues"]) == ({}, MESSAGES, 1)


@pytest_twisted.ensureDeferred
async def test_the_reactor_runs_while_another_node_holds_the_lock(postgres_url):
    """The store waits for row locks in its thread: while another connection holds message
    seq's lock, the acknowledgement waits and the reactor goes on running (counted, not timed)."""
    import psycopg

    store = await opened(postgres_url)
    try:
        seq = await store.next_seq()
        await store.publish(numbered(seq, "lock", mode="ONE"), [("a:1", "ADD"), ("b:1", "ADD")])
        other = psycopg.connect(postgres_url)
        try:
            other.execute("SELECT 1 FROM messages WHERE seq = %s FOR UPDATE", (seq,))
            acked = store.acknowledge("a:1", seq)
            for _ in range(20):
                await deferLater(reactor, 0, lambda: None)
            assert not acked.called
            other.execute("UPDATE messages SET done = TRUE WHERE seq = %s", (seq,))  # b:1 won meanwhile
            other.commit()
        finally:
            other.close()
        assert await acked is None  # waited, then found the message settled by the other node
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_survives_reopening_and_takes_a_new_block(postgres_url):
    import psycopg

    store = await opened(postgres_url)
    first = await store.next_seq()
    await store.put_topics([TopicRecord("news", "News", ("A",))])
    await store.publish(numbered(first, "news"), [("s:1", "ADD")])
    await store.close()
    again = await opened(postgres_url)
    try:
        assert [r.keywords for r in await again.load_topics()] == [("A",)]
        assert [d.seq for d in await again.pending("s:1", 10)] == [first]
        assert await again.next_seq() >= first + SEQ_BLOCK
    finally:
        await again.close()
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute("SELECT version FROM brokerd_schema").fetchall() == [(SCHEMA_VERSION,)]


@pytest.mark.slow  # a PostgreSQL server of its own (initdb), stopped and started again
@pytest_twisted.ensureDeferred
async def test_an_outage_fails_calls_then_the_store_reconnects(own_postgres):
    """Server stopped (immediate, as a crash): calls fail with StoreUnavailable and the store
    says it is unavailable; what was committed before is there after the restart; the store
    connects again by itself."""
    url = own_postgres.create_database()
    store = await opened(url)
    try:
        seq = await store.next_seq()
        await store.publish(numbered(seq, "kept"), [("s:1", "ADD")])
        assert store.available
        own_postgres.stop()
        with pytest.raises(StoreUnavailable):
            await store.publish(numbered(seq + 1, "lost"), [("s:1", "ADD")])
        assert not store.available
        with pytest.raises(StoreUnavailable):  # within the backoff: refused without waiting
            await store.pending("s:1", 10)
        own_postgres.start()
        for _attempt in range(20):  # one retry per backoff period, bounded
            try:
                pending = await store.pending("s:1", 10)
                break
            except StoreUnavailable:
                await deferLater(reactor, store._writer.backoff, lambda: None)
        else:
            raise AssertionError("the store did not reconnect")
        assert store.available
        assert [d.seq for d in pending] == [seq]  # committed before the outage, kept
        await store.publish(numbered(seq + 1, "kept"), [("s:1", "ADD")])
        assert await store.count_messages(["kept", "lost"]) == 2
    finally:
        await store.close()


def test_connection_info_reads_the_password_file_and_keeps_urls_out_of_logs(tmp_path):
    secret = tmp_path / "pw"
    write_private(secret, "s3cr'et\n")
    info = connection_info("postgresql://alice@db.example:6543/brokerd", secret)
    assert "password='s3cr\\'et'" in info and "port='6543'" in info and "dbname='brokerd'" in info
    assert "password='inline'" in connection_info("postgres://alice:inline@h/d", secret)
    assert redacted("postgresql://alice:inline@h/d") == "postgresql://alice:***@h/d"
    with pytest.raises(ValueError, match="no database"):
        connection_info("postgresql://alice@h:5432/")


@pytest_twisted.ensureDeferred
async def test_a_failing_operation_fails_alone_and_calls_share_commits(postgres_url):
    """A batch has no savepoints: a duplicate inside it rolls the batch back and its
    operations run again one by one, so only the duplicate fails.  Publishes made together
    share a few transactions, and none is done when publish() returns."""
    store = await opened(postgres_url)
    try:
        first = await store.next_seq()
        await store.publish(numbered(first, "news"), [])
        outcomes = await gatherResults([
            store.put_topics([TopicRecord("a", "a")]),
            store.publish(numbered(first, "other"), [("s:1", "ADD")]).addErrback(lambda f: f.trap(ValueError) and "dup"),
            store.publish(numbered(first + 1, "news"), [("s:1", "ADD"), ("s:1", "ADD"), ("t:1", "REPLACE")]),
        ])
        assert outcomes[1:] == ["dup", first + 1]
        assert [r.key for r in await store.load_topics()] == ["a"]
        assert [(d.seq, d.change) for d in await store.pending("t:1", 10)] == [(first + 1, "REPLACE")]
        before = store.batches
        calls = [store.publish(numbered(first + 2 + i, "bench"), [("s:1", "ADD")]) for i in range(500)]
        assert not any(d.called for d in calls)
        await gatherResults(calls)
        assert store.batches - before <= 5
        assert await store.count_messages(["bench"]) == 500
    finally:
        await store.close()


@pytest.mark.slow  # a PostgreSQL server of its own (initdb), stopped and started again
@pytest_twisted.ensureDeferred
async def test_a_store_opened_while_the_server_is_down_waits_for_it(own_postgres):
    """A node started during an outage: open() and the calls made meanwhile wait (nothing
    fails) and go out, in order, once the server is up."""
    url = own_postgres.create_database()
    own_postgres.stop()
    store = PostgreSQLStore(url, connection_info(url), reactor)
    opening = store.open()
    try:
        first = store.next_seq()
        put = store.put_topics([TopicRecord("news", "News")])
        loaded = store.load_topics()
        for _ in range(20):
            await deferLater(reactor, 0, lambda: None)
        assert not any(d.called for d in (opening, first, put, loaded))
        own_postgres.start()
        await opening
        assert await first >= 1 and await put is None
        assert [r.key for r in await loaded] == ["news"]
        assert store.available
    finally:
        await store.close()
    nowhere = "postgresql://x@127.0.0.1:1/none"  # closed before it ever connected
    closed_early = PostgreSQLStore(nowhere, connection_info(nowhere), reactor)
    waiting = closed_early.open()
    call = closed_early.load_topics()
    await closed_early.close()
    with pytest.raises(StoreClosed):
        await waiting
    with pytest.raises(StoreClosed):
        await call

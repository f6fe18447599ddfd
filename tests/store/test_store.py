"""The store contract, run against every store (StoreContract), plus what only the SQLite
store promises: durability across reopening, group commit, isolation of a failing
operation inside a batch, and the schema version."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults

from brokerd.store.memory import MemoryStore, StoreClosed
from brokerd.store.records import Contact, MessageRecord, SubscriptionRecord, TopicRecord
from brokerd.store.sqlite import FILENAME, MIGRATIONS, SQLiteStore


def topic(key: str, **fields: object) -> TopicRecord:
    return TopicRecord(key=key, name=key.rsplit("/", 1)[-1], **fields)  # type: ignore[arg-type]


def message(smuid: str, topic_key: str = "news", data: bytes = b"x") -> MessageRecord:
    return MessageRecord(smuid, topic_key, "alice:c1", "A1", 1000.0, None, 1, data)


class StoreContract:
    """Every test gets a fresh, open ``store``."""

    @pytest_twisted.ensureDeferred
    async def test_meta(self, store):
        assert await store.get_meta("suid") is None
        await store.set_meta("suid", "host/1")
        await store.set_meta("suid", "host/2")
        assert await store.get_meta("suid") == "host/2"

    @pytest_twisted.ensureDeferred
    async def test_topics_load_in_key_order_with_every_field(self, store):
        full = TopicRecord("stocks/ibm", "IBM", ("BIG BLUE", "IBM"), "ONE", "stocks/quotes/ibm",
                           "alice", 12.5, True)
        await store.put_topics([topic("stocks"), full])
        await store.put_topics([topic("news")])
        loaded = await store.load_topics()
        assert [r.key for r in loaded] == ["news", "stocks", "stocks/ibm"]
        assert loaded[2] == full

    @pytest_twisted.ensureDeferred
    async def test_put_replaces_and_delete_counts(self, store):
        await store.put_topics([topic("a"), topic("b")])
        await store.put_topics([topic("a", keywords=("K",))])
        assert [r.keywords for r in await store.load_topics()] == [("K",), ()]
        assert await store.delete_topics(["a", "zzz"]) == 1
        assert [r.key for r in await store.load_topics()] == ["b"]

    @pytest_twisted.ensureDeferred
    async def test_delete_many_topics(self, store):
        keys = [f"t{i}" for i in range(1200)]
        await store.put_topics([topic(k) for k in keys])
        assert await store.delete_topics(keys) == 1200
        assert await store.load_topics() == []

    @pytest_twisted.ensureDeferred
    async def test_rename_moves_rows(self, store):
        await store.put_topics([topic("a"), topic("a/b"), topic("c")])
        await store.rename_topics([("a", topic("x")), ("a/b", topic("x/b"))])
        assert [r.key for r in await store.load_topics()] == ["c", "x", "x/b"]

    @pytest_twisted.ensureDeferred
    async def test_contacts(self, store):
        assert await store.get_contact("alice") is None
        await store.set_contact("alice", Contact("text/x-vcard", b"begin:vcard\r\nend:vcard"))
        await store.set_contact("alice", Contact("text/x-vcard", b"v2"))
        assert await store.get_contact("alice") == Contact("text/x-vcard", b"v2")

    @pytest_twisted.ensureDeferred
    async def test_messages(self, store):
        first = await store.add_message(message("h/1", data=b"\x00\r\n."))
        second = await store.add_message(message("h/2"))
        await store.add_message(message("h/3", "other"))
        assert second > first
        listed = await store.list_messages("news")
        assert [(m.smuid, m.seq) for m in listed] == [("h/1", first), ("h/2", second)]
        assert listed[0].data == b"\x00\r\n."
        assert await store.count_messages(["news", "other", "none"]) == 3
        assert await store.remove_message("news", "h/1") is True
        assert await store.remove_message("news", "h/1") is False
        assert await store.count_messages(["news"]) == 1

    @pytest_twisted.ensureDeferred
    async def test_duplicate_smuid_fails_and_changes_nothing(self, store):
        await store.add_message(message("h/1"))
        with pytest.raises(ValueError):
            await store.add_message(message("h/1", "other"))
        assert await store.count_messages(["news", "other"]) == 1

    @pytest_twisted.ensureDeferred
    async def test_subscriptions(self, store):
        a = SubscriptionRecord("alice:c1", "MESSAGE", "news", ("ADD",), 5.0, 9.0)
        await store.put_subscription(a)
        await store.put_subscription(SubscriptionRecord("alice:c1", "MESSAGE", "news", ("ADD", "DELETE")))
        await store.put_subscription(SubscriptionRecord("alice:c2", "MESSAGE", "news"))
        await store.put_subscription(SubscriptionRecord("bob:c1", "TOPIC", "news"))
        mine = await store.subscriptions_of("alice:c1")
        assert mine == [SubscriptionRecord("alice:c1", "MESSAGE", "news", ("ADD", "DELETE"))]
        assert await store.count_subscribers(["news"]) == 2
        assert await store.remove_subscription("alice:c2", "MESSAGE", "news") is True
        assert await store.remove_subscription("alice:c2", "MESSAGE", "news") is False
        assert await store.count_subscribers(["news", "other"]) == 1

    @pytest_twisted.ensureDeferred
    async def test_calls_take_effect_in_order(self, store):
        results = await gatherResults([
            store.put_topics([topic("a")]),
            store.load_topics(),
            store.delete_topics(["a"]),
            store.load_topics(),
        ])
        assert [r.key for r in results[1]] == ["a"]
        assert results[2] == 1
        assert results[3] == []

    @pytest_twisted.ensureDeferred
    async def test_closed_store_refuses_calls(self, store):
        await store.close()
        await store.close()
        with pytest.raises(StoreClosed):
            await store.load_topics()


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        store = MemoryStore()
        store.open()
        return store


@pytest_twisted.async_yield_fixture
async def sqlite_store(tmp_path: Path):
    store = SQLiteStore(tmp_path / FILENAME, reactor)
    await store.open()
    yield store
    await store.close()


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, sqlite_store):
        return sqlite_store

    @pytest_twisted.ensureDeferred
    async def test_survives_reopening(self, tmp_path):
        path = tmp_path / "reopen" / FILENAME
        first = SQLiteStore(path, reactor)
        await first.open()
        await first.put_topics([topic("news", keywords=("A",))])
        await first.set_contact("alice", Contact("text/x-vcard", b"v"))
        await first.add_message(message("h/1"))
        await first.close()
        second = SQLiteStore(path, reactor)
        await second.open()
        try:
            assert [r.keywords for r in await second.load_topics()] == [("A",)]
            assert await second.get_contact("alice") == Contact("text/x-vcard", b"v")
            assert await second.count_messages(["news"]) == 1
        finally:
            await second.close()
        version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
        assert version == len(MIGRATIONS)

    @pytest_twisted.ensureDeferred
    async def test_calls_made_together_share_transactions(self, store):
        before = store.batches
        await gatherResults([store.put_topics([topic(f"t{i}")]) for i in range(200)])
        assert store.batches - before <= 3
        assert len(await store.load_topics()) == 200

    @pytest_twisted.ensureDeferred
    async def test_a_failing_operation_does_not_undo_its_batch(self, store):
        await store.add_message(message("h/1"))
        outcomes = await gatherResults([
            store.put_topics([topic("a")]),
            store.add_message(message("h/1")).addErrback(lambda f: f.trap(ValueError) and "dup"),
            store.put_topics([topic("b")]),
        ])
        assert outcomes[1] == "dup"
        assert [r.key for r in await store.load_topics()] == ["a", "b"]

    @pytest_twisted.ensureDeferred
    async def test_newer_schema_is_refused(self, tmp_path):
        path = tmp_path / FILENAME
        connection = sqlite3.connect(path)
        connection.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
        connection.close()
        store = SQLiteStore(path, reactor)
        with pytest.raises(RuntimeError, match="newer"):
            await store.open()
        await store.close()

    def test_close_before_open_is_harmless(self, tmp_path):
        store = SQLiteStore(tmp_path / FILENAME, reactor)
        assert store.close().called

"""The store contract, run against every store (StoreContract: memory, SQLite, PostgreSQL),
what both on-disk stores promise (DurableContract: retained messages are there after reopening),
plus what only the SQLite store promises: durability across reopening, group commit, isolation
of a failing operation inside a batch, and the schema version."""
from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from twisted.internet.task import deferLater

from brokerd.core import stored
from brokerd.core.message import MULTICAST, Details, Message
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.core.subscriber import SubscriberId
from brokerd.store.memory import MemoryStore, StoreClosed
from brokerd.store.pg_schema import SCHEMA, SCHEMA_VERSION
from brokerd.store.pg_writer import connection_info
from brokerd.store.postgresql import PostgreSQLStore
from brokerd.store.records import (
    Contact,
    MessageRecord,
    PacketFlow,
    SubscriptionRecord,
    TopicRecord,
)
from brokerd.store.sqlite import FILENAME, MIGRATIONS, SQLiteStore


def topic(key: str, **fields: object) -> TopicRecord:
    return TopicRecord(key=key, name=key.rsplit("/", 1)[-1], **fields)  # type: ignore[arg-type]


OLD_OWNED = "mqtt/account/alice/dev%2F1/000000000001.0000.1"
"""An MQTT session's subscriber as stored before the names had their encoding's tag."""
OLD_NAMES = (OLD_OWNED, "bridge/service/sys%2Fbridge%2Fb/b/1", "bob:c1", "bob:link_beta", "~beta")


def insert_old_subscribers(connection, marker: str) -> None:
    """A subscription, a pending delivery (of one stored message) and a packet flow for each of
    OLD_NAMES, as the previous schema wrote them (``marker``: the driver's placeholder)."""
    values = ", ".join([marker] * 6)
    connection.execute(f"INSERT INTO messages (seq, smuid, topic, publisher, cmuid, received, expires, priority,"
                       f" data) VALUES (7, 's/7', 'news', 'p', '', 1.0, NULL, 1, {marker})", (b"x",))
    for name in OLD_NAMES:
        connection.execute(f"INSERT INTO subscriptions VALUES ({values})", (name, "FILTER", "news", "ADD", None, None))
        connection.execute(f"INSERT INTO deliveries VALUES ({marker}, 7, 0, 0, 'ADD')", (name,))
        connection.execute(f"INSERT INTO flows VALUES ({marker}, {marker}, 1, 7, {marker})", (name, False, False))


async def assert_tagged(store) -> None:
    """The store opened over insert_old_subscribers' rows names the owned ones by SubscriberId."""
    owned = SubscriberId(Principal("alice", ACCOUNT), "mqtt", "dev/1", "000000000001.0000.1")
    expected = [owned.encode(), "@1/bridge/service/sys%2Fbridge%2Fb/b/1", "bob:c1", "bob:link_beta", "~beta"]
    assert SubscriberId.decode(expected[0]) == owned
    assert sorted(record.subscriber for record in await store.load_subscriptions()) == sorted(expected)
    for name in expected:
        assert [delivery.seq for delivery in await store.pending(name, 10)] == [7], name
        assert [flow.packet_id for flow in await store.flows_of(name)] == [1], name
    assert await store.pending(OLD_OWNED, 10) == []


def message(smuid: str, topic_key: str = "news", data: bytes = b"x") -> MessageRecord:
    return MessageRecord(smuid, topic_key, "alice:c1", "A1", 1000.0, None, 1, data)


def numbered(seq: int, topic_key: str, priority: int = 1, mode: str = "ALL", receipt: str = "NONE",
             expires: float | None = None, received: float = 1.0) -> MessageRecord:
    return MessageRecord(f"h/{seq}", topic_key, "alice:c1", f"C{seq}", received, expires, priority, b"d",
                         seq, mode, receipt)


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
    async def test_topic_timeouts(self, store):
        """None: the topic sets none (it inherits); seconds; math.inf: INFINITE."""
        await store.put_topics([topic("a"), topic("b", timeout=1.5), topic("c", timeout=math.inf)])
        assert [r.timeout for r in await store.load_topics()] == [None, 1.5, math.inf]
        await store.put_topics([topic("b")])
        await store.rename_topics([("c", topic("d", timeout=math.inf))])
        assert [(r.key, r.timeout) for r in await store.load_topics()] == [("a", None), ("b", None), ("d", math.inf)]

    @pytest_twisted.ensureDeferred
    async def test_deleting_topics_drops_the_given_subscriptions(self, store):
        await store.put_topics([topic("a"), topic("a/b"), topic("c")])
        for record in (SubscriptionRecord("x:1", "MESSAGE", "a/b"), SubscriptionRecord("x:1", "TOPIC", "a/*"),
                       SubscriptionRecord("y:1", "MESSAGE", "a/b"), SubscriptionRecord("y:1", "MESSAGE", "c")):
            await store.put_subscription(record)
        doomed = [("x:1", "MESSAGE", "a/b"), ("x:1", "TOPIC", "a/*"), ("y:1", "MESSAGE", "a/b"), ("z:1", "TOPIC", "a")]
        assert await store.delete_topics(["a", "a/b"], doomed) == 2
        assert [(r.subscriber, r.topic) for r in await store.load_subscriptions()] == [("y:1", "c")]
        assert [r.key for r in await store.load_topics()] == ["c"]

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
        listed = await store.get_messages("news")
        assert [(m.message_id, m.seq) for m in listed] == [("h/1", first), ("h/2", second)]
        assert await store.list_messages("news") == [first, second]
        assert [m.seq for m in await store.get_messages("news", limit=1)] == [first]
        assert [m.seq for m in await store.get_messages("news", [second, first], limit=1)] == [first]
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
    async def test_publish_many_stores_each_with_its_deliveries_or_none_of_them(self, store):
        first = await store.next_seq()
        seqs = await store.publish_many([(numbered(first, "news"), [("s:1", "ADD"), ("s:2", "ADD")]),
                                         (numbered(first + 1, "news"), [("s:1", "ADD")])])
        assert seqs == [first, first + 1]
        assert [d.seq for d in await store.pending("s:1", 10)] == [first, first + 1]
        assert [d.seq for d in await store.pending("s:2", 10)] == [first]
        with pytest.raises(ValueError):  # the second repeats a stored message: neither is kept
            await store.publish_many([(numbered(first + 2, "news"), [("s:3", "ADD")]),
                                      (numbered(first, "news"), [("s:3", "ADD")])])
        assert await store.pending("s:3", 10) == []
        assert await store.count_messages(["news"]) == 2

    @pytest_twisted.ensureDeferred
    async def test_publish_many_stores_a_long_run_whole_or_not_at_all(self, store):
        """A run of 150 messages with two subscribers each is kept whole, in order; a run with
        a duplicate as its last message keeps none of them."""
        first = await store.next_seq()
        count = 150
        run = [(numbered(first + i, "news"), [("s:1", "ADD"), ("s:2", "ADD")]) for i in range(count)]
        assert await store.publish_many(run) == [first + i for i in range(count)]
        for subscriber in ("s:1", "s:2"):
            pending = await store.pending(subscriber, 1000)
            assert [d.seq for d in pending] == [first + i for i in range(count)]
            assert [d.data for d in pending] == [record.data for record, _ in run]
        again = [(numbered(first + count + i, "news"), [("s:3", "ADD")]) for i in range(count)]
        with pytest.raises(ValueError):
            await store.publish_many(again + [(numbered(first, "news"), [("s:3", "ADD")])])
        assert await store.pending("s:3", 1000) == []
        assert await store.count_messages(["news"]) == count

    @pytest_twisted.ensureDeferred
    async def test_flows_are_kept_per_subscriber_direction_and_packet_id(self, store):
        """QoS 2 exchanges under way: put (replacing the same subscriber, direction and
        Packet Identifier), listed inbound first then in seq order, removed one by one or all
        of a subscriber at once; another subscriber's stay."""
        await store.put_flows([PacketFlow("m/1", False, 9, 20), PacketFlow("m/1", False, 3, 10),
                               PacketFlow("m/1", True, 9), PacketFlow("m/2", True, 9)])
        await store.put_flows([PacketFlow("m/1", False, 9, 20, released=True)])
        assert await store.flows_of("m/1") == [PacketFlow("m/1", True, 9), PacketFlow("m/1", False, 3, 10),
                                               PacketFlow("m/1", False, 9, 20, released=True)]
        assert await store.remove_flow("m/1", False, 3) is True
        assert await store.remove_flow("m/1", False, 3) is False
        assert await store.drop_flows("m/1") == 2
        assert await store.flows_of("m/1") == []
        assert await store.flows_of("m/2") == [PacketFlow("m/2", True, 9)]

    @pytest_twisted.ensureDeferred
    async def test_publish_many_puts_its_flows_in_the_same_transaction(self, store):
        """A QoS 2 PUBLISH received is stored with the note that it was: both or neither."""
        first = await store.next_seq()
        await store.publish_many([(numbered(first, "news"), [("s:1", "ADD")])], [PacketFlow("m/1", True, 7)])
        assert await store.flows_of("m/1") == [PacketFlow("m/1", True, 7)]
        with pytest.raises(ValueError):  # a duplicate message: the flow is not kept either
            await store.publish_many([(numbered(first, "news"), [("s:1", "ADD")])], [PacketFlow("m/1", True, 8)])
        assert await store.flows_of("m/1") == [PacketFlow("m/1", True, 7)]

    @pytest_twisted.ensureDeferred
    async def test_subscriptions(self, store):
        a = SubscriptionRecord("alice:c1", "MESSAGE", "news", ("ADD",), 5.0, 9.0)
        await store.put_subscription(a)
        await store.put_subscription(SubscriptionRecord("alice:c1", "MESSAGE", "news", ("ADD", "DELETE")))
        await store.put_subscription(SubscriptionRecord("alice:c2", "MESSAGE", "news"))
        await store.put_subscription(SubscriptionRecord("bob:c1", "TOPIC", "news"))
        mine = await store.subscriptions_of("alice:c1")
        assert mine == [SubscriptionRecord("alice:c1", "MESSAGE", "news", ("ADD", "DELETE"))]
        assert {r.subscriber for r in await store.load_subscriptions() if r.kind == "MESSAGE"} == {"alice:c1", "alice:c2"}
        assert await store.remove_subscription("alice:c2", "MESSAGE", "news") is True
        assert await store.remove_subscription("alice:c2", "MESSAGE", "news") is False
        assert {r.subscriber for r in await store.load_subscriptions() if r.kind == "MESSAGE"} == {"alice:c1"}

    @pytest_twisted.ensureDeferred
    async def test_publish_pending_acknowledge_in_priority_order(self, store):
        first = await store.next_seq()
        await store.publish(numbered(first, "news", priority=1), [("bob:c1", "ADD"), ("eve:c1", "ADD")])
        await store.publish(numbered(first + 1, "news", priority=5), [("bob:c1", "REPLACE")])
        await store.publish(numbered(first + 2, "other"), [("bob:c1", "ADD")])
        assert await store.next_seq() == first + 3
        pending = await store.pending("bob:c1", 10)
        assert [(d.seq, d.change) for d in pending] == [(first + 1, "REPLACE"), (first, "ADD"), (first + 2, "ADD")]
        assert pending[0].data == b"d" and pending[0].mode == "ALL"
        assert [d.seq for d in await store.pending("bob:c1", 10, ["other"])] == [first + 1, first]
        assert [d.seq for d in await store.pending("bob:c1", 1)] == [first + 1]
        assert [d.seq for d in await store.pending("bob:c1", 10, skip=[first + 1])] == [first, first + 2]
        # a byte budget: the messages before the one past it, always at least one
        assert [d.seq for d in await store.pending("bob:c1", 10, max_bytes=2)] == [first + 1, first]
        assert [d.seq for d in await store.pending("bob:c1", 10, max_bytes=1)] == [first + 1]
        assert [d.seq for d in await store.pending("bob:c1", 10, max_bytes=0)] == [first + 1]
        settled = await store.acknowledge("bob:c1", first + 1)
        assert settled.seq == first + 1 and settled.released == () and settled.receipt is None
        assert await store.acknowledge("bob:c1", first + 1) is None
        assert [d.seq for d in await store.pending("bob:c1", 10)] == [first, first + 2]
        with pytest.raises(ValueError):
            await store.publish(numbered(first, "news"), [])

    @pytest_twisted.ensureDeferred
    async def test_pending_counts_of_the_subscribers_under_a_prefix(self, store):
        first = await store.next_seq()
        for offset in range(3):
            await store.publish(numbered(first + offset, "news"), [("mqtt/a/x/1/i", "ADD"), ("bob:c1", "ADD")])
        await store.publish(numbered(first + 3, "jobs", mode="ONE"), [("mqtt/a/x/2/i", "ADD"), ("bob:c1", "ADD")])
        await store.publish(numbered(first + 4, "old"), [("mqtt/a/x/2/i", "ADD")])
        assert await store.pending_counts("mqtt/") == {"mqtt/a/x/1/i": 3, "mqtt/a/x/2/i": 2}
        await store.acknowledge("mqtt/a/x/1/i", first)  # acknowledged
        await store.acknowledge("bob:c1", first + 3)  # a ONE message another took
        await store.trash_message(first + 4, 10.0)  # in the Trash
        assert await store.pending_counts("mqtt/") == {"mqtt/a/x/1/i": 2}
        assert await store.pending_counts("bob:") == {"bob:c1": 3}
        assert await store.pending_counts("nobody/") == {}

    @pytest_twisted.ensureDeferred
    async def test_one_delivery_receipts_and_give_up(self, store):
        seq = await store.next_seq()
        await store.publish(numbered(seq, "jobs", mode="ONE", receipt="ONE"), [("a:1", "ADD"), ("b:1", "ADD")])
        settled = await store.acknowledge("b:1", seq)
        assert settled.released == ("a:1",)
        assert (settled.receipt.acked, settled.receipt.total) == (1, 2)
        assert await store.pending("a:1", 10) == []
        await store.backfill("c:1", ["jobs"], None, 0.0)
        assert await store.pending("c:1", 10) == []  # a settled ONE message is done
        seq2 = await store.next_seq()
        await store.publish(numbered(seq2, "all", receipt="ALL"), [("a:1", "ADD"), ("b:1", "ADD")])
        assert (await store.acknowledge("a:1", seq2)).receipt is None
        assert await store.attempt("b:1", seq2) == 1
        assert await store.attempt("b:1", seq2) == 2
        assert await store.attempt("nobody", seq2) == 0
        gave_up = await store.give_up("b:1", seq2, 50.0)
        assert gave_up.trashed and (gave_up.receipt.acked, gave_up.receipt.total) == (1, 2)
        assert await store.count_messages(["all/trash"]) == 1
        assert (await store.find_message(seq2)).trashed == 50.0

    @pytest_twisted.ensureDeferred
    async def test_expire_trash_empty_and_backfill_since(self, store):
        seq = await store.next_seq()
        await store.publish(numbered(seq, "news", expires=10.0, received=1.0), [("bob:c1", "ADD")])
        await store.publish(numbered(seq + 1, "news", expires=None, received=5.0), [])
        await store.publish(numbered(seq + 2, "news", expires=None, received=7.0), [])
        assert await store.backfill("eve:c1", ["news"], 5.0, 2.0) == 2
        assert [d.seq for d in await store.pending("eve:c1", 10)] == [seq + 1, seq + 2]
        assert await store.backfill("eve:c1", ["news"], 6.0, 2.0) == 0
        assert [d.seq for d in await store.pending("eve:c1", 10)] == [seq + 2]
        assert await store.drop_pending("eve:c1", ["news"]) == 1
        assert await store.expire(9.0, 10) == []
        [settled] = await store.expire(10.0, 10)
        assert settled.trashed and settled.released == ("bob:c1",) and settled.topic == "news"
        assert await store.pending("bob:c1", 10) == []
        assert [m.seq for m in await store.get_messages("news/trash")] == [seq]
        assert [m.seq for m in await store.get_messages("news", [seq + 2, 999])] == [seq + 2]
        assert await store.empty_trash(9.0) == 0
        assert await store.empty_trash(10.0) == 1
        assert await store.find_message(seq) is None

    @pytest_twisted.ensureDeferred
    async def test_move_trash_delete_and_load_subscriptions(self, store):
        seq = await store.next_seq()
        await store.publish(numbered(seq, "a"), [("x:1", "ADD"), ("y:1", "ADD")])
        await store.acknowledge("y:1", seq)
        moved = await store.move_message(seq, "b", [("y:1", "ADD"), ("z:1", "ADD")])
        assert moved.released == ("x:1",) and moved.topic == "a"
        assert [d.seq for d in await store.pending("z:1", 10)] == [seq]
        assert await store.pending("y:1", 10) == []  # acknowledged before the move
        trashed = await store.trash_message(seq, 3.0)
        assert trashed.released == ("z:1",) and await store.trash_message(seq, 3.0) is None
        assert await store.move_message(seq, "c", []) is None
        assert await store.delete_message(seq) is True
        await store.put_subscription(SubscriptionRecord("x:1", "MESSAGE", "a/*", ("ADD",)))
        assert [r.topic for r in await store.load_subscriptions()] == ["a/*"]

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
    async def test_a_stored_message_is_kept_byte_for_byte(self, store):
        """The durable service's rows hold a stored Message (binary, with NUL bytes): the
        pending delivery and the message read back give the same bytes."""
        kept = Message(MULTICAST, b"news", b"\x00\r\n.\r\n\xff", "ssmp", b"sam", True,
                       details=Details(message_id="h/3"))
        data = stored.encode(kept)
        seq = await store.next_seq()
        record = MessageRecord("h/3", "news", "ssmp:sam", "", 5.0, None, 1, data, seq)
        await store.publish(record, [("bob:1", "ADD")])
        [delivery] = await store.pending("bob:1", 10)
        assert delivery.data == data and (await store.find_message(seq)).data == data
        assert stored.decode(delivery.data).payload == kept.payload

    @pytest_twisted.ensureDeferred
    async def test_retained_messages_put_replace_delete(self, store):
        assert await store.load_retained() == []
        await store.put_retained("a/b", b"first")
        await store.put_retained("a/c", b"\x00\r\n.\xff")
        await store.put_retained("a/b", b"second")  # replaces
        assert await store.load_retained() == [("a/b", b"second"), ("a/c", b"\x00\r\n.\xff")]
        await store.put_retained("a/b", None)  # deletes
        await store.put_retained("never/there", None)  # nothing to delete: no error
        assert await store.load_retained() == [("a/c", b"\x00\r\n.\xff")]
        await store.put_retained("a/b", b"again")
        assert await store.load_retained() == [("a/b", b"again"), ("a/c", b"\x00\r\n.\xff")]

    @pytest_twisted.ensureDeferred
    async def test_retained_messages_load_in_topic_order(self, store):
        """By code point, as Python sorts str, whatever the database's collation: ``/`` before
        ``0``, capitals before small letters, accented letters after ``z``."""
        topics = ["z", "a0", "a/b", "a", "B", "\u00e9t\u00e9", "a/b/c", "$SYS/x", "", "\u65e5\u672c"]
        for number, name in enumerate(topics):
            await store.put_retained(name, b"%d" % number)
        loaded = await store.load_retained()
        assert [name for name, _data in loaded] == sorted(topics)
        assert dict(loaded) == {name: b"%d" % number for number, name in enumerate(topics)}

    @pytest_twisted.ensureDeferred
    async def test_retained_calls_take_effect_in_order(self, store):
        results = await gatherResults([
            store.put_retained("t", b"1"),
            store.load_retained(),
            store.put_retained("t", None),
            store.load_retained(),
            store.put_retained("t", b"2"),
            store.put_retained("t", b"3"),
            store.load_retained(),
        ])
        assert results[1] == [("t", b"1")] and results[3] == [] and results[6] == [("t", b"3")]

    @pytest_twisted.ensureDeferred
    async def test_a_retained_message_is_kept_in_its_stored_form(self, store):
        kept = Message(MULTICAST, b"sensors/t", b"\x00 21.5", "mqtt", b"probe", True, details=Details(qos=1))
        await store.put_retained("sensors/t", stored.encode(kept))
        [(name, data)] = await store.load_retained()
        back = stored.decode(data)
        assert name == "sensors/t" and (back.target, back.payload, back.qos) == (b"sensors/t", b"\x00 21.5", 1)

    @pytest_twisted.ensureDeferred
    async def test_message_properties_survive_the_store_pending_and_retained(self, store):
        """A request's properties (MQTT 5's; docs/architecture.md) come back whole from a
        pending delivery and from the retained messages: user properties in their order, a
        repeated name twice, correlation bytes that are not UTF-8."""
        details = Details(qos=1, content_type="application/json", expires=4000.5, response_topic="replies/c1",
                          correlation=b"\x00\xffid-7", payload_format=1,
                          user_properties=(("b", "2"), ("a", "1"), ("b", "\u00e9t\u00e9")))
        kept = Message(MULTICAST, b"requests", b'{"n": 1}', "mqtt", b"c1", False, details=details)
        seq = await store.next_seq()
        await store.publish(MessageRecord("h/9", "requests", "mqtt:c1", "", 5.0, None, 1, stored.encode(kept), seq),
                            [("bob:1", "ADD")])
        await store.put_retained("requests", stored.encode(kept))
        [delivery] = await store.pending("bob:1", 10)
        [(_name, retained)] = await store.load_retained()
        for data in (delivery.data, retained):
            back = stored.decode(data)
            assert back.details == details and back.user_properties == details.user_properties
            assert (back.payload, back.sender_name) == (b'{"n": 1}', b"c1")

    @pytest_twisted.ensureDeferred
    async def test_closed_store_refuses_calls(self, store):
        await store.close()
        await store.close()
        with pytest.raises(StoreClosed):
            await store.load_topics()
        with pytest.raises(StoreClosed):
            await store.put_retained("t", b"x")


class DurableContract:
    """What the on-disk stores promise: a new store on the same data (``reopened()``) finds
    everything the closed one committed."""

    @pytest_twisted.ensureDeferred
    async def test_retained_messages_survive_reopening(self, store, reopened):
        await store.put_retained("a/b", b"1")
        await store.put_retained("a/c", b"2")
        await store.put_retained("z", b"\x00")
        await store.put_retained("a/b", b"3")
        await store.put_retained("a/c", None)
        await store.close()
        again = reopened()
        await again.open()
        try:
            assert await again.load_retained() == [("a/b", b"3"), ("z", b"\x00")]
            await again.put_retained("z", None)
        finally:
            await again.close()
        third = reopened()
        await third.open()
        try:
            assert await third.load_retained() == [("a/b", b"3")]
        finally:
            await third.close()


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


@pytest_twisted.async_yield_fixture
async def postgresql_store(postgres_url):
    store = PostgreSQLStore(postgres_url, connection_info(postgres_url), reactor)
    await store.open()
    yield store
    await store.close()


class TestPostgreSQLStore(StoreContract, DurableContract):
    """Tests of what only PostgreSQL adds (nodes racing, outages): tests/store/test_postgresql.py."""

    @pytest.fixture
    def store(self, postgresql_store):
        return postgresql_store

    @pytest.fixture
    def reopened(self, postgres_url):
        return lambda: PostgreSQLStore(postgres_url, connection_info(postgres_url), reactor)

    @pytest_twisted.ensureDeferred
    async def test_a_version_1_database_is_migrated(self, postgres_url):
        """Version 2 adds the retained messages' table: a database of version 1 (without it)
        gets it in place, keeps its rows, and its version is raised."""
        import psycopg

        with psycopg.connect(postgres_url) as connection:
            for statement in SCHEMA.split(";"):
                if "retained" not in statement and "flows" not in statement:
                    connection.execute(statement)
            connection.execute("INSERT INTO brokerd_schema (version) VALUES (1)")
            connection.execute("INSERT INTO topics VALUES ('news', 'News', '[]', 'ALL', NULL, 'alice', 5.0, FALSE, NULL)")
        store = PostgreSQLStore(postgres_url, connection_info(postgres_url), reactor)
        await store.open()
        try:
            assert [r.key for r in await store.load_topics()] == ["news"]
            assert await store.load_retained() == []
            await store.put_retained("news", b"kept")
            assert await store.load_retained() == [("news", b"kept")]
            await store.put_flows([PacketFlow("m/1", True, 1)])
            assert await store.flows_of("m/1") == [PacketFlow("m/1", True, 1)]
        finally:
            await store.close()
        with psycopg.connect(postgres_url) as connection:
            assert connection.execute("SELECT version FROM brokerd_schema").fetchall() == [(SCHEMA_VERSION,)] == [(4,)]

    @pytest_twisted.ensureDeferred
    async def test_a_version_3_database_s_owned_subscribers_get_their_encoding_s_tag(self, postgres_url):
        """Version 4 tags the names of owned durable subscribers (brokerd.core.subscriber):
        the rows of a version 3 database name them as before; channels and queues keep theirs."""
        import psycopg

        with psycopg.connect(postgres_url) as connection:
            for statement in SCHEMA.split(";"):
                connection.execute(statement)
            connection.execute("INSERT INTO brokerd_schema (version) VALUES (3)")
            insert_old_subscribers(connection, "%s")
        store = PostgreSQLStore(postgres_url, connection_info(postgres_url), reactor)
        await store.open()
        try:
            await assert_tagged(store)
        finally:
            await store.close()


class TestSQLiteStore(StoreContract, DurableContract):
    @pytest.fixture
    def store(self, sqlite_store):
        return sqlite_store

    @pytest.fixture
    def reopened(self, sqlite_store):
        return lambda: SQLiteStore(sqlite_store.path, reactor)

    @pytest_twisted.ensureDeferred
    async def test_a_retained_message_is_committed_when_its_deferred_fires(self, store):
        reader = sqlite3.connect(store.path)  # another connection: it sees committed rows only
        try:
            await store.put_retained("t", b"x")
            assert reader.execute("SELECT topic, data FROM retained").fetchall() == [("t", b"x")]
            await store.put_retained("t", None)
            assert reader.execute("SELECT COUNT(*) FROM retained").fetchone() == (0,)
        finally:
            reader.close()

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
    async def test_publishes_made_together_share_a_commit_off_the_reactor(self, store):
        """Group commit: 500 concurrent publishes take a few transactions, and none of them is
        done when publish() returns (the work is queued for the writer thread)."""
        first = await store.next_seq()
        before = store.batches
        calls = [store.publish(numbered(first + i, "bench"), [("s:1", "ADD")]) for i in range(500)]
        assert not any(d.called for d in calls)
        await gatherResults(calls)
        assert store.batches - before <= 5
        assert await store.count_messages(["bench"]) == 500

    @pytest_twisted.ensureDeferred
    async def test_the_reactor_keeps_running_while_the_store_writes(self, store):
        """Disk work is in the writer thread: while another connection holds the database's
        write lock, the store's transaction waits in that thread and the reactor goes on
        running other calls; they are counted, not timed."""
        first = await store.next_seq()
        blocker = sqlite3.connect(store.path, isolation_level=None, timeout=0)
        blocker.execute("BEGIN IMMEDIATE")  # the write lock: the store's next BEGIN waits
        try:
            targets = [(f"s:{n}", "ADD") for n in range(10)]
            calls = [store.publish(numbered(first + i, "lag"), targets) for i in range(100)]
            for _ in range(20):  # twenty trips through the reactor while the writer waits
                await deferLater(reactor, 0, lambda: None)
            assert not any(d.called for d in calls)
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        await gatherResults(calls)
        assert await store.count_messages(["lag"]) == 100

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
    async def test_a_failing_operation_is_undone_alone_even_after_it_wrote(self, store):
        """Operations run without a savepoint each; one that fails after a write of its own
        sends the batch again with savepoints: its write is undone, the others commit."""

        def half_done(c):
            c.execute("INSERT INTO meta (key, value) VALUES ('half', 'written')")
            raise ValueError("fails after its write")

        outcomes = await gatherResults([
            store.put_topics([topic("a")]),
            store._submit(half_done).addErrback(lambda f: f.trap(ValueError) and "failed"),
            store.set_meta("after", "kept"),
        ])
        assert outcomes[1] == "failed"
        assert [r.key for r in await store.load_topics()] == ["a"]
        assert await store.get_meta("half") is None
        assert await store.get_meta("after") == "kept"

    @pytest_twisted.ensureDeferred
    async def test_a_batch_that_succeeds_takes_no_savepoints(self, store):
        statements: list[str] = []
        await store.set_meta("warm", "up")
        store._connection.set_trace_callback(statements.append)
        try:
            await gatherResults([store.put_topics([topic(f"s{i}")]) for i in range(5)])
        finally:
            store._connection.set_trace_callback(None)
        assert any(s.startswith("INSERT OR REPLACE INTO topics") for s in statements)
        assert not [s for s in statements if "SAVEPOINT" in s.upper()]

    @pytest_twisted.ensureDeferred
    async def test_a_version_2_database_is_migrated(self, tmp_path):
        """Migration 3 adds the topics' timeout column: rows written by the previous schema
        load with no timeout (they inherit), and the new column is written from then on."""
        path = tmp_path / FILENAME
        connection = sqlite3.connect(path)
        for script in MIGRATIONS[:2]:
            connection.executescript(script)
        connection.execute("INSERT INTO topics VALUES ('news', 'News', '[\"K\"]', 'ONE', NULL, 'alice', 5.0, 0)")
        connection.execute("PRAGMA user_version=2")
        connection.commit()
        connection.close()
        store = SQLiteStore(path, reactor)
        await store.open()
        try:
            [loaded] = await store.load_topics()
            assert loaded == TopicRecord("news", "News", ("K",), "ONE", None, "alice", 5.0, False, None)
            await store.put_topics([TopicRecord("news", "News", timeout=60.0)])
            assert [r.timeout for r in await store.load_topics()] == [60.0]
        finally:
            await store.close()
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)

    @pytest_twisted.ensureDeferred
    async def test_a_version_3_database_is_migrated(self, tmp_path):
        """Migration 4 adds the retained messages' table: the rows of the previous schema stay,
        and retained messages are kept from then on."""
        path = tmp_path / FILENAME
        connection = sqlite3.connect(path)
        for script in MIGRATIONS[:3]:
            connection.executescript(script)
        connection.execute("INSERT INTO topics VALUES ('news', 'News', '[]', 'ALL', NULL, 'alice', 5.0, 0, 30.0)")
        connection.execute("PRAGMA user_version=3")
        connection.commit()
        connection.close()
        store = SQLiteStore(path, reactor)
        await store.open()
        try:
            assert [(r.key, r.timeout) for r in await store.load_topics()] == [("news", 30.0)]
            assert await store.load_retained() == []
            await store.put_retained("news", b"kept")
            assert await store.load_retained() == [("news", b"kept")]
        finally:
            await store.close()
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 6 == len(MIGRATIONS)

    @pytest_twisted.ensureDeferred
    async def test_a_version_5_database_s_owned_subscribers_get_their_encoding_s_tag(self, tmp_path):
        """Migration 6 tags the names of owned durable subscribers (brokerd.core.subscriber):
        a file written by the previous schema names them as before; channels and queues keep
        theirs."""
        path = tmp_path / FILENAME
        connection = sqlite3.connect(path)
        for script in MIGRATIONS[:5]:
            connection.executescript(script)
        insert_old_subscribers(connection, "?")
        connection.execute("PRAGMA user_version=5")
        connection.commit()
        connection.close()
        store = SQLiteStore(path, reactor)
        await store.open()
        try:
            await assert_tagged(store)
        finally:
            await store.close()

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

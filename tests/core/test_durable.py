"""The core's durable delivery: the stored form of a Message, DurableService over a store,
the router's durable stage (a Multicast's ``kept``), and a front end (SSMP) answering only
after the commit."""
from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from brokerd.core import stored
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService
from brokerd.core.message import MULTICAST, Details, Message, Part
from brokerd.core.publication import KEEP, Multicast, Unstored
from brokerd.events.outcome_lines import outcome_line, record_head
from brokerd.store.memory import MemoryStore
from brokerd.store.records import SubscriptionRecord, TopicRecord
from tests.protocols.ssmp.helpers import Harness


def _result(d: Deferred):
    results: list = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    return results[0]


def keep(broker: Broker, messages: list[Message], keeping: int = KEEP) -> Deferred | None:
    """Route ``messages`` as a front end does and return what the durable stage kept (the
    commit's Deferred, or None when nothing was kept)."""
    publication = Multicast(messages, keeping=keeping)
    broker.route(publication)
    return publication.kept


def test_a_stored_message_comes_back_with_every_field():
    text = Part("text/plain", (("Content-Type", "text/plain"), ("X-Part", "1")), b"hello")
    blob = Part("application/octet-stream", (("Content-Type", "application/octet-stream"),), b"\x00\xff")
    details = Details(content_type="text/plain", message_id="h/7(D1)", created=12.5, priority=3, expires=99.0,
                      attributes=(("Created", "D1"), ("Name", "n")), parts=(blob, text), qos=1, retained=True)
    message = Message(MULTICAST, b"caf\xc3\xa9/\xff", text.data, "smqp", b"alice:\xe9", False,
                      display_name=b"Zo\xc3\xab", details=details)
    back = stored.decode(stored.encode(message))
    for name in Message.__slots__:
        assert getattr(back, name) == getattr(message, name), name
    assert back.details.priority == 3 and back.parts == (blob, text)
    assert back.parts[1].data is back.payload  # the main part is stored once


def test_a_plain_message_round_trips_and_garbage_is_a_value_error():
    message = Message(MULTICAST, b"news", b"\x00\x01", "ssmp", b"sam", True)
    back = stored.decode(stored.encode(message))
    assert (back.payload, back.binary, back.parts, back.attributes, back.priority) == (b"\x00\x01", True, (), (), 1)
    data = stored.encode(message)
    for bad in (b"Created: D1\r\n\r\n", data[:-1], data + b"x", stored.TAG + b"\x00\x00\x00\x02{}"):
        with pytest.raises(ValueError):
            stored.decode(bad)
    assert not stored.is_stored_message(b"Created: D1") and stored.is_stored_message(data)


class CountingFormat:
    """A wire format that counts its renderings."""

    protocol = "test"

    def __init__(self) -> None:
        self.rendered = 0

    def render_message(self, message: Message) -> bytes:
        self.rendered += 1
        return b"<" + message.payload + b">"


class Outbox:
    """A connected durable session that records what it is offered."""

    closed = False

    def __init__(self, name: str, wire_format: CountingFormat | None = None) -> None:
        self.name = name
        self.offered: list = []
        self.volatile: list[bytes] = []
        self.wire_format = wire_format

    def offer_volatile(self, data: bytes) -> None:
        self.volatile.append(data)

    def offer(self, delivery) -> None:
        self.offered.append(delivery)

    def discard(self, seq: int) -> None:
        pass

    def reoffer(self, seq: int) -> None:
        pass

    def refresh(self) -> None:
        pass

    def recheck(self) -> None:
        pass


@pytest.fixture
def core():
    clock = Clock()
    clock.advance(1000)
    store = MemoryStore()
    store.open()
    broker = Broker()
    durable = broker.use_durable(DurableService(store, clock))
    _result(durable.start())
    return broker, durable, store


def test_keep_stores_for_durable_subscribers_only(core):
    broker, durable, store = core
    assert keep(broker, [Message(MULTICAST, b"news", b"early", "ssmp", b"sam")]) is None
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "news", ("ADD",)))
    durable.index.add(SubscriptionRecord("eve:1", "MESSAGE", "news", ("DELETE",)))  # takes no ADD
    online = Outbox("bob:1")
    durable.attach(online)
    durable.topics.put([TopicRecord("news", "news", timeout=60.0)])  # its default timeout
    kept = keep(broker, [Message(MULTICAST, b"news", b"m1", "ssmp", b"sam"),
                        Message(MULTICAST, b"news", b"m2", "ssmp", b"sam", details=Details(priority=5))])
    assert _result(kept) is None
    assert keep(broker, [Message(MULTICAST, b"sport", b"x", "ssmp", b"sam")]) is None
    assert [d.priority for d in online.offered] == [1, 5]
    pending = _result(store.pending("bob:1", 10))
    assert [(d.priority, stored.decode(d.data).payload) for d in pending] == [(5, b"m2"), (1, b"m1")]
    assert _result(store.pending("eve:1", 10)) == []
    first = _result(store.find_message(pending[1].seq))
    message = stored.decode(first.data)
    assert (first.publisher, first.topic, first.expires) == ("ssmp:sam", "news", 1060.0)
    assert message.message_id == first.message_id and message.created == 1000.0
    assert durable.stats["kept"] == 2


def test_a_topic_the_owner_does_not_open_to_others_is_not_kept(core):
    broker, durable, _store = core
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "accounts/bob", ("ADD",)))
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "news", ("ADD",)))
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "virtual", ("ADD",)))
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "absent", ("ADD",)))
    durable.topics.put([TopicRecord("accounts", "accounts", system=True),
                        TopicRecord("accounts/bob", "bob", system=True), TopicRecord("news", "news"),
                        TopicRecord("virtual", "virtual", link="news")])
    assert keep(broker, [Message(MULTICAST, b"accounts/bob", b"x", "ssmp", b"sam")]) is None  # a login topic
    assert keep(broker, [Message(MULTICAST, b"virtual", b"x", "ssmp", b"sam")]) is None  # a virtual topic
    assert keep(broker, [Message(MULTICAST, b"absent", b"x", "ssmp", b"sam")]) is None  # no such topic
    assert keep(broker, [Message(MULTICAST, b"news", b"x", "ssmp", b"sam")]) is not None


class SlowStore(MemoryStore):
    """A store whose publishes commit when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[Deferred, Deferred]] = []

    def publish(self, record, deliveries):
        inner = super().publish(record, deliveries)
        outer: Deferred = Deferred()
        self.commits.append((inner, outer))
        return outer

    def commit(self, fail: bool = False) -> None:
        inner, outer = self.commits.pop(0)
        if fail:
            inner.addErrback(lambda _: None)
            outer.errback(RuntimeError("disk full"))
        else:
            inner.chainDeferred(outer)


def test_ssmp_answers_a_durable_mcast_after_the_commit_and_in_order():
    h = Harness()
    store = SlowStore()
    store.open()
    durable = h.broker.use_durable(DurableService(store, h.clock))
    durable.topics.put([TopicRecord("news", "news")])
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "news", ("ADD",)))
    pub = h.login("pub")
    pub.send("MCAST other a\nMCAST news b\nSUBSCRIBE t\n")
    assert pub.take() == b""  # the first 200 waits too: replies stay in order
    pub.send("MCAST news c\n")
    assert pub.take() == b""
    store.commit()
    assert pub.take() == b"200\n200\n200\n"
    store.commit(fail=True)
    assert pub.take() == b"500\n"
    pub.send("MCAST other d\n")
    assert pub.take() == b"200\n"  # nothing waits: answered at once


class FailingStore(MemoryStore):
    """A store whose expiry and Trash calls fail with ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def expire(self, now: float, limit: int) -> Deferred:
        from twisted.internet.defer import fail

        return fail(self.error)

    def empty_trash(self, before: float) -> Deferred:
        from twisted.internet.defer import fail

        return fail(self.error)


def test_a_failing_sweep_logs_its_failure_readably_and_a_store_outage_not_at_all() -> None:
    from twisted.logger import capturedLogs, formatEvent

    from brokerd.store.base import StoreUnavailable

    with capturedLogs() as events:
        DurableService(FailingStore(RuntimeError("disk on fire")), Clock()).sweep()
        DurableService(FailingStore(RuntimeError("disk on fire")), Clock()).purge_dead_letters()
    texts = [formatEvent(event) for event in events]
    assert texts == ["Expiring stored messages", "Purging the dead letters"], texts
    assert all(event["log_failure"].check(RuntimeError) for event in events)
    with capturedLogs() as events:
        DurableService(FailingStore(StoreUnavailable("away")), Clock()).sweep()
        DurableService(FailingStore(StoreUnavailable("away")), Clock()).purge_dead_letters()
    assert list(events) == []  # the store logs its outage once, as a change of state


def test_a_message_never_stored_reaches_the_connected_durable_subscribers_once_each(core):
    """route(Unstored) (SMQP's Guarantee: NO): rendered once per wire format, handed to
    each connected durable subscriber of the topic and each explicit one, never to a link (it
    takes stored messages only), and nothing is stored for an offline subscriber."""
    broker, durable, store = core
    fmt = CountingFormat()
    for name in ("bob:1", "peer:link_beta", "dave:1", "eve:1"):
        durable.index.add(SubscriptionRecord(name, "MESSAGE", "news", ("ADD",)))
    sessions = {name: Outbox(name, fmt) for name in ("bob:1", "peer:link_beta", "carol:1", "eve:1")}
    for session in sessions.values():
        durable.attach(session)
    sessions["eve:1"].closed = True  # closing: gets nothing more
    message = Message(MULTICAST, b"news", b"hi", "smqp", b"alice:c1")
    assert broker.route(Unstored(message, ["carol:1"])) == 2
    assert sessions["bob:1"].volatile == [b"<hi>"] and sessions["carol:1"].volatile == [b"<hi>"]
    assert sessions["peer:link_beta"].volatile == [] and sessions["eve:1"].volatile == []
    assert fmt.rendered == 1
    assert _result(store.pending("dave:1", 10)) == []  # offline: nothing kept
    assert all(not session.offered for session in sessions.values())


class Events:
    """An IEventRecorder that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []

    def record(self, kind: str, protocol: str, **fields) -> None:
        self.records.append((kind, fields))


class CountingReads(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def find_message(self, seq: int):
        self.reads += 1
        return super().find_message(seq)


def test_a_message_no_longer_in_memory_is_read_once_for_its_outcome_events():
    """The delivery and the acknowledgement of a message published before the service's
    memory (a restart, a long backlog) both name its id and publisher: the first event
    reads it from the store, the second takes it from memory."""
    clock = Clock()
    clock.advance(1000)
    store = CountingReads()
    store.open()
    events = Events()
    durable = DurableService(store, clock, events)
    _result(durable.start())
    durable.topics.put([TopicRecord("news", "news")])  # the core keeps messages of a stored topic
    durable.index.add(SubscriptionRecord("bob:1", "MESSAGE", "news", ("ADD",)))
    _result(durable.keep([Message(MULTICAST, b"news", b"hello", "ssmp", b"sam")]))
    durable.published.clear()  # as after a restart
    [delivery] = _result(store.pending("bob:1", 10))
    session = Outbox("bob:1")
    session.session = "bob:1"
    durable.attach(session)
    durable.delivered(session, delivery)
    _result(durable.acknowledged(session, delivery))
    assert [kind for kind, _fields in events.records] == ["delivered", "acked"]
    for kind, fields in events.records:
        assert fields["sender"] == "ssmp:sam" and fields["bytes"] == 5
        assert fields["message_id"].startswith(durable.server_id + "/")
        # the shape the event log writes from its format (brokerd.events.outcome_lines)
        assert outcome_line(1, record_head("node", "durable", kind), fields) is not None
    assert store.reads == 1


class HeldTopicStore(MemoryStore):
    """A store whose topic reads and topic writes answer when the test says so (a read
    returns what was stored when it started, as a read racing a commit in PostgreSQL)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[list[TopicRecord], Deferred]] = []
        self.writes: list[tuple[list[TopicRecord], Deferred]] = []

    def load_topics(self) -> Deferred:
        d: Deferred = Deferred()
        self.reads.append((_result(super().load_topics()), d))
        return d

    def put_topics(self, records) -> Deferred:
        d: Deferred = Deferred()
        self.writes.append((list(records), d))
        return d

    def answer_read(self) -> None:
        records, d = self.reads.pop(0)
        d.callback(records)

    def answer_write(self) -> None:
        records, d = self.writes.pop(0)
        _result(super().put_topics(records))
        d.callback(None)


def held_topics_service() -> tuple[DurableService, HeldTopicStore, list[list[str]]]:
    store = HeldTopicStore()
    store.open()
    durable = DurableService(store, Clock())
    started = durable.start()
    store.answer_read()
    assert _result(started) is None
    applied: list[list[str]] = []
    durable.on_tree_changed = lambda records: applied.append([r.key for r in records])
    return durable, store, applied


def test_a_read_of_the_tree_that_predates_a_change_of_this_node_does_not_take_it_back():
    """Another node announces a change and the read starts; this node then creates a topic
    and the store commits it; the read, which started before, answers without it.  The
    topic must stay (a subscriber was told 200) and the tree is read once more."""
    durable, store, applied = held_topics_service()
    durable.announced(tree=True, subscribers=(), pending=())
    assert len(store.reads) == 1
    created = durable.put_topics([TopicRecord("room", "room")])
    store.answer_write()
    assert _result(created) is None and durable.topics.get("room") is not None
    store.answer_read()  # the stale read: no room in it
    assert applied == [] and durable.topics.get("room") is not None
    assert len(store.reads) == 1  # read again, after the change
    store.answer_read()
    assert applied == [["room"]] and durable.topics.get("room") is not None


def test_no_read_of_the_tree_is_applied_while_a_change_of_this_node_is_in_flight():
    durable, store, applied = held_topics_service()
    created = durable.put_topics([TopicRecord("room", "room")])
    durable.announced(tree=True, subscribers=(), pending=())
    assert store.reads == []  # it would predate the change: it waits for the answer
    store.answer_write()
    assert _result(created) is None
    assert len(store.reads) == 1
    store.answer_read()
    assert applied == [["room"]]
    durable.announced(tree=True, subscribers=(), pending=())  # with nothing in flight: read at once
    store.answer_read()
    assert applied == [["room"], ["room"]] and store.reads == []

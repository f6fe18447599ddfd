"""The core's retained messages (brokerd.core.retained): retaining, replacing and clearing,
matching by filter (wildcards, ``$`` topics) against testing every topic, the bounds, loading
from and writing through to the memory and SQLite stores (kept across a close and reopen), and
a failing store that costs one log line and no error."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail
from twisted.logger import globalLogPublisher

from brokerd.core import retained as retained_module
from brokerd.core import stored
from brokerd.core.filters import matches
from brokerd.core.message import MULTICAST, UNICAST, Details, Message, Part
from brokerd.core.retained import RetainedMessages, RetainRefused, size
from brokerd.errors import BrokerError
from brokerd.store.base import StoreUnavailable
from brokerd.store.memory import MemoryStore
from brokerd.store.sqlite import FILENAME, SQLiteStore
from tests.core.test_filters import FILTERS, TOPICS
from tests.support.examples import examples


def publish(topic: bytes, payload: bytes = b"x", **details: object) -> Message:
    return Message(MULTICAST, topic, payload, "mqtt", b"client-1",
                   details=Details(**details) if details else Details())  # type: ignore[arg-type]


def topics_of(messages: list[Message]) -> list[bytes]:
    return [m.target for m in messages]  # type: ignore[misc]


@pytest.fixture
def logged() -> Iterator[list[dict]]:
    """The events RetainedMessages logs during the test."""
    events: list[dict] = []

    def observe(event: dict) -> None:
        if event.get("log_namespace", "").startswith("brokerd.core.retained"):
            events.append(event)

    globalLogPublisher.addObserver(observe)
    yield events
    globalLogPublisher.removeObserver(observe)


# ---------------------------------------------------------------------- in memory


def test_retain_replace_and_clear_without_a_store():
    held = RetainedMessages()
    assert held.retain(publish(b"a/b", b"12345")) is None  # no store: nothing to wait for
    assert held.retain(publish(b"a/c", b"1")) is None
    assert len(held) == 2 and held.bytes == 12  # each topic's name counts with its payload
    replacement = publish(b"a/b", b"99")
    held.retain(replacement)
    assert held.get(b"a/b") is replacement and len(held) == 2 and held.bytes == 9
    held.retain(publish(b"a/b", b""))  # an empty payload clears the topic
    assert held.get(b"a/b") is None and len(held) == 1 and held.bytes == 4
    held.retain(publish(b"never/retained", b""))  # clearing nothing is no error
    assert topics_of(held.matching(b"#")) == [b"a/c"]


def test_only_a_publish_to_a_topic_is_retained():
    held = RetainedMessages()
    with pytest.raises(ValueError):
        held.retain(Message(UNICAST, b"session-1", b"x", "mqtt", b"c"))
    with pytest.raises(RetainRefused, match="UTF-8"):
        held.retain(publish(b"caf\xe9", b"x"))  # Latin-1: the stores key topics by text
    with pytest.raises(RetainRefused, match="NUL"):
        held.retain(publish(b"a\x00b", b"x"))
    assert len(held) == 0 and held.bytes == 0


def test_matching_wildcards_and_dollar_topics_in_topic_order():
    held = RetainedMessages()
    for topic in (b"sport/tennis/player1", b"sport", b"sport/tennis", b"sport/", b"sports", b"$SYS/uptime",
                  b"/finance", b"a$b", b"sport/tennis/player1/ranking"):
        held.retain(publish(topic, topic))
    assert topics_of(held.matching(b"sport/#")) == [b"sport", b"sport/", b"sport/tennis", b"sport/tennis/player1",
                                                    b"sport/tennis/player1/ranking"]
    assert topics_of(held.matching(b"sport/+")) == [b"sport/", b"sport/tennis"]
    assert topics_of(held.matching(b"sport/+/player1")) == [b"sport/tennis/player1"]
    assert topics_of(held.matching(b"+/+")) == [b"/finance", b"sport/", b"sport/tennis"]
    assert topics_of(held.matching(b"/+")) == [b"/finance"]
    # a leading wildcard never reaches a $ topic; a filter naming its first level does
    assert b"$SYS/uptime" not in topics_of(held.matching(b"#"))
    assert held.matching(b"+/uptime") == []
    assert topics_of(held.matching(b"$SYS/#")) == [b"$SYS/uptime"]
    assert topics_of(held.matching(b"$SYS/uptime")) == [b"$SYS/uptime"]
    assert topics_of(held.matching(b"#")) == sorted(t for t in held._messages if not t.startswith(b"$"))
    assert held.matching(b"sport/tennis/player2") == [] and held.matching(b"nothing/#") == []
    with pytest.raises(ValueError, match="last level"):
        held.matching(b"sport/#/x")
    with pytest.raises(ValueError, match="whole level"):
        held.matching(b"sport+")


def test_an_exact_filter_is_a_lookup_and_a_filter_looks_below_its_fixed_levels(monkeypatch):
    held = RetainedMessages()
    for n in range(200):
        held.retain(publish(b"other/%d" % n))
    held.retain(publish(b"a/b/c"))
    held.retain(publish(b"a/b/d/e"))
    held.retain(publish(b"a/bc"))  # shares the prefix's bytes, not its levels
    tested: list[bytes] = []

    def counting(topic_filter: bytes, topic: bytes) -> bool:
        tested.append(topic)
        return matches(topic_filter, topic)

    monkeypatch.setattr(retained_module, "matches", counting)
    assert topics_of(held.matching(b"a/b/c")) == [b"a/b/c"] and tested == []
    assert topics_of(held.matching(b"a/b/+")) == [b"a/b/c"]
    assert tested == [b"a/b/c", b"a/b/d/e"]
    assert topics_of(held.matching(b"a/+")) == [b"a/bc"]


def test_the_bounds_refuse_and_change_nothing():
    held = RetainedMessages(max_messages=2, max_bytes=12)
    held.retain(publish(b"a", b"1234"))
    held.retain(publish(b"b", b"1234"))
    with pytest.raises(RetainRefused, match="2 topics") as refused:
        held.retain(publish(b"c", b"1"))
    assert isinstance(refused.value, BrokerError) and refused.value.reason == "full"
    held.retain(publish(b"a", b"123456"))  # a replacement is no new topic: 12 bytes, at the bound
    with pytest.raises(RetainRefused, match="12 bytes"):
        held.retain(publish(b"b", b"12345"))  # would be 13
    assert held.get(b"b").payload == b"1234" and held.bytes == 12 and len(held) == 2
    held.retain(publish(b"b", b""))  # clearing is never refused
    held.retain(publish(b"c", b"1234"))
    assert topics_of(held.matching(b"+")) == [b"a", b"c"] and held.bytes == 12


def test_a_single_message_larger_than_the_bound_is_refused():
    held = RetainedMessages(max_bytes=4)
    with pytest.raises(RetainRefused):
        held.retain(publish(b"big", b"12345"))
    assert len(held) == 0


def test_the_data_of_every_part_counts():
    body = b"main"
    message = Message(MULTICAST, b"t", body, "smqp", b"s",
                      details=Details(parts=(Part("text/plain", (), body), Part("image/png", (), b"12345678"))))
    assert size(message) == 13  # the topic, the body, the other part
    held = RetainedMessages(max_bytes=12)
    with pytest.raises(RetainRefused):
        held.retain(message)


# ---------------------------------------------------------------------- with a store


@pytest_twisted.ensureDeferred
async def test_the_memory_store_is_loaded_and_written_through():
    store = MemoryStore()
    await store.put_retained("kept/a", stored.encode(publish(b"kept/a", b"A", qos=1)))
    held = RetainedMessages()
    assert await held.use_store(store) == 1
    assert held.get(b"kept/a").payload == b"A" and held.get(b"kept/a").qos == 1 and held.bytes == 7
    assert await held.retain(publish(b"new/b", b"BB")) is True
    assert await held.retain(publish(b"kept/a", b"")) is True
    [(topic, data)] = await store.load_retained()
    assert topic == "new/b" and retained_module._unowned(data)[1].payload == b"BB"
    with pytest.raises(RuntimeError):
        held.use_store(MemoryStore())


@pytest_twisted.ensureDeferred
async def test_messages_retained_before_the_store_win_and_are_written():
    store = MemoryStore()
    await store.put_retained("t", stored.encode(publish(b"t", b"old")))
    await store.put_retained("u", stored.encode(publish(b"u", b"stored")))
    held = RetainedMessages()
    held.retain(publish(b"t", b"newer"))
    assert await held.use_store(store) == 1
    assert [m.payload for m in held.matching(b"#")] == [b"newer", b"stored"] and held.bytes == 13
    written = retained_module._unowned(dict(await store.load_retained())["t"])[1]
    assert stored.encode(written) == stored.encode(held.get(b"t"))


@pytest_twisted.ensureDeferred
async def test_sqlite_keeps_them_across_a_close_and_reopen(tmp_path: Path):
    path = tmp_path / FILENAME
    store = SQLiteStore(path, reactor)
    await store.open()
    held = RetainedMessages()
    await held.use_store(store)
    writes = [held.retain(publish(b"sensors/kitchen/temp", b"21", qos=1)),
              held.retain(publish(b"sensors/hall/temp", b"19")),
              held.retain(publish(b"$SYS/broker/uptime", b"5")),
              held.retain(publish(b"sensors/kitchen/temp", b"22", qos=2)),
              held.retain(publish(b"sensors/hall/temp", b""))]
    assert not any(d.called for d in writes)  # they wait for the commit, in the writer thread
    for d in writes:
        assert await d is True
    await store.close()

    again = SQLiteStore(path, reactor)
    await again.open()
    try:
        loaded = RetainedMessages()
        assert await loaded.use_store(again) == 2
        assert len(loaded) == 2 and loaded.bytes == 22 + 19
        [kitchen] = loaded.matching(b"sensors/+/temp")
        assert (kitchen.target, kitchen.payload, kitchen.qos, kitchen.protocol) == (
            b"sensors/kitchen/temp", b"22", 2, "mqtt")
        assert loaded.matching(b"#") == [kitchen]
        assert topics_of(loaded.matching(b"$SYS/#")) == [b"$SYS/broker/uptime"]
        await loaded.retain(publish(b"$SYS/broker/uptime", b""))
    finally:
        await again.close()
    third = SQLiteStore(path, reactor)
    await third.open()
    try:
        assert [topic for topic, _data in await third.load_retained()] == ["sensors/kitchen/temp"]
    finally:
        await third.close()


@pytest_twisted.ensureDeferred
async def test_changes_made_while_loading_are_not_undone_by_the_load(tmp_path: Path):
    store = SQLiteStore(tmp_path / FILENAME, reactor)
    await store.open()
    try:
        await store.put_retained("cleared", stored.encode(publish(b"cleared", b"stored")))
        await store.put_retained("replaced", stored.encode(publish(b"replaced", b"stored")))
        await store.put_retained("kept", stored.encode(publish(b"kept", b"stored")))
        held = RetainedMessages()
        loading = held.use_store(store)
        assert not loading.called  # the SQLite store reads in its thread
        held.retain(publish(b"cleared", b""))
        held.retain(publish(b"replaced", b"newer"))
        assert await loading == 1
        assert [(m.target, m.payload) for m in held.matching(b"#")] == [(b"kept", b"stored"), (b"replaced", b"newer")]
        assert held.bytes == 10 + 13
        assert [topic for topic, _data in await store.load_retained()] == ["kept", "replaced"]
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_unreadable_rows_are_left_out_and_logged(logged):
    store = MemoryStore()
    await store.put_retained("garbage", b"not a stored message")
    await store.put_retained("elsewhere", stored.encode(publish(b"another/topic")))
    await store.put_retained("good", stored.encode(publish(b"good")))
    held = RetainedMessages()
    assert await held.use_store(store) == 1
    assert topics_of(held.matching(b"#")) == [b"good"]
    [event] = logged
    assert event["count"] == 2 and event["topic"] == "elsewhere"


@pytest_twisted.ensureDeferred
async def test_a_load_past_the_bounds_keeps_everything_and_refuses_new_topics(logged):
    store = MemoryStore()
    for name in ("a", "b", "c"):
        await store.put_retained(name, stored.encode(publish(name.encode(), b"12")))
    held = RetainedMessages(max_messages=2)
    assert await held.use_store(store) == 3
    assert len(held) == 3 and "more than the bounds" in logged[0]["log_format"]
    with pytest.raises(RetainRefused):
        held.retain(publish(b"d"))
    held.retain(publish(b"a", b"34"))  # a replacement still goes
    held.retain(publish(b"a", b""))
    held.retain(publish(b"b", b""))
    held.retain(publish(b"d"))


class FailingStore(MemoryStore):
    """put_retained fails (``how``: "deferred", "raise", "outage") until ``failing`` is False."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.failing = True

    def put_retained(self, topic: str, data: bytes | None) -> Deferred:
        if not self.failing:
            return super().put_retained(topic, data)
        if self.how == "raise":
            raise OSError("disk on fire")
        if self.how == "outage":
            return fail(StoreUnavailable("the PostgreSQL server cannot be reached"))
        return fail(OSError("disk on fire"))


@pytest.mark.parametrize("how", ["deferred", "raise", "outage"])
def test_a_failing_store_costs_one_log_line_and_keeps_the_value(how, logged):
    store = FailingStore(how)
    held = RetainedMessages()
    held.use_store(store)
    first = held.retain(publish(b"t", b"1"))
    second = held.retain(publish(b"t", b"2"))
    # both fired (no error left for anyone to handle), with False: not durable
    assert first.called and first.result is False and second.called and second.result is False
    assert held.get(b"t").payload == b"2"  # served from memory all the same
    assert len(logged) == 1
    assert ("log_failure" in logged[0]) == (how != "outage") and logged[0]["topic"] == "t"
    store.failing = False
    assert held.retain(publish(b"t", b"3")).result is True
    assert len(logged) == 2 and "again" in logged[1]["log_format"]
    store.failing = True
    held.retain(publish(b"t", b""))
    assert len(logged) == 3 and held.get(b"t") is None


def test_a_closed_store_is_a_failing_store(logged):
    store = MemoryStore()
    held = RetainedMessages()
    held.use_store(store)
    store.close()
    d = held.retain(publish(b"t", b"1"))
    assert d.called and d.result is False and held.get(b"t") is not None and len(logged) == 1


def test_a_failing_load_fails_use_store():
    class Unreadable(MemoryStore):
        def load_retained(self) -> Deferred:
            return fail(StoreUnavailable("away"))

    held = RetainedMessages()
    failures: list = []
    held.use_store(Unreadable()).addErrback(failures.append)
    assert len(failures) == 1 and failures[0].check(StoreUnavailable)
    assert isinstance(held.retain(publish(b"t")), Deferred)  # writes go through all the same


# ---------------------------------------------------------------------- property


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(TOPICS, st.sampled_from([b"", b"p", b"payload"])), max_size=20),
       st.lists(FILTERS, min_size=1, max_size=6))
def test_matching_is_testing_every_retained_topic(changes, filters):
    held = RetainedMessages()
    expected: dict[bytes, Message] = {}
    for name, payload in changes:
        topic = name.encode()
        message = publish(topic, payload)
        held.retain(message)
        if payload:
            expected[topic] = message
        else:
            expected.pop(topic, None)
    everything = [expected[topic] for topic in sorted(expected)]
    assert len(held) == len(expected) and held.bytes == sum(map(size, everything))
    for topic_filter in [f.encode() for f in filters] + list(expected):
        assert held.matching(topic_filter) == [m for m in everything if matches(topic_filter, m.target)]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(TOPICS, max_size=30), FILTERS, st.integers(1, 4), st.integers(1, 5))
def test_paging_gives_what_matching_gives_in_order(names, topic_filter, limit, scan):
    held = RetainedMessages()
    for name in names:
        held.retain(publish(name.encode(), b"p"))
    wanted = held.matching(topic_filter.encode())
    got: list[Message] = []
    after = None
    for _page in range(len(names) + len(wanted) + 2):  # every page examines or picks something
        found, after = held.page(topic_filter.encode(), after, limit, scan)
        assert len(found) <= limit
        got += found
        if after is None:
            break
    assert after is None and got == wanted


def test_a_page_examines_at_most_scan_topics(monkeypatch):
    held = RetainedMessages()
    for number in range(1000):
        held.retain(publish(b"t/%04d" % number, b"p"))
    tested: list[bytes] = []
    real = retained_module.matches
    monkeypatch.setattr(retained_module, "matches", lambda f, t: tested.append(t) or real(f, t))
    found, after = held.page(b"#", None, 10, 50)
    assert [m.target for m in found] == [b"t/%04d" % n for n in range(10)] and after == b"t/0009"
    found, after = held.page(b"+/+/never", after, 10, 50)  # sparse: bounded by scan, not by matches
    assert found == [] and after == b"t/0059" and len(tested) == 10 + 50

"""Retained-message quotas per owner (brokerd.core.retainedquota through RetainedMessages):
one owner at its quota is refused while every other owner still retains; topic names count in
the bytes; claimed names share one quota; ownership moves with a replacement, is given back by
a deletion and survives a reload from the store; refusals are counted and logged at most once
per interval."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.logger import globalLogPublisher

from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import ANONYMOUS, BROKER, NOBODY, OPEN, Principal
from brokerd.core.retained import RetainedMessages, RetainRefused, size
from brokerd.core.retainedquota import RetainQuotas, quota_owner
from brokerd.store.memory import MemoryStore

ALICE = Principal("alice", "account")
BOB = Principal("bob", "account")


def publish(topic: bytes, payload: bytes, principal: Principal | None) -> Message:
    return Message(MULTICAST, topic, payload, "mqtt", b"client", principal=principal)


def held_with(messages: int = 2, quota_bytes: int = 1000, clock=None, **bounds: int) -> RetainedMessages:
    quotas = RetainQuotas(messages, quota_bytes) if clock is None else RetainQuotas(messages, quota_bytes, 60.0, clock)
    return RetainedMessages(quotas=quotas, **bounds)


def test_an_owner_at_its_quota_is_refused_and_the_others_are_not():
    held = held_with(messages=2)
    held.retain(publish(b"a/1", b"x", ALICE))
    held.retain(publish(b"a/2", b"x", ALICE))
    with pytest.raises(RetainRefused, match="alice") as refused:
        held.retain(publish(b"a/3", b"x", ALICE))
    assert refused.value.reason == "quota"
    held.retain(publish(b"a/1", b"replaced", ALICE))  # a replacement is no new topic
    held.retain(publish(b"b/1", b"x", BOB))  # positive control: another owner still retains
    assert held.quotas.usage(ALICE) == (2, size(publish(b"a/1", b"replaced", None)) + 4)
    assert held.quotas.usage(BOB) == (1, 4) and len(held) == 3
    assert held.quotas.refused["quota"] == 1


def test_topic_names_count_in_the_quota_bytes():
    held = held_with(messages=100, quota_bytes=20)
    held.retain(publish(b"0123456789", b"123456789", ALICE))  # 19 bytes
    with pytest.raises(RetainRefused, match="20 bytes"):
        held.retain(publish(b"b", b"1", ALICE))  # 2 more: 21
    held.retain(publish(b"b", b"1", BOB))
    assert held.quotas.usage(ALICE) == (1, 19) and held.bytes == 21


def test_claimed_names_share_one_quota_per_realm():
    assert quota_owner(None) == NOBODY == quota_owner(Principal("", ANONYMOUS))
    assert quota_owner(Principal("x", OPEN)) == quota_owner(Principal("y", OPEN)) != NOBODY
    assert quota_owner(ALICE) == ALICE
    held = held_with(messages=1)
    held.retain(publish(b"t/1", b"x", Principal("x", OPEN)))
    with pytest.raises(RetainRefused):
        held.retain(publish(b"t/2", b"x", Principal("y", OPEN)))
    held.retain(publish(b"t/3", b"x", None))  # anonymous: a realm of its own
    held.retain(publish(b"t/4", b"x", BROKER))  # the broker's own publishers have no quota
    held.retain(publish(b"t/5", b"x", BROKER))
    assert len(held) == 4


def test_a_replacement_moves_the_topic_and_a_deletion_gives_it_back():
    held = held_with(messages=1)
    held.retain(publish(b"shared", b"alice's", ALICE))
    held.retain(publish(b"shared", b"bob's", BOB))
    assert held.quotas.usage(ALICE) == (0, 0) and held.quotas.owner(b"shared") == BOB
    held.retain(publish(b"mine", b"x", ALICE))  # alice's quota is free again
    with pytest.raises(RetainRefused):
        held.retain(publish(b"more", b"x", BOB))
    held.retain(publish(b"shared", b"", ALICE))  # deleting is never refused
    assert held.quotas.usage(BOB) == (0, 0)
    held.retain(publish(b"more", b"x", BOB))


def test_lowered_quotas_still_let_an_owner_shrink_and_delete():
    held = held_with(messages=3, quota_bytes=100)
    for name in (b"a", b"b", b"c"):
        held.retain(publish(name, b"0123456789", ALICE))
    held.quotas.max_messages, held.quotas.max_bytes = 1, 5
    held.retain(publish(b"a", b"0", ALICE))  # smaller: allowed
    with pytest.raises(RetainRefused):
        held.retain(publish(b"a", b"01234567890123", ALICE))  # larger: refused
    held.retain(publish(b"b", b"", ALICE))
    assert held.quotas.usage(ALICE) == (2, 2 + 11)


@pytest_twisted.ensureDeferred
async def test_owners_survive_a_reload_from_the_store():
    store = MemoryStore()
    first = held_with(messages=2)
    await first.use_store(store)
    await first.retain(publish(b"a/1", b"x", ALICE))
    await first.retain(publish(b"a/2", b"x", ALICE))
    await first.retain(publish(b"n/1", b"x", None))
    again = held_with(messages=2)
    assert await again.use_store(store) == 3
    assert again.quotas.usage(ALICE) == (2, 8) and again.quotas.usage(NOBODY) == (1, 4)
    with pytest.raises(RetainRefused):
        again.retain(publish(b"a/3", b"x", ALICE))
    again.retain(publish(b"b/1", b"x", BOB))
    assert again.get(b"a/1").payload == b"x"


@pytest.fixture
def logged() -> Iterator[list[dict]]:
    events: list[dict] = []

    def observe(event: dict) -> None:
        if event.get("log_namespace", "").startswith("brokerd.core.retainedquota"):
            events.append(event)

    globalLogPublisher.addObserver(observe)
    yield events
    globalLogPublisher.removeObserver(observe)


def test_refusals_are_counted_each_and_logged_once_per_interval(logged):
    now = [1000.0]
    held = held_with(messages=1, clock=lambda: now[0])
    held.retain(publish(b"a/0", b"x", ALICE))
    for number in range(1, 50):
        with pytest.raises(RetainRefused):
            held.retain(publish(b"a/%d" % number, b"x", ALICE))
    assert held.quotas.refused["quota"] == 49 and len(logged) == 1
    now[0] += 61
    with pytest.raises(RetainRefused):
        held.retain(publish(b"a/99", b"x", ALICE))
    assert len(logged) == 2 and logged[1]["count"] == 49 and logged[1]["reason"] == "quota"

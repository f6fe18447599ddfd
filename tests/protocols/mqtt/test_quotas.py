"""SessionQuotas: which persistent sessions a node admits, at CONNECT and at its start."""
from __future__ import annotations

from twisted.internet.task import Clock

from brokerd.config import Settings
from brokerd.core.subscriber import SubscriberId
from brokerd.core.principal import ACCOUNT, NOBODY, Principal
from brokerd.protocols.mqtt.quotas import (
    ANONYMOUS_SESSIONS,
    PER_PRINCIPAL,
    SESSIONS,
    SessionQuotas,
    stored_owner,
)

ALICE, BOB = Principal("alice", ACCOUNT), Principal("bob", ACCOUNT)


def quotas(**settings: int) -> SessionQuotas:
    return SessionQuotas(Settings(**settings), Clock())


def test_a_connect_is_refused_by_the_first_quota_it_would_exceed_and_not_for_its_own_session() -> None:
    q = quotas(mqtt_max_sessions=3, mqtt_max_sessions_per_principal=2, mqtt_anonymous_sessions=1)
    assert q.refusal((NOBODY, "a")) is None
    q.add((NOBODY, "a"))
    assert q.refusal((NOBODY, "b")) == ANONYMOUS_SESSIONS
    q.add((ALICE, "1"))
    q.add((ALICE, "2"))
    assert q.refusal((ALICE, "3")) == PER_PRINCIPAL
    assert q.refusal((ALICE, "1")) is None, "its own session is no new one"
    assert q.refusal((BOB, "1")) == SESSIONS
    q.remove((ALICE, "2"))
    q.remove((ALICE, "2"))  # twice: counted once
    assert q.refusal((BOB, "1")) is None and q.per_principal[ALICE] == 1
    assert q.figures()["persistent_sessions"] == 2


def test_at_the_start_the_oldest_stored_sessions_within_the_quotas_are_kept() -> None:
    q = quotas(mqtt_max_sessions_per_principal=2, mqtt_anonymous_sessions=0)
    names = [SubscriberId(ALICE, "mqtt", f"c{n}", f"{n:012x}.0001.1").encode() for n in (3, 1, 2)]
    anonymous = SubscriberId(NOBODY, "mqtt", "x/y", "000000000001.0001.1").encode()
    beyond = q.admit_stored([*names, anonymous, "smqp-account:channel"])
    assert sorted(beyond) == sorted([names[0], anonymous])
    assert set(q.owners) == {(ALICE, "c1"), (ALICE, "c2")}
    assert q.refused == {PER_PRINCIPAL: 1, ANONYMOUS_SESSIONS: 1}
    assert stored_owner(anonymous) == (NOBODY, "x/y")

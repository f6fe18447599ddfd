"""Connection admission counted four ways (brokerd.core.admission), on the Broker."""
from __future__ import annotations

from brokerd.core.broker import Broker


def broker(**limits) -> Broker:
    values = dict(max_connections=100, max_listener_connections=100,
                  max_connections_per_address=100, max_unauthenticated=100)
    values.update(limits)
    return Broker(**values)


def test_each_listener_has_its_own_limit():
    b = broker(max_listener_connections=2)
    assert b.admit("mcchat", "10.0.0.1") and b.admit("mcchat", "10.0.0.2")
    assert b.admit("mcchat", "10.0.0.3") is None
    assert b.admit("ssmp", "10.0.0.3") is not None
    assert b.stats.refused_connections == 1


def test_each_source_address_has_its_own_limit():
    b = broker(max_connections_per_address=2)
    assert b.admit("a", "10.0.0.1") and b.admit("b", "10.0.0.1")
    assert b.admit("c", "10.0.0.1") is None
    assert b.admit("c", "10.0.0.2") is not None
    assert b.admit("c", None) is not None  # no address (UNIX socket): not counted by address


def test_connections_not_logged_in_have_their_own_limit():
    b = broker(max_unauthenticated=2)
    first, second = b.admit("a", "h1"), b.admit("a", "h2")
    assert b.admit("a", "h3") is None
    first.login()
    first.login()  # counts once
    third = b.admit("a", "h3")
    assert third is not None
    assert b.admit("a", "h4") is None
    second.release()
    assert b.admit("a", "h4") is not None
    assert b.admissions.unauthenticated == 2


def test_release_forgets_keys_and_counts_once():
    b = broker()
    admissions = [b.admit("l", "h") for _ in range(3)]
    admissions[0].login()
    for admission in admissions:
        admission.release()
        admission.release()
    assert b.stats.connections == 0
    assert b.admissions.unauthenticated == 0
    assert b.admissions.per_listener == {} and b.admissions.per_address == {}

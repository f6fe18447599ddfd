"""The session registry alone: who holds an address, and what a removal frees (the Broker's
attach, detach and takeovers are driven through it in test_broker.py)."""
from __future__ import annotations

from brokerd.core.principal import ACCOUNT, Principal
from brokerd.core.sessions import SessionRegistry


class Session:
    def __init__(self, address: bytes | None, protocol: str = "p", principal: Principal | None = None) -> None:
        self.address = address
        self.protocol = protocol
        self.principal = principal


def test_a_later_session_takes_the_address_and_the_earlier_frees_nothing_on_removal():
    registry = SessionRegistry()
    first, second, other = Session(b"a"), Session(b"a"), Session(b"a", protocol="q")
    assert registry.add(first) is None
    assert registry.add(other) is None  # another namespace: its own address
    assert registry.add(second) is first
    assert registry.holder("p", b"a") is second and registry.holder("q", b"a") is other
    assert not registry.remove(first)  # it no longer held the address
    assert first not in registry and second in registry
    assert registry.remove(second) and registry.holder("p", b"a") is None
    assert registry.add(Session(None)) is None and len(registry.sessions) == 2  # no address: only attached


def test_in_an_owned_namespace_only_the_holders_principal_wins_and_only_when_later():
    registry = SessionRegistry()
    alice, bob = Principal("alice", ACCOUNT), Principal("bob", ACCOUNT)
    registry.owned_namespaces.add("p")
    holder = Session(b"id", principal=alice)
    registry.add(holder)
    assert registry.may_take_address("p", b"id", alice) and not registry.may_take_address("p", b"id", bob)
    assert registry.loses_to("p", b"id", alice, later=True) is holder
    assert registry.loses_to("p", b"id", alice, later=False) is None
    assert registry.loses_to("p", b"id", bob, later=True) is None
    assert registry.loses_to("p", b"id", bob, later=False) is holder  # bob's login came first
    assert registry.loses_to("p", b"free", alice, later=True) is None

"""The DURABLE control message: what a node announces after committing durable state, and
the refusal of one whose fields are not subscriber names."""
from __future__ import annotations

import pytest

from brokerd.cluster import directory as control


def test_a_durable_change_reads_back_as_sent() -> None:
    data = control.encode("00000000000000ab", "node1", control.DURABLE,
                          **control.durable_fields(True, {"alice:b", "alice:a"}, {"bob:x"}))
    message = control.decode(data)
    assert message["k"] == control.DURABLE
    assert control.read_durable(message) == (True, ["alice:a", "alice:b"], ["bob:x"])


def test_a_durable_change_without_names_is_refused() -> None:
    for fields in ({"s": "alice:a"}, {"p": [1]}, {"s": [None]}):
        with pytest.raises(control.ControlError):
            control.read_durable(fields)
        with pytest.raises(control.ControlError):
            control.decode(control.encode("00000000000000ab", "node1", control.DURABLE, **fields))
    assert control.read_durable(control.decode(control.encode("00000000000000ab", "n", control.DURABLE))) == (False, [], [])


def test_an_address_carries_its_principal_until_it_is_gone() -> None:
    from brokerd.core.principal import OPEN, Principal

    directory = control.Directory(lambda *args: None, lambda *args: None)
    alice = Principal("alice", OPEN)

    def apply(kind: str, **fields) -> None:
        directory.apply(control.decode(control.encode("0000000000000002", "node2", kind, **fields)), 0.0)

    apply(control.ATTACH, **control.address_fields("ssmp", b"alice", 1.0, alice))
    apply(control.ATTACH, **control.address_fields("socketmq-app", b"echo", 1.0))  # a claim: no principal
    assert directory.principals == {("ssmp", b"alice"): alice}
    assert directory.owner == {("ssmp", b"alice"): "0000000000000002", ("socketmq-app", b"echo"): "0000000000000002"}
    apply(control.STATE, addresses=[["ssmp", "alice", 2.0, "alice", OPEN], ["ssmp", "bob", 2.0]])
    assert directory.principals == {("ssmp", b"alice"): alice} and ("ssmp", b"bob") in directory.owner
    apply(control.DETACH, **control.address_fields("ssmp", b"alice"))
    assert directory.principals == {}
    apply(control.ATTACH, **control.address_fields("ssmp", b"carol", 3.0, Principal("carol", OPEN)))
    directory.forget("0000000000000002")
    assert directory.principals == {} and directory.owner == {}

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


def test_filters_of_other_nodes_are_known_until_they_go() -> None:
    directory = control.Directory(lambda *args: None, lambda *args: None)

    def apply(origin: str, kind: str, **fields) -> None:
        directory.apply(control.decode(control.encode(origin, "n", kind, **fields)), 0.0)

    two, three = "0000000000000002", "0000000000000003"
    apply(two, control.FILTER, **control.filter_fields(b"sensors/+/temp", True))
    apply(three, control.FILTER, **control.filter_fields(b"#", True))
    assert set(directory.filter_nodes(b"sensors/a/temp")) == {two, three}
    assert directory.filter_nodes(b"$SYS/x") == ()  # '#' does not reach $ topics
    apply(two, control.FILTER, **control.filter_fields(b"sensors/+/temp", False))
    assert directory.filter_nodes(b"sensors/a/temp") == (three,)
    apply(two, control.STATE, addresses=[], members=[], filters=["jobs/#"])  # a node's whole state
    assert set(directory.filter_nodes(b"jobs/1")) == {two, three}
    directory.forget(three)
    assert directory.filter_nodes(b"sensors/a/temp") == ()
    assert directory.filter_nodes(b"jobs/1") == (two,)
    apply(two, control.STATE, addresses=[], members=[])  # a state without filters: none left
    assert directory.filter_nodes(b"jobs/1") == ()


@pytest.mark.parametrize("fields", [
    {"f": "a/#/b", "on": True},  # not a filter
    {"f": "a/b", "on": 1},
    {"on": True},
])
def test_a_damaged_filter_change_is_refused(fields) -> None:
    with pytest.raises(control.ControlError):
        control.decode(control.encode("0000000000000002", "n", control.FILTER, **fields))
    with pytest.raises(control.ControlError):
        control.decode(control.encode("0000000000000002", "n", control.STATE, addresses=[], members=[],
                                      filters=[fields.get("f", 7)] if fields.get("on") is True else [None]))

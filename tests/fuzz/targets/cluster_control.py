"""The cluster's control channel: a control message decoded, then applied to a directory of
the other nodes (and a durable or keep-out message read), as the engine does."""
from __future__ import annotations

from typing import Any

from brokerd.cluster import directory as control
from brokerd.core.principal import ACCOUNT, Principal
from tests.fuzz.harness import refused, selector_and_payload

ORIGIN = "07" * 8


def _apply(payload: bytes) -> dict[str, Any]:
    message = control.decode(payload)
    calls: list[tuple] = []
    table = control.Directory(lambda *args: calls.append(args), lambda *args: calls.append(args),
                              lambda: calls.append(()))
    table.apply(message, 1.0)
    if message["k"] == control.DURABLE:
        control.read_durable(message)
    if message["k"] == control.KEEP_OUT:
        control.read_keep_out(message)
    return message


def check(data: bytes) -> tuple:
    _selector, payload = selector_and_payload(data)
    return (refused(lambda: _apply(payload), (control.ControlError,)),)


def seeds() -> dict[str, bytes]:
    alice = Principal("alice", ACCOUNT)

    def make(kind: str, **fields: Any) -> bytes:
        return b"\x00" + control.encode(ORIGIN, "node2", kind, **fields)

    return {
        "attach": make(control.ATTACH, **control.address_fields("ssmp", b"alice", 1.0, alice)),
        "detach": make(control.DETACH, **control.address_fields("ssmp", b"alice")),
        "join": make(control.JOIN, **control.member_fields(b"room", "ssmp", b"alice", True)),
        "leave": make(control.LEAVE, **control.member_fields(b"room", "mcchat", b"bob", False)),
        "filter": make(control.FILTER, **control.filter_fields(b"a/+/c", True)),
        "state": make(control.STATE, addresses=[["ssmp", "alice", 2.0, "alice", ACCOUNT], ["ssmp", "bob", 2.0]],
                      members=[["room", "ssmp", "alice", True]]),
        "durable": make(control.DURABLE, **control.durable_fields(True, {"a:b"}, {"c:d"})),
        "keepout": make(control.KEEP_OUT, **control.keep_out_fields(alice, 30.0)),
        "hello": make(control.HELLO, re=1), "beat": make(control.BEAT), "bye": make(control.BYE),
    }

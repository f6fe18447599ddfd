"""The broker's own names (brokerd.auth.hosts): what a Host header must name."""
from __future__ import annotations

import socket

import pytest

from brokerd.auth.hosts import OwnNames, host_name, listener_interface


@pytest.mark.parametrize("host, name", [
    ("Broker.Example:8081", "broker.example"), ("broker.example.", "broker.example"), ("[::1]:80", "::1"),
    ("127.0.0.1", "127.0.0.1"), ("a b", None), ("host:port", None), ("user@host", None), ("", None),
    ("host/path", None), ("a..b", None), ("%41", None),
])
def test_host_name(host: str, name: str | None) -> None:
    assert host_name(host) == name


def test_own_names() -> None:
    own = OwnNames.of(["tcp:8081:interface=admin.internal", "tls:8443", "unix:/run/a.sock"], "broker.example, b.example")
    for host in ("localhost:8081", "LOCALHOST.", "127.0.0.1:8081", "[::1]", "192.0.2.7", "admin.internal:1",
                 "broker.example", "B.example:9", socket.gethostname(), None):
        assert own.owns(host), host
    for host in ("rebind.attacker.example:8081", "broker.example.attacker.example", "localhost.attacker.example",
                 "127.0.0.1.nip.io", "", "a b"):
        assert not own.owns(host), host


def test_listener_interface() -> None:
    assert listener_interface("tcp:8081:interface=127.0.0.1") == "127.0.0.1"
    assert listener_interface("tcp:8081:localhost") == "localhost"
    assert listener_interface("tls:8443:interface=broker.example") == "broker.example"
    assert listener_interface("unix:/run/a.sock") == ""

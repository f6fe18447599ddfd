"""The Origin allow-list: normalization, same origin, listed origins and patterns, ``*``,
``null``, requests without Origin, and preflight header negotiation."""
from __future__ import annotations

import pytest

from brokerd.auth.hosts import OwnNames
from brokerd.protocols.socketmq.origin import OriginPolicy, allowed_request_headers, normalize


@pytest.mark.parametrize(
    "origin, expected",
    [
        ("http://Broker.Example", "http://broker.example:80"),
        ("https://broker.example:8443", "https://broker.example:8443"),
        ("https://broker.example/", "https://broker.example:443"),
        ("http://[::1]:8080", "http://[::1]:8080"),
        ("null", "null"),
        ("file://", None),
        ("ftp://broker.example", None),
        ("https://broker.example/path", None),
        ("https://broker.example:99999", None),
        ("https://", None),
        ("not an origin", None),
    ],
)
def test_normalize(origin: str, expected: str | None) -> None:
    assert normalize(origin) == expected


BROKER = OwnNames(["broker.example"])
"""The broker's own names when it is reached as broker.example (``--server-names``)."""


def test_default_is_same_origin_only() -> None:
    policy = OriginPolicy.from_setting(None, BROKER)
    assert policy.allows("http://broker.example:8080", "broker.example:8080", secure=False)
    assert policy.allows("https://broker.example", "broker.example:443", secure=True)
    assert not policy.allows("http://broker.example:8080", "broker.example:8080", secure=True)  # scheme
    assert not policy.allows("http://broker.example:8081", "broker.example:8080", secure=False)  # port
    assert not policy.allows("https://evil.example", "broker.example", secure=True)
    assert not policy.allows("null", "broker.example", secure=False)
    assert not policy.allows("garbage", "broker.example", secure=False)
    assert policy.allows(None, "broker.example", secure=False)  # not a browser page


def test_listed_origins_and_patterns() -> None:
    policy = OriginPolicy.from_setting("self, https://app.example.com https://*.tools.example.com", BROKER)
    assert policy.allows("https://app.example.com", "broker.example", secure=True)
    assert policy.allows("https://APP.example.com:443", "broker.example", secure=True)
    assert policy.allows("https://a.tools.example.com", "broker.example", secure=True)
    assert not policy.allows("https://tools.example.com.evil.example", "broker.example", secure=True)
    assert not policy.allows("http://app.example.com", "broker.example", secure=True)
    assert not policy.allows("https://app.example.com:8443", "broker.example", secure=True)
    assert policy.allows("https://broker.example", "broker.example", secure=True)  # self


def test_self_is_only_the_brokers_own_names() -> None:
    """A DNS-rebinding page sends its own name as both Host and Origin: not self."""
    policy = OriginPolicy.from_setting("self", BROKER)
    assert not policy.allows("http://rebind.attacker.example:8080", "rebind.attacker.example:8080", secure=False)
    assert policy.allows("http://broker.example:8080", "broker.example:8080", secure=False)
    local = OriginPolicy.from_setting(None)  # no --server-names: localhost and addresses only
    assert not local.allows("http://broker.example:8080", "broker.example:8080", secure=False)
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "192.0.2.7:8080"):
        assert local.allows(f"http://{host}", host, secure=False), host


def test_without_self_the_broker_own_origin_must_be_listed() -> None:
    policy = OriginPolicy.from_setting(["https://app.example.com"])
    assert not policy.allows("https://broker.example", "broker.example", secure=True)
    assert policy.allows("https://app.example.com", "broker.example", secure=True)


def test_any_and_null() -> None:
    assert OriginPolicy.from_setting("*").allows("https://evil.example", "broker.example", secure=True)
    assert OriginPolicy.from_setting("null").allows("null", "broker.example", secure=False)


def test_cross_origin() -> None:
    policy = OriginPolicy()
    assert policy.cross_origin("https://app.example.com", "broker.example", secure=True)
    assert not policy.cross_origin("https://broker.example", "broker.example", secure=True)
    assert not policy.cross_origin(None, "broker.example", secure=True)


def test_allowed_request_headers() -> None:
    assert allowed_request_headers("Content-Type, Security-Method") == b"content-type, security-method"
    assert allowed_request_headers("x-evil") == b"content-type, security-method, socket-mq-version, interface-version"
    assert allowed_request_headers(None).startswith(b"content-type")

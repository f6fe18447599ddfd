"""The socket.mq policy file: parsing (every mistake is a one-line ConfigurationError naming
the file) and matching (allow rules, special client patterns, the default policy)."""
from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.errors import ConfigurationError
from brokerd.protocols.socketmq.policy import Policy, load_policy

EXAMPLE = """
security = "required"
keyring = "ring.asc"

[[allow]]
clients = ["alice", "fpr:abc*"]
request = ["echo/*"]
subscribe = ["sensors/*"]

[[allow]]
clients = "@authenticated"
request = "echo/public-*"

[[allow]]
clients = ["@anonymous"]
subscribe = ["public/*"]
"""


def write(tmp_path: Path, text: str, ring: bytes = b"") -> Path:
    (tmp_path / "ring.asc").write_bytes(ring)
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_example(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, EXAMPLE, b"KEYS"))
    assert policy.required and policy.enabled and policy.keyring_data == b"KEYS"
    alice, bob = ("alice", "fpr:1"), ("bob", "fpr:abcdef")
    assert policy.allows("request", alice, "echo/x")
    assert policy.allows("request", bob, "echo/x")  # by fingerprint pattern
    assert not policy.allows("request", ("carol",), "echo/x")
    assert policy.allows("request", ("carol",), "echo/public-1")
    assert not policy.allows("request", None, "echo/public-1")
    assert policy.allows("subscribe", None, "public/news")
    assert not policy.allows("subscribe", ("carol",), "public/news")  # @anonymous only
    assert not policy.allows("publish", alice, "sensors/x")  # no rule allows publishing
    assert not policy.allows("serve", alice, "echo")


def test_default_policy() -> None:
    policy = load_policy(None)
    assert policy.security == "enabled" and policy.keyring_data == b""
    for action in ("request", "subscribe", "publish"):
        assert policy.allows(action, None, "anything/at/all")
    assert not policy.allows("serve", None, "echo")
    assert policy.allows("serve", ("app",), "echo")
    assert not Policy(security="disabled").enabled


@pytest.mark.parametrize(
    "text, message",
    [
        ('security = "maybe"', "security must be one of"),
        ("colour = 1", "unknown setting 'colour'"),
        ("[[allow]]\nrequest = ['x']", "clients is required"),
        ("[[allow]]\nclients = ['a']\nbogus = ['x']", "unknown key 'bogus'"),
        ("[[allow]]\nclients = [1]", "must be a list of non-empty strings"),
        ("allow = 5", "allow must be an array"),
        ('keyring = "missing.asc"', "missing.asc"),
        ("this is not toml", "policy.toml"),
    ],
)
def test_mistakes(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match="--socketmq-policy") as error:
        load_policy(path)
    assert message in str(error.value)


def test_missing_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="No such file"):
        load_policy(tmp_path / "nope.toml")
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(ConfigurationError, match="larger than"):
        load_policy(big)

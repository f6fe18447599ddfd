"""Who may do what over socket.mq: the policy file (TOML), parsed and matched.

    security = "enabled"          # "disabled" | "enabled" | "required"
    keyring = "clients.asc"       # armored public keys of allowed clients (relative path)

    [[allow]]
    clients = ["alice", "fpr:3f1c...", "@authenticated"]
    request = ["echo/*"]          # <application>/<request-id>
    subscribe = ["sensors/*"]     # event names
    publish = ["sensors/*"]
    serve = ["echo"]              # applications a client may register for (brokered mode)

Patterns are shell-style (``fnmatch``, case-sensitive).  A client is known by several names:
its OpenPGP User ID and ``fpr:<fingerprint>``, or the names of its TLS client certificate, or
the identifier it logged in with.  Special client patterns: ``*`` (everybody, also plain
connections), ``@authenticated`` (any authenticated client), ``@anonymous`` (plain only).
Rules only allow; what no rule allows is denied.  Without a policy file everything is allowed
to everybody except ``serve``, which needs an authenticated client.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from brokerd.errors import ConfigurationError
from brokerd.protocols.socketmq.limits import MAX_POLICY_FILE

SECURITY_LEVELS = ("disabled", "enabled", "required")
ACTIONS = ("request", "subscribe", "publish", "serve")
ANYONE = "*"
AUTHENTICATED = "@authenticated"
ANONYMOUS = "@anonymous"


@dataclass(frozen=True)
class Rule:
    clients: tuple[str, ...]
    actions: dict[str, tuple[str, ...]]

    def matches_client(self, names: tuple[str, ...] | None) -> bool:
        for pattern in self.clients:
            if pattern == ANYONE:
                return True
            if pattern == ANONYMOUS:
                if names is None:
                    return True
            elif pattern == AUTHENTICATED:
                if names is not None:
                    return True
            elif names is not None and any(fnmatchcase(name, pattern) for name in names):
                return True
        return False


DEFAULT_RULES = (
    Rule((ANYONE,), {"request": ("*",), "subscribe": ("*",), "publish": ("*",)}),
    Rule((AUTHENTICATED,), {"serve": ("*",)}),
)


@dataclass(frozen=True)
class Policy:
    security: str = "enabled"
    keyring_data: bytes = b""
    """The key ring file's content (armored public keys), parsed by the pgp module."""
    rules: tuple[Rule, ...] = DEFAULT_RULES
    source: str = field(default="(default policy)")

    def allows(self, action: str, names: tuple[str, ...] | None, resource: str) -> bool:
        """Whether a client known as ``names`` (None: a plain connection) may ``action`` on
        ``resource`` (an event, an application, or ``application/request-id``)."""
        for rule in self.rules:
            patterns = rule.actions.get(action)
            if patterns and rule.matches_client(names):
                if any(fnmatchcase(resource, pattern) for pattern in patterns):
                    return True
        return False

    @property
    def required(self) -> bool:
        return self.security == "required"

    @property
    def enabled(self) -> bool:
        return self.security != "disabled"


def load_policy(path: Path | None) -> Policy:
    """The policy in ``path`` (None: the default policy); ConfigurationError if unusable."""
    if path is None:
        return Policy()
    data = _read(path, "--socketmq-policy")
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"--socketmq-policy {path}: {exc}") from None
    return parse_policy(document, path)


def parse_policy(document: dict[str, Any], path: Path) -> Policy:
    where = f"--socketmq-policy {path}"
    unknown = set(document) - {"security", "keyring", "allow"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown setting {sorted(unknown)[0]!r}")
    security = document.get("security", "enabled")
    if security not in SECURITY_LEVELS:
        raise ConfigurationError(f"{where}: security must be one of {', '.join(SECURITY_LEVELS)}")
    keyring_data = b""
    keyring = document.get("keyring")
    if keyring is not None:
        if not isinstance(keyring, str):
            raise ConfigurationError(f"{where}: keyring must be a file name")
        keyring_path = Path(keyring)
        if not keyring_path.is_absolute():
            keyring_path = path.parent / keyring_path
        keyring_data = _read(keyring_path, f"{where}: keyring")
    allow = document.get("allow", [])
    if not isinstance(allow, list):
        raise ConfigurationError(f"{where}: allow must be an array of tables ([[allow]])")
    rules = tuple(_rule(entry, index, where) for index, entry in enumerate(allow, 1))
    return Policy(security, keyring_data, rules, str(path))


def _rule(entry: object, index: int, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{where}: allow #{index} must be a table")
    unknown = set(entry) - {"clients", *ACTIONS}
    if unknown:
        raise ConfigurationError(f"{where}: allow #{index}: unknown key {sorted(unknown)[0]!r}")
    clients = _patterns(entry.get("clients"), f"{where}: allow #{index}: clients")
    if not clients:
        raise ConfigurationError(f"{where}: allow #{index}: clients is required")
    actions = {
        action: _patterns(entry[action], f"{where}: allow #{index}: {action}")
        for action in ACTIONS
        if action in entry
    }
    return Rule(clients, actions)


def _patterns(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigurationError(f"{where}: must be a list of non-empty strings")
    return tuple(value)


def _read(path: Path, label: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_POLICY_FILE + 1)
    except OSError as exc:
        raise ConfigurationError(f"{label} {path}: {exc.strerror}") from None
    if len(data) > MAX_POLICY_FILE:
        raise ConfigurationError(f"{label} {path}: larger than {MAX_POLICY_FILE} bytes")
    return data

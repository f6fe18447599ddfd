"""The configuration of MQTT bridges (``--mqtt-bridge``, or ``[[mqtt-bridge]]`` tables in the
TOML file), read as Mosquitto users know it (docs/mqtt.md, Bridges).

A bridge is a connection from this broker to another MQTT broker, as a client.  Each
``topic`` line says, as Mosquitto's ``topic`` does, ``PATTERN [DIRECTION [QOS [LOCAL-PREFIX
REMOTE-PREFIX]]]``: ``out`` sends what is published here to the topics the pattern matches
below LOCAL-PREFIX to the other broker (below REMOTE-PREFIX instead), ``in`` brings the other
way, ``both`` does both.  On the command line one ``--mqtt-bridge`` is one bridge, its keys as
shell-like ``KEY=VALUE`` words (``topic`` repeated):

    --mqtt-bridge "name=cloud address=mqtt.example:8883 tls=true 'topic=sensors/# out 1'"

Everything is checked here, before the broker starts: a mistake is one line naming the
bridge and the key.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.errors import ConfigurationError
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311
from brokerd.protocols.mqtt.topics import topic_filter_problem

DIRECTIONS = ("out", "in", "both")
PROTOCOLS = {"mqttv311": MQTT_311, "mqttv5": MQTT_5}
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+):(\d{1,5})\Z")


@dataclass(frozen=True)
class TopicRule:
    """One ``topic`` line: the pattern, its direction and QoS, and the two prefixes."""

    pattern: str
    direction: str = "out"
    qos: int = 0
    local_prefix: str = ""
    remote_prefix: str = ""

    @property
    def outgoing(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def incoming(self) -> bool:
        return self.direction in ("in", "both")

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.pattern

    def to_remote(self, local_topic: str) -> str:
        """The other broker's topic of ``local_topic`` (which the local filter matched)."""
        return self.remote_prefix + local_topic[len(self.local_prefix):]

    def to_local(self, remote_topic: str) -> str | None:
        """This broker's topic of ``remote_topic``; None when it is not below the remote prefix."""
        if not remote_topic.startswith(self.remote_prefix):
            return None
        return self.local_prefix + remote_topic[len(self.remote_prefix):]


@dataclass(frozen=True)
class BridgeSpec:
    """One bridge, as configured (defaults: docs/mqtt.md, Bridges)."""

    name: str
    address: str
    """A Twisted client endpoint string (``host:port`` is read as ``tcp:host:port``)."""
    topics: tuple[TopicRule, ...]
    client_id: str = ""
    """Empty: ``<host name>.<name>``, as Mosquitto names its bridges."""
    protocol: int = MQTT_5
    clean_session: bool = False
    keepalive: int = 60
    session_expiry: int = 86_400
    try_private: bool = True
    username: str | None = None
    password_file: Path | None = None
    tls: bool = False
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_hostname: str | None = None
    max_queued: int = 10_000
    max_queued_bytes: int = 64 << 20
    restart_timeout: float = 30.0

    def password(self) -> bytes | None:
        """The first line of ``password-file`` (None without one)."""
        if self.password_file is None:
            return None
        try:
            data = Path(self.password_file).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"mqtt-bridge {self.name}: password-file {self.password_file}: "
                                     f"{exc.strerror}") from None
        lines = data.splitlines()
        return lines[0].rstrip(b"\r") if lines else b""


def parse_topic(text: str, bridge: str) -> TopicRule:
    """One ``topic`` line (``PATTERN [DIRECTION [QOS [LOCAL-PREFIX REMOTE-PREFIX]]]``; ``""``
    is an empty prefix)."""
    where = f"mqtt-bridge {bridge}: topic {text!r}"
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    if not 1 <= len(words) <= 5 or len(words) == 4:
        raise ConfigurationError(f"{where}: is not PATTERN [DIRECTION [QOS [LOCAL-PREFIX REMOTE-PREFIX]]]")
    pattern = words[0]
    direction = words[1].lower() if len(words) > 1 else "out"
    if direction not in DIRECTIONS:
        raise ConfigurationError(f"{where}: the direction is out, in or both, not {words[1]!r}")
    qos_text = words[2] if len(words) > 2 else "0"
    if qos_text not in ("0", "1", "2"):
        raise ConfigurationError(f"{where}: the QoS is 0, 1 or 2, not {qos_text!r}")
    local_prefix, remote_prefix = (words[3], words[4]) if len(words) == 5 else ("", "")
    rule = TopicRule(pattern, direction, int(qos_text), local_prefix, remote_prefix)
    for prefix in (local_prefix, remote_prefix):
        if "+" in prefix or "#" in prefix or "\x00" in prefix:
            raise ConfigurationError(f"{where}: a prefix holds no wildcard")
    for topic_filter in (rule.local_filter, rule.remote_filter):
        problem = topic_filter_problem(topic_filter)
        if problem is not None or topic_filter.startswith("$share/"):
            raise ConfigurationError(f"{where}: {problem or 'a bridge pattern is no shared subscription'}")
    return rule


def _words(text: str) -> dict[str, Any]:
    """A command-line bridge: ``KEY=VALUE`` words, ``topic`` repeated."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigurationError(f"mqtt-bridge {text!r}: {exc}") from None
    table: dict[str, Any] = {"topic": []}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals:
            raise ConfigurationError(f"mqtt-bridge {text!r}: {word!r} is not KEY=VALUE")
        if key == "topic":
            table["topic"].append(value)
        else:
            table[key] = value
    return table


_TEXT_KEYS = ("name", "address", "client-id", "username", "tls-hostname")
_PATH_KEYS = ("password-file", "tls-ca", "tls-cert", "tls-key")
_FLAG_KEYS = ("clean-session", "try-private", "tls")
_NUMBER_KEYS = {"keepalive": (int, 0, 65_535), "session-expiry": (int, 0, 0xFFFFFFFF),
                "max-queued": (int, 1, None), "max-queued-bytes": (int, 1, None),
                "restart-timeout": (float, 0.1, None)}
KEYS = frozenset((*_TEXT_KEYS, *_PATH_KEYS, *_FLAG_KEYS, *_NUMBER_KEYS, "topic", "protocol"))


def _flag(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{where}: {value!r} is not a boolean (true or false)")


def _number(value: Any, kind: type, least: float, most: float | None, where: str) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{where}: {value!r} is not a number") from None
    if number < least or (most is not None and number > most):
        limits = f"{least} to {most}" if most is not None else f"at least {least}"
        raise ConfigurationError(f"{where}: must be {limits}, not {value!r}")
    return number


def endpoint_of(address: str) -> str:
    """The client endpoint string of an ``address``: ``host:port`` (Mosquitto's form) is
    ``tcp:host:port``; anything else is an endpoint string already (``tcp:``, ``unix:``...)."""
    found = _HOST_PORT.match(address)
    if found is None:
        return address
    host = found.group(1).strip("[]").replace(":", "\\:")
    return f"tcp:{host}:{found.group(2)}"


def parse_bridge(table: dict[str, Any]) -> BridgeSpec:
    """One bridge from its TOML table (or its command-line words, read into one)."""
    name = str(table.get("name", ""))
    if not _NAME.match(name):
        raise ConfigurationError(f"mqtt-bridge: name {name!r} is not 1-64 letters, digits, '.', '_' or '-'")
    where = f"mqtt-bridge {name}"
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigurationError(f"{where}: unknown key {unknown[0]!r}")
    address = str(table.get("address", ""))
    if not address:
        raise ConfigurationError(f"{where}: address is required (host:port, or a client endpoint string)")
    topics_value = table.get("topic", [])
    lines = [topics_value] if isinstance(topics_value, str) else list(topics_value)
    if not lines:
        raise ConfigurationError(f"{where}: no topic line (PATTERN [DIRECTION [QOS [LOCAL-PREFIX REMOTE-PREFIX]]])")
    options: dict[str, Any] = {}
    for key in _TEXT_KEYS[2:]:
        if key in table:
            options[key.replace("-", "_")] = str(table[key])
    for key in _PATH_KEYS:
        if key in table:
            options[key.replace("-", "_")] = Path(str(table[key]))
    for key in _FLAG_KEYS:
        if key in table:
            options[key.replace("-", "_")] = _flag(table[key], f"{where}: {key}")
    for key, (kind, least, most) in _NUMBER_KEYS.items():
        if key in table:
            options[key.replace("-", "_")] = _number(table[key], kind, least, most, f"{where}: {key}")
    if "protocol" in table:
        protocol = str(table["protocol"]).lower()
        if protocol not in PROTOCOLS:
            raise ConfigurationError(f"{where}: protocol is mqttv311 or mqttv5, not {table['protocol']!r}")
        options["protocol"] = PROTOCOLS[protocol]
    if "tls_key" in options and "tls_cert" not in options:
        raise ConfigurationError(f"{where}: tls-key needs tls-cert")
    if any(key in options for key in ("tls_ca", "tls_cert", "tls_hostname")) and not options.get("tls", False):
        raise ConfigurationError(f"{where}: tls-ca, tls-cert and tls-hostname need tls = true")
    topics = tuple(parse_topic(str(line), name) for line in lines)
    return BridgeSpec(name, endpoint_of(address), topics, **options)


def parse_bridges(value: str | list[Any] | None) -> tuple[BridgeSpec, ...]:
    """``--mqtt-bridge`` values (command-line words) and ``[[mqtt-bridge]]`` tables, checked:
    ConfigurationError names the first mistake."""
    if not value:
        return ()
    items = [value] if isinstance(value, (str, dict)) else list(value)
    specs = []
    for item in items:
        if isinstance(item, str):
            item = _words(item)
        if not isinstance(item, dict):
            raise ConfigurationError(f"mqtt-bridge: {item!r} is neither a table nor KEY=VALUE words")
        specs.append(parse_bridge(item))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigurationError("mqtt-bridge: two bridges have one name")
    return tuple(specs)

"""brokerd's settings: one dataclass built from the command line and/or a TOML file.

Every limit the broker enforces lives here with its default, so docs/ and the code agree on
one list.  The command line wins over the file.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from brokerd.errors import ConfigurationError

PROTOCOLS = ("ssmp", "mcchat", "smqp", "socketmq", "mqtt")
# Every default is a port above 1024, so a broker started without options by a user who is not
# root listens on all of them, where the clients look first (SMQP's draft names 720, which
# needs root or CAP_NET_BIND_SERVICE: --smqp tcp:720).
DEFAULT_PORTS = {"ssmp": 8787, "mcchat": 1502, "smqp": 7720, "socketmq": 8080, "mqtt": 1883}


@dataclass
class Settings:
    """Everything that shapes a running broker."""

    listeners: dict[str, list[str]] = field(default_factory=dict)
    """protocol -> endpoint strings; empty means every available protocol on its default port."""
    data_dir: Path = Path("brokerd-data")
    """The store, the event log and the lock file that keeps a second broker out."""
    open_login: bool = False
    """SSMP ``open`` login: any identifier, no proof (debugging only)."""
    anonymous: bool = False
    """SSMP anonymous ``.`` login (publish only)."""
    secret_file: Path | None = None
    """SSMP ``secret`` login: the shared secret is this file's first line."""
    accounts_file: Path | None = None
    """Accounts (``--accounts``): SMQP logins, SSMP's ``password`` scheme, socket.mq basic auth."""
    tls_cert: Path | None = None
    """Server certificate (PEM) of ``tls:`` listeners."""
    tls_key: Path | None = None
    """Private key (PEM) of ``tls_cert``."""
    tls_ca: Path | None = None
    """CA bundle (PEM): TLS listeners ask for client certificates and verify them against it."""
    ual_file: Path | None = None
    """SMQP User Access Lists (docs/smqp.md); default DATA_DIR/smqp.ual when that file exists."""
    smqp_guest: bool = True
    """SMQP: the draft's built-in ``guest`` account may log in (blank password) when the accounts
    file has no ``guest`` line of its own; ``--no-smqp-guest`` refuses it."""
    smqp_guest_permissions: str | None = None
    """SMQP guest permissions (letters, docs/smqp.md); default read-only ("s")."""
    smqp_domain: str | None = None
    """SMQP server domain for user@domain addresses; default the host name."""
    smqp_connectto_allow: str | list[str] = ""
    """SMQP CONNECTTO: addresses (IP, CIDR, host name, each optionally ``:port``) the server
    may connect to besides the client's own public address (commas or blanks, or a TOML
    list); loopback, link-local and private addresses need an entry even as the client's own."""
    smqp_link: str | list[str] = ""
    """SMQP server links, ``DOMAIN=ENDPOINT`` each (repeated option, or a TOML list)."""
    smqp_link_account: str | None = None
    """The account SMQP links log in with on the other servers."""
    smqp_link_password_file: Path | None = None
    """The file whose first line is the links' password (none: TLS client certificate, CERT)."""
    smqp_redirect: str | list[str] = ""
    """SMQP ``311 Redirect`` targets (``host:port``, commas or blanks, or a TOML list): a LOGIN
    over a connection limit or during shutdown is sent there, in turn."""
    smqp_message_timeout: float = 86400.0
    """SMQP default message timeout in seconds (per topic and per message values override)."""
    smqp_retry_timeout: float = 30.0
    """SMQP: seconds to wait for a client's 310 ACK before a NOTIFY is sent again (and before a
    delivery the client refused with 416 is offered again)."""
    smqp_max_attempts: int = 5
    """SMQP: sends of one NOTIFY to one subscriber before its delivery is given up (the message
    goes to the topic's Trash once no subscriber has it pending)."""
    smqp_trash_retention: float = 3600.0
    """SMQP: seconds a message stays in a topic's Trash before it is deleted for good."""
    socketmq_policy: Path | None = None
    """socket.mq policy (TOML): security mode, client key ring, allow rules (docs/socketmq.md)."""
    socketmq_key: Path | None = None
    """socket.mq server OpenPGP key; default DATA_DIR/socketmq/server-key.asc, made on first use."""

    login_timeout: float = 5.0
    """Seconds a new connection may take to log in before it is closed without a reply."""
    ping_interval: float = 30.0
    """Seconds of client silence before the server PINGs (checked with this granularity)."""
    pong_timeout: float = 30.0
    """Seconds to wait for any data after a server PING before closing."""
    max_connections: int = 50_000
    """Connections of all protocols together; more are refused at once."""
    max_subscriptions: int = 1024
    """Topics one session may be subscribed to."""
    max_output_buffer: int = 1 << 20
    """Bytes queued for one slow recipient before its messages are dropped and counted."""
    event_log: bool = True
    """Keep the event log under DATA_DIR/events/ (docs/events.md)."""
    event_log_payloads: bool = False
    """Include message contents (base64) in the event log."""
    event_log_flush: float = 1.0
    """Seconds between event-log writes: what a crash may lose."""
    event_log_sample: float = 0.1
    """Seconds between two delivery-latency samples at most (``latency`` records)."""
    event_log_gauge: float = 10.0
    """Seconds between two readings of SMQP's queue depth and Trash (``gauge`` records)."""
    mcchat_idle_timeout: float = 300.0
    """Seconds an MCCHAT connection with no subscription may stay silent."""
    mcchat_bind_username: bool = False
    """Show a verified client certificate's name as the MCCHAT username (no spoofing)."""
    mqtt_anonymous: bool = True
    """MQTT: a CONNECT without a username or client certificate logs in as the anonymous
    principal (the access list decides what it may do); ``--no-mqtt-anonymous`` refuses it."""
    mqtt_max_packet_size: int = 1 << 20
    """MQTT: bytes of one packet (fixed header included) a client may send; also announced
    to v5 clients as the server's Maximum Packet Size.  Larger ones end the connection (0x95)."""
    mqtt_max_inflight: int = 20
    """MQTT: QoS 1 and 2 messages sent to a client and not yet acknowledged (the client's
    Receive Maximum lowers it), and received from it and not yet answered (announced as the
    server's Receive Maximum; more end the connection with 0x93)."""
    mqtt_max_queued: int = 1000
    """MQTT: QoS 1 and 2 messages one session keeps waiting (its client away, slow or at its
    Receive Maximum); more are dropped and counted."""
    mqtt_max_topic_length: int = 1024
    """MQTT: bytes of a topic name or filter."""
    mqtt_max_topic_levels: int = 32
    """MQTT: levels (``/``-separated parts) of a topic name or filter."""
    mqtt_max_client_id: int = 256
    """MQTT: bytes of a client identifier (0x85 beyond)."""
    mqtt_connect_timeout: float = 10.0
    """MQTT: seconds from a connection's start until its CONNECT is accepted."""
    mqtt_max_session_expiry: int = 86_400
    """MQTT: seconds a persistent session outlives its connection at most (a 3.1.1 Clean
    Session 0 session, or a v5 Session Expiry Interval beyond this)."""
    mqtt_max_keep_alive: int = 0
    """MQTT: the longest keep-alive a client may ask for, in seconds (0: any); a v5 client
    is told the lower value as Server Keep Alive."""
    mqtt_topic_alias_maximum: int = 16
    """MQTT v5: topic aliases a client may set on one connection (0: none)."""
    smqp_max_topics_per_account: int = 10_000
    """SMQP: topics one account may have created (and not removed); 414 beyond."""
    smqp_max_message_size: int = 2 << 20
    """SMQP: bytes of one message body as received (attribute lines and data); 413 beyond."""
    smqp_max_queued_bytes: int = 4 << 20
    """SMQP: bytes of notifications one session holds in memory, in its window of pending
    messages and in its queue of notifications that need no acknowledgement (each)."""
    smqp_max_notify_window: int = 64
    """SMQP: the largest notification window a session may ask for with SET NOTIFY WINDOW
    (brokerd's extension; at most 1024)."""
    smqp_max_one_held: int = 8
    """SMQP: messages of ONE topics one session holds sent and unanswered at most; the others
    go to the topic's other subscribers meanwhile (a silent subscriber cannot hoard them)."""
    socketmq_max_frames: int = 1024
    """socket.mq: frames one incoming WebSocket message may have (more close it with 1009)."""
    socketmq_deflate: bool = False
    """Accept permessage-deflate offers of socket.mq WebSocket clients (docs/socketmq.md)."""
    socketmq_request_timeout: float = 30.0
    """socket.mq: seconds a registered application (on any node) has to answer a forwarded
    request before the requester gets 504."""
    socketmq_request_read_timeout: float = 30.0
    """socket.mq: seconds from an HTTP request's first byte until its headers and body arrived."""
    socketmq_handshake_timeout: float = 10.0
    """socket.mq: seconds from the first byte of a WebSocket upgrade request until it is open."""
    socketmq_origins: str | list[str] = "self"
    """socket.mq: browser origins that may open the WebSocket and POST (``self``, origins,
    patterns, ``*``; separated by commas or spaces, or a TOML list)."""
    server_names: str | list[str] = ""
    """DNS names users reach this broker by, beyond localhost, IP addresses, the listeners'
    interfaces and the host name: the Host check of the admin listener and socket.mq's
    ``self`` origin (separated by commas or spaces, or a TOML list)."""
    admin: str | None = None
    """Endpoint of the admin listener (metrics, JSON API, dashboard; docs/admin.md); off when None."""
    admin_token_file: Path | None = None
    """File whose first line is the admin listener's bearer token."""
    admin_cert_names: str | None = None
    """Comma-separated client-certificate names allowed on a tls: admin listener."""
    metrics_top_queues: int = 20
    """Queues named by users (SMQP Trash queues) that /metrics, the JSON API and the ~sys
    topics show one by one, the fullest first; the others are summed in one figure."""
    sys_interval: float | None = None
    """Seconds between statistics on the ~sys/brokerd/ topics; None: not published."""
    log_level: str = "info"
    """Lowest level twistd logs: debug, info, warn, error, critical."""
    log_format: str = "text"
    """twistd's log lines: text, or json (one JSON object per line)."""
    max_listener_connections: int = 20_000
    """Connections of one listener (one endpoint); more are refused at once."""
    max_connections_per_address: int = 256
    """Connections from one source IP address, all listeners together."""
    max_unauthenticated: int = 1024
    """Connections not yet logged in, all listeners together (docs/operations.md says when
    each protocol's connection counts as logged in)."""
    max_auth_queue: int = 64
    """Password checks (scrypt) and OpenPGP operations waiting for or running in the thread
    pool; more are refused at once with the protocol's temporary-failure reply."""
    disk_free_limit: int = 64 << 20
    """Bytes that must stay free where DATA_DIR is: below, publishes that would be stored
    are refused (acknowledgements and deletions still commit) and the event log pauses."""
    event_log_max_bytes: int = 1 << 30
    """Bytes of event-log files kept; the oldest hours are deleted first (docs/events.md)."""
    event_log_max_age: float = 7 * 86400.0
    """Seconds an hour of the event log is kept after it ended."""
    cluster: str | None = None
    """Redis URL of the cluster this node joins (docs/cluster.md); None: a single node."""
    cluster_password_file: Path | None = None
    """File whose first line is the Redis password (a password in the --cluster URL wins)."""
    cluster_secret_file: Path | None = None
    """File of the secret every node of the cluster shares (required with --cluster): one line,
    or two while a key is rotated (the first seals, both open); readable by its owner only."""
    cluster_tls_ca: Path | None = None
    """CA bundle (PEM) that verifies a rediss:// server; default: the system's trust store."""
    cluster_max_backlog: int = 16 << 20
    """Bytes published to Redis and not yet acknowledged; runs beyond are dropped and counted."""
    cluster_max_control: int = 16 << 20
    """Bytes one control message from another node may have (a node's whole state, sent when
    a node says hello, is the largest); a longer one is refused unread and counted."""
    cluster_heartbeat: float = 5.0
    """Seconds between this node's heartbeats to the others."""
    cluster_node_timeout: float = 15.0
    """Seconds without a node's heartbeat before its sessions leave presence and lose their addresses."""
    node_name: str | None = None
    """This node's name in the cluster; default host name and the first listener's port."""
    store: str | None = None
    """The durable store: None for the SQLite file in DATA_DIR (one node), or
    ``postgresql://user@host:port/db``, shared by the nodes of a cluster."""
    store_password_file: Path | None = None
    """The PostgreSQL password (the file's first line) when the --store URL has none."""

    def secret(self) -> bytes | None:
        """The SSMP shared secret (the file's first line), or None when not configured."""
        return None if self.secret_file is None else read_secret_file(self.secret_file)


def read_secret_file(path: Path) -> bytes:
    """The first line of an SSMP secret file, without surrounding whitespace: what the broker
    checks ``secret`` logins against and what brokerd-ssmp sends.  ConfigurationError if the
    file cannot be read or that line is empty."""
    return read_first_line(path, "--secret-file")


def read_first_line(path: Path, option: str) -> bytes:
    """The first line of the file ``option`` names, stripped; ConfigurationError naming the
    option if the file cannot be read or that line is empty."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"{option} {path}: {exc.strerror}") from None
    line = data.splitlines()[0].strip() if data.strip() else b""
    if not line:
        raise ConfigurationError(f"{option} {path}: the file is empty")
    return line


_PATHS = frozenset(f.name for f in fields(Settings) if f.type in ("Path", "Path | None"))
"""Settings given as file names (read from options and config files as paths)."""


def option_name(attribute: str) -> str:
    return attribute.replace("_", "-")


OPTION_RENAMES = {"accounts_file": "accounts", "ual_file": "ual"}
"""Settings whose option is not their field's name (DESIGN.md names them so)."""


def setting_fields() -> dict[str, Any]:
    """Option name -> Settings field, for every setting an option or the TOML file can set
    (the listeners are their own options: ``--ssmp`` and the others)."""
    return {OPTION_RENAMES.get(f.name, option_name(f.name)): f for f in fields(Settings) if f.name != "listeners"}


def settings_default(option: str) -> str | None:
    """The default of the setting ``option`` names as --help and docs/operations.md show it
    (``30``, ``0.1``, ``self``), or None when it has no plain value (unset, off, empty)."""
    spec = setting_fields().get(option)
    if spec is None or isinstance(spec.default, bool) or not isinstance(spec.default, (int, float, str, Path)):
        return None
    if spec.default == "":
        return None
    value = spec.default
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def settings_from(values: dict[str, Any], config_file: str | None = None,
                  problems: list[str] | None = None) -> Settings:
    """Build Settings from command-line ``values`` (None = not given) over ``config_file``.

    Keys use the option names (``data-dir``, ``max-output-buffer``); listener keys take a
    string or a list of endpoint strings.  A bad setting raises ConfigurationError, or, when
    a ``problems`` list is given, is added to it (and keeps its default) so that every bad
    setting is reported at once.
    """
    merged: dict[str, Any] = {}
    if config_file is not None:
        try:
            with open(config_file, "rb") as handle:
                merged.update(tomllib.load(handle))
        except OSError as exc:
            raise ConfigurationError(f"--config {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"--config {config_file}: {exc}") from None
    for key, value in values.items():
        if value is not None:
            merged[key] = value

    settings = Settings()
    known = setting_fields()
    for key, value in merged.items():
        try:
            _apply(settings, known, key, value)
        except ConfigurationError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
    return settings


def _apply(settings: Settings, known: dict[str, Any], key: str, value: Any) -> None:
    if key in PROTOCOLS:
        endpoints = [value] if isinstance(value, str) else list(value)
        if not all(isinstance(e, str) for e in endpoints):
            raise ConfigurationError(f"{key}: endpoints must be strings")
        settings.listeners[key] = endpoints
        return
    spec = known.get(key)
    if spec is None:
        raise ConfigurationError(f"unknown setting {key!r}")
    setattr(settings, spec.name, _convert(key, spec.name, value))


_OPTIONAL_NUMBERS = {"sys_interval": float}
"""Numbers whose default is None (off)."""


def _convert(key: str, attribute: str, value: Any) -> Any:
    default = getattr(Settings, attribute, None)
    if attribute in _OPTIONAL_NUMBERS:
        default = _OPTIONAL_NUMBERS[attribute]()
    if attribute in _PATHS:
        return Path(value)
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if isinstance(default, int):
            number = int(value)
        elif isinstance(default, float):
            number = float(value)
        else:
            return value
    except (TypeError, ValueError):
        raise ConfigurationError(f"{key}: {value!r} is not a number") from None
    if number <= 0:
        raise ConfigurationError(f"{key}: must be positive, not {value!r}")
    return number


@dataclass
class Runtime:
    """What a front end's ``build_factory`` gets: the shared pieces of one running broker.

    Typed loosely on purpose: this module sits below every layer it names.
    """

    settings: Settings
    broker: Any
    portal: Any
    reactor: Any
    tls: Any = None
    """brokerd.auth.tls.ServerTLS, or None when no --tls-cert/--tls-key were given."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Other shared services by name (the store, the event log) as later parts add them."""

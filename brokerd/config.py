"""brokerd's settings: one dataclass built from the command line and/or a TOML file.

Every limit the broker enforces lives here with its default, its help, its meaning and its
range, so that the command line, the TOML file's keys and docs/operations.md's option table
(all made from Settings) agree on one list.  The command line wins over the file.
"""
from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from brokerd.errors import ConfigurationError
from brokerd.settingspec import Option, convert, option_name, setting

PROTOCOLS = ("ssmp", "mcchat", "smqp", "socketmq", "mqtt")
# Every default is a port above 1024, so a broker started without options by a user who is not
# root listens on all of them, where the clients look first (SMQP's draft names 720, which
# needs root or CAP_NET_BIND_SERVICE: --smqp tcp:720).
DEFAULT_PORTS = {"ssmp": 8787, "mcchat": 1502, "smqp": 7720, "socketmq": 8080, "mqtt": 1883}
DEFAULT_INTERFACE = "127.0.0.1"
"""Where the default listeners (no listener option given) bind: this host only."""

LISTENER_OPTIONS = {
    "ssmp": Option(help="Listen for SSMP on ENDPOINT (repeatable).", meaning="SSMP listener; repeatable"),
    "mcchat": Option(help="Listen for MCCHAT on ENDPOINT (repeatable).", meaning="MCCHAT listener; repeatable"),
    "smqp": Option(help="Listen for SMQP on ENDPOINT (repeatable).",
                   meaning="SMQP listener; repeatable (the draft's port 720 needs root or `CAP_NET_BIND_SERVICE`: `--smqp tcp:720`)"),
    "socketmq": Option(help="Listen for socket.mq (HTTP + WebSocket) on ENDPOINT (repeatable).",
                       meaning="socket.mq HTTP + WebSocket listener; repeatable"),
    "mqtt": Option(help="Listen for MQTT 3.1.1 and 5.0 on ENDPOINT (repeatable).",
                   meaning="MQTT 3.1.1 and 5.0 listener (`tls:8883` for client certificates); repeatable "
                           "(docs/mqtt.md)"),
}
"""The listener options, one per protocol (each fills ``Settings.listeners[protocol]``)."""


def default_listener(protocol: str) -> str:
    """The endpoint a protocol listens on when no listener option is given."""
    return f"tcp:{DEFAULT_PORTS[protocol]}:interface={DEFAULT_INTERFACE}"


@dataclass
class Settings:
    """Everything that shapes a running broker.

    A field is one setting: ``setting(default, metavar, help=..., meaning=..., ...)``
    (brokerd.settingspec.Option says what each part is for).  A new field is a new option
    and TOML key; ``python -m brokerd.optiontable --write docs/operations.md`` puts its row in
    the docs (tests/test_settings_contract.py fails until then).
    """

    listeners: dict[str, list[str]] = field(default_factory=dict)
    """protocol -> endpoint strings; empty means every available protocol on its default port
    (its own options, ``--ssmp`` and the others: :data:`LISTENER_OPTIONS`)."""
    data_dir: Path = setting(
        Path("brokerd-data"), "DIR",
        shown="`./brokerd-data`",
        help="Directory of the store and the event log.",
        meaning="the store and the event log; created if missing; one broker at a time (its lock file, below)")
    open_login: bool = setting(
        False,
        help="Allow SSMP 'open' login (debugging only).",
        meaning="SSMP `open` login (debugging only)")
    anonymous: bool = setting(
        False,
        help="Allow SSMP anonymous '.' login (publish only).",
        meaning="SSMP anonymous `.` login (publish only)")
    secret_file: Path | None = setting(
        None,
        help="Enable SSMP 'secret' login with the shared secret in FILE.",
        meaning="SSMP `secret` login; the secret is the file's first line (mode 600: secret files, below)")
    accounts_file: Path | None = setting(
        None,
        name="accounts",
        help="SMQP (and socket.mq HTTP basic) accounts file.",
        meaning="accounts: SMQP logins and SSMP's `password` scheme (`LOGIN alice password <password>`); "
                "managed with `brokerd-accounts`, or live with `brokerd-ctl accounts` (docs/admin.md), which "
                "needs the file's directory writable by the broker (deploy/brokerd.toml keeps it in the data "
                "directory)")
    tls_cert: Path | None = setting(
        None,
        help="Server certificate (PEM) for tls: listeners.",
        meaning="server certificate (PEM) for `tls:` listeners, with `--tls-key`")
    tls_key: Path | None = setting(
        None,
        help="Private key (PEM) of --tls-cert.",
        meaning="private key (PEM) of `--tls-cert`")
    tls_ca: Path | None = setting(
        None,
        help="CA bundle (PEM): TLS listeners then ask for and verify client certificates.",
        meaning="TLS listeners ask for client certificates and verify them against FILE (`cert` login)")
    ual_file: Path | None = setting(
        None,
        name="ual",
        shown="`DATA_DIR/smqp.ual` if present",
        help="User Access Lists file: topic permissions for every protocol [DATA_DIR/smqp.ual if present].",
        meaning="User Access Lists: topic permissions for every protocol (docs/architecture.md, docs/smqp.md); "
                "without one nothing is checked but SMQP's guest defaults")
    smqp_guest: bool = setting(
        True,
        shown="guest on",
        help="SMQP: refuse the guest account's logins [guest may log in].",
        meaning="SMQP: refuse the draft's built-in `guest` account (blank password), which otherwise may log "
                "in with the guest permissions below; a `guest` line in the accounts file is an account like "
                "any other and still logs in with its password; TOML `smqp-guest = false`")
    smqp_guest_permissions: str | None = setting(
        None, "P",
        shown="`s`",
        help="SMQP guest permissions, as in the UAL file [s].",
        meaning="SMQP guest permissions, letters as in the UAL file")
    domain: str | None = setting(
        None, "NAME",
        name="smqp-domain",
        shown="host name",
        help="SMQP server domain for user@domain addresses [host name].",
        meaning="SMQP server domain: `user@domain` addresses, the SUID (the head of every stored message's id), "
                "and for server links the Hops entry and the `/<domain>` topic prefix on the other servers")
    smqp_connectto_allow: str | list[str] = setting(
        "",
        shown="none",
        help="SMQP CONNECTTO: addresses besides the client's own public one it may name (loopback, link-local "
             "and private ones included): IPs, CIDRs, host names, each optionally :port (commas) [none].",
        meaning="SMQP CONNECTTO: addresses the server may connect to besides the client's own public address: "
                "IPs, CIDR networks, host names, each optionally `:port` (`[v6]:port`), separated by commas; "
                "loopback, link-local and private addresses need it even when they are the client's own "
                "(docs/smqp.md)")
    smqp_link: str | list[str] = setting(
        "", "DOMAIN=ENDPOINT",
        shown="none",
        repeatable=True,
        help="SMQP server link DOMAIN=ENDPOINT: log in there and forward its messages (repeatable).",
        meaning="SMQP server link (repeatable, one per domain): log in to the server of DOMAIN at the client "
                "endpoint ENDPOINT (`tcp:`, `tls:` with `certificate=`/`privateKey=`/`trustRoots=`) and bring "
                "in what local clients subscribe to below `/<domain>` (docs/smqp.md, Federation)")
    smqp_link_account: str | None = setting(
        None, "NAME",
        help="SMQP: the account server links log in with on other servers.",
        meaning="SMQP: the account the links log in with on the other servers (required with `--smqp-link`)")
    smqp_link_password_file: Path | None = setting(
        None,
        shown="none",
        help="SMQP: file whose first line is the links' password [none: TLS client certificate].",
        meaning="SMQP: file whose first line is the links' password; without it the links log in with their "
                "TLS client certificate (CERT)")
    smqp_redirect: str | list[str] = setting(
        "",
        shown="none",
        help="SMQP: host:port targets (commas) a LOGIN over a connection limit or during shutdown is "
             "redirected to with 311; NAME=host:port: cluster node NAME, used while it is live [none].",
        meaning="SMQP: `host:port` targets (commas) a LOGIN is sent to with `311 Redirect` when the connection "
                "is over a connection limit or the server is shutting down; at most 256 such connections at "
                "once; in a cluster `NAME=host:port` is node NAME's address, used while that node is live "
                "(docs/smqp.md)")
    durable_message_timeout: float = setting(
        86400.0,
        help="Durable delivery: default life span of a stored message in seconds.",
        meaning="Durable delivery: default life span of a stored message, every protocol's (per message and per "
                "topic values win; SMQP's `Timeout`)")
    durable_retry_timeout: float = setting(
        30.0,
        help="Durable delivery: seconds before an unacknowledged delivery is sent again.",
        meaning="Durable delivery: seconds before an unacknowledged delivery (an SMQP NOTIFY) is sent again")
    durable_max_attempts: int = setting(
        5,
        help="Durable delivery: sends of a delivery before the message becomes a dead letter.",
        meaning="Durable delivery: sends of a delivery (an SMQP NOTIFY) before the message becomes a dead letter "
                "(SMQP: goes to its topic's Trash)")
    durable_dead_letter_retention: float = setting(
        3600.0,
        help="Durable delivery: seconds a dead letter is kept.",
        meaning="Durable delivery: seconds a dead letter (expired or given up; SMQP: in a Trash) is kept")
    tor_control: str | None = setting(
        None, "ENDPOINT",
        shown="launch a tor",
        help="Control port of a running tor for onion: listeners (unix:PATH, tcp:127.0.0.1:9051) [launch a tor].",
        meaning="the control port of a running tor that publishes the `onion:` listeners (`unix:/run/tor/control`, "
                "`tcp:127.0.0.1:9051`; cookie authentication); without it brokerd launches a tor of its own, data "
                "in `DATA_DIR/tor` (docs/tor.md)")
    tor_config: Path | None = setting(
        None,
        shown="Tor's defaults",
        help="torrc of the tor brokerd launches for onion: listeners [Tor's defaults].",
        meaning="a torrc whose options the tor brokerd launches runs with (the network it joins, its logs); not "
                "with `--tor-control`")
    tor_timeout: float = setting(
        120.0,
        help="Seconds to reach or launch tor and publish an onion service.",
        meaning="seconds to reach or launch (bootstrap) tor, and then for each onion service's descriptor to reach "
                "a directory; past it the listener fails and the broker stops")
    onion_client_auth: Path | None = setting(
        None, "DIR",
        shown="anyone",
        help="Directory of NAME.auth client keys: only they reach onion: listeners [anyone].",
        meaning="directory of `NAME.auth` files (`brokerd-onion add` makes them): only those clients can reach "
                "the `onion:` listeners (v3 client authorization, docs/tor.md)")
    socketmq_policy: Path | None = setting(
        None,
        help="socket.mq policy file (TOML): OpenPGP security, key ring, allow rules.",
        meaning="socket.mq policy (TOML): OpenPGP security, key ring, allow rules (docs/socketmq.md)")
    socketmq_key: Path | None = setting(
        None,
        shown="`DATA_DIR/socketmq/server-key.asc`",
        help="socket.mq server OpenPGP key [DATA_DIR/socketmq/server-key.asc].",
        meaning="socket.mq server OpenPGP key, made on first use")
    login_timeout: float = setting(
        5.0,
        help="Seconds a connection may take to log in.",
        meaning="seconds a connection may take to log in")
    ping_interval: float = setting(
        30.0,
        help="Seconds of client silence before a server PING.",
        meaning="seconds of client silence before the server PINGs")
    pong_timeout: float = setting(
        30.0,
        help="Seconds to wait for a client after a PING before closing.",
        meaning="seconds after a PING before a silent client is closed")
    max_connections: int = setting(
        50_000,
        help="Connections of all protocols together.",
        meaning="connections of all protocols together")
    max_subscriptions: int = setting(
        1024,
        help="Topics one session may subscribe to.",
        meaning="topics one session may subscribe to")
    max_output_buffer: int = setting(
        1 << 20, "BYTES",
        help="Bytes queued for a slow recipient before its messages are dropped.",
        meaning="bytes queued for one slow recipient before its messages are dropped and counted; also the "
                "most one read holds for one SSMP/MCCHAT connection before writing it")
    max_user_properties: int = setting(
        32,
        help="User properties one message may carry (any protocol).",
        meaning="user properties (name/value pairs) one message may carry, from any protocol; a message with more "
                "is refused (MQTT v5 PUBACK/PUBREC 0x97 Quota exceeded, docs/mqtt.md; SMQP and socket.mq 413)")
    max_property_bytes: int = setting(
        16_384, "BYTES",
        help="Bytes of one message's properties together.",
        meaning="bytes of one message's properties together (content type, response topic, correlation data, user "
                "property names and values); a message with more is refused as above")
    event_log: bool = setting(
        True,
        shown="log on",
        help="Do not keep the event log.",
        meaning="do not keep the event log (docs/events.md)")
    event_log_payloads: bool = setting(
        False,
        help="Include message contents (base64) in the event log.",
        meaning="include message contents (base64) in the event log")
    event_log_flush: float = setting(
        1.0,
        help="Seconds between event-log writes (what a crash may lose).",
        meaning="seconds between event-log writes: what a crash may lose")
    event_log_sample: float = setting(
        0.1,
        help="Seconds between two delivery-latency samples in the event log.",
        meaning="at most one timed publish per S seconds: its acceptance-to-write latency per receiving "
                "protocol goes to the event log (`latency` records, docs/events.md)")
    event_log_gauge: float = setting(
        10.0,
        help="Seconds between two SMQP queue-depth readings in the event log.",
        meaning="seconds between readings of SMQP's queue depth and Trash (one counting query off the reactor "
                "thread); a `gauge` record is written only when a figure changed")
    mcchat_idle_timeout: float = setting(
        300.0,
        help="Seconds an MCCHAT connection with no subscription may stay silent.",
        meaning="MCCHAT: seconds a connection with no subscription may stay silent")
    mcchat_bind_username: bool = setting(
        False,
        help="MCCHAT: show a verified client certificate's name as the username.",
        meaning="MCCHAT: show a verified client certificate's name as the username")
    mqtt_anonymous: bool = setting(
        True,
        shown="anonymous on",
        help="MQTT: refuse a CONNECT without a username or client certificate [anonymous allowed].",
        meaning="MQTT: refuse a CONNECT with neither a username nor a client certificate (CONNACK 0x87, 3.1.1 "
                "return code 5); otherwise it logs in as the anonymous principal and the access list decides; "
                "TOML `mqtt-anonymous = false`")
    mqtt_max_packet_size: int = setting(
        1 << 20, "BYTES",
        maximum=268_435_460,  # a 5-byte fixed header and the largest Remaining Length
        help="MQTT: bytes of one packet a client may send.",
        meaning="MQTT: bytes of one packet a client may send (fixed header included), announced to v5 clients; "
                "larger ones end the connection (v5 DISCONNECT 0x95)")
    mqtt_max_inflight: int = setting(
        20,
        maximum=65_535,  # announced as Receive Maximum, a Two Byte Integer
        help="MQTT: unacknowledged QoS 1 and 2 messages per direction per connection.",
        meaning="MQTT: QoS 1 and 2 messages sent to a client and not acknowledged (a lower Receive Maximum of "
                "the client wins), and received and not yet over (the server's Receive Maximum: a QoS 1 one "
                "until its PUBACK, a QoS 2 one until its PUBREL; more: DISCONNECT 0x93, and a 3.1.1 "
                "connection, told no limit, is closed)")
    mqtt_max_queued: int = setting(
        1000,
        help="MQTT: QoS 1 and 2 messages one session keeps waiting for its client.",
        meaning="MQTT: QoS 1 and 2 messages one session keeps waiting while its client is away, slow or at its "
                "window; more are dropped and counted")
    mqtt_max_sessions: int = setting(
        10_000,
        help="MQTT: persistent sessions on the node, all principals together.",
        meaning="MQTT: persistent sessions (3.1.1 Clean Session 0, v5 a Session Expiry Interval above 0) on "
                "the node, stored or in memory, of all principals together; a CONNECT that would make one more "
                "is refused (v5 CONNACK 0x97 Quota exceeded, 3.1.1 return code 3); a node that starts keeps "
                "the stored sessions within the quotas, the oldest first, and ends the others (not a node of a "
                "cluster, which counts the sessions it serves)")
    mqtt_max_sessions_per_principal: int = setting(
        100,
        help="MQTT: persistent sessions of one logged-in principal.",
        meaning="MQTT: persistent sessions one logged-in principal (an account, a client certificate) may "
                "have; one more is refused as above")
    mqtt_anonymous_sessions: int = setting(
        0,
        zero="none",
        help="MQTT: persistent sessions of the anonymous principal.",
        meaning="MQTT: persistent sessions the anonymous principal may have, all anonymous clients together; "
                "with 0 an anonymous v5 client asking for one gets a session that ends with its connection "
                "(CONNACK Session Expiry Interval 0) and an anonymous 3.1.1 Clean Session 0 CONNECT is refused "
                "(return code 5); above 0, one more is refused as above")
    mqtt_max_session_subscriptions: int = setting(
        100,
        help="MQTT: subscriptions one persistent session may keep.",
        meaning="MQTT: subscriptions one persistent session may keep; a SUBSCRIBE filter beyond gets SUBACK "
                "0x97 Quota exceeded (3.1.1: 0x80)")
    mqtt_max_stored_queued: int = setting(
        10_000,
        help="MQTT: messages the store keeps waiting for one persistent session.",
        meaning="MQTT: messages the store keeps waiting for one persistent session (its client away or behind, "
                "on a node with a store); a message beyond is not stored for that session, whatever its QoS "
                "(its publisher is still answered and the other subscribers get it), counted as "
                '`brokerd_messages_dropped_total{reason="stored_queue_full"}` and logged once per minute at '
                "most; the counts are read from the store at the start (a node of a cluster counts what it "
                "stored)")
    mqtt_max_topic_length: int = setting(
        1024,
        maximum=65_535,  # a UTF-8 Encoded String's length
        help="MQTT: bytes of a topic name or filter.",
        meaning="MQTT: bytes of a topic name or filter")
    mqtt_max_topic_levels: int = setting(
        32,
        help="MQTT: levels of a topic name or filter.",
        meaning="MQTT: levels of a topic name or filter")
    mqtt_max_client_id: int = setting(
        256,
        maximum=65_535,  # a UTF-8 Encoded String's length
        help="MQTT: bytes of a client identifier.",
        meaning="MQTT: bytes of a client identifier (CONNACK 0x85 beyond)")
    mqtt_connect_timeout: float = setting(
        10.0,
        help="MQTT: seconds a connection may take to send an accepted CONNECT.",
        meaning="MQTT: seconds from a connection's start until its CONNECT is accepted; then it is closed")
    mqtt_max_session_expiry: int = setting(
        86_400, "S",
        maximum=4_294_967_295,  # a v5 Session Expiry Interval, a Four Byte Integer
        help="MQTT: seconds a persistent session outlives its connection at most.",
        meaning="MQTT: seconds a persistent session outlives its connection at most (3.1.1 Clean Session 0, or "
                "a longer v5 Session Expiry Interval)")
    mqtt_max_keep_alive: int = setting(
        0, "S",
        zero="any", maximum=65_535,  # Server Keep Alive, a Two Byte Integer
        help="MQTT: longest keep-alive a client may ask for, seconds.",
        meaning="MQTT: the longest keep-alive a client may ask for; v5 clients are told the lower value "
                "(Server Keep Alive)")
    mqtt_topic_alias_maximum: int = setting(
        16,
        zero="none", maximum=65_535,  # Topic Alias Maximum, a Two Byte Integer
        help="MQTT v5: topic aliases per connection.",
        meaning="MQTT v5: topic aliases a client may set per connection")
    mqtt_max_retained: int = setting(
        100_000,
        help="MQTT: topics with a retained message, all publishers together.",
        meaning="MQTT: topics with a retained message, all publishers together (held in memory and in the "
                "store); a retain of a new topic beyond is refused (v5 QoS 1/2: PUBACK/PUBREC 0x97), counted "
                'in `brokerd_retained_refused_total{reason="full"}`')
    mqtt_max_retained_bytes: int = setting(
        64 << 20, "BYTES",
        help="MQTT: bytes of retained messages (topics and payloads), all together.",
        meaning="MQTT: bytes of retained messages, topic names and payloads, all publishers together; keep it "
                "at least the per-principal figure times the principals you expect to retain")
    mqtt_max_retained_per_principal: int = setting(
        1000,
        help="MQTT: topics one principal may hold the retained message of.",
        meaning="MQTT: topics one principal may hold the retained message of (the last to retain a topic holds "
                "it; a deletion frees it); every anonymous client together is one principal (docs/mqtt.md says "
                'why); beyond, refused as above, `reason="quota"`')
    mqtt_max_retained_bytes_per_principal: int = setting(
        4 << 20, "BYTES",
        help="MQTT: bytes of retained messages one principal may hold.",
        meaning="MQTT: bytes of retained messages (topic names and payloads) one principal may hold")
    mqtt_bridge: str | list[Any] = setting(
        "", '\'name=N address=HOST:PORT topic="PATTERN DIR QOS" ...\'',
        shown="none",
        repeatable=True,
        help='MQTT bridge to another broker: \'name=N address=HOST:PORT topic="PATTERN out 1" ...\' '
             "(repeatable; docs/mqtt.md).",
        meaning="MQTT bridge to another broker (repeatable; in the TOML file `[[mqtt-bridge]]` tables): its "
                "keys, defaults and bounds (`max-queued` 10000 messages, `max-queued-bytes` 64 MiB kept for "
                "the other broker while it is away; `restart-timeout` 30 s between attempts at most) are in "
                "docs/mqtt.md, Bridges")
    smqp_max_topics_per_account: int = setting(
        10_000,
        help="SMQP: topics one account may create.",
        meaning="SMQP: topics one account may have created and not removed (`414` beyond), so that no account "
                "uses up the server's 100,000")
    smqp_max_message_size: int = setting(
        2 << 20, "BYTES",
        help="SMQP: bytes of one message, attributes and data.",
        meaning="SMQP: bytes of one published message as received, attribute lines and data together (`413` "
                "beyond; the data alone stays limited to 1 MiB)")
    smqp_max_queued_bytes: int = setting(
        4 << 20, "BYTES",
        help="SMQP: bytes of notifications one session holds in memory.",
        meaning="SMQP: bytes one session holds in memory in its window of pending messages (at least one "
                "message; the store read that refills the window reads no more bodies than that), and again in "
                "its queue of notifications that need no acknowledgement (the rest of those are dropped and "
                "counted); with a notification window it also bounds the bodies of the NOTIFYs outstanding (at "
                "least one)")
    smqp_max_notify_window: int = setting(
        64,
        maximum=1024,  # the bound on what one session's window holds in memory
        help="SMQP: largest SET NOTIFY WINDOW a session may ask for.",
        meaning="SMQP: the largest notification window a session may ask for with `SET NOTIFY WINDOW` "
                "(brokerd's extension, docs/smqp.md); larger requests are refused `510` and the session keeps "
                "one notification at a time")
    smqp_max_one_held: int = setting(
        8,
        help="SMQP: messages of ONE topics one session holds unanswered at most; the rest go to other "
             "subscribers.",
        meaning="SMQP: messages of ONE topics one session holds sent and unanswered at most; the rest go to "
                "the topic's other subscribers meanwhile, and a ONE message left unanswered for "
                "`--durable-retry-timeout` closes its session (`421`) and goes to another (docs/smqp.md, ONE "
                "topics: no hoarding)")
    socketmq_max_frames: int = setting(
        1024,
        help="socket.mq: frames one incoming WebSocket message may have.",
        meaning="socket.mq: frames one incoming WebSocket message may have; more close the connection with 1009")
    socketmq_deflate: bool = setting(
        False,
        help="socket.mq: accept permessage-deflate (compressed WebSocket messages) [off].",
        meaning="socket.mq: accept permessage-deflate (RFC 7692) offers of WebSocket clients; events to those "
                "clients are compressed per connection (one zlib compressor and decompressor per connection, "
                "about 300 KiB at the client's default window), incoming compressed messages are bounded by "
                "the 1 MiB + 4 KiB message limit after decompression (docs/socketmq.md)")
    socketmq_request_timeout: float = setting(
        30.0,
        help="socket.mq: seconds a registered application has to answer a forwarded request before 504.",
        meaning="socket.mq: seconds a registered application (on this node or, in a cluster, another) has to "
                "answer a forwarded request; then the requester gets `504`")
    socketmq_request_read_timeout: float = setting(
        30.0,
        help="socket.mq: seconds an HTTP request's headers and body may take to arrive.",
        meaning="socket.mq: seconds from an HTTP request's first byte until its headers and body have arrived; "
                "then 408 and close (slow senders, slowloris)")
    socketmq_handshake_timeout: float = setting(
        10.0,
        help="socket.mq: seconds a WebSocket opening handshake may take.",
        meaning="socket.mq: seconds from the first byte of a WebSocket upgrade request until the WebSocket is "
                "open (also the bound on any request line); then 408 and close")
    socketmq_origins: str | list[str] = setting(
        "self",
        help="socket.mq: browser origins allowed to use the WebSocket and POST, e.g. 'self "
             "https://app.example.com'.",
        meaning="socket.mq: the web pages (origins) that may open the WebSocket and POST from a browser: "
                "`self` (same origin), `https://app.example.com`, patterns `https://*.example.com`, `*` (any); "
                "clients sending no `Origin` (programs) are always allowed (docs/socketmq.md, Browsers)")
    server_names: str | list[str] = setting(
        "", "NAMES",
        help="DNS names this broker is reached by (admin Host check, socket.mq 'self'); localhost and IP "
             "addresses always are.",
        meaning="DNS names users and tools reach this broker by (commas or spaces; a TOML list): the admin "
                "listener answers only requests whose `Host` is one of the broker's own names, and socket.mq's "
                "`self` origin only holds for them; `localhost`, every IP address, the listeners' `interface=` "
                "names and the machine's host name always are own names (docs/admin.md, Browsers and DNS "
                "rebinding)")
    admin: str | None = setting(
        None, "ENDPOINT",
        shown="off",
        help="Admin listener endpoint: /metrics, JSON API (docs/admin.md) [off].",
        meaning="admin listener: Prometheus `/metrics`, JSON API for `brokerd-ctl` (docs/admin.md); needs a "
                "token unless bound to loopback or a `unix:` socket, which is created mode 600 unless its "
                "endpoint string says `mode=` (660 lets the socket's group in; a mode open to others needs a "
                "token)")
    admin_token_file: Path | None = setting(
        None,
        help="Bearer token of the admin listener (the file's first line).",
        meaning="the admin listener's bearer token (the file's first line)")
    admin_cert_names: str | None = setting(
        None, "NAMES",
        help="Client-certificate names allowed on a tls: admin listener (comma-separated).",
        meaning="client-certificate names (comma-separated) let in on a `tls:` admin listener")
    metrics_top_queues: int = setting(
        20,
        help="SMQP Trash queues /metrics, the JSON API and ~sys show one by one (the fullest; the rest summed "
             'as queue="(others)").',
        meaning="SMQP Trash queues (one per topic, so made by users) that `/metrics`, `/api/status` and the "
                '`~sys` topics name one by one, the fullest first; the others are summed as `queue="(others)"` '
                "(docs/admin.md)")
    sys_interval: float | None = setting(
        None,
        shown="off",
        help="Seconds between statistics on the ~sys/brokerd/ topics [off].",
        meaning="publish the broker's figures under `~sys/brokerd/` every S seconds (docs/admin.md)")
    log_level: str = setting(
        "info", "LEVEL",
        help="Lowest level logged: debug, info, warn, error, critical.",
        meaning="lowest level logged: `debug`, `info`, `warn`, `error`, `critical`")
    log_format: str = setting(
        "text", "FORMAT",
        help="Log lines as text or json.",
        meaning="`json`: one JSON object per line: `time` (ISO 8601, UTC), `level`, `source` (the logger's "
                "namespace), `message`, `fields` (the event's own fields), `failure` (a traceback, when there "
                "is one); in both formats the control characters clients send are escaped (docs/admin.md, *The "
                "operator log*)")
    max_listener_connections: int = setting(
        20_000,
        help="Connections of one listener.",
        meaning="connections of one listener (endpoint)")
    max_connections_per_address: int = setting(
        256,
        help="Connections from one source IP address.",
        meaning="connections from one source IP address, all listeners together")
    max_unauthenticated: int = setting(
        1024,
        help="Connections not yet logged in, all listeners together.",
        meaning="connections not yet logged in, all listeners together")
    max_auth_queue: int = setting(
        64,
        help="Password checks and OpenPGP operations queued or running.",
        meaning="password checks (scrypt) and OpenPGP operations queued or running in the thread pool; more "
                "are refused at once (SMQP `451`, socket.mq `503`), never queued")
    login_backoff_after: int = setting(
        5,
        help="Failed password logins in a row from one address or for one account before the next check waits.",
        meaning="failed password logins (wrong password or shared secret, unknown account; SSMP, MQTT, SMQP, "
                "all together) in a row from one address, or for one account, before the next check of that "
                "address or account waits (see *Password guessing* below)")
    login_backoff: float = setting(
        1.0,
        help="Seconds of the first such wait, doubled with each further failure.",
        meaning="seconds the first such check waits; each further failure doubles the wait")
    login_backoff_max: float = setting(
        4.0,
        help="Longest wait of a login check; an attempt that would wait longer is refused at once.",
        meaning="the longest wait: an attempt that would wait longer (too many checks already waiting) is "
                "refused at once, unchecked; keep it below `--login-timeout` (and `--mqtt-connect-timeout`), "
                "which close a connection still waiting")
    login_backoff_entries: int = setting(
        10_000,
        help="Addresses, accounts and address-account logins the login backoff remembers.",
        meaning="source addresses the backoff remembers (and as many accounts, and as many address-account "
                "pairs that logged in); the least recently used are forgotten first")
    disk_free_limit: int = setting(
        64 << 20, "BYTES",
        help="Bytes to keep free where DATA_DIR is: below, stored publishes are refused.",
        meaning="free space kept where `--data-dir` is: below it, publishes that would be stored are refused "
                "and the event log pauses (below)")
    event_log_max_bytes: int = setting(
        1 << 30, "BYTES",
        help="Bytes of event-log files kept, oldest hours deleted first.",
        meaning="event-log files kept; the oldest hours are deleted first (docs/events.md)")
    event_log_max_age: float = setting(
        7 * 86400.0,
        help="Seconds an hour of the event log is kept.",
        meaning="seconds an hour of the event log is kept after it ended")
    cluster: str | None = setting(
        None, "URL",
        shown="off",
        help="Join the cluster sharing this Redis: redis://HOST:PORT[/DB], rediss://..., unix://PATH [off].",
        meaning="join the cluster that shares this Redis (docs/cluster.md): "
                "`redis://[user:password@]HOST:PORT[/DB]`, `rediss://...` (TLS), `unix://PATH[?db=N]`; needs "
                "the `cluster` extra (`pip install '.[cluster]'` in the checkout). The URL may name any master of a "
                "Redis Cluster (Redis 7 or later): the node finds the others with `CLUSTER SLOTS` and routes "
                "each topic to the master owning its slot. With an SMQP listener it also needs `--store "
                "postgresql://...`, else brokerd refuses to start")
    cluster_password_file: Path | None = setting(
        None,
        help="Redis password (the file's first line); one in the --cluster URL wins.",
        meaning="the Redis password (the file's first line); a password in the `--cluster` URL wins")
    cluster_secret_file: Path | None = setting(
        None,
        shown="— (required with `--cluster`)",
        help="Secret shared by the cluster's nodes, sealing what they send through Redis: one line (two while "
             "rotating: the first seals, both open), mode 600 [required with --cluster].",
        meaning="the secret every node of the cluster shares: it seals (encrypts, authenticates, numbers) "
                "everything a node writes to Redis, and a node drops what does not open "
                "(`brokerd_cluster_rejected_total{reason}`). One line of at least 16 bytes, or two while "
                "rotating a key (the first seals, both open); read again at each heartbeat; the file must not "
                "be readable or writable by group or others, else brokerd refuses to start (docs/cluster.md, "
                "*The cluster secret*)")
    cluster_tls_ca: Path | None = setting(
        None,
        shown="system trust store",
        help="CA bundle (PEM) verifying a rediss:// server [system trust store].",
        meaning="CA bundle (PEM) that verifies a `rediss://` server")
    cluster_max_backlog: int = setting(
        16 << 20, "BYTES",
        help="Bytes published to Redis and not yet acknowledged, beyond which messages for other nodes are "
             "dropped.",
        meaning="bytes published to Redis and not yet acknowledged by it (over all the masters of a Redis "
                "Cluster together, including publishes sent again after a `MOVED`; an envelope counts with the "
                "rendered bytes it carries, each at most `section_limit` of its run, docs/cluster.md); "
                "messages for other nodes beyond it are dropped and counted "
                '(`brokerd_cluster_dropped_total{reason="backlog"}`)')
    cluster_max_control: int = setting(
        16 << 20, "BYTES",
        help="Bytes of one control message from another node (its state is the largest); longer ones are "
             "refused.",
        meaning="bytes of one control message from another node (its whole state, sent when a node says hello, "
                "is the largest: about 100 bytes per session and per topic membership); a longer one is "
                "refused unread and counted (`brokerd_cluster_bad_envelopes_total`), and a node whose own "
                "would be longer logs an error and does not send it, so set the same value on every node; "
                'parsing one takes about ten times its bytes in memory for a moment (docs/cluster.md, "Damaged '
                'messages from Redis")')
    cluster_max_shared_pending: int = setting(
        100_000,
        help="Messages sent to another node's shared-group member and kept until it answers; beyond, sent "
             "unkept.",
        meaning="messages this node sent to a shared group's member on another node and keeps until that node "
                "answers it handed them to a member, so that they go to another member if that node dies or "
                'has no member left (docs/cluster.md, "Shared subscriptions across nodes"); beyond, messages '
                "are sent without being kept and counted "
                '(`brokerd_cluster_shared_messages_total{outcome="unkept"}`)')
    cluster_heartbeat: float = setting(
        5.0,
        help="Seconds between this node's heartbeats to the other nodes.",
        meaning="seconds between this node's heartbeats to the others")
    cluster_node_timeout: float = setting(
        15.0,
        help="Seconds without a node's heartbeat before its sessions leave presence.",
        meaning="seconds without a node's heartbeat before its sessions leave presence and its addresses are "
                'free, counted from its last message (docs/cluster.md, "Node liveness: the bound"); must '
                "exceed `--cluster-heartbeat`, keep it at least 3 times the heartbeat")
    cluster_clock_skew: float = setting(
        1.0,
        help="Seconds the nodes' clocks may disagree: frames sealed longer before a node subscribed are "
             "refused.",
        meaning="seconds the nodes' wall clocks may disagree (keep them in step with NTP): a node refuses, as "
                "`early`, a frame sealed more than this before it subscribed to the frame's channel (before it "
                "started, or subscribed again), so a Redis client cannot play it frames from before then "
                '(docs/cluster.md, "No replay"); one as long as `--cluster-node-timeout` or longer refuses '
                "nothing the freshness window does not (`stale`). Too small for the clocks, a node refuses the "
                "others' first frames after it subscribes (their state among them)")
    node_name: str | None = setting(
        None, "NAME",
        shown="host name`:`first listener port",
        help="This node's name in the cluster [host name:first listener port].",
        meaning="this node's name in the cluster (logs, `/metrics`)")
    store: str | None = setting(
        None, "URL",
        shown="the SQLite file in `--data-dir`",
        help="Durable store: postgresql://USER@HOST:PORT/DB, shared by cluster nodes [the SQLite file in "
             "DATA_DIR].",
        meaning="the durable store: `postgresql://USER@HOST:PORT/DB` (or `postgres://`) keeps the SMQP topic "
                "tree, durable subscriptions, stored messages and acknowledgements in PostgreSQL, shared by "
                "the nodes of a cluster (below, and docs/cluster.md); needs the `cluster` extra, "
                "`pip install '.[cluster]'` in the checkout (psycopg 3)")
    store_password_file: Path | None = setting(
        None,
        help="PostgreSQL password of --store (the file's first line) when the URL has none.",
        meaning="the PostgreSQL password (the file's first line) when the `--store` URL has none (libpq's "
                "`PGPASSWORD` and `~/.pgpass` also work)")


    def secret(self) -> bytes | None:
        """The SSMP shared secret (the file's first line), or None when not configured."""
        return None if self.secret_file is None else read_secret_file(self.secret_file)


SECRET_FILES = {
    "secret_file": "--secret-file",
    "admin_token_file": "--admin-token-file",
    "tls_key": "--tls-key",
    "accounts_file": "--accounts",
    "cluster_secret_file": "--cluster-secret-file",
    "cluster_password_file": "--cluster-password-file",
    "store_password_file": "--store-password-file",
    "smqp_link_password_file": "--smqp-link-password-file",
    "socketmq_key": "--socketmq-key",
}
"""Settings naming files that hold a secret (a password, a key, a token, password hashes):
the broker refuses to start when one of them is open to group or others."""


def check_private_mode(mode: int, path: Path | str, option: str) -> None:
    """ConfigurationError (one line naming ``option``) when ``mode`` (a file's ``st_mode``)
    gives group or others any access: a secret another local user can read is no secret, and
    one they can write lets them choose it.  The one check every secret file goes through."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigurationError(
            f"{option} {path}: the file must not be accessible to group or others (chmod 600 {path})")


def secret_file_problems(settings: Settings) -> list[str]:
    """One line per secret file the settings name (:data:`SECRET_FILES`) that group or others
    may access.  A file that cannot be stat'ed is left to the code that reads it, which names
    the problem."""
    problems = []
    values = vars(settings)
    for attribute, option in SECRET_FILES.items():
        path = values[attribute]
        if path is None:
            continue
        try:
            check_private_mode(os.stat(path).st_mode, path, option)
        except OSError:
            continue
        except ConfigurationError as exc:
            problems.append(str(exc))
    return problems


def check_secret_files(settings: Settings) -> None:
    """ConfigurationError for the first of :func:`secret_file_problems`."""
    problems = secret_file_problems(settings)
    if problems:
        raise ConfigurationError(problems[0])


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


def setting_fields() -> dict[str, Any]:
    """Option name -> Settings field, for every setting an option or the TOML file can set
    (the listeners are their own options: ``--ssmp`` and the others)."""
    return {option_name(f): f for f in fields(Settings) if f.name != "listeners"}


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
        endpoints = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else [value]
        if not all(isinstance(e, str) for e in endpoints):
            raise ConfigurationError(f"{key}: endpoints must be strings")
        settings.listeners[key] = endpoints
        return
    spec = known.get(key)
    if spec is None:
        raise ConfigurationError(f"unknown setting {key!r}")
    setattr(settings, spec.name, convert(key, spec, value))


def value_problems(settings: Settings) -> list[str]:
    """One line per field of ``settings`` holding a value its option would refuse (a number
    out of its range, a string where a flag belongs): what an embedder's Settings get checked
    against, as the command line and the TOML file are while they are read."""
    problems = []
    values = vars(settings)
    for key, spec in setting_fields().items():
        value = values[spec.name]
        if value is None:
            continue
        try:
            convert(key, spec, value)
        except ConfigurationError as exc:
            problems.append(str(exc))
    return problems


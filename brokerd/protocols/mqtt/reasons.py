"""MQTT reason codes, which packets may carry which, and the codec's one error type.

MQTT 5.0 section 2.4 (Reason Code) lists every code; each packet's section (3.2.2.2 CONNACK,
3.4.2.1 PUBACK, 3.5.2.1 PUBREC, 3.6.2.1 PUBREL, 3.7.2.1 PUBCOMP, 3.9.3 SUBACK, 3.11.3 UNSUBACK,
3.14.2.1 DISCONNECT, 3.15.2.1 AUTH) says which of them that packet may carry.  MQTT 3.1.1 has
only CONNACK return codes (section 3.2.2.3) and SUBACK return codes (3.9.3);
:func:`connack_return_code` maps the v5 code a server decided on to the 3.1.1 one.

Every malformation the decoder finds raises :class:`MQTTProtocolError` carrying the v5 reason
code to answer with; a 3.1.1 server has no code to send (except in CONNACK) and just closes.
"""
from __future__ import annotations

from brokerd.errors import ProtocolError
from brokerd.protocols.mqtt.packets import MQTT_311

SUCCESS = 0x00
"""Success; also Normal disconnection (DISCONNECT) and Granted QoS 0 (SUBACK)."""
NORMAL_DISCONNECTION = 0x00
GRANTED_QOS_0 = 0x00
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL_MESSAGE = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
RE_AUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

NAMES: dict[int, str] = {
    0x00: "Success",
    0x01: "Granted QoS 1",
    0x02: "Granted QoS 2",
    0x04: "Disconnect with Will Message",
    0x10: "No matching subscribers",
    0x11: "No subscription existed",
    0x18: "Continue authentication",
    0x19: "Re-authenticate",
    0x80: "Unspecified error",
    0x81: "Malformed Packet",
    0x82: "Protocol Error",
    0x83: "Implementation specific error",
    0x84: "Unsupported Protocol Version",
    0x85: "Client Identifier not valid",
    0x86: "Bad User Name or Password",
    0x87: "Not authorized",
    0x88: "Server unavailable",
    0x89: "Server busy",
    0x8A: "Banned",
    0x8B: "Server shutting down",
    0x8C: "Bad authentication method",
    0x8D: "Keep Alive timeout",
    0x8E: "Session taken over",
    0x8F: "Topic Filter invalid",
    0x90: "Topic Name invalid",
    0x91: "Packet Identifier in use",
    0x92: "Packet Identifier not found",
    0x93: "Receive Maximum exceeded",
    0x94: "Topic Alias invalid",
    0x95: "Packet too large",
    0x96: "Message rate too high",
    0x97: "Quota exceeded",
    0x98: "Administrative action",
    0x99: "Payload format invalid",
    0x9A: "Retain not supported",
    0x9B: "QoS not supported",
    0x9C: "Use another server",
    0x9D: "Server moved",
    0x9E: "Shared Subscriptions not supported",
    0x9F: "Connection rate exceeded",
    0xA0: "Maximum connect time",
    0xA1: "Subscription Identifiers not supported",
    0xA2: "Wildcard Subscriptions not supported",
}
"""Each v5 reason code's name in the spec's table (2.4)."""

CONNACK_REASONS = frozenset(
    (0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95,
     0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)
)
PUBACK_REASONS = frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))
"""PUBACK and PUBREC (3.4.2.1, 3.5.2.1) share one list."""
PUBREL_REASONS = frozenset((0x00, 0x92))
"""PUBREL and PUBCOMP (3.6.2.1, 3.7.2.1) share one list."""
SUBACK_REASONS = frozenset((0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2))
UNSUBACK_REASONS = frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91))
DISCONNECT_REASONS = frozenset(
    (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94,
     0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2)
)
AUTH_REASONS = frozenset((0x00, 0x18, 0x19))

V311_CONNACK_RETURN_CODES = frozenset(range(6))
"""3.1.1 CONNACK return codes (3.2.2.3): 0 accepted, 1 unacceptable protocol version,
2 identifier rejected, 3 server unavailable, 4 bad user name or password, 5 not authorized."""
V311_SUBACK_RETURN_CODES = frozenset((0x00, 0x01, 0x02, 0x80))
"""3.1.1 SUBACK return codes (3.9.3): the granted QoS, or 0x80 Failure."""

_V311_CONNACK = {
    SUCCESS: 0,
    UNSUPPORTED_PROTOCOL_VERSION: 1,
    CLIENT_IDENTIFIER_NOT_VALID: 2,
    SERVER_UNAVAILABLE: 3,
    SERVER_BUSY: 3,
    BAD_USER_NAME_OR_PASSWORD: 4,
    NOT_AUTHORIZED: 5,
    BANNED: 5,
}


V311_CONNACK_MEANINGS = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}
"""What a 3.1.1 client says for each refusing CONNACK return code."""


def describe_reason(reason_code: int) -> str:
    """``0x87 Not authorized``: a reason code as the error lines show it."""
    return f"0x{reason_code:02X} {NAMES.get(reason_code, 'unknown reason code')}"


def connack_refusal(reason_code: int, version: int, reason_string: str | None = None) -> str:
    """A refusing CONNACK as one line: ``the server refused the connection: ...``."""
    if version == MQTT_311:  # a return code, not a reason code
        text = f"return code {reason_code} ({V311_CONNACK_MEANINGS.get(reason_code, 'refused')})"
    else:
        text = describe_reason(reason_code)
        if reason_string:
            text += f": {reason_string}"
    return f"the server refused the connection: {text}"


def connack_return_code(reason_code: int) -> int | None:
    """The 3.1.1 CONNACK return code saying what the v5 ``reason_code`` says, or None when 3.1.1
    has none (a 3.1.1 server then closes without a CONNACK, as 3.1.1 section 3.1.4 allows)."""
    return _V311_CONNACK.get(reason_code)


class MQTTProtocolError(ProtocolError):
    """Bytes that break MQTT: the stream cannot be read any further.

    ``reason_code`` is the v5 reason code to answer with: in a CONNACK while the CONNECT is being
    read (``packet_type`` is then 1; :func:`connack_return_code` for a 3.1.1 client), in a
    DISCONNECT after it (v5 only; a 3.1.1 peer is just disconnected).  ``packet_type`` is the
    control packet type whose body broke the rules, or None when the fixed header itself did;
    ``version`` is the protocol level in force (4 or 5), or None before the CONNECT said it.
    ``reply`` stays None: the answer depends on the session's state, which the codec does not
    know, so the server builds it.
    """

    reply = None

    def __init__(
        self,
        message: str,
        reason_code: int = MALFORMED_PACKET,
        packet_type: int | None = None,
        version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.packet_type = packet_type
        self.version = version

    def __repr__(self) -> str:
        return (
            f"MQTTProtocolError({str(self)!r}, reason_code=0x{self.reason_code:02X}, "
            f"packet_type={self.packet_type!r}, version={self.version!r})"
        )


def malformed(message: str) -> MQTTProtocolError:
    """0x81 Malformed Packet: the bytes cannot be read as the packet they say they are."""
    return MQTTProtocolError(message, MALFORMED_PACKET)


def protocol_error(message: str) -> MQTTProtocolError:
    """0x82 Protocol Error: readable, but a value the spec forbids."""
    return MQTTProtocolError(message, PROTOCOL_ERROR)

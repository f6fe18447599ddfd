"""The MQTT control packets as typed values, the same classes for MQTT 3.1.1 and MQTT 5.0.

MQTT 3.1.1 (OASIS Standard, 2014) chapter 3 and MQTT 5.0 (OASIS Standard, 2019) chapter 3 define
the fifteen packets; their fixed header is section 2.1 of both; the v5 properties are 2.2.2
(the table of identifiers and which packets may carry each is in :mod:`.properties`).

A value that only v5 has (properties, reason codes other than success, AUTH, the v5 subscription
options) keeps its default when a 3.1.1 packet is decoded, and the encoder refuses to put a
non-default one on a 3.1.1 wire.  Strings are ``str`` (the wire's UTF-8 Encoded Strings, checked
on the way in and out); payloads, passwords, correlation and authentication data are ``bytes``.
The protocol version is not in the CONNECT value: the decoder keeps it (``decoder.version``)
and the encoder takes it as an argument.

Dataclasses with slots, and frozen: a decoded packet is a value the server may keep and share;
:func:`dataclasses.replace` makes a changed copy.  The exceptions are PUBLISH and its four
acknowledgements, one or more per message on the hot path: a frozen dataclass's ``__init__``
sets each field through ``object.__setattr__``, which makes building one about four times
slower, so those are plain slotted dataclasses, to be treated as values all the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

MQTT_311 = 4
"""The protocol level of MQTT 3.1.1 in CONNECT."""
MQTT_5 = 5
"""The protocol level of MQTT 5.0 in CONNECT."""
VERSIONS = (MQTT_311, MQTT_5)
PROTOCOL_NAME = b"\x00\x04MQTT"
"""The Protocol Name field of a CONNECT, length included (3.1.2.1)."""

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15
WILL = 16
"""Not a packet type: stands for the Will Properties of a CONNECT in the table of which
properties a packet may carry."""

PACKET_NAMES = {
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
    WILL: "Will Properties",
}


@dataclass(frozen=True, slots=True, repr=False)
class Properties:
    """The v5 properties of one packet (MQTT 5.0 section 2.2.2), None or empty when absent.

    Only user properties and (in PUBLISH) subscription identifiers may occur more than once;
    both keep their wire order, which a server must keep when it forwards them.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        present = (
            f"{name}={getattr(self, name)!r}"
            for name in self.__dataclass_fields__
            if getattr(self, name) not in (None, ())
        )
        return f"Properties({', '.join(present)})"


NO_PROPERTIES = Properties()
"""The properties of every 3.1.1 packet and of a v5 packet whose Property Length is 0."""


@dataclass(frozen=True, slots=True)
class Will:
    """The Will Message of a CONNECT (3.1.2.5-3.1.2.7 and 3.1.3.2-3.1.3.4 in v5; 3.1.2.5-3.1.2.7
    and 3.1.3.2-3.1.3.3 in 3.1.1): published for the client if it goes away unannounced."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (section 3.1).  ``clean_start`` is 3.1.1's Clean Session flag, renamed in v5.
    ``password`` without ``username`` is v5 only; ``client_id`` may be empty (the server then
    assigns one; 3.1.1 allows that only with a clean session)."""

    TYPE: ClassVar[int] = CONNECT
    client_id: str
    clean_start: bool = True
    keep_alive: int = 0
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK (section 3.2).  ``reason_code`` is the byte on the wire: a v5 Connect Reason Code,
    or on a 3.1.1 wire the Connect Return Code 0-5 (:func:`.reasons.connack_return_code`)."""

    TYPE: ClassVar[int] = CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class Publish:
    """PUBLISH (section 3.3).  ``packet_id`` is None at QoS 0 and 1-65535 otherwise.  In v5 an
    empty ``topic`` with a Topic Alias property means "the topic the alias stands for"."""

    TYPE: ClassVar[int] = PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class Acknowledgement:
    """What PUBACK, PUBREC, PUBREL and PUBCOMP share: a Packet Identifier and, in v5, a reason
    code and properties.  Equality also compares the class: a PUBACK is never a PUBREC."""

    TYPE: ClassVar[int]
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class Puback(Acknowledgement):
    """PUBACK (section 3.4): the answer to a QoS 1 PUBLISH."""

    TYPE: ClassVar[int] = PUBACK


@dataclass(slots=True)
class Pubrec(Acknowledgement):
    """PUBREC (section 3.5): the first answer to a QoS 2 PUBLISH."""

    TYPE: ClassVar[int] = PUBREC


@dataclass(slots=True)
class Pubrel(Acknowledgement):
    """PUBREL (section 3.6): the answer to PUBREC."""

    TYPE: ClassVar[int] = PUBREL


@dataclass(slots=True)
class Pubcomp(Acknowledgement):
    """PUBCOMP (section 3.7): the answer to PUBREL, ending a QoS 2 exchange."""

    TYPE: ClassVar[int] = PUBCOMP


RETAIN_SEND = 0
"""Retain Handling 0: send retained messages whenever the subscription is made."""
RETAIN_SEND_IF_NEW = 1
"""Retain Handling 1: send them only when the subscription did not exist before."""
RETAIN_DO_NOT_SEND = 2
"""Retain Handling 2: never send retained messages for this subscription."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """One Topic Filter of a SUBSCRIBE and its Subscription Options (v5 3.8.3.1; 3.1.1 has only
    the requested QoS).  The filter is not checked by the decoder: a bad one gets its own
    SUBACK reason code (0x8F), not a closed connection (:mod:`.topics` checks it)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RETAIN_SEND


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE (section 3.8): at least one subscription.  A v5 Subscription Identifier is in
    ``properties.subscription_identifiers`` (at most one here)."""

    TYPE: ClassVar[int] = SUBSCRIBE
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK (section 3.9): one reason code (3.1.1: return code) per subscription, in order."""

    TYPE: ClassVar[int] = SUBACK
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (section 3.10): at least one topic filter."""

    TYPE: ClassVar[int] = UNSUBSCRIBE
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsuback:
    """UNSUBACK (section 3.11).  v5: one reason code per topic filter; 3.1.1 has none (empty)."""

    TYPE: ClassVar[int] = UNSUBACK
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pingreq:
    """PINGREQ (section 3.12)."""

    TYPE: ClassVar[int] = PINGREQ


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP (section 3.13)."""

    TYPE: ClassVar[int] = PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (section 3.14).  v5 lets either side send it, with a reason; in 3.1.1 only the
    client sends it, and it has no fields."""

    TYPE: ClassVar[int] = DISCONNECT
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (v5 section 3.15): one step of an enhanced authentication exchange."""

    TYPE: ClassVar[int] = AUTH
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
    | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect | Auth
)

PINGREQ_PACKET = Pingreq()
PINGRESP_PACKET = Pingresp()

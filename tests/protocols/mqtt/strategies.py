"""Hypothesis strategies for MQTT packets: every packet either side may send, in 3.1.1 or 5.0,
with only values the spec allows (so each one must survive an encode and a decode unchanged)."""
from __future__ import annotations

from hypothesis import strategies as st

from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    WILL,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from brokerd.protocols.mqtt.properties import (
    BINARY,
    BYTE,
    FOUR_BYTE,
    STRING,
    STRING_PAIR,
    TWO_BYTE,
    VARIABLE_BYTE,
    allowed_in,
)

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
"""UTF-8 Encoded Strings: any character but U+0000 and the surrogates."""
level = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/+#"), max_size=6
)
topic_name = st.lists(level, min_size=1, max_size=4).map("/".join).filter(bool)
topic_filter = st.one_of(
    topic_name,
    st.lists(st.one_of(level, st.just("+")), min_size=1, max_size=4).map("/".join).filter(bool),
    st.lists(st.one_of(level, st.just("+")), max_size=3).map(lambda levels: "/".join([*levels, "#"])),
)
packet_id = st.integers(1, 0xFFFF)
binary = st.binary(max_size=20)
payload = st.binary(max_size=200)
qos = st.integers(0, 2)

_VALUES = {
    BYTE: st.integers(0, 1),
    TWO_BYTE: st.integers(1, 0xFFFF),
    FOUR_BYTE: st.integers(1, 0xFFFF_FFFF),
    VARIABLE_BYTE: st.integers(1, 268_435_455),
    STRING: text,
    BINARY: binary,
}


@st.composite
def properties(draw, packet_type: int, subscription_identifiers: int = 0) -> Properties:
    """Any valid properties of a ``packet_type`` packet, each present or not; at most
    ``subscription_identifiers`` of those."""
    values: dict[str, object] = {}
    for spec in allowed_in(packet_type):
        if spec.attribute == "user_properties":
            values[spec.attribute] = tuple(draw(st.lists(st.tuples(text, text), max_size=3)))
        elif spec.attribute == "subscription_identifiers":
            most = subscription_identifiers if packet_type == PUBLISH else min(subscription_identifiers, 1)
            values[spec.attribute] = tuple(draw(st.lists(_VALUES[VARIABLE_BYTE], max_size=most)))
        elif draw(st.booleans()):
            if spec.attribute == "response_topic":
                values[spec.attribute] = draw(topic_name)
            elif spec.kind is STRING_PAIR:
                raise AssertionError("only User Property is a string pair")
            else:
                values[spec.attribute] = draw(_VALUES[spec.kind])
    if "authentication_data" in values and "authentication_method" not in values:
        del values["authentication_data"]
    return Properties(**values)  # type: ignore[arg-type]


def _props(version: int, packet_type: int, subscription_identifiers: int = 0):
    if version == MQTT_311:
        return st.just(NO_PROPERTIES)
    return properties(packet_type, subscription_identifiers)


def _reason(version: int, allowed: frozenset[int]):
    if version == MQTT_311:
        return st.just(0)
    return st.sampled_from(sorted(allowed))


@st.composite
def connect(draw, version: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(draw(topic_name), draw(binary), draw(qos), draw(st.booleans()), draw(_props(version, WILL)))
    username = draw(st.none() | text)
    password = draw(st.none() | binary)
    if version == MQTT_311 and username is None:
        password = None
    client_id = draw(text)
    clean_start = draw(st.booleans())
    if version == MQTT_311 and not client_id:
        clean_start = True
    return Connect(
        client_id, clean_start, draw(st.integers(0, 0xFFFF)), will, username, password, draw(_props(version, CONNECT))
    )


@st.composite
def connack(draw, version: int) -> Connack:
    codes = reasons.CONNACK_REASONS if version == MQTT_5 else reasons.V311_CONNACK_RETURN_CODES
    code = draw(st.sampled_from(sorted(codes)))
    return Connack(draw(st.booleans()) and code == 0, code, draw(_props(version, CONNACK)))


@st.composite
def publish(draw, version: int, from_server: bool) -> Publish:
    level = draw(qos)
    props = draw(_props(version, PUBLISH, 3 if from_server else 0))
    topic = draw(topic_name)
    if props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(
        topic,
        draw(payload),
        level,
        draw(st.booleans()),
        draw(st.booleans()) if level else False,
        draw(packet_id) if level else None,
        props,
    )


def ack(version: int):
    return st.one_of(
        st.builds(Puback, packet_id, _reason(version, reasons.PUBACK_REASONS), _props(version, PUBACK)),
        st.builds(Pubrec, packet_id, _reason(version, reasons.PUBACK_REASONS), _props(version, PUBREC)),
        st.builds(Pubrel, packet_id, _reason(version, reasons.PUBREL_REASONS), _props(version, PUBREL)),
        st.builds(Pubcomp, packet_id, _reason(version, reasons.PUBREL_REASONS), _props(version, PUBCOMP)),
    )


@st.composite
def subscription(draw, version: int) -> Subscription:
    chosen = draw(topic_filter)
    if version == MQTT_311:
        return Subscription(chosen, draw(qos))
    shared = draw(st.booleans())
    if shared:
        chosen = f"$share/{draw(level.filter(bool))}/{chosen}"
    no_local = False if shared else draw(st.booleans())
    return Subscription(chosen, draw(qos), no_local, draw(st.booleans()), draw(st.integers(0, 2)))


def subscribe(version: int):
    return st.builds(
        Subscribe,
        packet_id,
        st.lists(subscription(version), min_size=1, max_size=4).map(tuple),
        _props(version, SUBSCRIBE, 1),
    )


def suback(version: int):
    codes = reasons.SUBACK_REASONS if version == MQTT_5 else reasons.V311_SUBACK_RETURN_CODES
    return st.builds(
        Suback,
        packet_id,
        st.lists(st.sampled_from(sorted(codes)), min_size=1, max_size=4).map(tuple),
        _props(version, SUBACK),
    )


def unsubscribe(version: int):
    return st.builds(
        Unsubscribe,
        packet_id,
        st.lists(topic_filter, min_size=1, max_size=4).map(tuple),
        _props(version, UNSUBSCRIBE),
    )


def unsuback(version: int):
    if version == MQTT_311:
        return st.builds(Unsuback, packet_id)
    return st.builds(
        Unsuback,
        packet_id,
        st.lists(st.sampled_from(sorted(reasons.UNSUBACK_REASONS)), min_size=1, max_size=4).map(tuple),
        _props(version, UNSUBACK),
    )


def disconnect(version: int):
    return st.builds(Disconnect, _reason(version, reasons.DISCONNECT_REASONS), _props(version, DISCONNECT))


def auth():
    return st.builds(Auth, st.sampled_from(sorted(reasons.AUTH_REASONS)), properties(AUTH))


def client_packet(version: int):
    """Any packet a client sends after its CONNECT."""
    choices = [
        publish(version, from_server=False),
        ack(version),
        subscribe(version),
        unsubscribe(version),
        st.just(Pingreq()),
        disconnect(version),
    ]
    if version == MQTT_5:
        choices.append(auth())
    return st.one_of(choices)


def server_packet(version: int):
    """Any packet a server sends."""
    choices = [
        connack(version),
        publish(version, from_server=True),
        ack(version),
        suback(version),
        unsuback(version),
        st.just(Pingresp()),
    ]
    if version == MQTT_5:
        choices += [disconnect(version), auth()]
    return st.one_of(choices)


versions = st.sampled_from((MQTT_311, MQTT_5))


@st.composite
def client_stream(draw, max_packets: int = 8):
    """(version, packets): a CONNECT and what a client may send after it."""
    version = draw(versions)
    return version, [draw(connect(version)), *draw(st.lists(client_packet(version), max_size=max_packets))]


@st.composite
def server_stream(draw, max_packets: int = 8):
    """(version, packets): what a server may send to a client of that version."""
    version = draw(versions)
    return version, draw(st.lists(server_packet(version), min_size=1, max_size=max_packets))


"""The MQTT client: first in memory (bytes written out by hand from the MQTT 3.1.1 and 5.0
documents, on a StringTransport with a Clock), then over real loopback sockets against
Debian's mosquitto, in MQTT 3.1.1 and 5.0: connecting, refusals, subscribing, QoS 0/1/2 both
ways, retained messages, the will, unsubscribing and the keep-alive."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionAborted, ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from brokerd.protocols.mqtt.client import (
    MQTTClientProtocol,
    MQTTConnectError,
    MQTTError,
    MQTTReasonCodeError,
    connect,
)
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Connack,
    Puback,
    Pubcomp,
    Publish,
    Suback,
    Unsuback,
    Will,
)
from tests.support.live import TIMEOUT, Waiter, reactor
from tests.support.mosquitto import Mosquitto, mosquitto, password_file, start_mosquitto  # noqa: F401

VERSIONS = pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["3.1.1", "5"])


def outcome(d: Deferred) -> list[Any]:
    seen: list[Any] = []
    d.addBoth(seen.append)
    return seen


# ---------------------------------------------------------------------------- in memory

def connected_in_memory(
    version: int = MQTT_311, connack: bytes = b"\x20\x02\x00\x00", **options: Any
) -> tuple[MQTTClientProtocol, StringTransport, Clock, list[Publish]]:
    """A protocol on a StringTransport whose CONNACK (given as bytes) came; the transport is
    emptied of the CONNECT."""
    clock, received = Clock(), []
    protocol = MQTTClientProtocol("c", version=version, clock=clock, on_message=received.append, **options)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(connack)
    transport.clear()
    return protocol, transport, clock, received


def test_connect_is_written_as_the_spec_lays_it_out() -> None:
    protocol = MQTTClientProtocol("c", keep_alive=10, username="u", password="p", clock=Clock())
    transport = StringTransport()
    protocol.makeConnection(transport)
    # 3.1.1 section 3.1: fixed header, "MQTT", level 4, flags (user name, password, clean
    # session), Keep Alive 10, then client id, user name and password, each length-prefixed.
    assert transport.value() == b"\x10\x13\x00\x04MQTT\x04\xc2\x00\x0a\x00\x01c\x00\x01u\x00\x01p"


def test_a_v5_connect_tells_the_server_our_maximum_packet_size() -> None:
    protocol = MQTTClientProtocol("c", version=MQTT_5, keep_alive=0, clock=Clock(), max_packet_size=4096)
    transport = StringTransport()
    protocol.makeConnection(transport)
    # Property Length 5: Maximum Packet Size (0x27) as a Four Byte Integer.
    assert transport.value() == b"\x10\x13\x00\x04MQTT\x05\x02\x00\x00\x05\x27\x00\x00\x10\x00\x00\x01c"


def test_a_refusing_connack_fails_the_wait_with_its_reason() -> None:
    protocol = MQTTClientProtocol("c", clock=Clock())
    transport = StringTransport()
    protocol.makeConnection(transport)
    seen = outcome(protocol.when_connected())
    protocol.dataReceived(b"\x20\x02\x00\x05")
    error = seen[0].value
    assert isinstance(error, MQTTConnectError) and error.reason_code == 5
    assert "not authorized" in str(error)
    assert transport.disconnecting


def test_nothing_is_sent_before_the_connack() -> None:
    protocol = MQTTClientProtocol("c", clock=Clock())
    protocol.makeConnection(StringTransport())
    assert isinstance(outcome(protocol.publish("t", b"x"))[0].value, MQTTError)


def test_keep_alive_pings_when_idle_and_drops_a_silent_server() -> None:
    protocol, transport, clock, _ = connected_in_memory(keep_alive=10)
    clock.advance(5)
    assert transport.value() == b"\xc0\x00"  # PINGREQ
    protocol.dataReceived(b"\xd0\x00")  # PINGRESP
    transport.clear()
    clock.advance(2)
    protocol.publish("t", b"x")
    clock.advance(3)
    assert transport.value() == b"\x30\x04\x00\x01tx"  # a packet went out 3 s ago: no PINGREQ
    transport.clear()
    clock.advance(5)
    assert transport.value() == b"\xc0\x00"
    clock.advance(5)
    assert not transport.disconnecting  # unanswered for half the Keep Alive: still waiting
    clock.advance(5)
    assert transport.disconnecting or transport.disconnected


def test_packet_identifiers_are_reused_only_when_free() -> None:
    protocol, transport, _clock, _ = connected_in_memory()
    flows = [outcome(protocol.publish("t", b"", qos=1)) for _ in range(65_535)]
    assert transport.value().endswith(b"\x32\x05\x00\x01t\xff\xff")  # the last id is 65535
    transport.clear()
    waiting = outcome(protocol.publish("t", b"", qos=1))
    assert transport.value() == b""  # every identifier is taken: it waits
    protocol.dataReceived(b"\x40\x02\x00\x07")  # PUBACK 7
    assert flows[6] == [Puback(7)]
    assert transport.value() == b"\x32\x05\x00\x01t\x00\x07"
    assert waiting == []


def test_the_servers_receive_maximum_holds_back_more_messages() -> None:
    # v5 CONNACK with Receive Maximum (0x21) 1.
    protocol, transport, _clock, _ = connected_in_memory(MQTT_5, b"\x20\x06\x00\x00\x03\x21\x00\x01")
    first = outcome(protocol.publish("t", b"1", qos=2))
    second = outcome(protocol.publish("t", b"2", qos=1))
    assert transport.value() == b"\x34\x07\x00\x01t\x00\x01\x001"
    transport.clear()
    protocol.dataReceived(b"\x50\x02\x00\x01")  # PUBREC 1
    assert transport.value() == b"\x62\x02\x00\x01"  # PUBREL 1
    transport.clear()
    protocol.dataReceived(b"\x70\x02\x00\x01")  # PUBCOMP 1
    assert first == [Pubcomp(1)] and second == []
    assert transport.value() == b"\x32\x07\x00\x01t\x00\x02\x002"


def test_a_failure_reason_code_fails_the_publish() -> None:
    protocol, _transport, _clock, _ = connected_in_memory(MQTT_5, b"\x20\x03\x00\x00\x00")
    seen = outcome(protocol.publish("t", b"", qos=1))
    protocol.dataReceived(b"\x40\x03\x00\x01\x87")  # PUBACK 1, Not authorized
    error = seen[0].value
    assert isinstance(error, MQTTReasonCodeError) and error.reason_code == 0x87
    assert str(error) == "PUBACK 0x87 Not authorized"


def test_a_qos2_message_is_delivered_once_and_answered() -> None:
    protocol, transport, _clock, received = connected_in_memory()
    publish = b"\x34\x06\x00\x01t\x00\x05m"  # PUBLISH QoS 2, id 5
    protocol.dataReceived(publish)
    protocol.dataReceived(b"\x3c" + publish[1:])  # the same again, DUP set
    assert [p.payload for p in received] == [b"m"]
    assert transport.value() == b"\x50\x02\x00\x05" * 2  # PUBREC each time
    transport.clear()
    protocol.dataReceived(b"\x62\x02\x00\x05")  # PUBREL
    assert transport.value() == b"\x70\x02\x00\x05"  # PUBCOMP
    protocol.dataReceived(publish)  # released: id 5 now carries a new message
    assert [p.payload for p in received] == [b"m", b"m"]


def test_a_qos1_message_is_acknowledged_after_delivery() -> None:
    protocol, transport, _clock, received = connected_in_memory()
    protocol.dataReceived(b"\x32\x06\x00\x01t\x01\x02m")
    assert received == [Publish("t", b"m", qos=1, packet_id=0x0102)]
    assert transport.value() == b"\x40\x02\x01\x02"


def test_a_handlers_deferred_holds_the_answers_back_in_order() -> None:
    """A bridge answers the server only once it stored a message: a handler's Deferred holds
    its PUBACK or PUBREC, and the answers after it, until it fires (4.6: in order)."""
    clock, holds = Clock(), []

    def handler(packet: Publish) -> Deferred:
        holds.append(Deferred())
        return holds[-1]

    protocol = MQTTClientProtocol("c", clock=clock, on_message=handler)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b"\x20\x02\x00\x00")
    transport.clear()
    protocol.dataReceived(b"\x32\x06\x00\x01t\x00\x01m" + b"\x34\x06\x00\x01t\x00\x02m")  # QoS 1 id 1, QoS 2 id 2
    assert len(holds) == 2 and transport.value() == b""
    holds[1].callback(None)
    assert transport.value() == b""  # the PUBREC of id 2 waits for the PUBACK of id 1
    holds[0].callback(None)
    assert transport.value() == b"\x40\x02\x00\x01" + b"\x50\x02\x00\x02"


def test_a_failing_handler_drops_the_connection_unanswered() -> None:
    """The message was not kept: no acknowledgement, so a server that keeps the session
    sends it again on the next connection."""
    held: list[Deferred] = []

    def handler(packet: Publish) -> Deferred:
        held.append(Deferred())
        return held[-1]

    protocol = MQTTClientProtocol("c", clock=Clock(), on_message=handler)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b"\x20\x02\x00\x00")
    transport.clear()
    protocol.dataReceived(b"\x32\x06\x00\x01t\x00\x01m")
    held[0].errback(OSError("disk full"))
    assert transport.value() == b"" and not protocol.is_open


def test_the_bridge_flag_sets_the_top_bit_of_the_protocol_level() -> None:
    """Mosquitto's try_private: a 3.1.1 CONNECT of level 0x84 (a v5 one is unchanged)."""
    protocol = MQTTClientProtocol("c", keep_alive=10, clock=Clock(), bridge=True)
    transport = StringTransport()
    protocol.makeConnection(transport)
    assert transport.value() == b"\x10\x0d\x00\x04MQTT\x84\x02\x00\x0a\x00\x01c"


def test_a_broken_stream_closes_the_connection_and_fails_what_waits() -> None:
    protocol, transport, _clock, _ = connected_in_memory()
    seen = outcome(protocol.subscribe([("t", 0)]))
    protocol.dataReceived(b"\x90\x03\x00\x01\x03")  # SUBACK with return code 3
    assert transport.disconnecting or transport.disconnected
    protocol.connectionLost(ConnectionDone())
    assert isinstance(seen[0].value, MQTTError)


# ---------------------------------------------------------------------------- against mosquitto

async def bounded(d: Deferred) -> Any:
    return await d.addTimeout(TIMEOUT, reactor())


async def client(server: Mosquitto, version: int, client_id: str, **options: Any) -> MQTTClientProtocol:
    d = connect(reactor(), server.endpoint, client_id=client_id, version=version, **options)
    return await bounded(d)  # type: ignore[no-any-return]


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_connect_is_accepted(mosquitto: Mosquitto, version: int) -> None:  # noqa: F811
    protocol = await client(mosquitto, version, "" if version == MQTT_5 else "plain", keep_alive=30)
    try:
        assert isinstance(protocol.connack, Connack)
        assert protocol.connack.reason_code == 0 and not protocol.connack.session_present
        if version == MQTT_5:
            assert protocol.client_id  # an empty identifier: the server assigned one
        assert await bounded(protocol.ping()) >= 0
    finally:
        await bounded(protocol.disconnect())


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_a_refused_connection_says_why(tmp_path: Path, version: int) -> None:
    users = password_file(tmp_path / "passwords", {"alice": "secret"})
    server = start_mosquitto(tmp_path / "closed", f"password_file {users}", anonymous=False)
    try:
        with pytest.raises(MQTTConnectError) as refused:
            await client(server, version, "intruder", username="alice", password="wrong")
        # mosquitto says Not authorized (3.1.1: return code 5) for a wrong password too.
        assert refused.value.reason_code == (5 if version == MQTT_311 else 0x87)
        accepted = await client(server, version, "alice", username="alice", password=b"secret")
        await bounded(accepted.disconnect())
    finally:
        server.stop()


@VERSIONS
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_publish_and_receive_at_each_qos(mosquitto: Mosquitto, version: int, qos: int) -> None:  # noqa: F811
    inbox = Waiter()
    subscriber = await client(mosquitto, version, "subscriber", on_message=inbox)
    publisher = await client(mosquitto, version, "publisher")
    try:
        suback = await bounded(subscriber.subscribe([("q/#", 2)]))
        assert isinstance(suback, Suback) and suback.reason_codes == (2,)
        result = await bounded(publisher.publish("q/one", "caf\u00e9", qos=qos))
        if qos == 0:
            assert result is None
        else:
            assert type(result) is (Puback if qos == 1 else Pubcomp) and result.reason_code == 0
        # A QoS 0 message after it: once it is here, the first had every chance to come twice.
        await bounded(publisher.publish("q/two", b"after"))
        messages = await inbox.count(2)
        assert [(m.topic, m.payload, m.qos, m.retain) for m in messages] == [
            ("q/one", "caf\u00e9".encode(), qos, False),
            ("q/two", b"after", 0, False),
        ]
    finally:
        await bounded(subscriber.disconnect())
        await bounded(publisher.disconnect())


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_a_subscription_caps_the_qos(mosquitto: Mosquitto, version: int) -> None:  # noqa: F811
    inbox = Waiter()
    subscriber = await client(mosquitto, version, "subscriber", on_message=inbox)
    try:
        assert (await bounded(subscriber.subscribe([("cap", 1)]))).reason_codes == (1,)
        await bounded(subscriber.publish("cap", b"2", qos=2))
        [message] = await inbox.count(1)
        assert message.qos == 1 and message.payload == b"2"
    finally:
        await bounded(subscriber.disconnect())


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_a_retained_message_reaches_a_later_subscriber(mosquitto: Mosquitto, version: int) -> None:  # noqa: F811
    publisher = await client(mosquitto, version, "publisher")
    await bounded(publisher.publish("kept", b"last value", qos=1, retain=True))
    await bounded(publisher.disconnect())
    inbox = Waiter()
    late = await client(mosquitto, version, "late", on_message=inbox)
    try:
        await bounded(late.subscribe([("kept", 1)]))
        [message] = await inbox.count(1)
        assert (message.topic, message.payload, message.retain) == ("kept", b"last value", True)
    finally:
        await bounded(late.disconnect())


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_the_will_is_published_when_the_connection_drops(mosquitto: Mosquitto, version: int) -> None:  # noqa: F811
    inbox = Waiter()
    watcher = await client(mosquitto, version, "watcher", on_message=inbox)
    try:
        await bounded(watcher.subscribe([("wills/#", 1)]))
        polite = await client(mosquitto, version, "polite", will=Will("wills/polite", b"gone", qos=1))
        await bounded(polite.disconnect())  # DISCONNECT: the server discards the will
        rude = await client(mosquitto, version, "rude", will=Will("wills/rude", b"gone", qos=1))
        rude.abort()
        assert isinstance(await bounded(rude.when_closed()), ConnectionAborted)
        messages = await inbox.count(1)
        assert [(m.topic, m.payload, m.qos) for m in messages] == [("wills/rude", b"gone", 1)]
    finally:
        await bounded(watcher.disconnect())


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_unsubscribe_stops_the_messages(mosquitto: Mosquitto, version: int) -> None:  # noqa: F811
    inbox = Waiter()
    subscriber = await client(mosquitto, version, "subscriber", on_message=inbox)
    try:
        await bounded(subscriber.subscribe([("u/a", 1), ("u/b", 1)]))
        unsuback = await bounded(subscriber.unsubscribe(["u/a"]))
        assert isinstance(unsuback, Unsuback)
        assert unsuback.reason_codes == ((0,) if version == MQTT_5 else ())
        await bounded(subscriber.publish("u/a", b"not for us", qos=1))
        await bounded(subscriber.publish("u/b", b"still ours", qos=1))
        messages = await inbox.count(1)
        assert [(m.topic, m.payload) for m in messages] == [("u/b", b"still ours")]
    finally:
        await bounded(subscriber.disconnect())


@VERSIONS
@pytest.mark.slow  # a mosquitto subprocess
@pytest_twisted.ensureDeferred
async def test_keep_alive_pings_are_answered(mosquitto: Mosquitto, version: int) -> None:  # noqa: F811
    clock = Clock()
    protocol = await client(mosquitto, version, "idle", keep_alive=10, clock=clock)
    try:
        clock.advance(5)  # idle for half the Keep Alive: the LoopingCall sends PINGREQ
        await bounded(protocol.ping())  # PINGRESPs come in order: the keep-alive's came first
        clock.advance(10)  # had that PINGRESP been missed, the client would drop the connection now
        assert protocol.is_connected
        await bounded(protocol.ping())
    finally:
        await bounded(protocol.disconnect())

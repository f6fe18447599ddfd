"""The MQTT server's clocks and windows on StringTransport and a Clock (tests/protocols/mqtt/
harness.py): the CONNECT timeout, keep-alive (3.1.2.10, v5 Server Keep Alive), the QoS 1 and 2
windows both ways (the client's Receive Maximum and ``--mqtt-max-inflight``, 4.9), what a
resumed session sends again (4.4), session expiry (3.1.2.11.2) and the Will Delay Interval
(3.1.3.2.2).  Every test names the exact bytes the server writes, and each "nothing happens"
is checked beside what does."""
from __future__ import annotations

import pytest

from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Subscription,
    Will,
)
from tests.protocols.mqtt.harness import Client, Harness

PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"
CONNACK_V3 = b"\x20\x02\x00\x00"
CONNACK_V3_PRESENT = b"\x20\x02\x01\x00"
# v5 DISCONNECT 0x8D (Keep Alive timeout) with the Reason String "keep-alive timeout" (2.2.2.2
# property 0x1F), as the server writes it to a client that did not turn problem information off.
KEEP_ALIVE_TIMEOUT = b"\xe0\x17\x8d\x15\x1f\x00\x12keep-alive timeout"
SUBACK_QOS1_V3 = b"\x90\x03\x00\x01\x01"


def v5_connack(present: bool = False, **granted: int) -> bytes:
    """The v5 CONNACK of an accepted CONNECT: what the server announces with the defaults
    (Receive Maximum 20, Maximum Packet Size 1 MiB, Topic Alias Maximum 16), and ``granted``."""
    announced = {"receive_maximum": 20, "maximum_packet_size": 1 << 20, "topic_alias_maximum": 16, **granted}
    return encode(Connack(present, 0, Properties(**announced)), MQTT_5)


def v5_disconnect(reason_code: int, reason: bytes) -> bytes:
    """A v5 DISCONNECT with a Reason String (lengths below 128: one-byte Remaining Length)."""
    return b"\xe0" + bytes((2 + 3 + len(reason), reason_code, 3 + len(reason), 0x1F, 0, len(reason))) + reason


def v3_publish(payload: bytes, packet_id: int, qos: int = 1, dup: bool = False) -> bytes:
    """PUBLISH to topic "t" as the server writes it on a 3.1.1 wire (3.3.1, 3.3.2)."""
    first = 0x30 | (0x08 if dup else 0) | qos << 1
    return bytes((first, 2 + 1 + 2 + len(payload))) + b"\x00\x01t" + packet_id.to_bytes(2, "big") + payload


def v5_publish(payload: bytes, packet_id: int, qos: int = 1) -> bytes:
    """The same on a v5 wire: an empty property block after the Packet Identifier."""
    return bytes((0x30 | qos << 1, 2 + 1 + 2 + 1 + len(payload))) + b"\x00\x01t" \
        + packet_id.to_bytes(2, "big") + b"\x00" + payload


def publish_from(harness: Harness, *payloads: bytes, qos: int = 1) -> None:
    """Another client publishes ``payloads`` to "t" (each answered, then it disconnects)."""
    publisher = harness.connected(MQTT_311, "publisher")
    for number, payload in enumerate(payloads, 1):
        publisher.send(Publish("t", payload, qos=qos, packet_id=number if qos else None))
        if qos == 2:
            publisher.send(Pubrel(number))
    answers = {0: b"", 1: b"\x40\x02", 2: b"\x50\x02"}[qos]  # PUBACK, or PUBREC then PUBCOMP
    assert publisher.take() == b"".join(
        answers + n.to_bytes(2, "big") + (b"\x70\x02" + n.to_bytes(2, "big") if qos == 2 else b"")
        for n in range(1, len(payloads) + 1))
    publisher.send(Disconnect())
    publisher.lose()


# ---------------------------------------------------------------------- the CONNECT timeout


def test_a_connection_that_sends_no_connect_is_closed_at_the_connect_timeout() -> None:
    harness = Harness(mqtt_connect_timeout=5)
    silent = harness.connection()
    partial = harness.connection()
    partial.send_bytes(encode(Connect("slow"), MQTT_5)[:6])
    prompt = harness.connection()
    harness.clock.advance(4.9)
    assert not silent.closed and not partial.closed
    prompt.version = MQTT_311
    prompt.send(Connect("prompt"))
    assert prompt.take() == CONNACK_V3
    harness.clock.advance(0.1)
    assert silent.closed and partial.closed
    assert silent.take() == b"" and partial.take() == b""  # never answered
    harness.elapse(3600)
    assert not prompt.closed  # keep-alive 0 and no --mqtt-max-keep-alive: no limit
    prompt.send_bytes(PINGREQ)
    assert prompt.take() == PINGRESP


def test_a_connect_fed_byte_by_byte_stops_the_connect_timer() -> None:
    harness = Harness(mqtt_connect_timeout=5)
    client = harness.connection()
    for byte in encode(Connect("slowly", keep_alive=0), MQTT_311):
        harness.clock.advance(0.1)
        client.send_bytes(bytes((byte,)))
    assert client.take() == CONNACK_V3
    harness.elapse(60)
    assert not client.closed


def test_the_connect_timer_ends_with_a_connection_lost_before_it() -> None:
    harness = Harness(mqtt_connect_timeout=5)
    gone = harness.connection()
    gone.lose()
    assert _connect_timers(harness) == 0
    waiting = harness.connection()  # the positive control: a live one has its timer
    assert _connect_timers(harness) == 1
    harness.clock.advance(5)
    assert waiting.closed


def test_a_connection_over_the_limit_is_dropped_with_no_timer_and_one_that_ends_leaves_the_sweep() -> None:
    harness = Harness(max_connections=1)
    admitted = harness.connected(MQTT_311, "admitted", keep_alive=10)
    assert list(harness.factory.live) == [admitted.protocol]
    refused = harness.connection()
    assert refused.closed and refused.take() == b"" and refused.transport.producer is None
    assert _connect_timers(harness) == 0
    admitted.lose()
    assert harness.factory.live == {} and harness.broker.stats.connections == 0
    harness.factory.stopFactory()
    assert harness.clock.getDelayedCalls() == []


def _connect_timers(harness: Harness) -> int:
    return sum(getattr(call.func, "__name__", "") == "_connect_timed_out" for call in harness.clock.getDelayedCalls())


# ---------------------------------------------------------------------- keep-alive


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_one_and_a_half_keep_alives_of_silence_close_the_connection(version: int) -> None:
    harness = Harness()
    harness.clock.advance(0.5)  # between two sweeps
    quiet = harness.connected(version, "quiet", keep_alive=10)
    harness.elapse(15)  # 1.5 x 10 s since the CONNECT: the spec's bound, not past it
    assert not quiet.closed
    harness.elapse(1)  # past it, within the 1 s sweep
    assert quiet.closed
    assert quiet.take() == (KEEP_ALIVE_TIMEOUT if version == MQTT_5 else b"")


def test_a_pingreq_starts_the_keep_alive_again() -> None:
    harness = Harness()
    harness.clock.advance(0.5)  # between two sweeps
    client = harness.connected(MQTT_5, "pinging", keep_alive=10)
    for _ in range(5):  # 50 s, far past 1.5 x 10 s, with a PINGREQ every 10 s
        harness.elapse(10)
        client.send_bytes(PINGREQ)
        assert client.take() == PINGRESP
        assert not client.closed
    harness.elapse(15)
    assert not client.closed
    harness.elapse(1)
    assert client.closed and client.take() == KEEP_ALIVE_TIMEOUT


def test_any_packet_counts_as_heard_for_keep_alive() -> None:
    harness = Harness()
    harness.clock.advance(0.5)  # between two sweeps
    client = harness.connected(MQTT_311, "busy", keep_alive=4)
    for number in range(1, 6):
        harness.elapse(4)
        client.send(Publish("t", b"x", qos=1, packet_id=number))
        assert client.take() == b"\x40\x02" + number.to_bytes(2, "big")
    harness.elapse(5.75)  # within 1.5 x 4 s of the last PUBLISH
    assert not client.closed
    harness.elapse(1)
    assert client.closed


def test_max_keep_alive_lowers_the_client_s_and_says_so_in_the_v5_connack() -> None:
    harness = Harness(mqtt_max_keep_alive=6)
    harness.clock.advance(0.5)  # between two sweeps
    v5 = harness.connected(MQTT_5, "v5", keep_alive=60)
    forever = harness.connected(MQTT_5, "forever", keep_alive=0)
    within = harness.connected(MQTT_5, "within", keep_alive=4)
    v3 = harness.connected(MQTT_311, "v3", keep_alive=60)
    assert v5.connack == forever.connack == v5_connack(server_keep_alive=6)
    assert within.connack == v5_connack()  # 4 s is within the bound: no Server Keep Alive
    assert v3.connack == CONNACK_V3  # 3.1.1 cannot be told
    harness.elapse(5.75)  # 5.75 s of silence: within every bound
    assert not (v5.closed or forever.closed or within.closed or v3.closed)
    harness.elapse(1)  # 6.75 s: past 1.5 x 4 s
    assert within.closed and within.take() == KEEP_ALIVE_TIMEOUT
    harness.elapse(2)  # 8.75 s: within 1.5 x 6 s
    assert not (v5.closed or forever.closed or v3.closed)
    harness.elapse(1)  # 9.75 s: past it, not the 60 s the clients asked for
    assert v5.closed and forever.closed and v3.closed
    assert v5.take() == forever.take() == KEEP_ALIVE_TIMEOUT and v3.take() == b""


def test_keep_alive_timeout_ends_the_session_and_publishes_the_will() -> None:
    harness = Harness()
    watcher = harness.connected(MQTT_311, "watcher")
    watcher.send(Subscribe(1, (Subscription("t", 1),)))
    assert watcher.take() == SUBACK_QOS1_V3
    harness.clock.advance(0.5)  # between two sweeps
    quiet = harness.connected(MQTT_311, "quiet", keep_alive=2, will=Will("t", b"gone", qos=1))
    harness.elapse(2.75)
    assert not quiet.closed
    harness.elapse(1)  # 3.75 s of silence: past 1.5 x 2 s
    assert quiet.closed and quiet.take() == b""
    quiet.lose()  # the socket closes: a lost connection, so the will goes
    assert watcher.take() == v3_publish(b"gone", 1)
    assert "quiet" not in harness.sessions.by_id


# ---------------------------------------------------------------------- windows


def test_the_client_s_receive_maximum_bounds_the_messages_in_flight_to_it() -> None:
    harness = Harness()
    client = harness.connected(MQTT_5, "small", properties=Properties(receive_maximum=2))
    client.send(Subscribe(1, (Subscription("t", 1),)))
    assert client.take() == b"\x90\x04\x00\x01\x00\x01"
    publish_from(harness, b"m1", b"m2", b"m3", b"m4")
    assert client.take() == v5_publish(b"m1", 1) + v5_publish(b"m2", 2)
    client.send(Puback(2))
    assert client.take() == v5_publish(b"m3", 3)
    client.send(Puback(1))
    assert client.take() == v5_publish(b"m4", 4)
    client.send(Puback(3))
    assert client.take() == b""  # nothing more waits


def test_what_the_pubacks_of_one_read_release_goes_out_in_one_write() -> None:
    harness = Harness()
    client = harness.connected(MQTT_5, "small", properties=Properties(receive_maximum=2))
    client.send(Subscribe(1, (Subscription("t", 1),)))
    assert client.take() == b"\x90\x04\x00\x01\x00\x01"
    publish_from(harness, b"m1", b"m2", b"m3", b"m4", b"m5")
    assert client.take() == v5_publish(b"m1", 1) + v5_publish(b"m2", 2)
    writes: list[bytes] = []
    write = client.transport.write
    client.transport.write = lambda data: (writes.append(data), write(data))  # type: ignore[method-assign]
    client.send_bytes(encode(Puback(1), MQTT_5) + encode(Puback(2), MQTT_5))
    assert writes == [v5_publish(b"m3", 3) + v5_publish(b"m4", 4)]  # one write, not one per PUBACK
    client.send(Puback(3))
    assert writes[1:] == [v5_publish(b"m5", 5)]


def test_max_inflight_bounds_the_window_of_a_client_that_allows_more() -> None:
    harness = Harness(mqtt_max_inflight=2)
    client = harness.connected(MQTT_311, "large")
    client.send(Subscribe(1, (Subscription("t", 2),)))
    assert client.take() == b"\x90\x03\x00\x01\x02"
    publish_from(harness, b"m1", b"m2", b"m3", qos=2)
    assert client.take() == v3_publish(b"m1", 1, qos=2) + v3_publish(b"m2", 2, qos=2)
    client.send(Pubrec(1))
    assert client.take() == b"\x62\x02\x00\x01"  # PUBREL: still in flight until PUBCOMP
    client.send(Pubcomp(1))
    assert client.take() == v3_publish(b"m3", 3, qos=2)


def test_more_qos2_flows_than_the_receive_maximum_are_a_v5_protocol_error() -> None:
    """4.9: the server announces Receive Maximum ``--mqtt-max-inflight``; a client with that
    many QoS 2 PUBLISHes answered PUBREC and not released is told 0x93 at one more."""
    harness = Harness(mqtt_max_inflight=2)
    client = harness.connected(MQTT_5, "eager")
    assert v5_connack(receive_maximum=2) == client.connack
    client.send(Publish("t", b"1", qos=2, packet_id=1))
    client.send(Publish("t", b"2", qos=2, packet_id=2))
    assert client.take() == b"\x50\x02\x00\x01\x50\x02\x00\x02"
    client.send(Pubrel(1))
    assert client.take() == b"\x70\x02\x00\x01"  # released: room for one more
    client.send(Publish("t", b"3", qos=2, packet_id=3))
    assert client.take() == b"\x50\x02\x00\x03" and not client.closed
    client.send(Publish("t", b"4", qos=2, packet_id=4))
    reason = b"more unacknowledged QoS 1 and 2 messages than the Receive Maximum"
    assert client.take() == v5_disconnect(0x93, reason)
    assert client.closed


# ---------------------------------------------------------------------- resumed sessions


def test_a_resumed_session_sends_unacknowledged_publishes_again_with_dup() -> None:
    harness = Harness(mqtt_anonymous_sessions=10)
    client = harness.connected(MQTT_311, "resumed", clean_start=False)
    client.send(Subscribe(1, (Subscription("t", 2),)))
    assert client.take() == b"\x90\x03\x00\x01\x02"
    publish_from(harness, b"m1", b"m2", b"m3", qos=2)
    assert client.take() == b"".join(v3_publish(m, n, qos=2) for n, m in enumerate((b"m1", b"m2", b"m3"), 1))
    client.send(Pubrec(1))  # m1: the PUBREL is the server's to send again
    client.send(Pubrec(2))
    client.send(Pubcomp(2))  # m2: done, never sent again
    assert client.take() == b"\x62\x02\x00\x01\x62\x02\x00\x02"
    client.lose()
    publish_from(harness, b"m4", qos=1)  # while away: it waits in the session

    again = harness.connection()
    again.version = MQTT_311
    again.send(Connect("resumed", clean_start=False))
    assert again.take() == (CONNACK_V3_PRESENT + b"\x62\x02\x00\x01" + v3_publish(b"m3", 3, qos=2, dup=True)
                            + v3_publish(b"m4", 4, qos=1))
    again.send(Pubcomp(1))
    again.send(Pubrec(3))
    again.send(Puback(4))
    assert again.take() == b"\x62\x02\x00\x03"
    again.send(Pubcomp(3))
    again.lose()
    third = harness.connection()
    third.version = MQTT_311
    third.send(Connect("resumed", clean_start=False))
    assert third.take() == CONNACK_V3_PRESENT  # all acknowledged: nothing sent again


def test_a_clean_start_sends_nothing_again() -> None:
    harness = Harness(mqtt_anonymous_sessions=10)
    client = harness.connected(MQTT_311, "clean", clean_start=False)
    client.send(Subscribe(1, (Subscription("t", 1),)))
    client.take()
    publish_from(harness, b"m1")
    assert client.take() == v3_publish(b"m1", 1)
    client.lose()
    again = harness.connected(MQTT_311, "clean", clean_start=True)
    assert again.connack == CONNACK_V3 and again.take() == b""
    publish_from(harness, b"m2")  # the new session has no subscription
    assert again.take() == b""


# ---------------------------------------------------------------------- session expiry


def _persistent(harness: Harness, client_id: str, expiry: int, **connect: object) -> Client:
    client = harness.connected(MQTT_5, client_id, clean_start=False,
                               properties=Properties(session_expiry_interval=expiry), **connect)
    client.send(Subscribe(1, (Subscription("t", 1),)))
    assert client.take() == b"\x90\x04\x00\x01\x00\x01"
    return client


def test_a_session_outlives_its_connection_by_its_expiry_interval() -> None:
    harness = Harness(mqtt_anonymous_sessions=10)
    _persistent(harness, "kept", 30).lose()
    _persistent(harness, "ended", 30).lose()
    publish_from(harness, b"m1")
    harness.clock.advance(29.9)
    back = harness.connection()
    back.send(Connect("kept", clean_start=False, properties=Properties(session_expiry_interval=30)))
    present = v5_connack(True)
    assert back.take() == present + v5_publish(b"m1", 1)
    harness.clock.advance(0.1)
    assert "ended" not in harness.sessions.by_id
    late = harness.connection()
    late.send(Connect("ended", clean_start=False, properties=Properties(session_expiry_interval=30)))
    absent = v5_connack()
    assert late.take() == absent  # a new session: no Session Present, none of m1
    harness.clock.advance(3600)
    assert "kept" in harness.sessions.by_id  # the one in use does not expire


def test_max_session_expiry_shortens_the_client_s_and_says_so() -> None:
    harness = Harness(mqtt_anonymous_sessions=10, mqtt_max_session_expiry=20)
    client = _persistent(harness, "long", 3600)
    assert client.connack == v5_connack(session_expiry_interval=20)
    client.lose()
    harness.clock.advance(19.9)
    assert "long" in harness.sessions.by_id
    harness.clock.advance(0.1)
    assert "long" not in harness.sessions.by_id


def test_disconnect_may_shorten_the_expiry_but_not_raise_it_from_zero() -> None:
    harness = Harness(mqtt_anonymous_sessions=10)
    client = _persistent(harness, "short", 300)
    client.send(Disconnect(properties=Properties(session_expiry_interval=5)))
    assert client.closed and client.take() == b""
    client.lose()
    harness.clock.advance(4.9)
    assert "short" in harness.sessions.by_id
    harness.clock.advance(0.1)
    assert "short" not in harness.sessions.by_id

    ends = harness.connected(MQTT_5, "ends")  # Session Expiry 0: it ends with its connection
    ends.send(Disconnect(properties=Properties(session_expiry_interval=60)))
    reason = b"a session that ends with its connection cannot be kept at DISCONNECT"
    assert ends.take() == v5_disconnect(0x82, reason)
    ends.lose()
    assert "ends" not in harness.sessions.by_id


# ---------------------------------------------------------------------- wills


def _watch(harness: Harness) -> Client:
    watcher = harness.connected(MQTT_311, "watcher")
    watcher.send(Subscribe(1, (Subscription("t", 1),)))
    assert watcher.take() == SUBACK_QOS1_V3
    return watcher


def _delayed_will(harness: Harness, delay: int, expiry: int) -> Client:
    will = Will("t", b"will", qos=1, properties=Properties(will_delay_interval=delay))
    return harness.connected(MQTT_5, "mortal", clean_start=False, will=will,
                             properties=Properties(session_expiry_interval=expiry))


@pytest.mark.parametrize(("delay", "expiry"), [(10, 60), (60, 10)])
def test_a_delayed_will_is_published_after_its_delay_or_the_session_s_end(delay: int, expiry: int) -> None:
    """3.1.3.2.2: the will goes when the Will Delay Interval or the session ends, the first."""
    harness = Harness(mqtt_anonymous_sessions=10)
    watcher = _watch(harness)
    _delayed_will(harness, delay, expiry).lose()
    harness.clock.advance(9.9)
    assert watcher.take() == b"" and "mortal" in harness.sessions.by_id
    harness.clock.advance(0.1)
    assert watcher.take() == v3_publish(b"will", 1)
    assert ("mortal" in harness.sessions.by_id) == (expiry > delay)


def test_a_client_back_within_the_will_delay_cancels_the_will() -> None:
    harness = Harness(mqtt_anonymous_sessions=10)
    watcher = _watch(harness)
    _delayed_will(harness, 10, 60).lose()
    harness.clock.advance(5)
    back = harness.connection()
    back.send(Connect("mortal", clean_start=False, properties=Properties(session_expiry_interval=60)))
    assert back.take() == v5_connack(True)
    harness.clock.advance(60)
    publish_from(harness, b"alive")  # the positive control: the watcher still receives
    assert watcher.take() == v3_publish(b"alive", 1)


@pytest.mark.parametrize(("reason_code", "published"), [(0x00, False), (0x04, True)])
def test_disconnect_decides_whether_the_will_goes(reason_code: int, published: bool) -> None:
    harness = Harness()
    watcher = _watch(harness)
    client = harness.connected(MQTT_5, "leaving", will=Will("t", b"will", qos=1))
    client.send(Disconnect(reason_code))
    client.lose()
    publish_from(harness, b"after")  # the positive control, after the will if any
    expected = v3_publish(b"will", 1) + v3_publish(b"after", 2) if published else v3_publish(b"after", 1)
    assert watcher.take() == expected

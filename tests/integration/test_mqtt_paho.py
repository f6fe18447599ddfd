"""The MQTT front end of a real ``twistd brokerd`` driven by paho-mqtt 2.x, a third-party client,
in MQTT 3.1.1 and in MQTT 5.0 (every test runs in both where both have the feature).

One broker serves the module; each test uses topics and client identifiers of its own (with the
protocol version in them).  paho runs its network loop in its own thread (``loop_start``) and
every callback lands in a queue, so each wait is a bounded ``Queue.get``.  A test that shows
something did *not* arrive also shows that something allowed, sent after it, did.

:class:`MQTTClient` is shared with the other ``test_mqtt_*`` modules.
"""
from __future__ import annotations

import itertools
import queue
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from paho.mqtt.client import CallbackAPIVersion, Client, MQTTMessage, MQTTv5, MQTTv311
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

BOUND = 10.0
"""Seconds any one wait may take before the test fails."""
MQTT_LISTENER = {"mqtt": "tcp:{port}:interface=127.0.0.1"}
ANONYMOUS_SESSIONS = ("--mqtt-anonymous-sessions", "1000")
"""Persistent sessions for the anonymous clients of a test broker (none by default)."""
VERSIONS = [pytest.param(MQTTv311, id="3.1.1"), pytest.param(MQTTv5, id="5.0")]
_names = itertools.count(1)


def unique(prefix: str, version: int) -> str:
    """A topic or client identifier no other test of the run uses."""
    return f"{prefix}-v{version}-{next(_names)}"


def code(reason: Any) -> int:
    """The numeric value of a paho ReasonCode (or of an int)."""
    return reason if isinstance(reason, int) else reason.value


def properties(packet_type: int, **values: Any) -> Properties:
    props = Properties(packet_type)
    for name, value in values.items():
        setattr(props, name, value)
    return props


class MQTTClient:
    """paho on its own network thread; connection events, acknowledgements and messages are
    queued, and every wait on them is bounded by :data:`BOUND`.  paho's automatic reconnection
    is off, so a connection the broker closed stays closed (no takeover ping-pong)."""

    def __init__(self, port: int, version: int, client_id: str = "", *, clean: bool = True,
                 expiry: int | None = None, username: str | None = None, password: str | None = None,
                 will: tuple[Any, ...] | None = None, connect: bool = True,
                 keepalive: int = 60, connect_properties: dict[str, Any] | None = None) -> None:
        self.port = port
        self.version = version
        self.client_id = client_id
        self.client = Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                             clean_session=clean if version == MQTTv311 else None, reconnect_on_failure=False)
        self.clean = clean
        self.keepalive = keepalive
        self.connect_properties = dict(connect_properties or {})
        if expiry is not None:
            self.connect_properties["SessionExpiryInterval"] = expiry
        self.connacks: queue.Queue = queue.Queue()
        self.messages: queue.Queue[MQTTMessage] = queue.Queue()
        self.acks: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        client = self.client
        client.on_connect = lambda c, u, flags, rc, props: self.connacks.put((flags.session_present, code(rc), props))
        client.on_message = lambda c, u, message: self.messages.put(message)
        client.on_subscribe = lambda c, u, mid, codes, props: self.acks.put(("suback", mid, [code(x) for x in codes]))
        client.on_unsubscribe = lambda c, u, mid, codes, props: self.acks.put(("unsuback", mid, [code(x) for x in codes]))
        client.on_publish = lambda c, u, mid, rc, props: self.acks.put(("publish", mid, code(rc)))
        client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(code(rc))
        if username is not None:
            client.username_pw_set(username, password)
        if will is not None:
            client.will_set(*will)
        self.looping = False
        if connect:
            self.connect()

    # ------------------------------------------------------------------ connection

    def start(self) -> None:
        """Open the connection and send CONNECT; :meth:`connack` waits for the answer."""
        client = self.client
        if self.version == MQTTv5:
            props = properties(PacketTypes.CONNECT, **self.connect_properties) if self.connect_properties else None
            client.connect("127.0.0.1", self.port, keepalive=self.keepalive, clean_start=self.clean, properties=props)
        else:
            client.connect("127.0.0.1", self.port, keepalive=self.keepalive)
        client.loop_start()
        self.looping = True

    def connack(self) -> tuple[bool, int, Any]:
        """(Session Present, the CONNACK's reason or return code, its v5 properties)."""
        return self.connacks.get(timeout=BOUND)

    def connect(self) -> bool:
        """Connect and require success; whether the session was present."""
        self.start()
        present, reason, _props = self.connack()
        assert reason == 0, f"CONNACK {reason:#x} for {self.client_id!r}"
        return bool(present)

    def disconnected(self) -> int:
        """The reason code of the broker's DISCONNECT (v5), or of paho's own view of the close."""
        return self.disconnects.get(timeout=BOUND)

    def disconnect(self) -> None:
        """A normal DISCONNECT (paho's) if still connected, then stop paho's thread."""
        if self.looping:
            if self.client.is_connected():
                self.client.disconnect()
                self.disconnected()
            self.stop()

    def stop(self) -> None:
        if self.looping:
            self.looping = False
            self.client.loop_stop()

    def socket(self) -> socket.socket:
        """paho's socket, paho's thread stopped, in blocking mode with the bound."""
        self.stop()
        sock = self.client.socket()
        assert sock is not None, "not connected"
        sock.settimeout(BOUND)
        return sock

    def abort(self) -> None:
        """Close the TCP connection without DISCONNECT (the will's case)."""
        sock = self.socket()
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def disconnect_and_see_it_taken(self, reason: int = 0) -> None:
        """Send DISCONNECT (v5: with ``reason``) on paho's socket and wait until the broker
        closes the connection: once the client sees the close, the broker has handled the
        DISCONNECT and the end of the connection (a will it published would be on its way
        before anything sent later)."""
        sock = self.socket()
        sock.sendall(bytes((0xE0, 1, reason)) if reason else b"\xe0\x00")
        while sock.recv(65536):
            pass
        sock.close()

    # ------------------------------------------------------------------ requests

    def _ack(self, kind: str, mid: int) -> Any:
        got = self.acks.get(timeout=BOUND)
        assert got[:2] == (kind, mid), (got, kind, mid)
        return got[2]

    def subscribe(self, topic_filter: str, qos: int = 0, **options: Any) -> int:
        """SUBSCRIBE to one filter; the SUBACK's code for it."""
        return self.subscribe_many([(topic_filter, qos)], **options)[0]

    def subscribe_many(self, filters: list[tuple[str, int]], *, no_local: bool = False,
                       identifier: int | None = None, retain_handling: int = 0,
                       retain_as_published: bool = False) -> list[int]:
        """SUBSCRIBE to several filters at once (v5: with these options); the SUBACK's codes."""
        props = None
        if self.version == MQTTv5:
            options = [(f, SubscribeOptions(qos=q, noLocal=no_local, retainAsPublished=retain_as_published,
                                            retainHandling=retain_handling)) for f, q in filters]
            if identifier is not None:
                props = properties(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=identifier)
            result, mid = self.client.subscribe(options, properties=props)
        else:
            result, mid = self.client.subscribe(filters)
        assert result == 0, result
        return self._ack("suback", mid)

    def send_invalid_filters(self) -> None:
        """Let paho send filters it would refuse itself, to hear the broker's answer."""
        self.client._filter_wildcard_len_check = lambda topic: 0  # type: ignore[method-assign]

    def unsubscribe(self, *filters: str) -> list[int]:
        """UNSUBSCRIBE; the UNSUBACK's codes (v5; paho gives 3.1.1 one success code)."""
        result, mid = self.client.unsubscribe(list(filters))
        assert result == 0, result
        return self._ack("unsuback", mid)

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False, **props: Any) -> int:
        """PUBLISH and wait until paho is done with it (QoS 0: written; QoS 1: PUBACK; QoS 2:
        PUBCOMP); the reason code of that acknowledgement (v5)."""
        publish_props = properties(PacketTypes.PUBLISH, **props) if props else None
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=publish_props)
        assert info.rc == 0, info.rc
        return self._ack("publish", info.mid)

    # ------------------------------------------------------------------ what arrives

    def message(self) -> MQTTMessage:
        return self.messages.get(timeout=BOUND)

    def messages_until(self, payload: bytes) -> list[MQTTMessage]:
        """Every message up to and including the first with ``payload`` (the sentinel)."""
        got = []
        while True:
            message = self.message()
            got.append(message)
            if message.payload == payload:
                return got


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-paho"), *ANONYMOUS_SESSIONS, listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


def assert_clean_log(broker: RunningBroker) -> None:
    log = broker.log()
    assert "Traceback" not in log and "Unhandled" not in log, log[-5000:]


@pytest.fixture
def clients(broker: RunningBroker) -> Iterator[Callable[..., MQTTClient]]:
    """``clients(version, client_id="", **options)``: connected MQTTClients, closed after the test."""
    made: list[MQTTClient] = []

    def make(version: int, client_id: str = "", **options: Any) -> MQTTClient:
        client = MQTTClient(broker.ports["mqtt"], version, client_id, **options)
        made.append(client)
        return client

    yield make
    close_clients(made)


def close_clients(made: list[MQTTClient]) -> None:
    """Disconnect each client, or stop it when it cannot (its connection is gone)."""
    for client in made:
        try:
            client.disconnect()
        except (queue.Empty, OSError):
            client.stop()


def texts(messages: list[MQTTMessage]) -> list[tuple[str, bytes]]:
    return [(m.topic, m.payload) for m in messages]


# ---------------------------------------------------------------------- QoS flows


@pytest.mark.parametrize("version", VERSIONS)
def test_every_qos_is_published_and_received_at_the_granted_qos(clients, version: int) -> None:
    topic = unique("qos", version)
    sub = clients(version)
    assert sub.subscribe(topic + "/#", 2) == 2
    pub = clients(version)
    for qos in (0, 1, 2):
        assert pub.publish(f"{topic}/q{qos}", f"payload at {qos}".encode(), qos) == 0
        message = sub.message()
        assert (message.topic, message.payload, message.qos, message.retain) == (
            f"{topic}/q{qos}", f"payload at {qos}".encode(), qos, False)

    # A subscription granted QoS 1 gets a QoS 2 message at QoS 1, and a QoS 0 subscription
    # everything at QoS 0.
    low = clients(version)
    assert low.subscribe_many([(f"{topic}/q2", 1), (f"{topic}/q1", 0)]) == [1, 0]
    pub.publish(f"{topic}/q2", b"downgraded to 1", 2)
    pub.publish(f"{topic}/q1", b"downgraded to 0", 1)
    got = [low.message(), low.message()]
    assert [(m.payload, m.qos) for m in got] == [(b"downgraded to 1", 1), (b"downgraded to 0", 0)]


@pytest.mark.parametrize("version", VERSIONS)
def test_many_messages_of_each_qos_arrive_once_in_order(clients, version: int) -> None:
    """Order is kept per QoS (4.6: same topic and QoS); paho hands a QoS 2 message over at
    PUBREL, after the QoS 0 and 1 ones the broker sent meanwhile, so only each QoS's own
    order is compared."""
    topic = unique("order", version)
    sub = clients(version)
    sub.subscribe(topic, 2)
    pub = clients(version)
    sent = []
    for i in range(60):
        qos = i % 3
        payload = f"m{i}".encode()
        info = pub.client.publish(topic, payload, qos=qos)
        assert info.rc == 0
        sent.append((payload, qos))
    got = [(m.payload, m.qos) for m in (sub.message() for _ in sent)]
    for qos in (0, 1, 2):
        assert [m for m in got if m[1] == qos] == [m for m in sent if m[1] == qos]
    assert sub.messages.empty()


# ---------------------------------------------------------------------- retained


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_goes_to_late_subscribers_until_an_empty_one_clears_it(clients, version: int) -> None:
    base = unique("retained", version)
    topic = f"{base}/state"
    early = clients(version)
    early.subscribe(topic, 1)
    pub = clients(version)
    assert pub.publish(topic, b"the state", 1, retain=True) == 0
    live = early.message()
    assert (live.payload, live.retain) == (b"the state", False), "a live subscription gets it as a normal message"

    late = clients(version)
    late.subscribe(topic, 1)
    kept = late.message()
    assert (kept.topic, kept.payload, kept.retain, kept.qos) == (topic, b"the state", True, 1)
    wild = clients(version)
    wild.subscribe(f"{base}/+", 0)  # a wildcard filter finds it too
    kept = wild.message()
    assert (kept.topic, kept.payload, kept.retain) == (topic, b"the state", True)

    assert pub.publish(topic, b"", 1, retain=True) == 0
    cleared = early.message()
    assert cleared.payload == b"", "the empty retained message is delivered as a normal one"

    later = clients(version)
    later.subscribe(topic, 1)
    pub.publish(topic, b"not retained", 1)
    first = later.message()
    assert (first.payload, first.retain) == (b"not retained", False), "nothing retained any more"


def test_v5_retain_handling(clients) -> None:
    """Retain Handling 0 sends the retained message at every SUBSCRIBE, 1 only for a new
    subscription, 2 never; live messages reach all of them with RETAIN 0."""
    base = unique("handling", MQTTv5)
    topic = f"{base}/state"
    pub = clients(MQTTv5)
    pub.publish(topic, b"retained", 2, retain=True)

    never = clients(MQTTv5)
    never.subscribe(topic, 2, retain_handling=2)
    if_new = clients(MQTTv5)
    if_new.subscribe(topic, 2, retain_handling=1)
    got = if_new.message()
    assert (got.payload, got.retain, got.qos) == (b"retained", True, 2)
    if_new.subscribe(topic, 2, retain_handling=1)  # the same filter again: not new
    always = clients(MQTTv5)
    always.subscribe(topic, 1)
    assert always.message().payload == b"retained"
    always.subscribe(topic, 1)
    assert always.message().payload == b"retained", "Retain Handling 0 sends it at every SUBSCRIBE"

    pub.publish(topic, b"live and retained", 1, retain=True)
    pub.publish(topic, b"live only", 1)
    for client in (never, if_new, always):
        assert [(m.payload, m.retain) for m in (client.message(), client.message())] == [
            (b"live and retained", False), (b"live only", False)]


def test_v5_retain_as_published_keeps_the_retain_flag_on_live_messages(clients) -> None:
    """3.8.3.1: with Retain As Published (SUBSCRIBE options 0x08) messages keep the RETAIN
    flag they were published with."""
    topic = unique("rap", MQTTv5)
    as_published = clients(MQTTv5)
    as_published.subscribe(topic, 1, retain_as_published=True)
    pub = clients(MQTTv5)
    pub.publish(topic, b"live and retained", 1, retain=True)
    pub.publish(topic, b"live only", 1)
    assert [(m.payload, m.retain) for m in (as_published.message(), as_published.message())] == [
        (b"live and retained", True), (b"live only", False)]


def test_v5_messages_over_the_clients_maximum_packet_size_are_not_sent_to_it(clients) -> None:
    topic = unique("small", MQTTv5)
    small = clients(MQTTv5, connect_properties={"MaximumPacketSize": 128})
    small.subscribe(topic, 1)
    pub = clients(MQTTv5)
    pub.publish(topic, b"x" * 200, 1)
    pub.publish(topic, b"x" * 200, 0)
    pub.publish(topic, b"fits", 1)
    assert small.message().payload == b"fits"


def test_an_unacknowledged_message_is_sent_again_with_dup_when_the_session_resumes(broker: RunningBroker,
                                                                                     clients) -> None:
    from tests.integration.test_mqtt_bad_input import V5, RawMQTT, subscribe_packet

    topic = unique("dup", MQTTv5)
    client_id = unique("forgetful", MQTTv5)
    raw = RawMQTT(broker)
    try:
        raw.connect(V5, client_id, clean=False, session_expiry=300)
        raw.send(subscribe_packet(V5, topic, 1))
        assert raw.read() == (0x90, b"\x00\x01\x00\x01")
        clients(MQTTv5).publish(topic, b"say again", 1)
        first, body = raw.read()
        assert first == 0x32 and b"say again" in body
        packet_id = body[2 + len(topic):4 + len(topic)]
    finally:
        raw.close()  # no PUBACK
    again = RawMQTT(broker)
    try:
        present, reason = again.connack(V5, client_id, clean=False, session_expiry=300)
        assert (present, reason) == (1, 0)
        first, body = again.read()
        assert first == 0x3A, "QoS 1 with DUP"
        assert body[2 + len(topic):4 + len(topic)] == packet_id and body.endswith(b"say again")
        again.send(bytes((0x40, 2)) + packet_id)
    finally:
        again.close()


# ---------------------------------------------------------------------- wills


@pytest.mark.parametrize("version", VERSIONS)
def test_will_is_published_when_the_connection_breaks_and_not_after_disconnect(clients, version: int) -> None:
    topic = unique("will", version)
    watcher = clients(version)
    watcher.subscribe(topic + "/#", 1)

    polite = clients(version, will=(f"{topic}/polite", b"polite will", 1, False))
    polite.disconnect_and_see_it_taken()
    rude = clients(version, will=(f"{topic}/rude", b"rude will", 1, False))
    rude.abort()
    got = watcher.message()
    assert (got.topic, got.payload, got.qos) == (f"{topic}/rude", b"rude will", 1), "the polite client's will came"

    # A retained will is kept for later subscribers.
    kept = clients(version, will=(f"{topic}/kept", b"kept will", 0, True))
    kept.abort()
    assert watcher.message().payload == b"kept will"
    late = clients(version)
    late.subscribe(f"{topic}/kept")
    got = late.message()
    assert (got.payload, got.retain) == (b"kept will", True)


def test_v5_will_delay_interval_lets_a_client_resume_without_its_will(clients) -> None:
    """3.1.3.2.2: the will waits for its Will Delay Interval (or the end of the session); a
    connection to the session before then cancels it [MQTT-3.1.3-9].  The resumed connection's
    own message, published after its CONNACK, bounds the wait."""
    topic = unique("delayed", MQTTv5)
    watcher = clients(MQTTv5)
    watcher.subscribe(topic, 1)
    client_id = unique("delaying", MQTTv5)
    will_props = properties(PacketTypes.WILLMESSAGE, WillDelayInterval=300)
    breaking = clients(MQTTv5, client_id, clean=False, expiry=300, will=(topic, b"too early", 1, False, will_props))
    breaking.abort()
    back = clients(MQTTv5, client_id, clean=False, expiry=300, connect=False)
    back.start()
    assert back.connack()[:2] == (True, 0)
    back.publish(topic, b"back again", 1)
    assert watcher.message().payload == b"back again"


def test_v5_a_takeover_within_the_will_delay_sends_no_will_and_a_clean_start_sends_it(clients) -> None:
    """3.1.4: a takeover publishes the old connection's will as a lost connection would: with a
    Will Delay Interval and the session going on (Clean Start 0) it is cancelled; a takeover
    with Clean Start 1 ends the session, so the will goes at once (3.1.3.2.2)."""
    topic = unique("takeover-will", MQTTv5)
    watcher = clients(MQTTv5)
    watcher.subscribe(topic, 1)
    client_id = unique("taken", MQTTv5)
    will_props = properties(PacketTypes.WILLMESSAGE, WillDelayInterval=300)
    first = clients(MQTTv5, client_id, clean=False, expiry=300, will=(topic, b"will one", 1, False, will_props))
    second = clients(MQTTv5, client_id, clean=False, expiry=300,
                     will=(topic, b"will two", 1, False, will_props))
    assert first.disconnected() == 0x8E
    first.stop()
    second.publish(topic, b"resumed", 1)
    assert watcher.message().payload == b"resumed", "the will of the resumed session was sent"
    clients(MQTTv5, client_id, clean=True)
    assert second.disconnected() == 0x8E
    second.stop()
    assert watcher.message().payload == b"will two"


def test_v5_disconnect_with_will_message_publishes_the_will(clients) -> None:
    topic = unique("will", MQTTv5)
    watcher = clients(MQTTv5)
    watcher.subscribe(topic, 1)
    leaving = clients(MQTTv5, will=(topic, b"asked for", 1, False))
    leaving.disconnect_and_see_it_taken(reason=0x04)
    assert watcher.message().payload == b"asked for"


# ---------------------------------------------------------------------- wildcards and $ topics


@pytest.mark.parametrize("version", VERSIONS)
def test_wildcards_match_and_overlapping_filters_deliver_once_at_the_highest_qos(clients, version: int) -> None:
    top = unique("wild", version)
    sub = clients(version)
    assert sub.subscribe_many([(f"{top}/+/temp", 0), (f"{top}/house/#", 1)]) == [0, 1]
    pub = clients(version)
    for topic in (f"{top}/kitchen/temp", f"{top}/kitchen/humidity", f"{top}/house", f"{top}/house/a/b",
                  f"{top}/a/b/temp", f"{top}/house/temp", f"{top}x/kitchen/temp"):
        pub.publish(topic, topic.encode(), 1)
    pub.publish(f"{top}/end/temp", b"end", 1)
    got = sub.messages_until(b"end")
    assert [(m.topic, m.qos) for m in got] == [
        (f"{top}/kitchen/temp", 0), (f"{top}/house", 1), (f"{top}/house/a/b", 1), (f"{top}/house/temp", 1),
        (f"{top}/end/temp", 0),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_dollar_topics_are_the_servers_and_not_matched_by_leading_wildcards(clients, version: int) -> None:
    """A client's publish to a ``$`` topic is refused (v5 0x90; 3.1.1 acknowledged, dropped:
    test_mqtt_retained_hardening has the rest), and ``#`` never brings one."""
    name = unique("dollar", version)
    everything = clients(version)
    assert everything.subscribe_many([("#", 0), ("+/status", 0)]) == [0, 0]
    exact = clients(version)
    exact.subscribe_many([("$SYS/status", 0), (f"{name}/status", 0)])
    pub = clients(version)
    assert pub.publish("$SYS/status", name.encode(), 1) == (0x90 if version == MQTTv5 else 0)
    pub.publish(f"{name}/status", b"sentinel", 1)
    assert texts([exact.message()]) == [(f"{name}/status", b"sentinel")], "the $ topic was published"
    seen = everything.messages_until(b"sentinel")
    # Retained messages of earlier tests may come first; nothing under $ may come at all.
    assert not [m.topic for m in seen if m.topic.startswith("$")], texts(seen)
    assert [m.topic for m in seen if m.payload == b"sentinel"] == [f"{name}/status"]


# ---------------------------------------------------------------------- unsubscribe


@pytest.mark.parametrize("version", VERSIONS)
def test_unsubscribe_stops_delivery_of_that_filter_only(clients, version: int) -> None:
    topic = unique("unsub", version)
    sub = clients(version)
    sub.subscribe_many([(f"{topic}/a", 1), (f"{topic}/b", 1)])
    pub = clients(version)
    pub.publish(f"{topic}/a", b"a before", 1)
    assert sub.message().payload == b"a before"
    codes = sub.unsubscribe(f"{topic}/a")
    if version == MQTTv5:
        assert codes == [0]
        assert sub.unsubscribe(f"{topic}/never") == [0x11], "No subscription existed"
    pub.publish(f"{topic}/a", b"a after", 1)
    pub.publish(f"{topic}/b", b"b after", 1)
    assert texts([sub.message()]) == [(f"{topic}/b", b"b after")]


# ---------------------------------------------------------------------- persistent sessions


def test_a_stored_session_reads_more_than_a_page_of_what_waits_in_order(clients) -> None:
    """What waits for a stored session is read from the store a page (256) at a time as the
    client acknowledges: 600 messages come, each once, in the order published."""
    topic = unique("pages", MQTTv311)
    client_id = unique("pages", MQTTv311)
    first = clients(MQTTv311, client_id, clean=False)
    assert first.subscribe(topic, 1) == 1
    first.disconnect()
    pub = clients(MQTTv311)
    sent = [f"page {i}".encode() for i in range(600)]
    for payload in sent:
        assert pub.publish(topic, payload, 1) == 0
    back = clients(MQTTv311, client_id, clean=False, connect=False)
    back.start()
    assert back.connack()[:2] == (True, 0)
    assert [back.message().payload for _ in sent] == sent
    pub.publish(topic, b"live", 1)
    assert back.message().payload == b"live", "nothing came twice"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_persistent_session_keeps_subscriptions_and_queues_qos_1_while_away(clients, version: int) -> None:
    topic = unique("persist", version)
    client_id = unique("persistent", version)
    first = clients(version, client_id, clean=False, expiry=300)
    assert first.subscribe(topic, 1) == 1
    first.disconnect()

    pub = clients(version)
    pub.publish(topic, b"away 1", 1)
    pub.publish(topic, b"away 2", 2)
    pub.publish(topic, b"away 0", 0)  # kept in the store with the others, sent at QoS 0
    pub.publish(topic, b"away 3", 1)

    back = clients(version, client_id, clean=False, expiry=300, connect=False)
    back.start()
    present, reason, _props = back.connack()
    assert (present, reason) == (True, 0)
    got = [back.message() for _ in range(4)]
    assert [(m.payload, m.qos) for m in got] == [(b"away 1", 1), (b"away 2", 1), (b"away 0", 0), (b"away 3", 1)]
    pub.publish(topic, b"live again", 1)
    assert back.message().payload == b"live again", "the subscription is still there"
    back.disconnect()

    # A clean start ends the session: nothing queued, no subscription, Session Present 0.
    pub.publish(topic, b"to the old session", 1)
    fresh = clients(version, client_id, clean=True, connect=False)
    fresh.start()
    present, reason, _props = fresh.connack()
    assert (present, reason) == (False, 0)
    fresh.subscribe(topic + "/other", 1)
    pub.publish(topic, b"not subscribed any more", 1)
    pub.publish(topic + "/other", b"sentinel", 1)
    assert texts([fresh.message()]) == [(topic + "/other", b"sentinel")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_second_connection_with_the_client_id_takes_the_session_over(clients, version: int) -> None:
    topic = unique("takeover", version)
    client_id = unique("taken", version)
    old = clients(version, client_id, clean=False, expiry=300)
    old.subscribe(topic, 1)
    new = clients(version, client_id, clean=False, expiry=300, connect=False)
    new.start()
    present, reason, _props = new.connack()
    assert (present, reason) == (True, 0)
    closed = old.disconnected()
    if version == MQTTv5:
        assert closed == 0x8E, "Session taken over"
    old.stop()
    pub = clients(version)
    pub.publish(topic, b"to the new connection", 1)
    got = new.message()
    assert (got.payload, got.qos) == (b"to the new connection", 1)
    assert old.messages.empty()


# ---------------------------------------------------------------------- MQTT 5.0 only


def test_v5_no_local_subscription_does_not_get_its_own_messages(clients) -> None:
    topic = unique("nolocal", MQTTv5)
    me = clients(MQTTv5)
    assert me.subscribe(topic, 1, no_local=True) == 1
    other = clients(MQTTv5)
    other.subscribe(topic, 1)
    me.publish(topic, b"mine", 1)
    assert other.message().payload == b"mine"
    other.publish(topic, b"theirs", 1)
    assert texts([me.message()]) == [(topic, b"theirs")]


def test_v5_subscription_identifiers_come_with_the_messages(clients) -> None:
    top = unique("subid", MQTTv5)
    sub = clients(MQTTv5)
    sub.subscribe(f"{top}/+", 1, identifier=7)
    sub.subscribe(f"{top}/#", 1, identifier=300)
    sub.subscribe(f"{top}/plain/x", 1)
    pub = clients(MQTTv5)
    pub.publish(f"{top}/a", b"both", 1)
    got = sub.message()
    assert got.payload == b"both"
    assert sorted(got.properties.SubscriptionIdentifier) == [7, 300]
    pub.publish(f"{top}/plain/x", b"one", 1)
    got = sub.message()
    assert got.payload == b"one" and got.properties.SubscriptionIdentifier == [300]


def test_v5_topic_alias_on_publish(clients) -> None:
    topic = unique("alias", MQTTv5)
    sub = clients(MQTTv5)
    sub.subscribe(topic, 1)
    pub = clients(MQTTv5)
    assert pub.publish(topic, b"sets the alias", 1, TopicAlias=3) == 0
    assert pub.publish("", b"by alias", 1, TopicAlias=3) == 0
    assert pub.publish("", b"by alias at qos 0", 0, TopicAlias=3) == 0
    got = [sub.message() for _ in range(3)]
    assert texts(got) == [(topic, b"sets the alias"), (topic, b"by alias"), (topic, b"by alias at qos 0")]


def test_v5_connack_announces_the_topic_alias_maximum(broker: RunningBroker) -> None:
    client = MQTTClient(broker.ports["mqtt"], MQTTv5, connect=False)
    try:
        client.start()
        _present, reason, props = client.connack()
        assert reason == 0
        assert props.TopicAliasMaximum == 16
        assert getattr(props, "SharedSubscriptionAvailable", 1) == 1  # absent: available
    finally:
        client.disconnect()


def test_v5_message_expiry_and_content_type_reach_a_v5_subscriber(clients) -> None:
    topic = unique("props", MQTTv5)
    v5 = clients(MQTTv5)
    v5.subscribe(topic, 1)
    v3 = clients(MQTTv311)
    v3.subscribe(topic, 1)
    pub = clients(MQTTv5)
    pub.publish(topic, b'{"t": 21}', 1, MessageExpiryInterval=600, ContentType="application/json")
    got = v5.message()
    assert got.payload == b'{"t": 21}'
    assert got.properties.ContentType == "application/json"
    assert 0 < got.properties.MessageExpiryInterval <= 600
    assert v3.message().payload == b'{"t": 21}', "a 3.1.1 subscriber gets the payload"


@pytest.mark.parametrize("version", VERSIONS)
def test_invalid_filters_get_their_reason_codes(clients, version: int) -> None:
    topic = unique("codes", version)
    sub = clients(version)
    sub.send_invalid_filters()
    invalid = 0x8F if version == MQTTv5 else 0x80
    codes = sub.subscribe_many([(f"{topic}/#/x", 1), (f"{topic}/a+", 1), ("$share/group", 1), ("$share//x", 1),
                                ("$share/g+/x", 1), (topic, 1)])
    assert codes == [invalid] * 5 + [1]
    pub = clients(version)
    pub.publish(topic, b"the valid one works", 1)
    assert sub.message().payload == b"the valid one works"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_shared_subscription_gives_each_message_to_one_member(clients, version: int) -> None:
    """Two members of ``$share/workers/...`` get every message once between them (which one
    is the broker's choice), a plain subscriber every message, and a retained message is not
    sent to a shared subscription when it is made (4.8.2)."""
    topic = unique("shared", version)
    pub = clients(version)
    pub.publish(topic, b"retained before", 1, retain=True)
    shared: queue.Queue = queue.Queue()
    members = [clients(version), clients(version)]
    for index, member in enumerate(members):
        member.client.on_message = lambda c, u, message, index=index: shared.put((index, message))
        assert member.subscribe(f"$share/workers/{topic}", 1) == 1
    plain = clients(version)
    plain.subscribe(topic, 1)
    assert plain.message().payload == b"retained before"

    sent = [f"job {i}".encode() for i in range(20)]
    for payload in sent:
        pub.publish(topic, payload, 1)
    assert [plain.message().payload for _ in sent] == sent
    got = [shared.get(timeout=BOUND) for _ in sent]
    assert sorted(m.payload for _, m in got) == sorted(sent), "each message once, retained none"
    for index in (0, 1):
        mine = [m.payload for i, m in got if i == index]
        assert mine == [p for p in sent if p in mine], "each member's share in order"
    assert shared.empty()


def test_module_broker_has_not_logged_a_traceback(broker: RunningBroker, clients) -> None:
    client = clients(MQTTv5)
    assert client.subscribe(unique("alive", MQTTv5)) == 0
    assert_clean_log(broker)


def test_v5_a_takeover_of_a_session_that_ends_with_its_connection_goes_on_for_the_new_one(clients) -> None:
    """Session Expiry Interval 0 and Clean Start 0: the session lives while a connection has it,
    so the connection that takes it over (3.1.4 step 3) gets what its subscription matches; the
    old connection's close must not end it under the new one."""
    topic = unique("takeover-expiry-0", MQTTv5)
    client_id = unique("taken-expiry-0", MQTTv5)
    old = clients(MQTTv5, client_id, clean=False, expiry=0)
    old.subscribe(topic, 1)
    new = clients(MQTTv5, client_id, clean=False, expiry=0, connect=False)
    new.start()
    present, reason, _props = new.connack()
    assert (present, reason) == (True, 0)
    assert old.disconnected() == 0x8E, "Session taken over"
    old.stop()
    pub = clients(MQTTv5)
    pub.publish(topic, b"to the new connection", 1)
    assert new.message().payload == b"to the new connection"

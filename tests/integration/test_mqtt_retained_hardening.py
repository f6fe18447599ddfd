"""Retained messages hardened, over real sockets on a real ``twistd brokerd``.

- One access decision: every way a message reaches an MQTT client (live, retained, stored for
  a persistent session, shared, a will) takes the decision the core takes for a live
  delivery; the tests walk each with a topic the access list keeps from the reader
  (``/secret``) beside an allowed one (``/open``), whose arrival bounds the wait for what must
  not arrive.
- ``$`` topics are the server's: no client publishes, retains or leaves a will there.
- Quotas: one principal (every anonymous client together) at its retained quota is refused
  (v5 0x97), counted in /metrics and logged once, across a restart, while others retain.
- Paging: a subscription's retained messages arrive complete and in order however slowly its
  client reads, and other clients are served meanwhile.
"""
from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.integration.test_mqtt_bad_input import V5, RawMQTT, publish_packet, subscribe_packet
from tests.integration.test_mqtt_paho import (
    BOUND,
    MQTT_LISTENER,
    VERSIONS,
    MQTTClient,
    assert_clean_log,
    close_clients,
    texts,
    unique,
)
from tests.admin.support import http
from tests.support.broker import RunningBroker, free_port, start_broker

pytestmark = pytest.mark.slow

UAL = """\
/secret      *          -
/secret      alice      ps
/open        *          ps
"""


def start_with_access(tmp_path: Path, *options: str, wait_for: tuple[int, ...] = ()) -> RunningBroker:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    ual = tmp_path / "ual"
    ual.write_text(UAL)
    return start_broker(tmp_path, "--accounts", str(accounts), "--ual", str(ual), *options,
                        listeners=MQTT_LISTENER, wait_for=wait_for)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_with_access(tmp_path_factory.mktemp("mqtt-retained"))
    yield running
    running.stop()
    assert_clean_log(running)


@pytest.fixture
def login(broker: RunningBroker) -> Iterator[Callable[..., MQTTClient]]:
    """``login(version, account=None, client_id="", **options)``: a connected MQTTClient of
    that account (anonymous without one), closed after the test."""
    made: list[MQTTClient] = []

    def make(version: int, account: str | None = None, client_id: str = "", **options: Any) -> MQTTClient:
        if account is not None:
            options.update(username=account, password=ACCOUNTS[account])
        client = MQTTClient(broker.ports["mqtt"], version, client_id, **options)
        made.append(client)
        return client

    yield make
    close_clients(made)


# ---------------------------------------------------------------------- one access decision


@pytest.mark.parametrize("reader", ["bob", None], ids=["account", "anonymous"])
@pytest.mark.parametrize("version", VERSIONS)
def test_a_retained_message_goes_only_to_who_may_read_its_topic(login, version: int, reader: str | None) -> None:
    name = unique("retained", version)
    alice = login(MQTTv5, "alice")
    assert alice.publish(f"secret/{name}", b"secret plans", 1, retain=True) == 0
    assert alice.publish(f"open/{name}", b"open plans", 1, retain=True) == 0
    bob = login(version, reader)
    refused = 0x87 if version == MQTTv5 else 0x80
    assert bob.subscribe(f"secret/{name}", 1) == refused
    assert bob.subscribe_many([("#", 1), (f"+/{name}", 1)]) == [1, 1]
    alice.publish(f"open/{name}", b"sentinel", 1)
    got = [(m.topic, m.payload) for m in bob.messages_until(b"sentinel") if name in m.topic]
    assert got == [(f"open/{name}", b"open plans"), (f"open/{name}", b"open plans"),
                   (f"open/{name}", b"sentinel")], got
    # Positive control: the reader the list allows gets the secret retained message.
    insider = login(version, "alice")
    assert insider.subscribe(f"+/{name}", 1) == 1
    assert sorted(texts([insider.message(), insider.message()])) == [
        (f"open/{name}", b"open plans"), (f"secret/{name}", b"secret plans")]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_delivery_path_asks_the_access_list_for_the_reader(login, version: int) -> None:
    """Live, retained, stored (persistent session), shared (``$share``) and will: for each,
    alice (who may write both) sends to a ``secret`` topic and then to an ``open`` one; bob
    gets the open one only, in the order sent, so its arrival shows the secret one did not."""
    name = unique("paths", version)
    alice = login(MQTTv5, "alice")

    # live, through a wildcard the list allows
    live = login(version, "bob")
    assert live.subscribe("+/live/#", 1) == 1
    alice.publish(f"secret/live/{name}", b"live secret", 1)
    alice.publish(f"open/live/{name}", b"live open", 1)
    assert texts([live.message()]) == [(f"open/live/{name}", b"live open")]

    # retained
    alice.publish(f"secret/kept/{name}", b"retained secret", 1, retain=True)
    alice.publish(f"open/kept/{name}", b"retained open", 1, retain=True)
    late = login(version, "bob")
    assert late.subscribe(f"+/kept/{name}", 1) == 1
    alice.publish(f"open/kept/{name}", b"kept sentinel", 1)
    assert texts(late.messages_until(b"kept sentinel")) == [(f"open/kept/{name}", b"retained open"),
                                                            (f"open/kept/{name}", b"kept sentinel")]

    # stored for a persistent session while its client is away
    client_id = unique("paths-bob", version)
    away = login(version, "bob", client_id, clean=False, expiry=300)
    assert away.subscribe(f"+/stored/{name}", 1) == 1
    away.disconnect()
    alice.publish(f"secret/stored/{name}", b"stored secret", 1)
    alice.publish(f"open/stored/{name}", b"stored open", 1)
    back = login(version, "bob", client_id, clean=False, expiry=300)
    assert texts([back.message()]) == [(f"open/stored/{name}", b"stored open")]

    # shared subscription
    shared = login(version, "bob")
    assert shared.subscribe(f"$share/g{name}/+/shared/{name}", 1) == 1
    alice.publish(f"secret/shared/{name}", b"shared secret", 1)
    alice.publish(f"open/shared/{name}", b"shared open", 1)
    assert texts([shared.message()]) == [(f"open/shared/{name}", b"shared open")]

    # wills: a takeover publishes the first connection's (before the second's CONNACK), the
    # second's goes when its connection breaks; bob reads the open will only
    wills = login(version, "bob")
    assert wills.subscribe(f"+/will/{name}", 1) == 1
    willing = unique("paths-alice", version)
    login(MQTTv5, "alice", willing, will=(f"secret/will/{name}", b"will secret", 1, False))
    login(MQTTv5, "alice", willing, will=(f"open/will/{name}", b"will open", 1, False)).abort()
    assert texts([wills.message()]) == [(f"open/will/{name}", b"will open")]

    # Positive control: alice, whom the list lets read /secret, gets the secret retained one.
    insider = login(version, "alice")
    assert insider.subscribe(f"secret/kept/{name}", 1) == 1
    assert texts([insider.message()]) == [(f"secret/kept/{name}", b"retained secret")]


@pytest.mark.parametrize("version", VERSIONS)
def test_what_was_stored_before_a_reload_goes_only_to_who_may_still_read_it(tmp_path: Path, version: int) -> None:
    """The access decision made when a message was stored for a persistent session is asked
    again when the session reads it: bob's session, away, has a message stored to
    ``news/sec`` and one to ``news/open``; the operator then takes ``/news/sec`` from bob
    (``POST /api/ual/set``, installed before its answer).  Back, bob gets the open one only,
    in the order sent, so its arrival shows the other did not come; alice, who may still
    read it, gets both (the positive control)."""
    admin = free_port()
    running = start_with_access(tmp_path, "--admin", f"tcp:{admin}:interface=127.0.0.1", wait_for=(admin,))
    made: list[MQTTClient] = []

    def login(account: str, client_id: str = "", **options: Any) -> MQTTClient:
        client = MQTTClient(running.ports["mqtt"], version, client_id, username=account, password=ACCOUNTS[account],
                            **options)
        made.append(client)
        return client

    try:
        readers = {name: unique(f"reload-{name}", version) for name in ("bob", "alice")}
        for name, client_id in readers.items():
            away = login(name, client_id, clean=False, expiry=300)
            assert away.subscribe("open/news/#", 1) == 1
            away.disconnect()
        publisher = login("alice")
        publisher.publish("open/news/sec", b"stored secret", 1)  # PUBACK: stored for both
        publisher.publish("open/news/open", b"stored open", 1)
        reply = http(admin, "POST", "/api/ual/set", None,
                     b'{"topic": "/open/news/sec", "who": "bob", "permissions": "-"}', "application/json")
        assert reply.status == 200, reply.body
        bob = login("bob", readers["bob"], clean=False, expiry=300)
        assert texts([bob.message()]) == [("open/news/open", b"stored open")]
        alice = login("alice", readers["alice"], clean=False, expiry=300)
        assert texts(alice.messages_until(b"stored open")) == [("open/news/sec", b"stored secret"),
                                                               ("open/news/open", b"stored open")]
    finally:
        close_clients(made)
        running.stop()
    assert_clean_log(running)


# ---------------------------------------------------------------------- the server's topics


@pytest.mark.parametrize("version", VERSIONS)
def test_a_client_cannot_publish_retain_or_will_under_a_dollar_topic(login, version: int) -> None:
    """4.7.2: ``$`` topics are the server's.  A client's PUBLISH there is refused (v5: PUBACK
    0x90 Topic Name invalid; 3.1.1, which cannot refuse: acknowledged and dropped), retained
    or not, and a will there is not published; the same client's publish elsewhere is."""
    name = unique("dollar", version)
    alice = login(version, "alice")
    watcher = login(MQTTv5, "alice")
    assert watcher.subscribe_many([("$SYS/#", 1), (f"open/{name}/#", 1)]) == [1, 1]
    refused = 0x90 if version == MQTTv5 else 0
    assert alice.publish(f"$SYS/broker/{name}", b"forged", 1, retain=True) == refused
    assert alice.publish(f"$SYS/broker/{name}", b"forged live", 1) == refused
    assert alice.publish(f"$SYS/broker/{name}", b"forged qos 0", 0, retain=True) == 0
    client_id = unique("dollar-will", version)
    login(version, "alice", client_id, will=(f"$SYS/broker/{name}", b"forged will", 1, True))
    login(version, "alice", client_id)  # the takeover publishes the first connection's will, if any
    assert alice.publish(f"open/{name}/status", b"sentinel", 1) == 0
    assert texts(watcher.messages_until(b"sentinel")) == [(f"open/{name}/status", b"sentinel")]
    late = login(version, "alice")
    assert late.subscribe_many([(f"$SYS/broker/{name}", 1), (f"open/{name}/status", 1)]) == [1, 1]
    assert alice.publish(f"open/{name}/status", b"second sentinel", 1) == 0
    assert texts(late.messages_until(b"second sentinel")) == [(f"open/{name}/status", b"second sentinel")]


# ---------------------------------------------------------------------- quotas


QUOTA = 5


def scrape(admin: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def start_with_quota(tmp_path: Path, admin: int) -> RunningBroker:
    return start_with_access(tmp_path, "--mqtt-max-retained-per-principal", str(QUOTA),
                             "--admin", f"tcp:{admin}:interface=127.0.0.1", wait_for=(admin,))


def test_one_principal_at_its_retained_quota_stops_nobody_else(tmp_path: Path) -> None:
    """Anonymous clients (one principal, whatever their client identifiers) fill their quota:
    the next retain is refused with 0x97 (v5; a 3.1.1 one goes out live, not retained) and
    counted, across a restart too, while alice still retains and subscribers get hers."""
    admin = free_port()
    broker = start_with_quota(tmp_path, admin)
    made: list[MQTTClient] = []
    try:
        port = broker.ports["mqtt"]
        first, second = MQTTClient(port, MQTTv5), MQTTClient(port, MQTTv5)
        old = MQTTClient(port, MQTTv311)
        alice = MQTTClient(port, MQTTv5, username="alice", password=ACCOUNTS["alice"])
        made += [first, second, old, alice]
        for number in range(QUOTA):
            assert first.publish(f"open/flood/{number}", b"x", 1, retain=True) == 0
        assert first.publish("open/flood/over", b"x", 1, retain=True) == 0x97
        assert second.publish("open/flood/other-client", b"x", 1, retain=True) == 0x97
        assert second.publish("open/flood/over", b"x", 0, retain=True) == 0  # QoS 0: live, not retained
        assert old.publish("open/flood/old", b"live only", 1, retain=True) == 0  # 3.1.1: cannot refuse
        assert alice.publish("open/alice", b"alice's", 1, retain=True) == 0
        assert first.publish("open/flood/0", b"replaced", 1, retain=True) == 0  # not growing: allowed
        values = scrape(admin)
        assert values["brokerd_retained_refused_total", (("reason", "quota"),)] == 4
        assert values["brokerd_retained_messages", ()] == QUOTA + 1
        late = MQTTClient(port, MQTTv5)
        made.append(late)
        assert late.subscribe("open/#", 1) == 1
        alice.publish("open/sentinel", b"sentinel", 1)
        assert sorted(texts(late.messages_until(b"sentinel"))) == sorted(
            [(f"open/flood/{n}", b"x") for n in range(1, QUOTA)]
            + [("open/flood/0", b"replaced"), ("open/alice", b"alice's"), ("open/sentinel", b"sentinel")])
        assert broker.log().count("retain(s) refused") == 1, "one line per interval"
    finally:
        close_clients(made)
        made.clear()
        broker.stop()
    assert_clean_log(broker)

    admin = free_port()
    broker = start_with_quota(tmp_path, admin)  # the same data directory: the quota holds
    try:
        port = broker.ports["mqtt"]
        anonymous = MQTTClient(port, MQTTv5)
        bob = MQTTClient(port, MQTTv5, username="bob", password=ACCOUNTS["bob"])
        made += [anonymous, bob]
        assert anonymous.publish("open/flood/after-restart", b"x", 1, retain=True) == 0x97
        assert bob.publish("open/bob", b"bob's", 1, retain=True) == 0
        assert anonymous.publish("open/flood/1", b"", 1, retain=True) == 0  # a deletion frees one
        assert anonymous.publish("open/flood/after-restart", b"x", 1, retain=True) == 0
    finally:
        close_clients(made)
        broker.stop()
    assert_clean_log(broker)


# ---------------------------------------------------------------------- paged delivery


MANY = 10_000
"""Retained topics of the paging test: 10 MB of payload, more than the kernel's socket buffers
(4 MiB at most on the sending side) and ``--max-output-buffer`` can hold for a reader that
reads nothing."""
PAYLOAD = bytes(range(250)) * 4
PAGING_OPTIONS = ("--max-output-buffer", "65536", "--mqtt-max-queued", "100",
                  "--mqtt-max-retained-per-principal", "100000",
                  "--mqtt-max-retained-bytes-per-principal", str(64 << 20))


@pytest.fixture(scope="module")
def paging_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = start_broker(tmp_path_factory.mktemp("mqtt-retained-pages"), *PAGING_OPTIONS, listeners=MQTT_LISTENER)
    yield running
    running.stop()
    assert_clean_log(running)


def retain_packet(topic: str, payload: bytes, qos: int = 0, packet_id: int = 1) -> bytes:
    data = bytearray(publish_packet(V5, topic, payload, qos, packet_id))
    data[0] |= 0x01  # RETAIN
    return bytes(data)


def read_until(raw: RawMQTT, kind: int) -> bytes:
    """The body of the next packet of ``kind`` (its first byte's high nibble), skipping others."""
    while True:
        got = raw.read()
        assert got is not None, "closed"
        if got[0] >> 4 == kind:
            return got[1]


def retain_all(broker: RunningBroker, topics: list[str], payload: bytes, qos: int = 0) -> None:
    """Retain ``payload`` in every topic (at ``qos``, one write), then wait for a QoS 1
    PUBLISH's PUBACK: the broker handled them all before it."""
    loader = RawMQTT(broker)
    try:
        loader.connect(V5)
        loader.send(b"".join(retain_packet(topic, payload, qos, number % 60_000 + 1)
                             for number, topic in enumerate(topics))
                    + publish_packet(V5, "loaded", b"", 1, packet_id=60_001))
        while read_until(loader, 4)[:2] != (60_001).to_bytes(2, "big"):
            pass
    finally:
        loader.close()


class SlowReader(RawMQTT):
    """A raw client with a small receive buffer, which reads only when told to."""

    def __init__(self, broker: RunningBroker) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(BOUND)
        self.sock.connect(("127.0.0.1", broker.ports["mqtt"]))
        self.buffer = b""


def publish_of(first: int, body: bytes) -> tuple[str, bytes, bool]:
    """(topic, payload, RETAIN) of a v5 PUBLISH."""
    length = int.from_bytes(body[:2], "big")
    topic = body[2:2 + length].decode()
    at, size, shift = 2 + length + (2 if first & 0x06 else 0), 0, 0
    while True:  # the properties' Variable Byte Integer length
        byte = body[at]
        at += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    return topic, body[at + size:], bool(first & 0x01)


def test_subscribe_to_many_retained_topics_gets_them_all_in_order_while_others_are_served(
        paging_broker: RunningBroker) -> None:
    """``r/#`` over 10,000 retained topics (retained at QoS 0), by a client that reads nothing
    at first: the broker sends what its buffers take and stops, so a PUBLISH from another
    client is handled meanwhile and its live message (QoS 1: written even to a congested
    client) reaches the reader before the last retained one.  Then every retained message
    arrives, once, in topic order (before, those past the output buffer were dropped, and the
    live message could only come after every one written)."""
    topics = [f"r/{number:05d}" for number in range(MANY)]
    retain_all(paging_broker, topics, PAYLOAD)
    reader = SlowReader(paging_broker)
    publisher = RawMQTT(paging_broker)
    try:
        reader.connect(V5)
        reader.send(subscribe_packet(V5, "r/#", 1, packet_id=3))
        assert read_until(reader, 9) == b"\x00\x03\x00\x01"  # SUBACK: granted QoS 1
        publisher.connect(V5)
        publisher.send(publish_packet(V5, "r/live", b"live", 1, packet_id=9))
        assert read_until(publisher, 4)[:2] == (9).to_bytes(2, "big")  # served: PUBACK
        publisher.send(b"\xc0\x00")  # PINGREQ
        assert read_until(publisher, 13) == b""  # PINGRESP
        got: list[tuple[str, bytes, bool]] = []
        while len(got) < MANY + 1:
            packet = reader.read()
            assert packet is not None and packet[0] >> 4 == 3, packet
            got.append(publish_of(*packet))
        retained = [(topic, payload) for topic, payload, flag in got if flag]
        assert retained == [(topic, PAYLOAD) for topic in topics]
        live = got.index(("r/live", b"live", False))
        assert live < len(got) - 1, "the live message came after every retained one"
    finally:
        reader.close()
        publisher.close()


def test_qos_1_retained_messages_wait_for_the_window_and_none_is_dropped(paging_broker: RunningBroker,
                                                                        ) -> None:
    """500 retained topics to a QoS 1 subscription, with a window of 20 and at most 100 queued
    (``--mqtt-max-queued``): every one arrives, in order (before, those past the queue were
    dropped)."""
    topics = [f"q/{number:04d}" for number in range(500)]
    retain_all(paging_broker, topics, b"queued", qos=1)
    client = MQTTClient(paging_broker.ports["mqtt"], MQTTv5)
    try:
        assert client.subscribe("q/#", 1) == 1
        got = [client.message() for _topic in topics]
        assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [(t, b"queued", 1, True) for t in topics]
    finally:
        client.disconnect()

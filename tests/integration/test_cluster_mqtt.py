"""MQTT on a cluster of two nodes sharing one real redis-server: a wildcard or shared
subscription on one node gets what any protocol publishes on the other (the filter channel,
brokerd.cluster.redis_engine), and a client identifier connecting on the other node takes the
session over (the first connection is told 0x8E and closed) if it is the same principal's and is
refused (0x87) otherwise, even when two nodes let both logins in; with the shared PostgreSQL store,
a persistent session is taken up on another node with what was stored for it meanwhile."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from brokerd.cluster.redis_engine import CONTROL_CHANNEL
from brokerd.core.principal import ACCOUNT, Principal
from brokerd.protocols.mqtt.client import MQTTConnectError
from brokerd.protocols.mqtt.client import connect as mqtt_connect
from brokerd.protocols.mqtt.packets import MQTT_5, Properties
from brokerd.protocols.mqtt.sessions import STORED_SESSIONS
from tests.integration.cluster_nodes import TIMEOUT, Node, Waiter, reactor
from tests.integration.smqp_fixtures import write_test_accounts
from tests.integration.test_cluster_routing import poll_until
from tests.integration.test_cluster_sealing import control_frames
from tests.support.collect import eventually
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - the fixtures
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture
from tests.support.redis_tap import Tap

pytestmark = pytest.mark.slow

PROTOCOLS = ("ssmp", "mqtt")


async def two_nodes(tmp_path: Path, redis: RedisServer) -> list[Node]:
    return [await Node(tmp_path / f"node{i}", redis.url, f"node{i}", protocols=PROTOCOLS).start() for i in (1, 2)]


async def mqtt(node: Node, client_id: str, messages: Waiter | None = None, tag: object = None, **options):
    """An MQTT client of ``node``; what it receives goes to ``messages`` as (topic, payload),
    or (tag, topic, payload) with a ``tag``."""
    on_message = None
    if messages is not None:
        def on_message(publish) -> None:
            messages((publish.topic, publish.payload) if tag is None else (tag, publish.topic, publish.payload))
    client = await mqtt_connect(reactor(), f"tcp:127.0.0.1:{node.port('mqtt')}", client_id=client_id,
                                on_message=on_message, **options).addTimeout(TIMEOUT, reactor())
    node.clients.append(client)
    return client


def until_filter_known(publisher: Node, topic: bytes, shared: bool = False) -> Deferred:
    """Fires once ``publisher`` knows another node has a filter (``shared``: a shared group's
    member) matching ``topic``."""
    done: Waiter = Waiter()
    directory = publisher.engine.directory

    def poll() -> None:
        if (directory.shared_groups if shared else directory.filter_nodes)(topic):
            done(True)
        else:
            reactor().callLater(0.02, poll)

    poll()
    return done.until(lambda items: bool(items))


@pytest_twisted.ensureDeferred
async def test_a_filter_on_one_node_gets_every_protocol_s_publishes_on_the_other(
        tmp_path: Path, redis_server: RedisServer) -> None:
    one, two = await two_nodes(tmp_path, redis_server)
    try:
        got = Waiter()
        subscriber = await mqtt(one, "wild", got)
        suback = await subscriber.subscribe([("sensors/+/temp", 1)]).addTimeout(TIMEOUT, reactor())
        assert list(suback.reason_codes) == [1]
        jobs = Waiter()
        for index in range(2):
            worker = await mqtt(one, f"worker{index}", jobs, tag=index)
            await worker.subscribe([("$share/pool/jobs/#", 0)]).addTimeout(TIMEOUT, reactor())
        await until_filter_known(two, b"sensors/kitchen/temp").addTimeout(TIMEOUT, reactor())
        await until_filter_known(two, b"jobs/a", shared=True).addTimeout(TIMEOUT, reactor())

        publisher = await mqtt(two, "pub")
        await publisher.publish("sensors/kitchen/temp", b"21", qos=1).addTimeout(TIMEOUT, reactor())
        await publisher.publish("sensors/kitchen/humidity", b"not-matched", qos=1).addTimeout(TIMEOUT, reactor())
        ssmp = await two.ssmp(b"ssmp-pub")
        ssmp.send(b"MCAST sensors/hall/temp 19")
        await got.until(lambda items: len(items) >= 2)
        assert got.items == [("sensors/kitchen/temp", b"21"), ("sensors/hall/temp", b"19")]

        for n in range(4):
            await publisher.publish(f"jobs/{n}", f"job{n}".encode(), qos=1).addTimeout(TIMEOUT, reactor())
        await jobs.count(4)
        assert sorted(item[1:] for item in jobs.items) == [(f"jobs/{n}", f"job{n}".encode()) for n in range(4)]
        assert {item[0] for item in jobs.items} == {0, 1}  # each job once, and the group shared them

        # A node that has members of the topic itself gets the run on the topic's channel
        # only, and its filter members get it once.
        local = await one.ssmp(b"local")
        local.send(b"SUBSCRIBE sensors/attic/temp")
        await one.engine.when_following(b"sensors/attic/temp").addTimeout(TIMEOUT, reactor())
        ssmp.send(b"MCAST sensors/attic/temp 25")
        await got.until(lambda items: len(items) >= 3).addTimeout(TIMEOUT, reactor())
        await publisher.publish("sensors/last/temp", b"end", qos=1).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: items[-1] == ("sensors/last/temp", b"end")).addTimeout(TIMEOUT, reactor())
        assert got.items[2:] == [("sensors/attic/temp", b"25"), ("sensors/last/temp", b"end")]
    finally:
        for node in (one, two):
            await node.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_identifier_connecting_on_another_node_takes_the_session_over(
        tmp_path: Path, redis_server: RedisServer) -> None:
    one, two = await two_nodes(tmp_path, redis_server)
    try:
        first = await mqtt(one, "device-7", version=MQTT_5)
        closed = first.when_closed()
        second = await mqtt(two, "device-7", version=MQTT_5)
        await closed.addTimeout(TIMEOUT, reactor())
        assert "taken over" in str(first._error).lower()
        got = Waiter()
        listener = await mqtt(two, "listener", got)
        await listener.subscribe([("status", 0)]).addTimeout(TIMEOUT, reactor())
        await second.publish("status", b"still here", qos=1).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())
        assert got.items == [("status", b"still here")]  # the new connection works
        assert "device-7" not in one.service.runtime.mqtt_sessions.by_id
    finally:
        for node in (one, two):
            await node.stop()


ALICE = {"version": MQTT_5, "username": "alice", "password": "alicepw"}
"""alice's CONNECT (an account of tests/integration/smqp_fixtures.py's accounts file)."""


async def nodes_with_accounts(tmp_path: Path, redis: RedisServer, count: int) -> list[Node]:
    write_test_accounts(tmp_path / "accounts")
    return [await Node(tmp_path / f"node{i}", redis.url, f"node{i}", protocols=PROTOCOLS,
                       accounts_file=tmp_path / "accounts").start() for i in range(1, count + 1)]


async def refused_to_others(node: Node, client_id: str, **credentials: str) -> None:
    """A CONNECT with ``client_id`` on ``node`` is refused 0x87, once ``node`` gives the
    identifier to alice's login."""
    await eventually(lambda: node.engine.principal_of("mqtt", client_id.encode()) == Principal("alice", ACCOUNT),
                     f"{node.name} giving {client_id} to alice's login")
    with pytest.raises(MQTTConnectError) as refused:
        await mqtt(node, client_id, version=MQTT_5, **credentials)
    assert refused.value.reason_code == 0x87, credentials


async def status_listener(node: Node) -> Waiter:
    """What a client of ``node`` subscribed to ``status`` receives, from any node."""
    got = Waiter()
    listener = await mqtt(node, "listener", got)
    await listener.subscribe([("status", 0)]).addTimeout(TIMEOUT, reactor())
    await node.engine.when_following(b"status").addTimeout(TIMEOUT, reactor())
    return got


@pytest_twisted.ensureDeferred
async def test_a_client_identifier_is_taken_over_on_another_node_only_by_its_own_principal(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """As on one node (tests/integration/test_mqtt_access.py), another principal's CONNECT
    with alice's client identifier is refused (0x87) and her session goes on; her own CONNECT
    on the other node takes it over."""
    one, two = await nodes_with_accounts(tmp_path, redis_server, 2)
    try:
        alice = await mqtt(one, "alice-phone", **ALICE)
        closed = alice.when_closed()
        await refused_to_others(two, "alice-phone")  # anonymous
        await refused_to_others(two, "alice-phone", username="bob", password="bobpw")
        got = await status_listener(two)
        await alice.publish("status", b"still alice's", qos=1).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())
        assert got.items == [("status", b"still alice's")] and not closed.called
        # Positive control: alice's own CONNECT on node 2 takes her session over.
        again = await mqtt(two, "alice-phone", **ALICE)
        await closed.addTimeout(TIMEOUT, reactor())
        assert "taken over" in str(alice._error).lower()
        await again.publish("status", b"alice on node 2", qos=1).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: len(items) == 2).addTimeout(TIMEOUT, reactor())
        assert got.items[1] == ("status", b"alice on node 2")
    finally:
        for node in (one, two):
            await node.stop()


@pytest_twisted.ensureDeferred
async def test_of_two_principals_connecting_on_two_nodes_at_once_the_first_keeps_the_client_identifier(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Node 2 does not read Redis while alice connects on node 1, so it lets an anonymous
    CONNECT with her client identifier in: once each node hears of the other's login, both
    keep the earlier one (alice's), as one node refuses the later one, the anonymous
    connection is told 0x8E, and node 3, which heard both logins, gives the identifier to
    alice's (node 1 announces it again)."""
    one, two, three = await nodes_with_accounts(tmp_path, redis_server, 3)
    tap = await Tap(redis_server.port).listen(CONTROL_CHANNEL)
    try:
        reading = [shard.subscriber.protocol.transport for shard in two.engine.shards.shards.values()]
        for transport in reading:
            transport.pauseProducing()
        alice = await mqtt(one, "alice-phone", **ALICE)
        await tap.seen.until(lambda _: bool(control_frames(tap, one, "attach"))).addTimeout(TIMEOUT, reactor())
        intruder = await mqtt(two, "alice-phone", version=MQTT_5)  # node 2 has not heard of alice yet
        ended = Waiter()
        alice.when_closed().addBoth(lambda _: ended("alice"))
        intruder.when_closed().addBoth(lambda _: ended("intruder"))
        for transport in reading:
            transport.resumeProducing()
        await ended.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())
        assert ended.items == ["intruder"] and "taken over" in str(intruder._error).lower()
        await two.ssmp(b"marker")  # announced after node 2's detach of the intruder's login
        await eventually(lambda: three.engine.owner("ssmp", b"marker") == two.engine.origin, "node 3 up to date")
        for node in (two, three):
            await refused_to_others(node, "alice-phone")
        # Positive control: alice's connection on node 1 was never closed and still publishes.
        got = await status_listener(two)
        await alice.publish("status", b"still alice's", qos=1).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())
        assert got.items == [("status", b"still alice's")] and ended.items == ["intruder"]
    finally:
        tap.close()
        for node in (one, two, three):
            await node.stop()


@pytest_twisted.ensureDeferred
async def test_a_persistent_session_is_taken_up_on_another_node_from_the_shared_store(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """With the cluster's PostgreSQL store, a persistent session's QoS 1 subscription is the
    core's durable subscription: what SSMP publishes on node 2 while the client is away is
    stored for it there, and the client, coming back on node 2, gets it (Session Present)."""
    one, two = [await Node(tmp_path / f"node{i}", redis_server.url, f"node{i}", protocols=PROTOCOLS,
                           store=postgres_url, mqtt_anonymous_sessions=10).start() for i in (1, 2)]
    try:
        device = await mqtt(one, "roaming-7", clean_start=False)
        suback = await device.subscribe([("fleet/+/cmd", 1)]).addTimeout(TIMEOUT, reactor())
        assert list(suback.reason_codes) == [1]
        await device.disconnect()
        [name] = one.broker.durable.index.subscribers_named(STORED_SESSIONS)
        read = Waiter()
        poll_until(lambda: bool(two.broker.durable.index.of(name)), read)  # node 2 read the subscription
        await read.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())

        ssmp = await two.ssmp(b"dispatcher")
        before = len(ssmp.lines.items)
        ssmp.send(b"MCAST fleet/7/cmd reboot")
        await ssmp.lines.count(before + 1).addTimeout(TIMEOUT, reactor())
        assert ssmp.lines.items[before] == b"200"  # answered once stored for the session

        got = Waiter()
        back = await mqtt(two, "roaming-7", got, clean_start=False)
        assert back.connack.session_present
        await got.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())
        assert got.items == [("fleet/7/cmd", b"reboot")]
        publisher = await mqtt(one, "pub")
        await publisher.publish("fleet/7/cmd", b"second", qos=1).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: len(items) >= 2).addTimeout(TIMEOUT, reactor())
        assert got.items == [("fleet/7/cmd", b"reboot"), ("fleet/7/cmd", b"second")]
    finally:
        for node in (one, two):
            await node.stop()


@pytest_twisted.ensureDeferred
async def test_message_properties_cross_to_a_v5_subscriber_on_the_other_node(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """An MQTT 5 request published on node 2 reaches a v5 filter subscriber on node 1 with its
    Response Topic, Correlation Data, Content Type and User Properties (in order): the
    envelope carries them between the nodes."""
    one, two = await two_nodes(tmp_path, redis_server)
    try:
        got = Waiter()
        subscriber = await mqtt_connect(reactor(), f"tcp:127.0.0.1:{one.port('mqtt')}", client_id="responder",
                                        version=MQTT_5, on_message=lambda publish: got(publish.properties)
                                        ).addTimeout(TIMEOUT, reactor())
        one.clients.append(subscriber)
        await subscriber.subscribe([("rpc/+", 1)]).addTimeout(TIMEOUT, reactor())
        await until_filter_known(two, b"rpc/time").addTimeout(TIMEOUT, reactor())
        publisher = await mqtt(two, "requester", version=MQTT_5)
        request = Properties(response_topic="reply/requester", correlation_data=b"\x00\x01", content_type="text/plain",
                             user_properties=(("trace", "a"), ("lang", "fr"), ("trace", "b")))
        await publisher.publish("rpc/time", b"now?", qos=1, properties=request).addTimeout(TIMEOUT, reactor())
        await got.until(lambda items: bool(items)).addTimeout(TIMEOUT, reactor())
        [properties] = got.items
        assert (properties.response_topic, properties.correlation_data, properties.content_type,
                properties.user_properties) == (request.response_topic, request.correlation_data,
                                                request.content_type, request.user_properties)
    finally:
        for node in (one, two):
            await node.stop()

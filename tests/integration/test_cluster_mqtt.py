"""MQTT on a cluster of two nodes sharing one real redis-server: a wildcard or shared
subscription on one node gets what any protocol publishes on the other (the filter channel,
brokerd.cluster.redis_engine), and a client identifier connecting on the other node takes the
session over (the first connection is told 0x8E and closed); with the shared PostgreSQL store,
a persistent session is taken up on another node with what was stored for it meanwhile."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from brokerd.protocols.mqtt.client import connect as mqtt_connect
from brokerd.protocols.mqtt.packets import MQTT_5, Properties
from tests.integration.cluster_nodes import TIMEOUT, Node, Waiter, reactor
from tests.integration.test_cluster_routing import poll_until
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - the fixtures
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

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


def until_filter_known(publisher: Node, topic: bytes) -> Deferred:
    """Fires once ``publisher`` knows another node has a filter matching ``topic``."""
    done: Waiter = Waiter()

    def poll() -> None:
        if publisher.engine.directory.filter_nodes(topic):
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
        await until_filter_known(two, b"jobs/a").addTimeout(TIMEOUT, reactor())

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
        assert "device-7" not in one.service.runtime.resources["mqtt_sessions"].by_id
    finally:
        for node in (one, two):
            await node.stop()


@pytest_twisted.ensureDeferred
async def test_a_persistent_session_is_taken_up_on_another_node_from_the_shared_store(
        tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> None:
    """With the cluster's PostgreSQL store, a persistent session's QoS 1 subscription is the
    core's durable subscription: what SSMP publishes on node 2 while the client is away is
    stored for it there, and the client, coming back on node 2, gets it (Session Present)."""
    one, two = [await Node(tmp_path / f"node{i}", redis_server.url, f"node{i}", protocols=PROTOCOLS,
                           store=postgres_url).start() for i in (1, 2)]
    try:
        device = await mqtt(one, "roaming-7", clean_start=False)
        suback = await device.subscribe([("fleet/+/cmd", 1)]).addTimeout(TIMEOUT, reactor())
        assert list(suback.reason_codes) == [1]
        await device.disconnect()
        [name] = one.broker.durable.index.subscribers_named("mqtt/")
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

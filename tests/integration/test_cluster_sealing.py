"""Redis is not trusted: a Redis client that is not a node (this test's :class:`Tap`, on the
test's real redis-server) reads and writes the channels the nodes use, and nothing it writes is
delivered or acted on.  Each attack is followed by its positive control: the same bytes sealed
by a real node (or the same path used by a real node) do reach the clients, so what stopped the
attack is the sealing, not a path that does not deliver."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from brokerd.cluster import envelope
from brokerd.cluster.connection import channel
from brokerd.cluster.redis_engine import CONTROL_CHANNEL
from brokerd.cluster.seal import HEADER, HEADER_SIZE, Sealer
from brokerd.config import Settings
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import Principal
from tests.integration.cluster_nodes import TIMEOUT, LineProtocol, Node, Waiter, reactor, ssmp_subscribed
from tests.integration.test_cluster_routing import stop_all
from tests.integration.test_twistd_plugin import run_twistd
from tests.support.collect import eventually
from tests.support.redis import RedisServer, cluster_secret, redis_server  # noqa: F401 - the fixture
from tests.support.redis_tap import Tap

pytestmark = pytest.mark.slow

UAL = """\
/open      *  ps
/readonly  *  s
/accounts  *  ps
"""


async def nodes_with_ual(tmp_path: Path, redis: RedisServer, count: int, **fields: Any) -> list[Node]:
    ual = tmp_path / "smqp.ual"
    ual.write_text(UAL)
    return [await Node(tmp_path / f"node{i}", redis.url, f"node{i}", ual_file=ual, **fields).start()
            for i in range(1, count + 1)]


def rejections(node: Node) -> Waiter:
    """The reasons of the frames ``node`` rejects from now on."""
    waiter = Waiter()
    node.engine.sealer.observers.append(waiter)
    return waiter


async def subscriber(node: Node, name: bytes, topic: bytes) -> LineProtocol:
    """``name`` logged in on ``node`` and subscribed to ``topic``, once Redis confirmed that
    ``node`` receives the topic's channel."""
    client = await node.ssmp(name)
    await ssmp_subscribed(client, topic)
    await node.engine.when_following(topic).addTimeout(TIMEOUT, reactor())
    return client


def ssmp_lines(client: LineProtocol, after: int) -> list[bytes]:
    return client.lines.items[after:]


def a_message_from(name: bytes, topic: bytes, text: bytes) -> bytes:
    """A plaintext envelope of one SSMP MCAST from ``name``, with its rendered SSMP section."""
    message = Message(MULTICAST, topic, text, "ssmp", name, principal=Principal(name.decode(), "ssmp-open"))
    return envelope.encode(os.urandom(8), [message], None)


@pytest_twisted.ensureDeferred
async def test_a_forged_envelope_to_a_topic_nobody_may_publish_to_is_dropped(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await nodes_with_ual(tmp_path, redis_server, 2)
    tap = await Tap(redis_server.port).listen(channel(b"readonly"))
    try:
        alice = await subscriber(nodes[1], b"alice", b"readonly")
        mallory = await nodes[0].ssmp(b"mallory")
        mallory.send(b"MCAST readonly through-a-node")
        await mallory.lines.count(2)
        assert mallory.lines.items[1] == b"405"  # the access list: nobody publishes here
        seen = len(alice.lines.items)
        reasons = rejections(nodes[1])
        forged = a_message_from(b"root", b"readonly", b"forged")
        assert tap.publish(channel(b"readonly"), forged) == 2  # both nodes' subscribers got it
        # A frame with a real node's key id and sender (both visible on Redis) and a box of its own.
        real_header = HEADER.unpack_from(nodes[0].engine.sealer.seal(b"x", b"x"))
        header = HEADER.pack(*real_header[:3], real_header[3] + 1000, int(time.time() * 1000))
        tap.publish(channel(b"readonly"), header + forged + bytes(16))
        stranger = Sealer([b"a-secret-that-is-not-the-cluster-secret"], os.urandom(8), 15.0)
        tap.publish(channel(b"readonly"), stranger.seal(channel(b"readonly"), forged))
        await reasons.until(lambda items: items == ["malformed", "bad_tag", "unknown_key"])
        assert ssmp_lines(alice, seen) == []
        # Positive control: the very same envelope, sealed by a real node, is delivered.
        tap.publish(channel(b"readonly"), nodes[0].engine.sealer.seal(channel(b"readonly"), forged))
        await alice.lines.count(seen + 1)
        assert ssmp_lines(alice, seen) == [b"000 root MCAST readonly forged"]
        assert nodes[1].engine.sealer.rejected == {"malformed": 1, "unknown_key": 1, "bad_tag": 1, "replay": 0,
                                                   "stale": 0, "early": 0, "overflow": 0}
    finally:
        tap.close()
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_a_forged_rendered_section_never_reaches_a_socket(tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await nodes_with_ual(tmp_path, redis_server, 2)
    tap = await Tap(redis_server.port).listen(channel(b"open"))
    try:
        alice = await subscriber(nodes[1], b"alice", b"open")
        seen = len(alice.lines.items)
        reasons = rejections(nodes[1])
        # Raw SSMP bytes as the section: a fake "200" reply and a message from a fake sender.
        raw = b"200\n000 operator MCAST open reset-your-password\n"
        message = Message(MULTICAST, b"open", b"x", "ssmp", b"operator", principal=Principal("operator", "ssmp-open"))
        forged = envelope.encode(os.urandom(8), [message], {"ssmp": raw})
        assert envelope.open_run(forged).sections == {"ssmp": raw}  # what the attacker wants sent as is
        tap.publish(channel(b"open"), forged)
        await reasons.until(lambda items: items == ["malformed"])
        # Positive control on the same channel: a real node's publish reaches alice, alone.
        publisher = await nodes[0].ssmp(b"bob")
        publisher.send(b"MCAST open hello")
        await alice.lines.count(seen + 1)
        assert ssmp_lines(alice, seen) == [b"000 bob MCAST open hello"]
        # And the path does send a section as it is when a node sealed it (what sealing protects).
        tap.publish(channel(b"open"), nodes[0].engine.sealer.seal(channel(b"open"), forged))
        await alice.lines.count(seen + 3)
        assert ssmp_lines(alice, seen + 1) == raw.splitlines()
    finally:
        tap.close()
        await stop_all(nodes)


async def a_payment_seen_on_redis(nodes: list[Node], tap: Tap) -> tuple[LineProtocol, LineProtocol, bytes]:
    """alice on node 2 subscribed to ``open`` gets bob's ``pay-10-euros`` from node 1: the two
    clients, and the frame that carried it as the tap (listening to ``open``) saw it."""
    alice = await subscriber(nodes[1], b"alice", b"open")
    bob = await nodes[0].ssmp(b"bob")
    bob.send(b"MCAST open pay-10-euros")
    await alice.next_line(lambda line: line == b"000 bob MCAST open pay-10-euros")
    await tap.until_frame(channel(b"open"))
    (recorded,) = tap.frames(channel(b"open"))
    return alice, bob, recorded


@pytest_twisted.ensureDeferred
async def test_an_envelope_seen_on_redis_and_sent_again_is_delivered_once(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await nodes_with_ual(tmp_path, redis_server, 2)
    tap = await Tap(redis_server.port).listen(channel(b"open"))
    try:
        alice, bob, recorded = await a_payment_seen_on_redis(nodes, tap)
        seen = alice.lines.items.index(b"000 bob MCAST open pay-10-euros")
        assert b"pay-10-euros" not in recorded  # and nobody without the secret reads it
        reasons = rejections(nodes[1])
        assert tap.publish(channel(b"open"), recorded) == 2
        assert tap.publish(channel(b"open"), recorded) == 2
        await reasons.until(lambda items: items == ["replay", "replay"])
        bob.send(b"MCAST open next")  # positive control: the sender's next message arrives
        await alice.lines.count(seen + 2)
        assert ssmp_lines(alice, seen) == [b"000 bob MCAST open pay-10-euros", b"000 bob MCAST open next"]
    finally:
        tap.close()
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_an_envelope_captured_before_a_node_restarted_is_not_delivered_by_it_again(
        tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await nodes_with_ual(tmp_path, redis_server, 2)
    tap = await Tap(redis_server.port).listen(channel(b"open"))
    try:
        _, bob, recorded = await a_payment_seen_on_redis(nodes, tap)
        await nodes[1].stop()
        # The frame must be older than the clock skew allowance when node 2 is back: what a
        # node may still open from before it subscribed (docs/cluster.md, "No replay").
        sealed_at = HEADER.unpack_from(recorded)[4] / 1000
        await eventually(lambda: time.time() > sealed_at + Settings.cluster_clock_skew, "the skew allowance past")
        nodes[1] = await Node(tmp_path / "node2", redis_server.url, "node2", ual_file=tmp_path / "smqp.ual").start()
        alice = await subscriber(nodes[1], b"alice", b"open")
        seen = len(alice.lines.items)
        reasons = rejections(nodes[1])
        assert tap.publish(channel(b"open"), recorded) == 2  # the tap and the restarted node 2
        # Positive control: traffic after the restart arrives, behind the replay on node 2's
        # connection to Redis (the tap's publish was answered before bob's was sent).
        bob.send(b"MCAST open fresh")
        await alice.lines.count(seen + 1)
        assert ssmp_lines(alice, seen) == [b"000 bob MCAST open fresh"]
        await reasons.until(lambda items: items == ["early"])
    finally:
        tap.close()
        await stop_all(nodes)


def control_frames(tap: Tap, node: Node, kind: str) -> list[tuple[bytes, dict[str, Any]]]:
    """The frames ``node`` sent on the control channel that the tap saw, with their contents
    (opened with the node's own keys: the tap itself cannot)."""
    found = []
    for frame in tap.frames(CONTROL_CHANNEL):
        opened = node.engine.sealer.open_own(CONTROL_CHANNEL, frame)
        if opened is not None and json.loads(opened)["k"] == kind:
            found.append((frame, json.loads(opened)))
    return found


async def owner_is(node: Node, address: bytes, origin: str) -> None:
    """Wait (bounded) until ``node``'s directory gives ``address`` to node ``origin``."""
    await eventually(lambda: node.engine.owner("ssmp", address) == origin, f"{address!r} owned by {origin}")


@pytest_twisted.ensureDeferred
async def test_forged_and_replayed_attach_messages_hijack_no_address(tmp_path: Path, redis_server: RedisServer) -> None:
    nodes = await nodes_with_ual(tmp_path, redis_server, 3)
    tap = await Tap(redis_server.port).listen(CONTROL_CHANNEL)
    try:
        first = await nodes[2].ssmp(b"alice")  # alice on node 3 first: its attach is recorded
        await owner_is(nodes[0], b"alice", nodes[2].engine.origin)
        await tap.until_frame(CONTROL_CHANNEL)
        ((old_attach, fields),) = control_frames(tap, nodes[2], "attach")
        assert fields["a"] == "alice"
        await first.close()
        alice = await nodes[1].ssmp(b"alice")  # then on node 2
        await owner_is(nodes[0], b"alice", nodes[1].engine.origin)
        reasons = [rejections(node) for node in nodes[:2]]

        fake = os.urandom(8).hex()
        forged = json.dumps({"o": fake, "n": "node9", "k": "attach", "ns": "ssmp", "a": "alice",
                             "at": time.time() + 3600}).encode()
        tap.publish(CONTROL_CHANNEL, forged)
        tap.publish(CONTROL_CHANNEL, old_attach)
        for waiter in reasons:
            await waiter.until(lambda items: items == ["malformed", "replay"])
        assert nodes[0].engine.owner("ssmp", b"alice") == nodes[1].engine.origin
        # Positive control: a UCAST from node 1 still reaches alice's session on node 2.
        bob = await nodes[0].ssmp(b"bob")
        seen = len(alice.lines.items)
        bob.send(b"UCAST alice still-yours")
        await alice.lines.count(seen + 1)
        assert ssmp_lines(alice, seen) == [b"000 bob UCAST alice still-yours"]
        assert not alice.lost.called
        # The same forged attach sealed by a real node is acted on (the path is live): node 2
        # closes alice's session, node 1 gives her address to the invented node.
        tap.publish(CONTROL_CHANNEL, nodes[2].engine.sealer.seal(CONTROL_CHANNEL, forged))
        await owner_is(nodes[0], b"alice", fake)
        await alice.lost.addTimeout(TIMEOUT, reactor())
    finally:
        tap.close()
        await stop_all(nodes)


def test_twistd_without_a_usable_cluster_secret_exits_with_one_line(tmp_path: Path) -> None:
    base = ["--cluster", "redis://127.0.0.1:1", "--ssmp", "tcp:0:interface=127.0.0.1"]
    readable = cluster_secret(tmp_path / "readable")
    os.chmod(readable, 0o644)
    cases = [
        ([], "brokerd: --cluster needs --cluster-secret-file FILE"),
        (["--cluster-secret-file", str(readable)],
         f"brokerd: --cluster-secret-file {readable}: the file must not be accessible to group or others"),
        (["--cluster-secret-file", str(cluster_secret(tmp_path / "empty", b""))],
         f"brokerd: --cluster-secret-file {tmp_path / 'empty'}: the file is empty"),
    ]
    for extra, message in cases:
        result = run_twistd(tmp_path, *base, *extra)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output
        errors = [line for line in output.splitlines() if "brokerd: " in line]
        assert len(errors) == 1 and message in errors[0], output
        assert "Traceback" not in output


OLD = b"the-cluster-secret-before-rotation"
NEW = b"the-cluster-secret-after-rotation!"


def rewrite(path: Path, *lines: bytes) -> None:
    """Replace the secret file at once (write a new file, rename it over the old)."""
    os.replace(cluster_secret(path.with_suffix(".new"), *lines), path)


@pytest_twisted.ensureDeferred
async def test_a_key_rotates_across_three_nodes_under_traffic_with_nothing_lost(
        tmp_path: Path, redis_server: RedisServer) -> None:
    from twisted.internet.task import LoopingCall

    from brokerd.cluster.seal import Key

    files = [cluster_secret(tmp_path / f"node{i}.secret", OLD) for i in range(1, 4)]
    nodes = [await Node(tmp_path / f"node{i}", redis_server.url, f"node{i}", cluster_secret_file=files[i - 1],
                        cluster_heartbeat=0.2, cluster_node_timeout=3.0).start() for i in range(1, 4)]
    sending: Any = None
    try:
        subscribers = []
        for node, name in zip(nodes, (b"dave", b"alice", b"carol")):
            client = await node.ssmp(name)
            await ssmp_subscribed(client, b"open")
            subscribers.append(client)
        for node in nodes:
            await node.engine.when_following(b"open").addTimeout(TIMEOUT, reactor())
        bob, erin = await nodes[0].ssmp(b"bob"), await nodes[2].ssmp(b"erin")
        sent = {b"bob": 0, b"erin": 0}

        def send() -> None:
            for name, client in ((b"bob", bob), (b"erin", erin)):
                client.send(b"MCAST open %s-%d" % (name, sent[name]))
                sent[name] += 1

        sending = LoopingCall(send)
        sending.clock = reactor()
        sending.start(0.01)

        async def traffic_flows() -> None:
            """Every subscriber sees a message sent from now on by each publisher (not its own)."""
            marks = {name: sent[name] + 3 for name in sent}
            for client, own in zip(subscribers, (b"bob", None, b"erin")):
                for name, mark in marks.items():
                    if name != own:
                        await client.next_line(lambda line, n=name, m=mark: line.endswith(b" %s-%d" % (n, m)))

        installed = []
        for node in nodes:
            waiter = Waiter()
            node.engine.secret_listeners.append(waiter)
            installed.append(waiter)
        await traffic_flows()
        for step in ([OLD, NEW], [NEW, OLD], [NEW]):  # docs/cluster.md's three steps
            expected = [Key(secret).key_id.hex() for secret in step]
            for path, waiter in zip(files, installed):
                rewrite(path, *step)
                await waiter.until(lambda items, e=expected: bool(items) and items[-1] == e)
                await traffic_flows()
        sending.stop()
        last = {name: count - 1 for name, count in sent.items()}
        for client, own in zip(subscribers, (b"bob", None, b"erin")):
            for name, final in last.items():
                if name != own:
                    await client.next_line(lambda line, n=name, f=final: line.endswith(b" %s-%d" % (n, f)))
            for name, final in last.items():
                if name == own:
                    continue
                got = [line.rsplit(b" ", 1)[1] for line in client.lines.items if b" MCAST open %s-" % name in line]
                assert got == [b"%s-%d" % (name, i) for i in range(final + 1)], (client, name)
        for node in nodes:
            assert not any(node.engine.sealer.rejected.values()), node.engine.sealer.rejected
            assert node.engine.sealer.key_ids == [Key(NEW).key_id]
        assert min(sent.values()) > 0
    finally:
        if sending is not None and sending.running:
            sending.stop()
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_nodes_stalled_longer_than_the_node_timeout_exchange_their_state_again(
        tmp_path: Path, redis_server: RedisServer) -> None:
    from tests.integration.test_cluster_addresses import until_members

    nodes = [await Node(tmp_path / f"node{i}", redis_server.url, f"node{i}", cluster_heartbeat=0.2,
                        cluster_node_timeout=1.0).start() for i in (1, 2)]
    try:
        alice = await nodes[1].ssmp(b"alice")
        await ssmp_subscribed(alice, b"hall")
        await until_members(nodes[0], b"hall", 1)
        stalled: Deferred = Deferred()
        gone = Waiter()
        nodes[0].engine.node_listeners.append(gone)

        def stall() -> None:  # the whole process stops answering, as under SIGSTOP
            time.sleep(1.5)
            stalled.callback(None)

        reactor().callLater(0, stall)
        await stalled
        await gone.until(lambda origins: nodes[1].engine.origin in origins)  # taken for dead...
        await until_members(nodes[0], b"hall", 1)  # ...and its members are back from its state
        bob = await nodes[0].ssmp(b"bob")
        bob.send(b"MCAST hall after-the-stall")
        await alice.next_line(lambda line: line == b"000 bob MCAST hall after-the-stall")
    finally:
        await stop_all(nodes)

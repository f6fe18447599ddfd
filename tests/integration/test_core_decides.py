"""The core is the one place that decides, for SMQP and for programs embedding the broker.

Real sockets, makeService, the UAL file.  To prove that SMQP asks the core (and not the
access list it also reads), the SMQP tests install a core policy that refuses more than the
file: whatever SMQP refuses beyond the file, it can only have learnt from the core.  The
embedding tests publish from in-process code with the principals docs/embedding.md names.
Every test that asserts "nothing arrived" waits for an allowed message sent after the
refused one, on the same subscriptions.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from zope.interface import implementer

from brokerd.auth.policy import UALPolicy
from brokerd.core.access import Perm
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import ACCOUNT, BROKER, Principal
from brokerd.errors import Forbidden
from brokerd.interfaces import IAccessPolicy
from tests.integration.test_permissions_crossproto import (
    PEERS,
    PROTOCOLS,
    SMQPPeer,
    _admin,
    _ready,
    _stop,
    start_live,
)
from tests.support.live import LiveBroker


@implementer(IAccessPolicy)
class StricterThanTheFile:
    """The file's policy, except that mallory may neither publish nor subscribe anywhere."""

    def __init__(self, file_policy: UALPolicy) -> None:
        self.file_policy = file_policy
        self.asked: list[tuple[Principal, bytes]] = []

    def permissions(self, principal: Principal, topic: bytes) -> Perm:
        self.asked.append((principal, topic))
        perms = self.file_policy.permissions(principal, topic)
        if principal.name == "mallory":
            perms &= ~(Perm.PUBLISH | Perm.SUBSCRIBE)
        return perms


@pytest.fixture
def live(tmp_path: Path) -> Any:
    broker = start_live(tmp_path)
    pytest_twisted.blockon(_ready(broker))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(_stop(broker)))


def stricter(live: LiveBroker) -> StricterThanTheFile:
    policy = StricterThanTheFile(UALPolicy(live.runtime.access_list.current))
    live.broker.set_policy(policy)
    return policy


@pytest_twisted.ensureDeferred
async def test_smqp_publish_is_decided_by_the_core_for_every_protocols_subscribers(live: LiveBroker) -> None:
    admin = await _admin(live)
    await admin.create_topic("/open/core")
    policy = stricter(live)
    peers = [await PEERS[protocol]().start(live, "c" + protocol) for protocol in PROTOCOLS]
    for peer in peers:
        await peer.subscribe("open/core")
    mallory = await SMQPPeer().start(live, "m1", account="mallory")
    alice = await SMQPPeer().start(live, "a1", account="alice")
    forwarded = live.broker.stats.accepted_by["smqp"]

    # The file lets every account publish to /open; the core's policy does not let mallory.
    await mallory.refused(mallory.publish("open/core", "from mallory"))
    assert live.broker.stats.accepted_by["smqp"] == forwarded, "nothing reached the core's routing"
    assert (Principal("mallory", ACCOUNT), b"open/core") in policy.asked
    await alice.publish("open/core", "from alice")
    for peer in peers:
        await peer.wait_for("from alice")
        assert peer.texts() == ["from alice"], peer.protocol
    assert live.broker.stats.accepted_by["smqp"] == forwarded + 1
    await admin.quit()


@pytest_twisted.ensureDeferred
async def test_smqp_subscribe_and_point_to_point_are_decided_by_the_core(live: LiveBroker) -> None:
    admin = await _admin(live)
    await admin.create_topic("/open/p2p")
    stricter(live)
    mallory = await SMQPPeer().start(live, "m2", account="mallory")
    bob = await SMQPPeer().start(live, "b2", account="bob")
    alice = await SMQPPeer().start(live, "a2", account="alice")

    await mallory.refused(mallory.subscribe("open/p2p"))
    await bob.subscribe("open/p2p")
    await mallory.refused(mallory.client.publish("bob:b2@localhost", "m1", [("text/plain", b"psst bob")]))
    await alice.client.publish("bob:b2@localhost", "m2", [("text/plain", b"hi bob")])
    await alice.publish("open/p2p", "to the topic")
    await bob.wait_for("to the topic")
    assert sorted(bob.texts()) == ["hi bob", "to the topic"]
    await mallory.refused(mallory.publish("open/p2p", "still no"))
    await alice.publish("open/p2p", "again")
    await bob.wait_for("again")
    assert "still no" not in bob.texts() and mallory.texts() == []
    await admin.quit()


EMBEDDED_REFUSED = [
    (None, "readonly/emb", "an embedding program that names no principal is anonymous"),
    (Principal("mallory", ACCOUNT), "readonly/emb", "the list gives accounts only sc on /readonly"),
]
EMBEDDED_ALLOWED = [
    (Principal("bob", ACCOUNT), "open/emb", "as bob"),
    (BROKER, "readonly/emb", "as the broker itself"),
]


@pytest_twisted.ensureDeferred
async def test_an_embedded_publish_is_checked_by_the_same_policy(live: LiveBroker) -> None:
    admin = await _admin(live)
    for topic in ("/open/emb", "/readonly/emb"):
        await admin.create_topic(topic)
    peers = [await PEERS[protocol]().start(live, "e" + protocol) for protocol in ("ssmp", "mcchat", "socketmq")]
    for peer in peers:
        await peer.subscribe("open/emb")
        await peer.subscribe("readonly/emb")
    broker = live.broker

    def embedded(principal: Principal | None, topic: str, text: str) -> int:
        message = Message(MULTICAST, topic.encode(), text.encode(), "app", b"my-service", principal=principal)
        delivered: int = broker.publish(message)
        return delivered

    for principal, topic, text in EMBEDDED_REFUSED:
        with pytest.raises(Forbidden):
            embedded(principal, topic, text)
    for principal, topic, text in EMBEDDED_ALLOWED:
        assert embedded(principal, topic, text) == len(peers)
    wanted = [text for _principal, _topic, text in EMBEDDED_ALLOWED]
    for peer in peers:
        await peer.wait_for(wanted[-1])
        assert peer.texts() == wanted, peer.protocol
    await admin.quit()

"""One access policy for every protocol, end to end (makeService, real sockets, the UAL file).

The matrix: for each (publishing protocol, subscribing protocol) pair, a message to a topic
the publisher may publish to arrives, and one to a topic it may only read is refused with the
publisher's own code and reaches no one.  Each wait for an allowed message also proves the
refused one did not come: both go from one publisher to one subscriber in order, the refused
one first.  Then: subscriptions the policy refuses (each protocol's code), unicast, and a
reload that revokes live and durable subscriptions at once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint

from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.client import connect as smqp_connect
from brokerd.protocols.socketmq.api import Client as SocketMQClient
from brokerd.protocols.socketmq.api import SocketMQError
from brokerd.protocols.ssmp.client import SSMPError
from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.support.live import LOOPBACK, TIMEOUT, Inbox, LiveBroker, reactor, synced

PASSWORDS = {**ACCOUNTS, "mallory": "mallorypw"}
PROTOCOLS = ("ssmp", "mcchat", "smqp", "socketmq")
PAIRS = [(publisher, subscriber) for publisher in PROTOCOLS for subscriber in PROTOCOLS]

UAL = """\
# Anonymous and unproven logins (SSMP open, MCCHAT, socket.mq) match * only.
/open            *          ps
/open            @accounts  psacr
/readonly        *          s
/readonly        @accounts  sc
/dropbox         *          p
/dropbox         @accounts  pc
/accounts/bob    *          p
/accounts/carol  *          p
"""


class Peer:
    """One client of one protocol, seen the same way for every protocol: what it received
    as (topic, text) pairs, and what each protocol answers to a refused request."""

    protocol: str
    refused_code: Any

    def __init__(self) -> None:
        self.got = Inbox()

    def texts(self) -> list[str]:
        return [text for _topic, text in self.got.messages]

    def wait_for(self, text: str) -> Deferred:
        return self.got.until(lambda inbox: any(t == text for _topic, t in inbox.messages))


class SSMPPeer(Peer):
    protocol = "ssmp"
    refused_code = b"405"

    async def start(self, live: LiveBroker, name: str) -> SSMPPeer:
        inbox = Inbox()
        inbox.on_message = self._on_message  # type: ignore[method-assign]
        self.client = await live.ssmp(name.encode(), inbox)
        return self

    def _on_message(self, sender: bytes, verb: bytes, target: bytes, payload: bytes, *rest: Any) -> None:
        self.got.on_message(target.decode(), payload.decode())

    async def subscribe(self, topic: str) -> None:
        await self.client.subscribe(topic.encode()).addTimeout(TIMEOUT, reactor())

    async def publish(self, topic: str, text: str) -> None:
        await self.client.mcast(topic.encode(), text.encode()).addTimeout(TIMEOUT, reactor())

    async def refused(self, call: Deferred) -> None:
        with pytest.raises(SSMPError) as info:
            await call
        assert info.value.code == b"405"


class MCChatPeer(Peer):
    """MCCHAT has no reply to refuse with: a refused SUB or MSG is dropped and counted."""

    protocol = "mcchat"

    async def start(self, live: LiveBroker, name: str) -> MCChatPeer:
        self.live = live
        inbox = Inbox()
        inbox.on_message = self._on_message  # type: ignore[method-assign]
        self.client = await live.mcchat(inbox)
        return self

    def _on_message(self, topic: str, username: str, text: str, *rest: Any) -> None:
        self.got.on_message(topic, text)

    async def subscribe(self, topic: str) -> None:
        self.client.subscribe(topic)
        await synced(self.client)

    async def publish(self, topic: str, text: str) -> None:
        self.client.publish(topic, "zoe", text)
        await synced(self.client)

    async def refused(self, call: Any) -> None:
        stats = self.live.mcchat_factory().stats
        before = stats.forbidden
        await call
        assert stats.forbidden == before + 1


class SMQPPeer(Peer):
    protocol = "smqp"

    async def start(self, live: LiveBroker, name: str, account: str = "bob") -> SMQPPeer:
        self.acks: list[Deferred] = []
        self.client = await smqp_connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        await self.client.login(account, name, PASSWORDS[account])
        self.client.notifyReceived = self._on_notify
        return self

    def _on_notify(self, notify: Any) -> None:
        if notify.body is not None and notify.body.sections:
            if notify.body.get("Guarantee") != "NO":
                self.acks.append(self.client.acknowledge())
            self.got.on_message(notify.args[0], notify.body.sections[0].data.decode())

    async def wait_for(self, text: str) -> None:  # type: ignore[override]
        """The message arrived, and the server took every acknowledgement sent so far."""
        await super().wait_for(text)
        await gatherResults(self.acks).addTimeout(TIMEOUT, reactor())

    async def subscribe(self, topic: str) -> None:
        await self.client.subscribe("/" + topic)

    async def publish(self, topic: str, text: str) -> None:
        await self.client.publish("/" + topic, "m1", [("text/plain", text.encode())])

    async def refused(self, call: Deferred) -> None:
        with pytest.raises(SMQPError) as info:
            await call
        assert info.value.code == 403


class SocketMQPeer(Peer):
    """A plain (unauthenticated) WebSocket connection: refusals are 496."""

    protocol = "socketmq"

    async def start(self, live: LiveBroker, name: str) -> SocketMQPeer:
        self.client = SocketMQClient(f"http://127.0.0.1:{live.port('socketmq')}")
        await self.client.connect()
        return self

    def _on_event(self, event: Any) -> None:
        self.got.on_message(event.event, event.data.decode())

    async def subscribe(self, topic: str) -> None:
        await self.client.subscribe(topic, self._on_event)

    async def publish(self, topic: str, text: str) -> None:
        await self.client.publish(topic, text)

    async def refused(self, call: Deferred) -> None:
        with pytest.raises(SocketMQError) as info:
            await call
        assert info.value.status == 496


PEERS = {"ssmp": SSMPPeer, "mcchat": MCChatPeer, "smqp": SMQPPeer, "socketmq": SocketMQPeer}


def start_live(tmp_path: Path, ual: str = UAL) -> LiveBroker:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts, PASSWORDS)
    ual_file = tmp_path / "ual"
    ual_file.write_text(ual)
    return LiveBroker.start(tmp_path / "data", accounts_file=accounts, ual_file=ual_file,
                            listeners={protocol: [LOOPBACK] for protocol in PROTOCOLS})


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the whole matrix; each pair uses its own topics."""
    broker = start_live(tmp_path_factory.mktemp("matrix"))
    pytest_twisted.blockon(_ready(broker))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(_stop(broker)))


def _ready(live: LiveBroker) -> Deferred:
    for service in live.service:  # type: ignore[union-attr]
        if getattr(service, "option", None) == "smqp":
            return service.factory.started  # type: ignore[no-any-return]
    raise LookupError("smqp")


async def _stop(live: LiveBroker) -> None:
    await live.stop()
    await live.runtime.store.close()


async def _admin(live: LiveBroker) -> Any:
    """alice over SMQP: she creates the SMQP topics (SMQP needs them to exist), the first
    levels included."""
    client = await smqp_connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
    await client.login("alice", "admin", ACCOUNTS["alice"])
    for top in ("/open", "/readonly", "/dropbox", "/news"):
        try:
            await client.create_topic(top)
        except SMQPError as exc:
            assert exc.code == 409, exc  # made by an earlier test
    return client


@pytest.mark.parametrize(("publisher", "subscriber"), PAIRS)
@pytest_twisted.ensureDeferred
async def test_publish_is_checked_for_every_pair_of_protocols(live: LiveBroker, publisher: str,
                                                              subscriber: str) -> None:
    pair = publisher + subscriber
    admin = await _admin(live)
    for topic in (f"/open/{pair}", f"/readonly/{pair}"):
        await admin.create_topic(topic)
    await admin.quit()
    sub = await PEERS[subscriber]().start(live, "s" + pair)
    await sub.subscribe(f"open/{pair}")
    await sub.subscribe(f"readonly/{pair}")
    if publisher == "smqp":
        pub = await SMQPPeer().start(live, "p" + pair, account="alice")
    else:
        pub = await PEERS[publisher]().start(live, "p" + pair)

    await pub.refused(pub.publish(f"readonly/{pair}", "denied"))
    await pub.publish(f"open/{pair}", "allowed")
    await sub.wait_for("allowed")
    assert sub.got.messages == [(_shown(subscriber, f"open/{pair}"), "allowed")]


def _shown(protocol: str, topic: str) -> str:
    return "/" + topic if protocol == "smqp" else topic


@pytest_twisted.ensureDeferred
async def test_refused_subscriptions_get_each_protocols_code_and_nothing(live: LiveBroker) -> None:
    admin = await _admin(live)
    await admin.create_topic("/dropbox/box")
    await admin.create_topic("/open/box")
    peers = [await PEERS[protocol]().start(live, "box") for protocol in PROTOCOLS]
    for peer in peers:
        await peer.refused(peer.subscribe("dropbox/box"))
        await peer.subscribe("open/box")
    sam = await SSMPPeer().start(live, "sam1")
    await sam.publish("dropbox/box", "into the box")  # allowed: p, but nobody may read it
    await sam.publish("open/box", "in the open")
    for peer in peers:
        await peer.wait_for("in the open")
        assert peer.texts() == ["in the open"], peer.protocol
    await admin.quit()


@pytest_twisted.ensureDeferred
async def test_unicast_needs_publish_on_the_recipients_login_topic(live: LiveBroker) -> None:
    bob = await SMQPPeer().start(live, "u1", account="bob")
    alice = await SMQPPeer().start(live, "u1", account="alice")
    carol, dave = await SSMPPeer().start(live, "carol"), await SSMPPeer().start(live, "dave")
    admin = await _admin(live)
    await admin.create_topic("/open/ucast")
    for peer in (alice, carol, dave):
        await peer.subscribe("open/ucast")
    sam = await SSMPPeer().start(live, "sam2")

    await sam.refused(sam.client.ucast(b"smqp:alice:u1", b"psst alice"))
    await sam.refused(sam.client.ucast(b"dave", b"psst dave"))
    await sam.client.ucast(b"smqp:bob:u1", b"hi bob")
    await sam.client.ucast(b"carol", b"hi carol")
    await sam.publish("open/ucast", "after")
    await bob.wait_for("hi bob")
    await carol.wait_for("after")
    assert carol.texts() == ["hi carol", "after"]
    for peer in (alice, dave):
        await peer.wait_for("after")
        assert peer.texts() == ["after"], peer.protocol
    await admin.quit()


REVOKING_UAL = """\
/news      *          ps
/news      @accounts  psacr
"""
REVOKED_UAL = REVOKING_UAL + """\
/news/sec  *          -
/news/sec  alice      psacr
"""


@pytest_twisted.ensureDeferred
async def test_a_reload_revokes_live_and_durable_subscriptions(tmp_path: Path) -> None:
    live = start_live(tmp_path, REVOKING_UAL)
    try:
        await _ready(live)
        admin = await _admin(live)
        for topic in ("/news/sec", "/news/other"):
            await admin.create_topic(topic)
        alice = await SMQPPeer().start(live, "c1", account="alice")
        mallory = await SMQPPeer().start(live, "c1", account="mallory")
        await mallory.subscribe("news/sec")
        await mallory.subscribe("news/other")
        await mallory.client.quit()  # offline; her subscriptions are durable
        peers = [await PEERS[protocol]().start(live, "r1") for protocol in PROTOCOLS]
        for peer in peers:
            await peer.subscribe("news/sec")
            await peer.subscribe("news/other")
        await alice.publish("news/sec", "before")
        for peer in peers:
            await peer.wait_for("before")

        (tmp_path / "ual").write_text(REVOKED_UAL)
        await live.runtime.access_list.reload()
        await alice.publish("news/sec", "after")
        await alice.publish("news/other", "other news")
        for peer in peers:
            await peer.wait_for("other news")
            assert [t for t in peer.texts() if t != "before"] == ["other news"], peer.protocol

        again = SMQPPeer()
        await again.start(live, "c1", account="mallory")
        await again.wait_for("other news")
        assert again.texts() == ["other news"], "nothing from /news/sec, not even what was pending"
    finally:
        await _stop(live)

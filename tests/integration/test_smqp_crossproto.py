"""SMQP with SSMP and MCCHAT on one broker (makeService, real sockets): an SMQP publish to
/room reaches SSMP and MCCHAT subscribers of ``room`` (the first text/* section), and their
messages reach SMQP subscribers of /room as NOTIFY MESSAGE of a stored message (acknowledged
with 310, no ``Guarantee: NO``): /room has a durable subscriber, so the core stores them."""
from __future__ import annotations

from pathlib import Path

import pytest_twisted
from twisted.internet.endpoints import TCP4ClientEndpoint

from brokerd.protocols.smqp.client import connect
from brokerd.protocols.socketmq.api import Client
from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.support.live import LOOPBACK, Inbox, LiveBroker, SMQPInbox, reactor, synced


@pytest_twisted.ensureDeferred
async def test_smqp_to_ssmp_and_mcchat_and_back(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    live = LiveBroker.start(tmp_path / "data", accounts_file=accounts,
                            listeners={"ssmp": [LOOPBACK], "mcchat": [LOOPBACK], "smqp": [LOOPBACK]})
    try:
        smqp = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        login = await smqp.login("alice", "c1", ACCOUNTS["alice"])
        inbox = SMQPInbox(smqp)
        await smqp.create_topic("/room")
        await smqp.subscribe("/room")
        ssmp_inbox, mc_inbox = Inbox(), Inbox()
        ssmp = await live.ssmp(b"s0", ssmp_inbox)
        await ssmp.subscribe(b"room")
        mc = await live.mcchat(mc_inbox)
        mc.subscribe("room")
        await synced(mc)

        await smqp.publish("/room", "X1", [("application/octet-stream", b"\x00\x01"),
                                           ("text/plain", b"hello from smqp")])
        await ssmp_inbox.count(1)
        assert ssmp_inbox.messages[0][1:4] == (b"MCAST", b"room", b"hello from smqp")
        assert ssmp_inbox.messages[0][0] == b"smqp:alice:c1"
        await mc_inbox.count(1)
        assert mc_inbox.messages[0][0] == "room" and mc_inbox.messages[0][2] == "hello from smqp"
        notify = await inbox.next()
        assert notify.body.get("Guarantee") is None, "SMQP subscribers get it once, durably"
        await smqp.acknowledge()
        assert await inbox.quiet()

        await ssmp.mcast(b"room", b"from ssmp")
        notify = await inbox.next()
        assert notify.args == ("/room", "ADD") and notify.body.get("Guarantee") is None
        assert notify.body.sections[0].data == b"from ssmp"
        assert notify.body.get("Cmuid").startswith("ssmp:s0@")
        assert notify.body.get("Smuid").startswith(f"{login.suid}/")
        await smqp.acknowledge()
        mc.publish("room", "zoe", "from mcchat")
        notify = await inbox.next()
        assert notify.body.sections[0].data == b"from mcchat"
        await smqp.acknowledge()
        assert await inbox.quiet()
    finally:
        await live.stop()
        await live.runtime.store.close()


@pytest_twisted.ensureDeferred
async def test_an_offline_durable_subscriber_gets_other_protocols_messages_when_it_returns(tmp_path: Path) -> None:
    """SSMP, MCCHAT and socket.mq publish while the SMQP subscriber of /room is away: the core
    stores each (SSMP's 200 and socket.mq's result come after the commit), and the subscriber
    gets all three, in order, two-phase, when it logs in again; a topic it does not subscribe
    to is not kept for it."""
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    live = LiveBroker.start(tmp_path / "data", accounts_file=accounts,
                            listeners={"ssmp": [LOOPBACK], "mcchat": [LOOPBACK], "smqp": [LOOPBACK],
                                       "socketmq": [LOOPBACK]})
    web = Client(f"http://127.0.0.1:{live.port('socketmq')}")
    try:
        smqp = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        await smqp.login("alice", "c1", ACCOUNTS["alice"])
        await smqp.create_topic("/room")
        await smqp.create_topic("/elsewhere")
        await smqp.subscribe("/room")
        await smqp.quit()

        ssmp = await live.ssmp(b"s0")
        await ssmp.mcast(b"room", b"from ssmp")
        await ssmp.mcast(b"elsewhere", b"not kept")
        mc = await live.mcchat()
        mc.publish("room", "zoe", "from mcchat")
        await synced(mc)
        await web.connect()
        await web.publish("room", "from socket.mq")
        store = live.runtime.store
        assert await store.count_messages(["room"]) == 3
        assert await store.count_messages(["elsewhere"]) == 0

        back = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        inbox = SMQPInbox(back)
        await back.login("alice", "c1", ACCOUNTS["alice"])
        received = []
        for _ in range(3):
            notify = await inbox.next()
            assert notify.args == ("/room", "ADD") and notify.body.get("Guarantee") is None
            received.append((notify.body.get("Cmuid").partition(":")[0], notify.body.sections[0].data))
            await back.acknowledge()
        assert received == [("ssmp", b"from ssmp"), ("mcchat", b"from mcchat"), ("socketmq", b"from socket.mq")]
        assert await inbox.quiet()
        assert await store.count_messages(["room"]) == 3  # kept until they expire, as SMQP's own
    finally:
        await web.close()
        await live.stop()
        await live.runtime.store.close()


@pytest_twisted.ensureDeferred
async def test_an_smqp_account_named_like_a_protocol_does_not_own_its_messages(tmp_path: Path) -> None:
    """Another protocol's message is stored with publisher ``ssmp:<name>``: an SMQP account
    called ``ssmp`` must not count as its publisher (REMOVE MESSAGE is for the publisher or
    a topic administrator), while the same account removes its own message."""
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts, {**ACCOUNTS, "ssmp": "ssmppw"})
    ual = tmp_path / "ual"
    ual.write_text("/ @accounts psc\n/room * ps\n/room alice psacr\n")  # only alice administers /room
    live = LiveBroker.start(tmp_path / "data", accounts_file=accounts, ual_file=ual,
                            listeners={"ssmp": [LOOPBACK], "smqp": [LOOPBACK]})
    try:
        alice = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        await alice.login("alice", "c1", ACCOUNTS["alice"])
        await alice.create_topic("/room")
        await alice.subscribe("/room")
        await alice.quit()
        ssmp = await live.ssmp(b"s0")
        await ssmp.mcast(b"room", b"from ssmp")
        mallory = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        await mallory.login("ssmp", "s0", "ssmppw")
        foreign = (await mallory.command("LIST", "MESSAGE", "/room")).lines[-1]
        refused = await mallory.command("REMOVE", "MESSAGE", "/room", foreign).addErrback(lambda f: f.value)
        assert refused.code == 403
        await mallory.publish("/room", "m1", [("text/plain", b"mine")])
        numbers = (await mallory.command("LIST", "MESSAGE", "/room")).lines[-1]
        own = numbers.rpartition(",")[2].rpartition("-")[2]
        assert own != foreign
        await mallory.command("REMOVE", "MESSAGE", "/room", own)
        assert (await mallory.command("LIST", "MESSAGE", "/room")).lines[-1] == foreign
        await mallory.quit()
    finally:
        await live.stop()

"""SMQP with SSMP and MCCHAT on one broker (makeService, real sockets): an SMQP publish to
/room reaches SSMP and MCCHAT subscribers of ``room`` (the first text/* section), and their
messages reach SMQP subscribers of /room as NOTIFY MESSAGE with Guarantee: NO."""
from __future__ import annotations

from pathlib import Path

import pytest_twisted
from twisted.internet.endpoints import TCP4ClientEndpoint

from brokerd.protocols.smqp.client import connect
from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.integration.test_smqp_messaging import Inbox as SMQPInbox
from tests.protocols.mcchat.live import LOOPBACK, Inbox, LiveBroker, reactor, synced


@pytest_twisted.ensureDeferred
async def test_smqp_to_ssmp_and_mcchat_and_back(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    live = LiveBroker.start(tmp_path / "data", accounts_file=accounts,
                            listeners={"ssmp": [LOOPBACK], "mcchat": [LOOPBACK], "smqp": [LOOPBACK]})
    try:
        smqp = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        await smqp.login("alice", "c1", ACCOUNTS["alice"])
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
        assert notify.args == ("/room", "ADD") and notify.body.get("Guarantee") == "NO"
        assert notify.body.sections[0].data == b"from ssmp"
        assert notify.body.get("Cmuid").startswith("ssmp:s0@")
        mc.publish("room", "zoe", "from mcchat")
        notify = await inbox.next()
        assert notify.body.sections[0].data == b"from mcchat"
        assert await inbox.quiet()
    finally:
        await live.stop()
        await live.runtime.resources["store"].close()

"""MCCHAT and SSMP on one broker, over real loopback sockets: several subscribers of each
protocol on one topic, messages in both directions, what one side cannot carry (dropped and
counted), and MCCHAT subscribers in SSMP presence events."""
from __future__ import annotations

from pathlib import Path

import pytest_twisted

from brokerd.protocols.mcchat.client import MCChatClientProtocol
from brokerd.protocols.mcchat.wire import MCCHAT_WIRE
from brokerd.protocols.ssmp.wire import SSMP_WIRE
from tests.support.live import Inbox, LiveBroker, synced


def mcchat_id(client: MCChatClientProtocol) -> bytes:
    """How SSMP names an MCCHAT client: its transport id as the server sees it."""
    return f"mcchat:127.0.0.1:{client.transport.getHost().port}".encode()


@pytest_twisted.ensureDeferred
async def test_several_subscribers_of_each_protocol_get_each_others_messages(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        mc_inboxes = [Inbox() for _ in range(3)]
        mc = [await live.mcchat(inbox) for inbox in mc_inboxes]
        for client in mc:
            client.subscribe("room")
        await synced(*mc)
        ssmp_inboxes = [Inbox() for _ in range(3)]
        ssmp = [await live.ssmp(b"s%d" % i, inbox) for i, inbox in enumerate(ssmp_inboxes)]
        for client in ssmp:
            await client.subscribe(b"room")

        # SSMP -> MCCHAT (all three) and the other SSMP subscribers.
        await ssmp[0].mcast(b"room", b"from ssmp")
        for inbox in mc_inboxes:
            await inbox.count(1)
            assert inbox.messages == [("room", "ssmp:s0", "from ssmp")]
        for inbox in ssmp_inboxes[1:]:
            await inbox.count(1)
            assert inbox.messages == [(b"s0", b"MCAST", b"room", b"from ssmp", False)]

        # MCCHAT -> SSMP (all three) and every MCCHAT subscriber, the sender included.
        mc[0].publish("room", "Zo\u00eb", "from mcchat")
        for inbox in mc_inboxes:
            await inbox.count(2)
            assert inbox.messages[1] == ("room", "Zo\u00eb", "from mcchat")
        for index, inbox in enumerate(ssmp_inboxes):
            await inbox.count(2 if index else 1)
            assert inbox.messages[-1] == (mcchat_id(mc[0]), b"MCAST", b"room", b"from mcchat", False)

        # Many messages in a row keep their order across the protocols.
        for i in range(200):
            mc[1].publish("room", "bob", f"n{i}")
        await ssmp_inboxes[2].count(202)
        assert [m[3] for m in ssmp_inboxes[2].messages[2:]] == [b"n%d" % i for i in range(200)]
        await mc_inboxes[2].count(202)
        assert [m[2] for m in mc_inboxes[2].messages[2:]] == [f"n{i}" for i in range(200)]
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_what_the_other_side_cannot_carry_is_dropped_and_counted(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        mc_inbox, ssmp_inbox = Inbox(), Inbox()
        mc = await live.mcchat(mc_inbox)
        mc.subscribe("room")
        await synced(mc)
        sub = await live.ssmp(b"listener", ssmp_inbox)
        await sub.subscribe(b"room")
        pub = await live.ssmp(b"publisher")
        not_text, unrepresentable = MCCHAT_WIRE.not_text, SSMP_WIRE.unrepresentable
        unrenderable = live.broker.stats.unrenderable

        # An SSMP binary payload with NUL bytes cannot be an MCCHAT string.
        await pub.mcast(b"room", b"\x00\x01\x02", binary=True)
        await pub.mcast(b"room", b"sentinel 1")
        await mc_inbox.count(1)
        assert mc_inbox.messages == [("room", "ssmp:publisher", "sentinel 1")]
        assert MCCHAT_WIRE.not_text == not_text + 1
        # ... while a binary payload that is UTF-8 text gets through.
        await pub.mcast(b"room", b"two\nlines", binary=True)
        await mc_inbox.count(2)
        assert mc_inbox.messages[1] == ("room", "ssmp:publisher", "two\nlines")

        # An MCCHAT message over SSMP's 1024 bytes, or empty, cannot be an SSMP payload.
        mc.publish("room", "zoe", "x" * 1025)
        mc.publish("room", "zoe", "")
        mc.publish("room", "zoe", "sentinel 2")
        await ssmp_inbox.count(4)
        assert [m[3] for m in ssmp_inbox.messages] == [
            b"\x00\x01\x02", b"sentinel 1", b"two\nlines", b"sentinel 2",
        ]
        assert SSMP_WIRE.unrepresentable == unrepresentable + 2
        await mc_inbox.count(5)  # the MCCHAT subscriber (the sender) got all three
        assert [m[2] for m in mc_inbox.messages[2:]] == ["x" * 1025, "", "sentinel 2"]
        assert live.broker.stats.unrenderable == unrenderable + 3
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_mcchat_subscribers_appear_in_ssmp_presence(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        early = await live.mcchat()
        early.subscribe("room")
        await synced(early)
        watcher_inbox = Inbox()
        watcher = await live.ssmp(b"watcher", watcher_inbox)
        await watcher.subscribe(b"room", presence=True)
        await watcher_inbox.until(lambda i: len(i.presence) >= 1)
        assert watcher_inbox.presence == [(mcchat_id(early), b"SUBSCRIBE", b"room", False)]

        late = await live.mcchat()
        late.subscribe("room")
        await watcher_inbox.until(lambda i: len(i.presence) >= 2)
        assert watcher_inbox.presence[1] == (mcchat_id(late), b"SUBSCRIBE", b"room", False)
        late.unsubscribe("room")
        await watcher_inbox.until(lambda i: len(i.presence) >= 3)
        assert watcher_inbox.presence[2] == (mcchat_id(late), b"UNSUBSCRIBE", b"room", False)

        gone = mcchat_id(early)
        await early.close()
        await watcher_inbox.until(lambda i: len(i.presence) >= 4)
        assert watcher_inbox.presence[3] == (gone, b"UNSUBSCRIBE", b"room", False)
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_tl_and_discovery_see_topics_of_both_protocols(tmp_path: Path) -> None:
    live = LiveBroker.start(tmp_path)
    try:
        ssmp = await live.ssmp(b"alice")
        await ssmp.subscribe(b"ssmp-room")
        discover_inbox = Inbox()
        discover = await live.mcchat(discover_inbox)
        discover.subscribe("")
        await discover_inbox.count(1)
        assert discover_inbox.messages == [("", "", "ssmp-room")]
        other = await live.mcchat()
        other.subscribe("mc-room")
        await discover_inbox.count(2)
        assert discover_inbox.messages[1] == ("", "", "mc-room")
        topics = await other.topics()
        assert topics == ["ssmp-room", "mc-room"]
    finally:
        await live.stop()

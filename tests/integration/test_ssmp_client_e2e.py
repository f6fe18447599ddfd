"""SSMPClient against the real SSMP server on real loopback sockets: round trips of every
message kind, presence, a reconnect after the broker drops the connection, and TLS with a
client certificate.  Every wait is bounded."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from brokerd.protocols.ssmp.client import SSMPError, client_endpoint
from tests.support.certs import CLIENT_NAME, SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401
from tests.support.live import LOOPBACK, TIMEOUT, Inbox, LiveBroker, reactor


@pytest_twisted.ensureDeferred
async def test_messages_of_every_kind_round_trip(tmp_path: Path) -> None:
    server = LiveBroker.start(tmp_path / "data", listeners={"ssmp": [LOOPBACK]})
    try:
        alice_inbox, bob_inbox = Inbox(), Inbox()
        alice = await server.ssmp(b"alice", alice_inbox)
        bob = await server.ssmp(b"bob", bob_inbox)
        await alice.subscribe(b"news")
        await bob.subscribe(b"news")
        await bob.mcast(b"news", b"hello")
        await bob.mcast(b"news", b"\x00\xffbinary\n", binary=True)
        await bob.ucast(b"alice", b"just you")
        await bob.bcast(b"everyone sharing a topic")
        await alice_inbox.until(lambda inbox: len(inbox.messages) == 4)
        assert alice_inbox.messages == [
            (b"bob", b"MCAST", b"news", b"hello", False),
            (b"bob", b"MCAST", b"news", b"\x00\xffbinary\n", True),
            (b"bob", b"UCAST", b"alice", b"just you", False),
            (b"bob", b"BCAST", None, b"everyone sharing a topic", False),
        ]
        assert bob_inbox.messages == []  # MCAST and BCAST skip their sender

        with pytest.raises(SSMPError) as refused:
            await bob.ucast(b"nobody", b"anyone there?")
        assert refused.value.code == b"404"
        assert await alice.ping() >= 0
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_presence_follows_subscriptions(tmp_path: Path) -> None:
    server = LiveBroker.start(tmp_path / "data", listeners={"ssmp": [LOOPBACK]})
    try:
        watcher_inbox = Inbox()
        watcher = await server.ssmp(b"watcher", watcher_inbox)
        await watcher.subscribe(b"room", presence=True)
        member = await server.ssmp(b"member")
        await member.subscribe(b"room")
        await watcher_inbox.until(lambda inbox: len(inbox.presence) == 1)
        await member.unsubscribe(b"room")
        await watcher_inbox.until(lambda inbox: len(inbox.presence) == 2)
        assert watcher_inbox.presence == [
            (b"member", b"SUBSCRIBE", b"room", False),
            (b"member", b"UNSUBSCRIBE", b"room", False),
        ]
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_client_logs_in_and_resubscribes_after_the_broker_drops_it(tmp_path: Path) -> None:
    server = LiveBroker.start(tmp_path / "data", listeners={"ssmp": [LOOPBACK]})
    try:
        inbox = Inbox()
        alice = await server.ssmp(b"alice", inbox)
        bob = await server.ssmp(b"bob")
        await alice.subscribe(b"news", presence=True)
        first = alice.protocol
        assert first is not None
        dropped = first.when_closed()

        server.broker.session_for("ssmp", b"alice").transport.loseConnection()
        await dropped.addTimeout(TIMEOUT, reactor())
        second = await alice.whenConnected().addTimeout(TIMEOUT, reactor())

        assert second is not first and second.identifier == b"alice"
        session = server.broker.session_for("ssmp", b"alice")
        assert session is not None and server.broker.subscriptions(session) == [b"news"]
        await bob.mcast(b"news", b"after the reconnect")
        await inbox.until(lambda box: box.messages)
        assert inbox.messages == [(b"bob", b"MCAST", b"news", b"after the reconnect", False)]
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_login_with_a_client_certificate_over_tls(tmp_path: Path, pki: TestPKI) -> None:  # noqa: F811
    server = LiveBroker.start(tmp_path / "data", listeners={"ssmp": ["tls:0:interface=127.0.0.1"]},
                              tls_cert=pki.server.cert, tls_key=pki.server.key, tls_ca=pki.ca)
    try:
        endpoint = client_endpoint(
            reactor(),
            server.address("ssmp"),
            tls=True,
            hostname=SERVER_HOSTNAME,
            ca=pki.ca,
            cert=pki.client.cert,
            key=pki.client.key,
        )
        inbox = Inbox()
        alice = await server.ssmp(
            f"{CLIENT_NAME}/laptop".encode(), inbox, endpoint=endpoint, scheme=b"cert"
        )
        await alice.subscribe(b"secure")
        await alice.mcast(b"secure", b"nobody hears this one")
        assert alice.protocol is not None and alice.protocol.identifier == b"alice/laptop"
    finally:
        await server.stop()

"""SSMPClient against the real SSMP server on real loopback sockets: round trips of every
message kind, presence, a reconnect after the broker drops the connection, and TLS with a
client certificate.  Every wait is bounded."""
from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.application.internet import backoffPolicy
from twisted.internet import endpoints
from twisted.internet.defer import Deferred

from brokerd.auth.realm import build_portal
from brokerd.auth.tls import ServerTLS, listen_endpoint
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.ssmp.client import SSMPClient, SSMPError, client_endpoint
from brokerd.protocols.ssmp.server import SSMPServerFactory
from tests.support.certs import CLIENT_NAME, SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401

TIMEOUT = 10.0
"""Seconds any single wait may take before the test fails instead of hanging."""


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


class Inbox:
    """What one client received, and bounded waits for more of it."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes, bytes | None, bytes, bool]] = []
        self.presence: list[tuple[bytes, bytes, bytes, bool]] = []
        self._waits: list[tuple[Any, Deferred]] = []

    def on_message(self, *message: Any) -> None:
        self.messages.append(message)  # type: ignore[arg-type]
        self._check()

    def on_presence(self, *change: Any) -> None:
        self.presence.append(change)  # type: ignore[arg-type]
        self._check()

    def until(self, condition: Any) -> Deferred:
        """Fires once ``condition(self)`` holds; fails after TIMEOUT seconds."""
        d: Deferred = Deferred()
        self._waits.append((condition, d))
        self._check()
        return d.addTimeout(TIMEOUT, _reactor())

    def _check(self) -> None:
        for condition, d in list(self._waits):
            if not d.called and condition(self):
                self._waits.remove((condition, d))
                d.callback(None)


class LiveBroker:
    """A real SSMP listener on 127.0.0.1, port chosen by the OS."""

    def __init__(self, portal: Any = None) -> None:
        self.broker = Broker()
        self.factory = SSMPServerFactory(
            self.broker, portal or build_portal(open_login=True), Settings(), _reactor()
        )
        self.port: Any = None
        self.clients: list[SSMPClient] = []

    async def listen(self, endpoint: Any = None) -> None:
        endpoint = endpoint or endpoints.serverFromString(_reactor(), "tcp:0:interface=127.0.0.1")
        self.port = await endpoint.listen(self.factory)

    @property
    def address(self) -> str:
        return f"tcp:127.0.0.1:{self.port.getHost().port}"

    async def client(
        self, identifier: bytes, inbox: Inbox | None = None, **options: Any
    ) -> SSMPClient:
        """A started SSMPClient, logged in."""
        endpoint = options.pop("endpoint", None) or client_endpoint(_reactor(), self.address)
        inbox = inbox or Inbox()
        client = SSMPClient(
            endpoint,
            identifier,
            reactor=_reactor(),
            on_message=inbox.on_message,
            on_presence=inbox.on_presence,
            retry_policy=backoffPolicy(initialDelay=0.05, maxDelay=0.5),
            **options,
        )
        self.clients.append(client)
        client.startService()
        await client.whenConnected(failAfterFailures=3).addTimeout(TIMEOUT, _reactor())
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.stopService()
        if self.port is not None:
            await self.port.stopListening()


@pytest_twisted.ensureDeferred
async def test_messages_of_every_kind_round_trip() -> None:
    server = LiveBroker()
    await server.listen()
    try:
        alice_inbox, bob_inbox = Inbox(), Inbox()
        alice = await server.client(b"alice", alice_inbox)
        bob = await server.client(b"bob", bob_inbox)
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
        await server.close()


@pytest_twisted.ensureDeferred
async def test_presence_follows_subscriptions() -> None:
    server = LiveBroker()
    await server.listen()
    try:
        watcher_inbox = Inbox()
        watcher = await server.client(b"watcher", watcher_inbox)
        await watcher.subscribe(b"room", presence=True)
        member = await server.client(b"member")
        await member.subscribe(b"room")
        await watcher_inbox.until(lambda inbox: len(inbox.presence) == 1)
        await member.unsubscribe(b"room")
        await watcher_inbox.until(lambda inbox: len(inbox.presence) == 2)
        assert watcher_inbox.presence == [
            (b"member", b"SUBSCRIBE", b"room", False),
            (b"member", b"UNSUBSCRIBE", b"room", False),
        ]
    finally:
        await server.close()


@pytest_twisted.ensureDeferred
async def test_client_logs_in_and_resubscribes_after_the_broker_drops_it() -> None:
    server = LiveBroker()
    await server.listen()
    try:
        inbox = Inbox()
        alice = await server.client(b"alice", inbox)
        bob = await server.client(b"bob")
        await alice.subscribe(b"news", presence=True)
        first = alice.protocol
        assert first is not None
        dropped = first.when_closed()

        server.broker.session_for("ssmp", b"alice").transport.loseConnection()
        await dropped.addTimeout(TIMEOUT, _reactor())
        second = await alice.whenConnected().addTimeout(TIMEOUT, _reactor())

        assert second is not first and second.identifier == b"alice"
        session = server.broker.session_for("ssmp", b"alice")
        assert session is not None and server.broker.subscriptions(session) == [b"news"]
        await bob.mcast(b"news", b"after the reconnect")
        await inbox.until(lambda box: box.messages)
        assert inbox.messages == [(b"bob", b"MCAST", b"news", b"after the reconnect", False)]
    finally:
        await server.close()


@pytest_twisted.ensureDeferred
async def test_login_with_a_client_certificate_over_tls(pki: TestPKI) -> None:  # noqa: F811
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    server = LiveBroker(build_portal(client_certificates=True))
    await server.listen(listen_endpoint(_reactor(), tls, "tls:0:interface=127.0.0.1"))
    try:
        endpoint = client_endpoint(
            _reactor(),
            server.address,
            tls=True,
            hostname=SERVER_HOSTNAME,
            ca=pki.ca,
            cert=pki.client.cert,
            key=pki.client.key,
        )
        inbox = Inbox()
        alice = await server.client(
            f"{CLIENT_NAME}/laptop".encode(), inbox, endpoint=endpoint, scheme=b"cert"
        )
        await alice.subscribe(b"secure")
        await alice.mcast(b"secure", b"nobody hears this one")
        assert alice.protocol is not None and alice.protocol.identifier == b"alice/laptop"
    finally:
        await server.close()

"""Each protocol's sessions live in their own namespace (makeService, real sockets).

No SSMP, MCCHAT or socket.mq login can claim, replace or receive an SMQP session, and an SMQP
login does not replace an SSMP session of the same name; ``UCAST smqp:<account>:<channel>``
is the documented way from SSMP to an SMQP session.  A shared secret proves "knows the
secret", so a socket.mq ``secret`` login as ``alice`` does not get what the socket.mq policy
gives the certificate (or key) named ``alice``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from brokerd.protocols.socketmq.api import Client as SocketMQClient
from brokerd.protocols.socketmq.api import SocketMQError
from tests.integration.smqp_fixtures import write_test_accounts
from tests.integration.test_permissions_crossproto import (
    PROTOCOLS,
    MCChatPeer,
    SMQPPeer,
    SSMPPeer,
    SocketMQPeer,
    _ready,
    _stop,
)
from tests.support.live import LOOPBACK, TIMEOUT, LineProtocol, LiveBroker, reactor
from tests.support.secrets import write_private

POLICY = """\
[[allow]]
clients = ["alice"]
subscribe = ["vault/*"]

[[allow]]
clients = ["*"]
subscribe = ["public/*", "after", "accounts/*"]
publish = ["*"]
"""


def start_live(tmp_path: Path) -> LiveBroker:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    secret = tmp_path / "secret"
    write_private(secret, "s3cret\n")
    policy = tmp_path / "socketmq.toml"
    policy.write_text(POLICY)
    return LiveBroker.start(tmp_path / "data", accounts_file=accounts, secret_file=secret,
                            socketmq_policy=policy,
                            listeners={protocol: [LOOPBACK] for protocol in PROTOCOLS})


@pytest.fixture
def live(tmp_path: Path) -> Any:
    broker = start_live(tmp_path)
    pytest_twisted.blockon(_ready(broker))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(_stop(broker)))


async def ssmp_line_client(live: LiveBroker) -> LineProtocol:
    endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("ssmp"))
    return await connectProtocol(endpoint, LineProtocol()).addTimeout(TIMEOUT, reactor())


@pytest_twisted.ensureDeferred
async def test_no_other_protocol_takes_over_or_receives_an_smqp_session(live: LiveBroker) -> None:
    broker = live.broker
    ssmp_alice = await SSMPPeer().start(live, "alice")
    ssmp_session = broker.session_for("ssmp", b"alice")
    smqp_alice = await SMQPPeer().start(live, "c1", account="alice")
    smqp_session = broker.session_for("smqp", b"smqp:alice:c1")
    assert smqp_session is not None
    assert broker.session_for("ssmp", b"alice") is ssmp_session and not ssmp_session.closed

    impostor = await ssmp_line_client(live)
    impostor.send(b"LOGIN smqp:alice:c1 open")
    assert (await impostor.next_line(lambda line: True)).startswith(b"401 ")
    await impostor.lost.addTimeout(TIMEOUT, reactor())
    secret_impostor = await ssmp_line_client(live)
    secret_impostor.send(b"LOGIN smqp:alice:c1 secret s3cret")
    assert (await secret_impostor.next_line(lambda line: True)).startswith(b"401 ")

    web = SocketMQClient(f"http://127.0.0.1:{live.port('socketmq')}")
    await web.connect()
    await web.login("open", "smqp:alice:c1")
    mcchat = await MCChatPeer().start(live, "m")
    await mcchat.subscribe("accounts/alice/c1")
    await mcchat.subscribe("after")
    await mcchat.publish("accounts/alice/c1", "injected")

    sam = await SSMPPeer().start(live, "sam")
    await sam.client.ucast(b"smqp:alice:c1", b"for smqp alice")
    await sam.client.ucast(b"alice", b"for ssmp alice")
    await sam.publish("after", "done")
    await smqp_alice.wait_for("for smqp alice")
    await ssmp_alice.wait_for("for ssmp alice")
    await mcchat.wait_for("done")
    assert smqp_alice.texts() == ["for smqp alice"]
    assert ssmp_alice.texts() == ["for ssmp alice"]
    assert mcchat.texts() == ["injected", "done"]  # its own MSG only: MCCHAT echoes to subscribers
    assert broker.session_for("smqp", b"smqp:alice:c1") is smqp_session and not smqp_session.closed
    assert broker.session_for("ssmp", b"alice") is ssmp_session and not ssmp_session.closed
    await web.close()


@pytest_twisted.ensureDeferred
async def test_a_shared_secret_does_not_get_a_certificates_socketmq_rights(live: LiveBroker) -> None:
    web = SocketMQPeer()
    await web.start(live, "w")
    answer = await web.client.login("secret", "alice", "s3cret")
    assert answer is not None
    with pytest.raises(SocketMQError) as refused:
        await web.subscribe("vault/gold")
    assert refused.value.status == 403
    await web.subscribe("public/news")
    sam = await SSMPPeer().start(live, "sam")
    await sam.publish("vault/gold", "gold")
    await sam.publish("public/news", "news")
    await web.wait_for("news")
    assert web.texts() == ["news"]

"""``brokerd-ctl close``: a closed session's client may come back at once, which the command
says; ``close --for SECONDS`` keeps its principal out, refused at login in SSMP and socket.mq
with each protocol's answer, on every node of a cluster (the keep-out travels on the cluster's
control channel), while another identity logs in (positive control)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import endpoints, threads
from twisted.internet.protocol import Factory

from brokerd.core.principal import OPEN, Principal
from tests.integration.cluster_nodes import TIMEOUT, Node, reactor
from tests.integration.test_cluster_routing import poll_until, stop_all
from tests.support.broker import REPO, free_port
from tests.support.certs import CLIENT_NAME, SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401
from tests.support.live import Inbox, LineProtocol, LiveBroker, Waiter, synced
from tests.support.redis import RedisServer, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def ctl(admin: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "brokerd.cli.ctl", "--admin", f"http://127.0.0.1:{admin}", *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


async def ssmp_login(node: Node, name: bytes) -> tuple[LineProtocol, bytes]:
    """A new SSMP connection's answer to ``LOGIN name open``."""
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", node.port("ssmp"))
    client: LineProtocol = await endpoint.connect(Factory.forProtocol(LineProtocol)).addTimeout(TIMEOUT, reactor())
    node.clients.append(client)
    client.send(b"LOGIN " + name + b" open")
    await client.lines.count(1).addTimeout(TIMEOUT, reactor())
    return client, client.lines.items[0]


async def session_id(admin: int, name: str) -> str:
    listing = await threads.deferToThread(ctl, admin, "sessions")
    return next(line.split("\t")[0] for line in listing.stdout.splitlines() if line.split("\t")[2] == name)


@pytest_twisted.ensureDeferred
async def test_close_for_keeps_the_identity_out_on_every_node(tmp_path: Path, redis_server: RedisServer) -> None:
    admin = free_port()
    url = f"redis://127.0.0.1:{redis_server.port}"
    nodes = [await Node(tmp_path / "n1", url, "n1", admin=f"tcp:{admin}:interface=127.0.0.1").start(),
             await Node(tmp_path / "n2", url, "n2").start()]
    try:
        # a plain close: the client may reconnect, and the command says so
        alice, answer = await ssmp_login(nodes[0], b"alice")
        assert answer == b"200"
        closed = await threads.deferToThread(ctl, admin, "close", await session_id(admin, "alice"))
        assert closed.returncode == 0 and "may reconnect at once" in closed.stdout, closed
        await alice.lost.addTimeout(TIMEOUT, reactor())
        alice, answer = await ssmp_login(nodes[0], b"alice")
        assert answer == b"200"

        # close --for: refused on this node and the other, in SSMP and socket.mq
        kept = await threads.deferToThread(ctl, admin, "close", await session_id(admin, "alice"), "--for", "600")
        assert kept.returncode == 0, kept.stderr
        assert kept.stdout.endswith("open:alice is refused at login for 600 s on every node\n"), kept.stdout
        await alice.lost.addTimeout(TIMEOUT, reactor())
        heard = Waiter()
        poll_until(lambda: nodes[1].broker.kept_out.refuses(Principal("alice", OPEN)) is not None, heard)
        await heard.count(1).addTimeout(TIMEOUT, reactor())
        for node in nodes:
            _client, answer = await ssmp_login(node, b"alice")
            assert answer.startswith(b"401"), answer  # SSMP's refused login: 401 and the schemes
            _client, answer = await ssmp_login(node, b"bob")  # positive control: another identity
            assert answer == b"200"
        socketmq = await nodes[1].socketmq()
        with pytest.raises(Exception) as refused:
            await socketmq.login("open", "alice").addTimeout(TIMEOUT, reactor())
        assert "kept out" in str(refused.value) or "401" in str(refused.value), refused.value
        other = await nodes[1].socketmq()
        await other.login("open", "carol").addTimeout(TIMEOUT, reactor())  # positive control

        status = await threads.deferToThread(ctl, admin, "status", "--interval", "0")
        assert "cluster: node n1, 2 nodes alive\n" in status.stdout, status.stdout  # the summary's cluster line

        # what cannot be kept out is refused with a reason, and nothing is closed
        bad = await threads.deferToThread(ctl, admin, "close", "0", "--for", "-1")
        assert bad.returncode == 2 and "--for" in bad.stderr
    finally:
        await stop_all(nodes)


@pytest_twisted.ensureDeferred
async def test_close_for_keeps_an_mcchat_certificate_out(tmp_path: Path, pki: TestPKI) -> None:  # noqa: F811
    """MCCHAT has no login: a connection whose client certificate names a principal kept out
    is closed at its first packet, and the operator log counts it as a refused login."""
    admin = free_port()
    live = LiveBroker.start(tmp_path, listeners={"mcchat": ["tls:0:interface=127.0.0.1"]}, tls_cert=pki.server.cert,
                            tls_key=pki.server.key, tls_ca=pki.ca, admin=f"tcp:{admin}:interface=127.0.0.1",
                            event_log=False)
    with_cert = {"tls": True, "hostname": SERVER_HOSTNAME, "ca": pki.ca, "cert": pki.client.cert,
                 "key": pki.client.key}
    try:
        holder = await live.mcchat(**with_cert)
        holder.subscribe("room")
        await synced(holder)
        listing = await threads.deferToThread(ctl, admin, "sessions")
        session = next(line.split("\t")[0] for line in listing.stdout.splitlines() if "\tmcchat\t" in line)
        kept = await threads.deferToThread(ctl, admin, "close", session, "--for", "600")
        assert kept.returncode == 0, kept.stderr
        assert f"certificate:{CLIENT_NAME} is refused at login for 600 s" in kept.stdout, kept.stdout
        await holder.when_closed().addTimeout(TIMEOUT, reactor())
        again = await live.mcchat(**with_cert)  # the TLS handshake and INFO happen; its first packet ends it
        again.subscribe("room")
        await again.when_closed().addTimeout(TIMEOUT, reactor())
        assert live.runtime.event_log.auth_failures["mcchat"] == 1
        inbox = Inbox()  # positive control: a connection without that certificate goes on
        other = await live.mcchat(inbox, tls=True, hostname=SERVER_HOSTNAME, ca=pki.ca)
        other.subscribe("room")
        await synced(other)
        other.publish("room", "me", "still here")
        await inbox.count(1).addTimeout(TIMEOUT, reactor())
        live.mcchat_clients = [other]
    finally:
        await live.stop()

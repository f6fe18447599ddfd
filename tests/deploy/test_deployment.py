"""The shipped deployment, run as the image runs it (its ENTRYPOINT and CMD, outside Docker)
with deploy/'s files installed as the Dockerfile installs them, only paths and ports changed,
and the config directory read-only as systemd's ProtectSystem=strict and the container make
it: it warns of nothing, an account added live with brokerd-ctl logs in over every protocol
with a login and talks across them, and a client without credentials is refused on each, nor
reads or writes an account's topics through MCCHAT."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import endpoints, threads

from brokerd.protocols.mcchat.codec import MCChatParser, encode_msg, encode_sub, encode_tlrq
from brokerd.protocols.mcchat.events import Msg, TopicList
from brokerd.protocols.mqtt.client import MQTTConnectError
from brokerd.protocols.mqtt.client import connect as mqtt_connect
from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.client import connect as smqp_connect
from brokerd.protocols.socketmq.api import Client, SocketMQError
from brokerd.protocols.socketmq.pgp import SecretKey
from tests.admin.support import http
from tests.deploy.support import TOKEN, Installed, can_mount, ctl, image_command, install, read_only, start
from tests.support import processes
from tests.support.broker import LineClient
from tests.support.live import TIMEOUT, Inbox, reactor

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not can_mount(), reason="root without mount namespaces: /etc cannot be made read-only")]

PASSWORD = "alice-deploy-pw"
SOCKETMQ_CLIENT = SecretKey.generate("deploy-app")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("deployed")
    installed = install(root, policy_edits={'# keyring = "socketmq-clients.asc"': 'keyring = "socketmq-clients.asc"'})
    # the documented socket.mq example: the key ring of the clients allowed
    (installed.etc / "socketmq-clients.asc").write_text(SOCKETMQ_CLIENT.armored_public())
    log = root / "broker.log"
    process = start(installed, read_only(installed.etc, image_command(installed.config)), log)
    added = ctl(installed.config, "accounts", "add", "alice", typed=PASSWORD + "\n")
    yield installed, log, added
    processes.stop(process)


def log_events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_it_warns_of_nothing_and_check_config_agrees(deployed: Any) -> None:
    installed, log, _added = deployed
    events = log_events(log)
    listening = {event["fields"]["option"] for event in events if "listening on" in event["message"]}
    assert listening == set(installed.ports)  # every protocol is served (and the log is read)
    assert [event["message"] for event in events if event["level"] == "warn" and event["source"] == "brokerd.tap"] == []
    checked = subprocess.run([sys.executable, "-m", "brokerd.cli.server", "--check-config", "--config",
                              str(installed.config)], capture_output=True, text=True, timeout=60,
                             env=processes.repo_env())
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "brokerd: configuration OK\n", "")
    assert installed.loopback == {"mcchat"}  # MCCHAT, which has no login, is this host's only


def test_accounts_are_added_live_while_the_config_directory_is_read_only(deployed: Any) -> None:
    installed, _log, added = deployed
    assert added.returncode == 0, added
    assert "\nalice:scrypt" in (installed.state / "accounts").read_text()
    listed = ctl(installed.config, "accounts")
    assert listed.returncode == 0 and "alice" in listed.stdout.split(), listed


def test_accounts_in_the_read_only_config_directory_could_not_be_edited(tmp_path: Path) -> None:
    """The control: with the accounts file beside the config (where it was), under the same
    read-only /etc, brokerd-ctl fails: the file is written beside itself and renamed."""
    installed = install(tmp_path, config_edits={'accounts = "' + str(tmp_path / "state"): 'accounts = "' + str(tmp_path / "etc")})
    process = start(installed, read_only(installed.etc, image_command(installed.config)), tmp_path / "broker.log")
    try:
        added = ctl(installed.config, "accounts", "add", "alice", typed=PASSWORD + "\n")
    finally:
        processes.stop(process)
    assert added.returncode != 0 and ("Read-only file system" in added.stderr or "Permission denied" in added.stderr), added
    assert not (installed.etc / "accounts").exists()


def test_admin_needs_its_token(deployed: Any) -> None:
    installed, _log, _added = deployed
    assert http(installed.ports["admin"], "GET", "/api/status").status == 401
    assert http(installed.ports["admin"], "GET", "/api/status", token=TOKEN).status == 200


def ssmp_login(port: int, line: str) -> tuple[LineClient, bytes]:
    client = LineClient.connect(port)
    return client, client.request(line)


def test_ssmp_refuses_every_login_without_an_account(deployed: Any) -> None:
    installed, _log, _added = deployed
    port = installed.ports["ssmp"]
    for line in ("LOGIN mallory open", "LOGIN . open", f"LOGIN alice password {PASSWORD}x", "LOGIN guest password x"):
        client, answer = ssmp_login(port, line)
        client.close()
        assert answer.startswith(b"401"), (line, answer)
    client, answer = ssmp_login(port, f"LOGIN alice password {PASSWORD}")  # positive control
    client.close()
    assert answer.startswith(b"200"), answer


class MCChat:
    """A blocking MCCHAT client: no login, so nothing to refuse but what it may do."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.parser = MCChatParser()
        self.received: list[Any] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def barrier(self) -> list[Any]:
        """TLRQ, then everything up to its TL: what the broker sent before it handled the TLRQ."""
        self.send(encode_tlrq())
        while True:
            events, error = self.parser.feed(self.sock.recv(65536))
            assert error is None
            self.received += events
            if any(isinstance(event, TopicList) for event in events):
                return self.received

    def close(self) -> None:
        self.sock.close()


@pytest_twisted.ensureDeferred
async def test_an_account_talks_over_every_protocol_and_no_credentials_get_nothing(deployed: Any) -> None:
    installed, _log, _added = deployed
    host = "tcp:127.0.0.1:{}".format
    # MQTT: no username is refused (anonymous login is off), a wrong password too
    for credentials in ({}, {"username": "alice", "password": b"wrong"}, {"username": "guest", "password": b""}):
        with pytest.raises(MQTTConnectError):
            await mqtt_connect(reactor(), host(installed.ports["mqtt"]), client_id="x", **credentials)
    inbox = Inbox()
    alice_mqtt = await mqtt_connect(reactor(), host(installed.ports["mqtt"]), client_id="alice-1",
                                    username="alice", password=PASSWORD.encode(),
                                    on_message=lambda packet: inbox.on_message(packet.topic, packet.payload))
    try:
        granted = await alice_mqtt.subscribe([("accounts/alice/#", 0)])
        assert list(granted.reason_codes) == [0]
        # MCCHAT, which has no login, may neither read nor write the account's topics
        mcchat = await threads.deferToThread(MCChat, installed.ports["mcchat"])
        try:
            mcchat.send(encode_sub(b"accounts/alice/inbox") + encode_msg(b"accounts/alice/inbox", b"alice", b"forged"))
            await threads.deferToThread(mcchat.barrier)
            # SSMP: the account publishes into its own topic; MQTT gets that, not the forgery
            ssmp, answer = await threads.deferToThread(ssmp_login, installed.ports["ssmp"],
                                                       f"LOGIN alice password {PASSWORD}")
            assert answer.startswith(b"200"), answer
            assert (await threads.deferToThread(ssmp.request, "MCAST accounts/alice/inbox hello")).startswith(b"200")
            ssmp.close()
            await inbox.count(1).addTimeout(TIMEOUT, reactor())
            # SMQP: the guest is refused, the account logs in, publishes to and subscribes to its topic
            smqp_endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", installed.ports["smqp"])
            guest = await smqp_connect(smqp_endpoint).addTimeout(TIMEOUT, reactor())
            with pytest.raises(SMQPError):
                await guest.login("guest", "c1").addTimeout(TIMEOUT, reactor())
            guest.transport.loseConnection()
            alice_smqp = await smqp_connect(smqp_endpoint).addTimeout(TIMEOUT, reactor())
            await alice_smqp.login("alice", "c1", PASSWORD).addTimeout(TIMEOUT, reactor())
            published = await alice_smqp.publish("/accounts/alice", "m1", [("text/plain", b"from smqp")])
            assert published.code == 200, published
            assert await alice_smqp.subscribe("/accounts/alice") == ["/accounts/alice"]
            alice_smqp.transport.loseConnection()
            seen = await threads.deferToThread(mcchat.barrier)
        finally:
            mcchat.close()
    finally:
        alice_mqtt.abort()
    assert inbox.messages == [("accounts/alice/inbox", b"hello")]
    assert not [event for event in seen if isinstance(event, Msg)]  # nothing of alice's reached MCCHAT


@pytest_twisted.ensureDeferred
async def test_socketmq_refuses_plain_clients_and_serves_an_authenticated_one(deployed: Any) -> None:
    installed, _log, _added = deployed
    url = f"http://127.0.0.1:{installed.ports['socketmq']}"
    plain = Client(url)
    app = Client(url, key=SOCKETMQ_CLIENT)
    try:
        assert (await plain.request("echo", "r1", b"hi")).status == 496
        await plain.connect()
        with pytest.raises(SocketMQError) as refused:
            await plain.serve("echo", lambda request: request.respond(200, b"never"))
        assert refused.value.status == 496
        # positive control: a client of the key ring serves and calls an application
        await app.connect()
        assert app.connection.identity == "deploy-app"  # type: ignore[union-attr]
        await app.serve("echo", lambda request: request.respond(200, request.body))
        reply = await app.request("echo", "r2", b"hello")
        assert (reply.status, reply.body) == (200, b"hello")
    finally:
        await plain.close()
        await app.close()

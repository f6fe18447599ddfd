"""What the socket.mq front end writes to the event log, on real loopback sockets: refused
authentication and policy refusals (WebSocket and HTTP) as ``auth_failure`` with scheme and
source, and a ``login`` when a client authenticates.  (The portal's logins and refusals and the
one ``dropped`` record per slow-consumer episode are tested in memory in test_adapter.py.)"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from brokerd.protocols.socketmq.api import Client, IncomingRequest, SocketMQError
from brokerd.protocols.socketmq.pgp import SecretKey
from tests.protocols.recording import RecordingEvents
from tests.support.live import Waiter
from tests.support.socketmq import LiveBrokerd

ALICE = SecretKey.generate("alice")
BOB = SecretKey.generate("bob")
MALLORY = SecretKey.generate("mallory")

POLICY = """
security = "required"
keyring = "clients.asc"

[[allow]]
clients = ["alice"]
request = ["echo/*"]
subscribe = ["sensors/*"]
publish = ["sensors/*"]
serve = ["echo"]

[[allow]]
clients = ["*"]
subscribe = ["public/*"]
"""


def _start(broker: LiveBrokerd) -> LiveBrokerd:
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    return broker


@pytest.fixture
def required(tmp_path: Path) -> Any:
    (tmp_path / "clients.asc").write_text("".join(key.armored_public() for key in (ALICE, BOB)))
    (tmp_path / "policy.toml").write_text(POLICY)
    broker = _start(LiveBrokerd(tmp_path / "data", events=RecordingEvents(),
                                socketmq_policy=tmp_path / "policy.toml"))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


def _events(broker: LiveBrokerd) -> RecordingEvents:
    return broker.services.event_log


def _failures(broker: LiveBrokerd) -> list[tuple]:
    return [(f.get("session"), f.get("scheme"), f["reason"]) for f in _events(broker).of("auth_failure")]


@pytest_twisted.ensureDeferred
async def test_websocket_refusals_and_logins(required: LiveBrokerd) -> None:
    mallory = required.track(Client(required.url, key=MALLORY))
    with pytest.raises(SocketMQError):
        await mallory.connect()
    anonymous = required.track(Client(required.url))
    await anonymous.connect()
    with pytest.raises(SocketMQError) as refused:
        await anonymous.subscribe("public/news", Waiter())
    assert refused.value.status == 496
    bob = required.track(Client(required.url, key=BOB))
    await bob.connect()
    with pytest.raises(SocketMQError) as forbidden:
        await bob.publish("sensors/t1", "fake")
    assert forbidden.value.status == 403
    failures = _failures(required)
    assert failures[0][:2] == (None, "OpenPGP") and failures[0][2]  # the verification error
    assert failures[1:] == [
        (None, None, "authentication required"),
        ("bob", "OpenPGP", "not allowed: publish to sensors/t1"),
    ]
    records = _events(required).of("auth_failure")
    assert all(r["protocol"] == "socketmq" and r["source"].startswith("127.0.0.1:") for r in records)
    logins = _events(required).of("login")
    assert [(r["session"], r["scheme"], r["outcome"]) for r in logins] == [("bob", "OpenPGP", "ok")]
    assert logins[0]["source"].startswith("127.0.0.1:")


@pytest_twisted.ensureDeferred
async def test_http_refusals(required: LiveBrokerd) -> None:
    def echo(request: IncomingRequest) -> None:
        request.respond(200, request.body)

    app = required.track(Client(required.url, key=ALICE))
    await app.connect()
    await app.serve("echo", echo)
    assert (await required.track(Client(required.url, key=MALLORY)).request("echo", "x", b"hi")).status == 401
    assert (await required.track(Client(required.url, key=BOB)).request("echo", "x", b"hi")).status == 403
    assert (await required.track(Client(required.url)).request("echo", "x", b"hi")).status == 496
    failures = _failures(required)
    assert [f[:2] for f in failures] == [(None, "OpenPGP"), ("bob", "OpenPGP"), (None, None)]
    assert failures[1][2] == "not allowed: request echo/x" and failures[2][2] == "authentication required"
    assert all(r["source"].startswith("127.0.0.1:") for r in _events(required).of("auth_failure"))

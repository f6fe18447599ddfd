"""socket.mq OpenPGP security end to end on real sockets: secure requests (valid, unknown
key -> 401, forbidden -> 403, plain when security is required -> 496, garbage -> 401),
replies sealed to the client and signed by the server, the public-key interface with key
pinning, WebSocket authentication with mutual proofs, per-event access control, and a
brokered application behind OpenPGP."""
from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool
from twisted.web.http_headers import Headers

from brokerd.protocols.socketmq.api import Client, IncomingRequest, SocketMQError, read_body
from brokerd.protocols.socketmq.pgp import PGPError, SecretKey
from tests.support.live import Waiter, reactor
from tests.support.socketmq import LiveBrokerd

ALICE = SecretKey.generate("alice")
BOB = SecretKey.generate("bob")
MALLORY = SecretKey.generate("mallory")
VAULT = SecretKey.generate("vault-app")

POLICY = """
security = "{security}"
keyring = "clients.asc"

[[allow]]
clients = ["alice"]
request = ["echo/*", "vault/*"]
subscribe = ["sensors/*"]
publish = ["sensors/*"]

[[allow]]
clients = ["vault-app"]
serve = ["vault", "echo"]

[[allow]]
clients = ["*"]
request = ["echo/public-*"]
subscribe = ["public/*"]
"""


def write_policy(directory: Path, security: str) -> Path:
    ring = "".join(key.armored_public() for key in (ALICE, BOB, VAULT))
    (directory / "clients.asc").write_text(ring)
    path = directory / "policy.toml"
    path.write_text(POLICY.format(security=security))
    return path


def start(tmp_path: Path, security: str) -> LiveBrokerd:
    broker = LiveBrokerd(tmp_path / "data", socketmq_policy=write_policy(tmp_path, security))
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    return broker


@pytest.fixture
def required(tmp_path: Path) -> Any:
    broker = start(tmp_path, "required")
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


@pytest.fixture
def enabled(tmp_path: Path) -> Any:
    broker = start(tmp_path, "enabled")
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


seen: list[IncomingRequest] = []


def echo(request: IncomingRequest) -> None:
    seen.append(request)
    request.respond(200, b"for " + (request.client_id or "nobody").encode() + b": " + request.body)


async def vault_app(brokerd: LiveBrokerd, name: str = "echo") -> Client:
    app = brokerd.track(Client(brokerd.url, key=VAULT))
    await app.connect()
    assert app.connection.identity == "vault-app"  # type: ignore[union-attr]
    await app.serve(name, echo)
    return app


@pytest_twisted.ensureDeferred
async def test_secure_request_is_decrypted_and_the_reply_sealed(required: LiveBrokerd) -> None:
    await vault_app(required)
    alice = required.track(Client(required.url, key=ALICE))
    seen.clear()
    reply = await alice.request("echo", "secret-1", b"the plans")
    assert reply.status == 200
    assert reply.body == b"for alice: the plans"
    assert reply.signer is not None and reply.signer.fingerprint == required.hub.key.fingerprint
    assert reply.headers.getRawHeaders(b"Security-Method") == [b"OpenPGP"]
    assert reply.headers.getRawHeaders(b"Content-Type") == [b"application/pgp-encrypted"]
    (request,) = seen
    assert (request.client_id, request.body) == ("alice", b"the plans")


@pytest_twisted.ensureDeferred
async def test_the_wire_carries_ciphertext_only(required: LiveBrokerd) -> None:
    await vault_app(required)
    alice = required.track(Client(required.url, key=ALICE))
    server_key = await alice.fetch_public_key()
    sealed = ALICE.seal(b"the plans", SecretKey.from_armored(required.hub.key.armored_secret()).cert)
    assert b"the plans" not in sealed
    assert server_key == required.hub.key.armored_public()


@pytest_twisted.ensureDeferred
async def test_unknown_key_is_401(required: LiveBrokerd) -> None:
    await vault_app(required)
    mallory = required.track(Client(required.url, key=MALLORY))
    reply = await mallory.request("echo", "x", b"let me in")
    assert reply.status == 401
    assert reply.signer is None


@pytest_twisted.ensureDeferred
async def test_garbage_with_security_header_is_401(required: LiveBrokerd) -> None:
    await vault_app(required)
    anonymous = required.track(Client(required.url))
    reply = await anonymous.request("echo", "x", b"-----BEGIN PGP MESSAGE-----\nnope\n", secure=False)
    assert reply.status == 496  # no Security-Method header at all
    agent = Agent(reactor(), pool=HTTPConnectionPool(reactor(), persistent=False))
    response = await agent.request(
        b"POST",
        (required.url + "/socket.mq/echo/x").encode(),
        Headers({b"Security-Method": [b"OpenPGP"]}),
        FileBodyProducer(BytesIO(b"garbage")),
    )
    body = await read_body(response)
    assert response.code == 401
    assert body.startswith(b"cannot open the request")


@pytest_twisted.ensureDeferred
async def test_known_but_forbidden_key_is_403(required: LiveBrokerd) -> None:
    await vault_app(required)
    bob = required.track(Client(required.url, key=BOB))
    reply = await bob.request("echo", "x", b"hello")
    assert reply.status == 403
    public = await bob.request("echo", "public-notes", b"hello")
    assert (public.status, public.body) == (200, b"for bob: hello")


@pytest_twisted.ensureDeferred
async def test_plain_request_when_security_is_required_is_496(required: LiveBrokerd) -> None:
    await vault_app(required)
    plain = required.track(Client(required.url))
    reply = await plain.request("echo", "public-notes", b"hello")
    assert reply.status == 496


@pytest_twisted.ensureDeferred
async def test_plain_request_to_a_restricted_resource_is_496_when_enabled(enabled: LiveBrokerd) -> None:
    await vault_app(enabled)
    plain = enabled.track(Client(enabled.url))
    assert (await plain.request("echo", "public-notes", b"hi")).body == b"for nobody: hi"
    assert (await plain.request("echo", "private", b"hi")).status == 496


@pytest_twisted.ensureDeferred
async def test_changed_server_key_is_refused_after_pinning(enabled: LiveBrokerd, tmp_path: Path) -> None:
    await vault_app(enabled)
    known = tmp_path / "known.json"
    alice = enabled.track(Client(enabled.url, key=ALICE, known_servers=known))
    assert (await alice.request("echo", "a", b"1")).status == 200
    assert enabled.hub.key.fingerprint in known.read_text()
    enabled.hub.key = SecretKey.generate("impostor")
    again = enabled.track(Client(enabled.url, key=ALICE, known_servers=known))
    with pytest.raises(PGPError, match="changed"):
        await again.request("echo", "a", b"1")


@pytest_twisted.ensureDeferred
async def test_websocket_openpgp_auth_and_per_event_access(required: LiveBrokerd) -> None:
    alice = required.track(Client(required.url, key=ALICE))
    connection = await alice.connect()
    assert connection.identity == "alice"
    events = Waiter()
    await alice.subscribe("sensors/t1", events)
    with pytest.raises(SocketMQError) as forbidden:
        await alice.subscribe("admin/log", Waiter())
    assert forbidden.value.status == 403
    bob = required.track(Client(required.url, key=BOB))
    await bob.connect()
    with pytest.raises(SocketMQError) as bob_forbidden:
        await bob.publish("sensors/t1", "fake reading")
    assert bob_forbidden.value.status == 403
    await bob.subscribe("public/news", Waiter())
    await alice.publish("sensors/t1", "21.5")
    sam = await required.ssmp(b"sam")
    sam.send(b"MCAST sensors/t1 22.0")
    items = await events.count(1)
    assert [e.data for e in items] == [b"22.0"]  # alice's own publication is not echoed


@pytest_twisted.ensureDeferred
async def test_websocket_without_auth_is_496_when_required(required: LiveBrokerd) -> None:
    plain = required.track(Client(required.url))
    await plain.connect()
    with pytest.raises(SocketMQError) as refused:
        await plain.subscribe("public/news", Waiter())
    assert refused.value.status == 496


@pytest_twisted.ensureDeferred
async def test_websocket_unknown_key_auth_is_401(required: LiveBrokerd) -> None:
    mallory = required.track(Client(required.url, key=MALLORY))
    with pytest.raises(SocketMQError) as refused:
        await mallory.connect()
    assert refused.value.status == 401


@pytest_twisted.ensureDeferred
async def test_proof_from_another_connection_is_401(required: LiveBrokerd) -> None:
    from brokerd.protocols.socketmq.events import Auth
    from brokerd.protocols.socketmq.pgp import client_proof

    first = required.track(Client(required.url))
    connection = await first.connect()
    server_cert = SecretKey.from_armored(required.hub.key.armored_secret()).cert
    replayed = client_proof(ALICE, server_cert, "some-other-connection-nonce", "n")
    with pytest.raises(SocketMQError) as refused:
        await connection.call(Auth(None, "OpenPGP", proof=replayed))
    assert refused.value.status == 401



def _break_the_proof_check(monkeypatch: pytest.MonkeyPatch, broker: LiveBrokerd) -> tuple[str, Any]:
    from brokerd.protocols.socketmq import session
    from brokerd.protocols.socketmq.events import Auth

    def broken(*_args: object) -> None:
        raise RuntimeError("a bug in the proof check")

    monkeypatch.setattr(session, "check_client_proof", broken)
    return "socket.mq OpenPGP authentication", Auth(None, "OpenPGP", proof="a proof")


def _break_the_portal(monkeypatch: pytest.MonkeyPatch, broker: LiveBrokerd) -> tuple[str, Any]:
    from twisted.internet.defer import fail

    from brokerd.protocols.socketmq.events import Auth

    monkeypatch.setattr(broker.hub.portal, "login", lambda *_args: fail(RuntimeError("a bug in a checker")))
    return "socket.mq login", Auth(None, "secret", identity="alice", secret="a secret")


@pytest.mark.parametrize("breaking", [_break_the_proof_check, _break_the_portal])
@pytest_twisted.ensureDeferred
async def test_an_unexpected_error_of_a_login_is_logged_with_its_traceback(
        required: LiveBrokerd, monkeypatch: pytest.MonkeyPatch, breaking: Any) -> None:
    """A login that fails for no reason the protocol knows is logged as the failure it is
    (its traceback), not as an event nobody can read."""
    from twisted.logger import globalLogPublisher

    from brokerd.protocols.socketmq import session

    text, auth = breaking(monkeypatch, required)
    logged = Waiter()

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_namespace", "").startswith(session.__name__):
            logged(event)

    globalLogPublisher.addObserver(observe)
    try:
        connection = await required.track(Client(required.url)).connect()
        connection.call(auth).addErrback(lambda _: None)
        await logged.until(lambda events: any("log_failure" in event for event in events))
    finally:
        globalLogPublisher.removeObserver(observe)
    [event] = [event for event in logged.items if "log_failure" in event]
    assert event["log_format"] == text
    assert event["log_failure"].check(RuntimeError)

"""The admin listener against a browser on the operator's machine, on real sockets: a
DNS-rebinding page (its own name in Host and Origin) is refused before any handler runs,
whatever the credential; the listener's own names are served; a ``unix:`` listener is created
0600; every JSON answer parses with a strict parser while SMQP and its store run."""
from __future__ import annotations

import json
import os
import socket
import stat
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from brokerd.config import Settings
from brokerd.tap import StartupError, makeService
from tests.admin.support import Reply
from tests.admin.test_admin_listener import TOKEN, _run
from tests.support.broker import LineClient, free_port

REBOUND = "rebind.attacker.example"


def request(port: int, method: str, path: str, host: str | None, origin: str | None = None,
            token: str | None = None, json_body: bool = False) -> Reply:
    """One request with the Host (None: no Host header at all) and Origin a page would send."""
    connection = HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            connection.putheader("Host", host)
        if origin is not None:
            connection.putheader("Origin", origin)
        if token is not None:
            connection.putheader("Authorization", f"Bearer {token}")
        body = b"{}" if json_body else b""
        if json_body:
            connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def _session_id(admin: int, name: str) -> str:
    sessions = request(admin, "GET", "/api/sessions", f"127.0.0.1:{admin}").json()["sessions"]
    return next(s["id"] for s in sessions if s["name"] == name)


def _rebinding(ssmp: int, admin: int) -> dict[str, Any]:
    innocent = LineClient.connect(ssmp)
    assert innocent.request("LOGIN innocent open") == b"200"
    assert innocent.request("SUBSCRIBE news") == b"200"
    victim = LineClient.connect(ssmp)
    assert victim.request("LOGIN victim open") == b"200"
    victim_id = _session_id(admin, "victim")
    rebound = f"{REBOUND}:{admin}"
    page = f"http://{rebound}"
    seen: dict[str, Any] = {
        "list": request(admin, "GET", "/api/sessions", rebound, page),
        "close": request(admin, "POST", f"/api/sessions/{victim_id}/close", rebound, page, json_body=True),
        "dashboard": request(admin, "GET", "/", rebound),
        "metrics": request(admin, "GET", "/metrics", rebound),
        "trailing dot": request(admin, "GET", "/api/sessions", f"{REBOUND}.:{admin}"),
        "bad host": request(admin, "GET", "/api/sessions", "a b:c"),
    }
    # the victim's session survived, and the innocent client is still served
    assert victim.request("MCAST news still-here") == b"200"
    assert innocent.line() == b"000 victim MCAST news still-here"
    # the listener's own names
    for host in (f"127.0.0.1:{admin}", f"localhost:{admin}", "LOCALHOST", f"[::1]:{admin}", f"broker.example:{admin}", None):
        seen[f"own {host}"] = request(admin, "GET", "/api/sessions", host)
    seen["own close"] = request(admin, "POST", f"/api/sessions/{victim_id}/close", f"127.0.0.1:{admin}",
                                f"http://127.0.0.1:{admin}", json_body=True)
    assert victim.closed()
    innocent.close()
    return seen


@pytest_twisted.inlineCallbacks
def test_a_rebound_host_is_refused_before_any_handler_and_own_names_are_served(tmp_path: Path) -> None:
    seen = yield _run(tmp_path, _rebinding, admin_token_file=None, server_names="broker.example")
    for what in ("list", "close", "dashboard", "metrics", "trailing dot", "bad host"):
        reply = seen[what]
        assert reply.status == 421, (what, reply.status, reply.body)
        assert "Host" in reply.json()["error"]
    own = {key: reply for key, reply in seen.items() if key.startswith("own ") and key != "own close"}
    assert len(own) == 6
    for key, reply in own.items():
        assert reply.status == 200, (key, reply.body)
        assert {s["name"] for s in reply.json()["sessions"]} == {"innocent", "victim"}
    assert seen["own close"].status == 200 and "closed" in seen["own close"].json()


def _with_token(_ssmp: int, admin: int) -> dict[str, Reply]:
    return {
        "rebound": request(admin, "GET", "/api/status", f"{REBOUND}:{admin}", token=TOKEN),
        "own": request(admin, "GET", "/api/status", f"127.0.0.1:{admin}", token=TOKEN),
    }


@pytest_twisted.inlineCallbacks
def test_the_host_check_applies_with_a_token_too(tmp_path: Path) -> None:
    seen = yield _run(tmp_path, _with_token)
    assert seen["rebound"].status == 421
    assert seen["own"].status == 200 and "uptime_seconds" in seen["own"].json()


def _strict(text: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _every_json_endpoint(_ssmp: int, admin: int, smqp: int) -> dict[str, Any]:
    from tests.integration.smqp_fixtures import BlockingSMQP

    bob = BlockingSMQP(smqp)
    bob.login("bob", "jobs")
    assert bob.command("CREATE TOPIC /jobs").code == 200
    assert bob.command("SUB MESSAGE /jobs").code == 200
    assert bob.command("QUIT").code == 200
    bob.close()
    alice = BlockingSMQP(smqp)
    alice.login("alice", "pub")
    for i in range(3):
        alice.send(alice.publish_bytes("/jobs", f"J{i}", b"job"))
        assert alice.reply().code == 200
    parsed: dict[str, Any] = {}
    for path in ("/api/", "/api/status", "/api/sessions", "/api/topics", "/api/nothing"):
        reply = request(admin, "GET", path, f"127.0.0.1:{admin}", token=TOKEN)
        assert reply.headers["content-type"] == "application/json"
        parsed[path] = _strict(reply.body)
    parsed["401"] = _strict(request(admin, "GET", "/api/status", f"127.0.0.1:{admin}").body)
    parsed["421"] = _strict(request(admin, "GET", "/api/status", REBOUND, token=TOKEN).body)
    connection = socket.create_connection(("127.0.0.1", admin), timeout=10)
    try:
        connection.sendall(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{admin}\r\n"
                           f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        received = b""
        while b"\n\n" not in received.partition(b"data: ")[2]:
            chunk = connection.recv(65536)
            assert chunk, received
            received += chunk
        line = received.partition(b"data: ")[2].partition(b"\n\n")[0]
        parsed["/api/events"] = _strict(line)
    finally:
        connection.close()
    alice.close()
    return parsed


@pytest_twisted.inlineCallbacks
def test_every_json_answer_is_strict_json_while_smqp_runs(tmp_path: Path) -> None:
    from tests.integration.smqp_fixtures import write_test_accounts

    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    smqp = free_port()
    parsed = yield _run(tmp_path, _every_json_endpoint, smqp, accounts_file=accounts,
                        listeners={"ssmp": [f"tcp:{free_port()}:interface=127.0.0.1"],
                                   "smqp": [f"tcp:{smqp}:interface=127.0.0.1"]})
    for name in ("/api/status", "/api/events"):
        store = parsed[name]["store"]
        assert store["commit_seconds_buckets"][-1][0] == "+Inf"
        assert store["commit_seconds_buckets"][-1][1] == store["commits"] >= 1
        assert parsed[name]["smqp_queues"]["pending"] == 3
    assert parsed["401"] == {"error": "authentication required"}
    assert parsed["/api/nothing"] == {"error": "no such resource"}


@pytest_twisted.inlineCallbacks
def test_a_unix_admin_socket_is_the_brokers_user_only(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    service = makeService(Settings(listeners={}, data_dir=tmp_path / "data", event_log=False,
                                   admin=f"unix:{path}"), reactor)
    service.startService()
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

        def ask() -> tuple[int, bytes]:
            connection = socket.socket(socket.AF_UNIX)
            connection.settimeout(10)
            connection.connect(str(path))
            connection.sendall(b"GET /api/topics HTTP/1.0\r\n\r\n")
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
            connection.close()
            return int(received.split(b" ")[1]), received.partition(b"\r\n\r\n")[2]

        status, body = yield threads.deferToThread(ask)
        assert status == 200 and json.loads(body) == {"topics": []}  # its owner is served
    finally:
        yield service.stopService()


@pytest_twisted.inlineCallbacks
def test_a_unix_admin_socket_may_let_its_group_in(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    service = makeService(Settings(listeners={}, data_dir=tmp_path / "data", event_log=False,
                                   admin=f"unix:{path}:mode=660"), reactor)
    service.startService()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    finally:
        yield service.stopService()


def test_a_unix_admin_socket_open_to_everyone_needs_a_token(tmp_path: Path) -> None:
    settings = Settings(listeners={}, data_dir=tmp_path / "data", event_log=False,
                        admin=f"unix:{tmp_path / 'admin.sock'}:mode=666")
    with pytest.raises(StartupError, match="mode=666 lets every local user in without a token"):
        makeService(settings, reactor)

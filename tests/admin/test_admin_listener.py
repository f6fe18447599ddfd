"""The admin listener on a real socket: every endpoint, the token, and refusals.

The broker runs in-process on the test's reactor (makeService); the clients are blocking
sockets in a thread, as an operator's tools would be.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor, threads
from twisted.internet.defer import gatherResults

from brokerd.config import Settings
from brokerd.tap import StartupError, makeService
from tests.admin.support import http, post_json
from tests.support.broker import LineClient, free_port
from tests.support.secrets import write_private

TOKEN = "s3cret-token"


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def _start(tmp_path: Path, **overrides: Any) -> tuple[Any, int, int]:
    ssmp, admin = free_port(), free_port()
    token = tmp_path / "admin-token"
    write_private(token, TOKEN + "\n")
    values: dict[str, Any] = dict(
        listeners={"ssmp": [f"tcp:{ssmp}:interface=127.0.0.1"]}, open_login=True, data_dir=tmp_path / "data",
        admin=f"tcp:{admin}:interface=127.0.0.1", admin_token_file=token, event_log=False,
    )
    values.update(overrides)
    service = makeService(Settings(**values), reactor)
    service.startService()
    return service, ssmp, admin


def _run(tmp_path: Path, script: Any, *args: Any, **overrides: Any) -> Any:
    """Start a broker, run ``script(ssmp_port, admin_port, *args)`` in a thread, stop the
    broker (and its store, if any); a Deferred of the script's result."""
    service, ssmp, admin = _start(tmp_path, **overrides)
    factories = service.runtime.front_ends.values()
    d = gatherResults([f.started for f in factories if hasattr(f, "started")])  # SMQP's store is open
    d.addCallback(lambda _: threads.deferToThread(script, ssmp, admin, *args))

    def stop(result: Any) -> Any:
        stopped = service.stopService()
        store = service.runtime.store
        if store is not None:
            stopped.addCallback(lambda _: store.close())
        return stopped.addCallback(lambda _: result)

    return d.addBoth(stop)


def _traffic(ssmp: int, admin: int) -> dict[str, Any]:
    """Two subscribers, one publisher of five messages, one refused login; then scrape."""
    subscribers = []
    for name in ("sub1", "sub2"):
        client = LineClient.connect(ssmp)
        assert client.request(f"LOGIN {name} open") == b"200"
        assert client.request("SUBSCRIBE news") == b"200"
        subscribers.append(client)
    publisher = LineClient.connect(ssmp)
    assert publisher.request("LOGIN pub open") == b"200"
    for n in range(5):
        assert publisher.request(f"MCAST news m{n}") == b"200"
    for client in subscribers:
        assert [client.line() for _ in range(5)] == [b"000 pub MCAST news m%d" % n for n in range(5)]
    refused = LineClient.connect(ssmp)
    assert refused.request("LOGIN mallory secret guess") != b"200"
    assert refused.closed()
    metrics = http(admin, "GET", "/metrics", TOKEN)
    sessions = http(admin, "GET", "/api/sessions", TOKEN)
    topics = http(admin, "GET", "/api/topics", TOKEN)
    status = http(admin, "GET", "/api/status", TOKEN)
    index = http(admin, "GET", "/api/", TOKEN)
    for client in (*subscribers, publisher):
        client.close()
    return {"metrics": metrics, "sessions": sessions, "topics": topics, "status": status, "index": index}


@pytest_twisted.inlineCallbacks
def test_metrics_and_api_match_a_scripted_traffic_run(tmp_path: Path) -> None:
    replies = yield _run(tmp_path, _traffic)
    metrics = replies["metrics"]
    assert metrics.status == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = _samples(metrics.body.decode())
    ssmp_label = (("protocol", "ssmp"),)
    assert samples["brokerd_messages_accepted_total", ssmp_label] == 5
    assert samples["brokerd_messages_delivered_total", ssmp_label] == 10
    assert samples["brokerd_messages_routed_total", (("protocol", "ssmp"), ("receiver", "ssmp"))] == 10
    assert samples["brokerd_logins_total", ssmp_label] == 3
    assert samples["brokerd_auth_failures_total", ssmp_label] == 1
    assert samples["brokerd_sessions", ssmp_label] == 3
    assert samples["brokerd_connections", ssmp_label] == 3  # the refused one is gone
    assert samples["brokerd_connections_total", ssmp_label] == 4
    assert samples["brokerd_topics", ()] == 1
    assert samples["brokerd_subscriptions", ()] == 2
    assert samples["brokerd_messages_dropped_total", (("reason", "slow_consumer"),)] == 0
    assert samples["brokerd_process_resident_memory_bytes", ()] > 0
    assert samples["brokerd_process_open_fds", ()] > 0
    assert ("brokerd_thread_pool_queue", (("pool", "reactor"),)) in samples
    assert all(name.startswith("brokerd_") for name, _labels in samples)

    sessions = replies["sessions"].json()["sessions"]
    assert [(s["protocol"], s["name"], s["subscriptions"]) for s in sessions] == [
        ("ssmp", "pub", []), ("ssmp", "sub1", ["news"]), ("ssmp", "sub2", ["news"])]
    assert all(s["source"].startswith("127.0.0.1:") and s["queued_bytes"] == 0 for s in sessions)
    assert replies["topics"].json() == {"topics": [{"name": "news", "subscribers": 2, "by_protocol": {"ssmp": 2}}]}
    status = replies["status"].json()
    assert status["messages"]["accepted"] == 5 and status["sessions"] == {"ssmp": 3}
    assert [(f["protocol"], f["identity"], f["scheme"]) for f in status["recent_auth_failures"]] == [
        ("ssmp", "mallory", "secret")]
    assert "GET /metrics" in replies["index"].json()["endpoints"]


def _refusals(_ssmp: int, admin: int) -> dict[str, Any]:
    return {
        "none": http(admin, "GET", "/metrics"),
        "wrong": http(admin, "GET", "/api/status", "not-the-token"),
        "basic": http(admin, "GET", "/api/sessions", None),
        "allowed": http(admin, "GET", "/api/topics", TOKEN),
        "status": http(admin, "GET", "/api/status", TOKEN),
    }


@pytest_twisted.inlineCallbacks
def test_requests_without_the_token_are_refused_and_counted(tmp_path: Path) -> None:
    replies = yield _run(tmp_path, _refusals)
    for key in ("none", "wrong", "basic"):
        assert replies[key].status == 401
        assert replies[key].headers["www-authenticate"] == 'Bearer realm="brokerd"'
        assert b"brokerd_" not in replies[key].body
    assert replies["allowed"].status == 200
    failures = replies["status"].json()["recent_auth_failures"]
    assert [(f["protocol"], f["scheme"]) for f in failures] == [("admin", None), ("admin", "bearer"), ("admin", None)]


def _close_and_reload(ssmp: int, admin: int) -> dict[str, Any]:
    victim = LineClient.connect(ssmp)
    assert victim.request("LOGIN victim open") == b"200"
    other = LineClient.connect(ssmp)
    assert other.request("LOGIN other open") == b"200"
    sessions = http(admin, "GET", "/api/sessions", TOKEN).json()["sessions"]
    victim_id = next(s["id"] for s in sessions if s["name"] == "victim")
    replies = {
        "form": http(admin, "POST", f"/api/sessions/{victim_id}/close", TOKEN, b"x", "text/plain"),
        "unknown": post_json(admin, "/api/sessions/ffff/close", TOKEN),
        "get_close": http(admin, "GET", f"/api/sessions/{victim_id}/close", TOKEN),
        "close": post_json(admin, f"/api/sessions/{victim_id}/close", TOKEN),
        "reload": post_json(admin, "/api/reload", TOKEN),
        "delete": http(admin, "DELETE", "/api/reload", TOKEN),
        "missing": http(admin, "GET", "/api/nothing", TOKEN),
    }
    replies["victim_closed"] = victim.closed()
    replies["other_alive"] = other.request("SUBSCRIBE still-here")
    replies["after"] = [s["name"] for s in http(admin, "GET", "/api/sessions", TOKEN).json()["sessions"]]
    other.close()
    return replies


@pytest_twisted.inlineCallbacks
def test_close_a_session_and_reload(tmp_path: Path) -> None:
    replies = yield _run(tmp_path, _close_and_reload)
    assert replies["form"].status == 415  # a cross-site form post cannot set a JSON type
    assert replies["unknown"].status == 404
    assert replies["get_close"].status == 404
    assert replies["close"].status == 200 and replies["close"].json()["closed"]
    assert replies["victim_closed"]
    assert replies["other_alive"] == b"200"
    assert replies["after"] == ["other"]
    assert replies["reload"].status == 200 and replies["reload"].json() == {"reloaded": []}
    assert replies["delete"].status == 405
    assert replies["missing"].status == 404


def test_admin_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    settings = Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, data_dir=tmp_path, admin="tcp:0")
    with pytest.raises(StartupError, match="--admin tcp:0: reachable from the network without a token"):
        makeService(settings, reactor)
    empty = tmp_path / "empty"
    write_private(empty, "\n")
    settings.admin_token_file = empty
    with pytest.raises(StartupError, match="--admin-token-file .*: the file is empty"):
        makeService(settings, reactor)


def _open_loopback(_ssmp: int, admin: int) -> int:
    return http(admin, "GET", "/api/topics").status


@pytest_twisted.inlineCallbacks
def test_loopback_admin_without_a_token_is_open(tmp_path: Path) -> None:
    status = yield _run(tmp_path, _open_loopback, admin_token_file=None)
    assert status == 200


def _reload_and_scrape(_ssmp: int, admin: int, accounts: Path) -> dict[str, Any]:
    replies = {"good": post_json(admin, "/api/reload", TOKEN)}
    accounts.write_text("this is not an accounts file\n")
    replies["bad"] = post_json(admin, "/api/reload", TOKEN)
    replies["metrics"] = http(admin, "GET", "/metrics", TOKEN)
    return replies


@pytest_twisted.inlineCallbacks
def test_reload_reads_smqp_files_and_metrics_show_the_store(tmp_path: Path) -> None:
    from tests.integration.smqp_fixtures import write_test_accounts

    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    replies = yield _run(tmp_path, _reload_and_scrape, accounts, accounts_file=accounts,
                         listeners={"ssmp": [f"tcp:{free_port()}:interface=127.0.0.1"],
                                    "smqp": [f"tcp:{free_port()}:interface=127.0.0.1"]})
    assert replies["good"].status == 200 and replies["good"].json() == {"reloaded": ["smqp"]}
    assert replies["bad"].status == 422 and str(accounts) in replies["bad"].json()["error"]
    samples = _samples(replies["metrics"].body.decode())
    assert samples["brokerd_smqp_pending_messages", ()] == 0
    assert samples["brokerd_smqp_unacknowledged_messages", ()] == 0
    assert samples["brokerd_store_commit_seconds_count", ()] >= 1
    assert ("brokerd_thread_pool_queue", (("pool", "store"),)) in samples


def _login_and_scrape(ssmp: int, admin: int) -> str:
    client = LineClient.connect(ssmp)
    assert client.request("LOGIN alice open") == b"200"
    assert client.request("MCAST news hello") == b"200"
    text = http(admin, "GET", "/metrics", TOKEN).body.decode()
    client.close()
    return text


@pytest_twisted.inlineCallbacks
def test_metrics_of_the_event_log(tmp_path: Path) -> None:
    text = yield _run(tmp_path, _login_and_scrape, event_log=True)
    samples = _samples(text)
    assert samples["brokerd_event_log_failing", ()] == 0
    assert samples["brokerd_event_log_write_errors_total", ()] == 0
    assert samples["brokerd_event_log_overflowed_total", ()] == 0
    assert ("brokerd_event_log_backlog", ()) in samples and ("brokerd_event_log_queued_batches", ()) in samples
    assert samples["brokerd_messages_accepted_total", (("protocol", "ssmp"),)] == 1


def _hostile_bodies(_ssmp: int, admin: int) -> dict[str, Any]:
    """Bodies a handler must refuse with 400, each next to one it accepts."""

    def post(path: str, body: bytes) -> Any:
        return http(admin, "POST", path, TOKEN, body, "application/json")

    replies = {
        "close_deep": post("/api/sessions/ffff/close", b"[" * 1024),  # within the 1024-byte limit
        "close_unknown": post("/api/sessions/ffff/close", b"{}"),
        "add_deep": post("/api/accounts/add", b"[" * 4096),
        "add": post("/api/accounts/add", b'{"name": "alice", "password": "pw"}'),
        "ual_comment": post("/api/ual/set", b'{"topic": "# x", "who": "alice", "permissions": "r"}'),
        "ual_two_lines": post("/api/ual/set", b'{"topic": "/a", "who": "alice", "permissions": "r\\n/b bob r"}'),
        "ual_set": post("/api/ual/set", b'{"topic": "/a", "who": "alice", "permissions": "r"}'),
    }
    replies["ual"] = http(admin, "GET", "/api/ual", TOKEN)
    return replies


@pytest_twisted.inlineCallbacks
def test_bodies_the_handlers_cannot_read_are_refused_with_400(tmp_path: Path) -> None:
    """JSON nested deeper than Python's stack, and an access entry whose fields are not one
    word each (a comment, a second line), are the client's mistakes: 400, not a 500 with a
    traceback, and not an entry other than the one asked for."""
    replies = yield _run(tmp_path, _hostile_bodies, accounts_file=tmp_path / "accounts")
    for key in ("close_deep", "add_deep"):
        assert (replies[key].status, replies[key].json()) == (400, {"error": "the body is not JSON"})
    assert replies["close_unknown"].status == 404  # the body was read: the session is unknown
    assert replies["add"].status == 200
    for key in ("ual_comment", "ual_two_lines"):
        assert (replies[key].status, replies[key].json()) == (400, {"error": "expected: topic who permissions"})
    assert replies["ual_set"].status == 200
    assert replies["ual"].json()["entries"] == [{"topic": "/a", "who": "alice", "permissions": "r"}]

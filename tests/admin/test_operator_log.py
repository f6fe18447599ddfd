"""What a real ``twistd brokerd`` logs for an operator: connections, logins and refusals, in
text or JSON, filtered by --log-level; and the warning about open login on the network."""
from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.broker import LineClient, start_broker


def _session(port: int) -> None:
    client = LineClient.connect(port)
    assert client.request("LOGIN alice open") == b"200"
    refused = LineClient.connect(port)
    assert refused.request("LOGIN mallory secret guess") .startswith(b"401")
    assert refused.closed()
    client.close()


def _log_of_a_session(tmp_path: Path, *options: str) -> str:
    """The log of a broker started with ``options`` that saw one login and one refusal."""
    broker = start_broker(tmp_path, "--open-login", "--no-event-log", *options)
    try:
        _session(broker.ports["ssmp"])
    finally:
        broker.stop()
    return broker.log()


@pytest.mark.slow
def test_json_log_has_connections_logins_and_refusals(tmp_path: Path) -> None:
    log = _log_of_a_session(tmp_path, "--log-format", "json")
    events = [json.loads(line) for line in log.splitlines()]  # every line is one JSON object
    assert events and all(set(e) >= {"time", "level", "source", "message", "fields"} for e in events), events
    assert all(datetime.fromisoformat(e["time"]).tzinfo is not None for e in events)
    texts = [e["message"] for e in events]
    assert any(t.startswith("ssmp: connection from 127.0.0.1:") for t in texts)
    assert any(t.startswith("ssmp: login alice from 127.0.0.1:") for t in texts)
    assert any(t.startswith("ssmp: logout alice from 127.0.0.1:") for t in texts)
    assert any(t.startswith("ssmp: login refused for mallory from 127.0.0.1:") and "(secret)" in t for t in texts)
    login = next(e for e in events if e["message"].startswith("ssmp: login alice"))
    assert login["fields"]["protocol"] == "ssmp" and login["fields"]["name"] == "alice"
    assert login["level"] == "info" and login["source"] == "brokerd"  # as docs/admin.md says
    listening = [e for e in events if e["source"] == "brokerd.tap" and "listening on" in e["message"]]
    assert [e["fields"]["role"] for e in listening] == ["SSMP"], listening
    assert listening[0]["fields"]["address"].startswith("127.0.0.1:")
    assert "Server Shut Down." in texts


@pytest.mark.slow
def test_log_level_warn_keeps_refusals_and_drops_logins(tmp_path: Path) -> None:
    log = _log_of_a_session(tmp_path, "--log-level", "warn")
    assert "ssmp: login refused for mallory from 127.0.0.1:" in log
    assert "ssmp: login alice" not in log
    assert "connection from" not in log


@pytest.mark.slow
def test_open_login_beyond_loopback_is_warned_about(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, "--open-login", "--anonymous", "--smqp-guest-permissions", "psc",
                          listeners={"ssmp": "tcp:{port}", "smqp": "tcp:{port}"})
    broker.stop()
    assert "--ssmp tcp:" in broker.log() and "allows open and anonymous login" in broker.log()
    assert "its guest (no password) may subscribe, publish and create topics" in broker.log()
    (tmp_path / "loopback").mkdir()
    quiet = start_broker(tmp_path / "loopback", "--open-login")
    quiet.stop()
    assert "reachable from the network" not in quiet.log()
    assert "SSMP listening on 127.0.0.1:" in quiet.log()  # its log was written, without the warning


EVERY_LISTENER = {protocol: "tcp:{port}:interface=127.0.0.1"
                  for protocol in ("ssmp", "mcchat", "smqp", "socketmq", "mqtt", "admin")}


def _admin(port: int, method: str, path: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=b"{}" if method == "POST" else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_log_says_what_an_operator_needs_and_no_more(tmp_path: Path, log_format: str) -> None:
    """Every listener, a login, admin API calls and an operator's close: no Twisted
    ``Starting factory <... at 0x...>`` line, no HTTP access line, no Python repr of a name, and
    each line's source the one docs/admin.md names."""
    broker = start_broker(tmp_path, "--open-login", "--no-event-log", "--log-format", log_format,
                          listeners=EVERY_LISTENER)
    try:
        alice = LineClient.connect(broker.ports["ssmp"])
        assert alice.request("LOGIN alice open") == b"200"
        sessions = _admin(broker.ports["admin"], "GET", "/api/sessions")["sessions"]
        session = next(s["id"] for s in sessions if s["name"] == "alice")
        assert _admin(broker.ports["admin"], "POST", f"/api/sessions/{session}/close") == {"closed": session}
        assert alice.closed()
    finally:
        broker.stop()
    log = broker.log()
    if log_format == "json":
        events = [json.loads(line) for line in log.splitlines()]
        lines = [(event["source"], event["message"]) for event in events]
    else:
        lines = [(line.partition("[")[2].partition("#")[0], line.partition("] ")[2]) for line in log.splitlines()]
    sources = {message: source for source, message in lines}
    # positive controls: the lines an operator needs are there, from the documented sources
    listening = [message for message in sources if " listening on 127.0.0.1:" in message]
    assert len(listening) == len(EVERY_LISTENER) and {sources[m] for m in listening} == {"brokerd.tap"}, listening
    login = next(message for message in sources if message.startswith("ssmp: login alice from 127.0.0.1:"))
    assert sources[login] == "brokerd"
    closed = f"admin: closed ssmp session alice ({session})"
    assert sources.get(closed) == "brokerd.admin", [line for line in lines if "admin:" in line[1]]
    for source, message in lines:
        assert "Starting factory" not in message and "HTTP/1.1" not in message, message
        assert "b'" not in message and ' object at 0x' not in message, message
        if source.startswith("brokerd"):  # a module's name, as the docs say, never a class's
            assert not any(part[:1].isupper() for part in source.split(".")), (source, message)

"""What a real ``twistd brokerd`` logs for an operator: connections, logins and refusals, in
text or JSON, filtered by --log-level; and the warning about open login on the network."""
from __future__ import annotations

import json
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
    assert login["level"] == "info" and login["source"].startswith("brokerd.")
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
    assert "Starting factory" in quiet.log()  # its log was written, without the warning

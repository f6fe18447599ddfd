"""Control characters a client sends (an MQTT client identifier or user name, an SSMP or SMQP
login) never reach the operator log raw: the text format writes them as backslash escapes,
the JSON format escapes them in ``message`` and writes every one as a JSON escape, so each
event stays one line for every reader and a terminal shows no escape sequence."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from brokerd.admin.logs import escape_controls, json_line, text_line
from tests.integration.smqp_fixtures import ACCOUNTS, BlockingSMQP, write_test_accounts
from tests.integration.test_mqtt_bad_input import V311, RawMQTT, connect_packet
from tests.support.broker import LineClient, RunningBroker, start_broker

EVIL = "ev\x1b[31mil\r2026-01-01T00:00:00+0000 [forged#info] root logged in\nz\u2028y\u2029x\u0085w\x7fv\x9b"
"""A name with ESC (a terminal colour), CR, LF, the Unicode line and paragraph separators,
NEL (U+0085), DEL and CSI (U+009B), and a forged log line in it (MQTT refuses U+0000)."""
ESCAPED = ("ev\\x1b[31mil\\r2026-01-01T00:00:00+0000 [forged#info] root logged in\\nz\\u2028y\\u2029x\\x85w\\x7fv"
           "\\x9b")
RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
"""Every control character but the line feed that ends each log line."""
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \[")
BROKER = {"ssmp": "tcp:{port}:interface=127.0.0.1", "mqtt": "tcp:{port}:interface=127.0.0.1",
          "smqp": "tcp:{port}:interface=127.0.0.1"}


def test_escape_controls_escapes_every_control_and_nothing_else() -> None:
    assert escape_controls(EVIL) == ESCAPED
    ordinary = "alice/laptop é 日本 ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./ \u00a0\u00ff\u0100"
    assert escape_controls(ordinary) == ordinary  # positive control: printable text as it is
    assert [escape_controls(chr(c)) for c in (0x00, 0x0A, 0x0D, 0x09, 0x1B, 0x7F, 0x85, 0x2028)] == \
        ["\\x00", "\\n", "\\r", "\\t", "\\x1b", "\\x7f", "\\x85", "\\u2028"]


def test_both_formats_escape_a_field_and_an_object_formatted_into_the_message() -> None:
    class Named:
        def __str__(self) -> str:
            return EVIL

    event = {"log_format": "login {name} as {who}", "name": EVIL, "who": Named(), "log_time": 0.0,
             "log_namespace": "test"}
    text = text_line(event)
    assert text is not None and text.count("\n") == 1 and not RAW_CONTROLS.search(text)
    assert text.endswith(f"login {ESCAPED} as {ESCAPED}\n")
    line = json_line(event)
    assert line.count("\n") == 1 and len(line.splitlines()) == 1 and not RAW_CONTROLS.search(line)
    record = json.loads(line)
    assert record["message"] == f"login {ESCAPED} as {ESCAPED}"
    assert record["fields"]["name"] == EVIL  # the JSON reader gets the field as sent


def _attempts(broker: RunningBroker) -> None:
    """A client identifier and a user name with control characters over MQTT, the same in
    SSMP and SMQP logins (their codecs answer 400), and an ordinary refused login in each."""
    ports = broker.ports
    accepted = RawMQTT(broker)
    accepted.send(connect_packet(V311, EVIL))
    assert accepted.read() == (0x20, b"\x00\x00")  # CONNACK accepted: the identifier is logged
    refused = RawMQTT(broker)
    refused.send(connect_packet(V311, "plain", username=EVIL, password=b"guess"))
    assert refused.read() == (0x20, b"\x00\x04")  # bad user name or password: the name is logged
    for line in (f"LOGIN {EVIL.splitlines()[0]} open", "LOGIN a\u2028b\u0085c open"):
        ssmp = LineClient.connect(ports["ssmp"])
        assert ssmp.request(line.encode("utf-8")) == b"400"
    ssmp = LineClient.connect(ports["ssmp"])
    assert ssmp.request("LOGIN mallory secret guess").startswith(b"401")
    for line in ("LOGIN a\u2028b\u0085c:c1 CLEAR/1.0", "LOGIN ev\x1bil:c1 CLEAR/1.0"):
        smqp = BlockingSMQP(ports["smqp"])
        assert smqp.command(line).code == 400
        smqp.close()
    smqp = BlockingSMQP(ports["smqp"])
    assert smqp.command("LOGIN alice:c1 CLEAR/1.0").code == 200
    assert smqp.command("PASSWORD alice not-" + ACCOUNTS["alice"]).code == 401
    smqp.close()


def _log_of_attempts(tmp_path: Path, log_format: str) -> str:
    write_test_accounts(tmp_path / "accounts")
    broker = start_broker(tmp_path, "--open-login", "--no-event-log", "--accounts", str(tmp_path / "accounts"),
                          "--log-format", log_format, listeners=BROKER)
    try:
        _attempts(broker)
    finally:
        broker.stop()
    return broker.log()


@pytest.mark.slow
def test_text_log_escapes_what_clients_sent(tmp_path: Path) -> None:
    log = _log_of_attempts(tmp_path, "text")
    assert not RAW_CONTROLS.search(log), [line for line in log.split("\n") if RAW_CONTROLS.search(line)]
    lines = log.split("\n")[:-1]
    assert all(TIMESTAMP.match(line) for line in lines), [line for line in lines if not TIMESTAMP.match(line)]
    assert any(f"mqtt: login {ESCAPED} from 127.0.0.1:" in line for line in lines), log
    assert any(f"mqtt: login refused for {ESCAPED} from 127.0.0.1:" in line for line in lines), log
    assert any("ssmp: login refused for mallory from 127.0.0.1:" in line for line in lines), log
    assert any("smqp: login refused for alice from 127.0.0.1:" in line for line in lines), log


@pytest.mark.slow
def test_json_log_escapes_what_clients_sent(tmp_path: Path) -> None:
    log = _log_of_attempts(tmp_path, "json")
    assert not RAW_CONTROLS.search(log)
    assert log.splitlines() == log.split("\n")[:-1]  # no reader finds a line break inside an event
    events = [json.loads(line) for line in log.splitlines()]
    login = next(e for e in events if e["message"].startswith("mqtt: login ev"))
    assert login["message"].startswith(f"mqtt: login {ESCAPED} from 127.0.0.1:")
    assert login["fields"]["name"] == EVIL  # lossless for a JSON reader
    refused = next(e for e in events if e["message"].startswith("mqtt: login refused"))
    assert refused["fields"]["identity"] == EVIL and ESCAPED in refused["message"]
    messages = [e["message"] for e in events]
    assert any(m.startswith("ssmp: login refused for mallory from 127.0.0.1:") for m in messages)
    assert any(m.startswith("smqp: login refused for alice from 127.0.0.1:") for m in messages)

"""A listener the network reaches where a client needs no credentials is one warning line at
start, naming the listener and why, and ``--check-config`` prints the same lines; a listener
bound to loopback, or one that requires a login, is not warned about."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from brokerd.config import Settings
from brokerd.preflight import exposure_warnings
from tests.support.broker import start_broker
from tests.support.processes import repo_env

pytestmark = pytest.mark.slow

WARNING = re.compile(r"\[brokerd\.tap#warn\] (.*)$")


def warnings_of(log: str) -> list[str]:
    return [match.group(1) for line in log.splitlines() if (match := WARNING.search(line))]


def check_config(*options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brokerd.cli.server", "--check-config", *options],
                          env=repo_env(), capture_output=True, text=True, timeout=60)


def test_mcchat_on_every_interface_is_one_warning_and_loopback_none(tmp_path: Path) -> None:
    for name in ("exposed", "loopback"):
        (tmp_path / name).mkdir()
    # bound to 0.0.0.0 on a free port; only 127.0.0.1 is ever connected to
    exposed = start_broker(tmp_path / "exposed", listeners={"mcchat": "tcp:{port}"})
    with socket.create_connection(("127.0.0.1", exposed.ports["mcchat"]), timeout=5) as client:
        assert client.recv(16)  # it serves, and anyone gets in: INFO at once
    exposed.stop()
    endpoint = f"tcp:{exposed.ports['mcchat']}"
    assert warnings_of(exposed.log()) == [
        f"--mcchat {endpoint} is reachable from the network and MCCHAT has no login: anyone may subscribe and "
        "publish as the access list's * entries allow (bind it to loopback, tcp:PORT:interface=127.0.0.1, or "
        "require a login)"]
    # --check-config says the same, line for line, and the configuration is still OK
    checked = check_config("--mcchat", endpoint, "--data-dir", str(tmp_path / "checked"))
    assert checked.returncode == 0 and checked.stdout == "brokerd: configuration OK\n", checked
    assert checked.stderr.splitlines() == [f"brokerd: warning: {line}" for line in warnings_of(exposed.log())]
    # positive control: the same listener on loopback starts, logs, and warns of nothing
    quiet = start_broker(tmp_path / "loopback", listeners={"mcchat": "tcp:{port}:interface=127.0.0.1"})
    quiet.stop()
    assert "MCCHAT listening on 127.0.0.1:" in quiet.log()
    assert warnings_of(quiet.log()) == []


def test_each_listener_without_credentials_is_one_line(tmp_path: Path) -> None:
    """A line per such listener, for every way in without credentials, and none where the
    option that closes it is given."""
    open_everything = {protocol: ["tcp:7000", "tcp:7001:interface=127.0.0.1"]
                       for protocol in ("ssmp", "mcchat", "smqp", "socketmq", "mqtt")}
    lines = exposure_warnings(Settings(open_login=True), open_everything)
    assert [line.split(" is reachable")[0] for line in lines] == [
        "--ssmp tcp:7000", "--mcchat tcp:7000", "--smqp tcp:7000", "--socketmq tcp:7000", "--mqtt tcp:7000"]
    assert "allows anonymous login (a CONNECT without a username)" in lines[4]
    assert "its guest (no password) may subscribe" in lines[2]
    policy = tmp_path / "policy.toml"
    policy.write_text('[[allow]]\nclients = ["@authenticated"]\nrequest = ["*"]\n')
    accounts = tmp_path / "accounts"
    accounts.write_text("")
    closed = Settings(mqtt_anonymous=False, smqp_guest=False, socketmq_policy=policy, accounts_file=accounts)
    reachable = {protocol: ["tcp:7000"] for protocol in ("ssmp", "smqp", "socketmq", "mqtt")}
    assert exposure_warnings(closed, reachable) == []
    # what each closing option left open comes back alone
    anonymous_plain = tmp_path / "anonymous.toml"
    anonymous_plain.write_text('[[allow]]\nclients = ["@anonymous"]\nsubscribe = ["news/*"]\n')
    closed.socketmq_policy = anonymous_plain
    assert exposure_warnings(closed, reachable) == [
        f"--socketmq tcp:7000 is reachable from the network and lets clients without authentication subscribe "
        f"(by {anonymous_plain}) (bind it to loopback, tcp:PORT:interface=127.0.0.1, or require a login)"]

"""brokerd-ctl against a running broker's admin listener, and its backup of the store."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from brokerd import __version__
from brokerd.config import Settings
from brokerd.store.records import MessageRecord
from brokerd.store.sqlite import MIGRATIONS
from brokerd.tap import makeService
from tests.support.broker import REPO, LineClient, free_port
from tests.support.secrets import write_private


def ctl(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "brokerd.cli.ctl", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO)


def _session(ssmp: int, admin: str, token: Path, out: Path) -> dict[str, Any]:
    client = LineClient.connect(ssmp)
    assert client.request("LOGIN alice open") == b"200"
    assert client.request("SUBSCRIBE news") == b"200"
    common = ("--admin", admin, "--token-file", str(token))
    results = {name: ctl(*common, name) for name in ("status", "sessions", "topics", "reload", "metrics")}
    assert client.request("MCAST news hello").startswith(b"200")
    results["status_json"] = ctl(*common, "status", "--json")
    session_id = results["sessions"].stdout.split("\t")[0]
    results["close"] = ctl(*common, "close", session_id)
    results["closed"] = client.closed()
    results["close_again"] = ctl(*common, "close", session_id)
    results["no_token"] = ctl("--admin", admin, "status")
    results["unreachable"] = ctl("--admin", f"http://127.0.0.1:{free_port()}", "status")
    results["version"] = ctl("--version")
    return results


@pytest.mark.slow  # eleven brokerd-ctl processes, each importing Twisted and brokerd
@pytest_twisted.inlineCallbacks
def test_ctl_commands(tmp_path: Path) -> None:
    ssmp, admin = free_port(), free_port()
    token = tmp_path / "token"
    write_private(token, "t0ken\n")
    settings = Settings(listeners={"ssmp": [f"tcp:{ssmp}:interface=127.0.0.1"]}, open_login=True,
                        data_dir=tmp_path / "data", event_log=False,
                        admin=f"tcp:{admin}:interface=127.0.0.1", admin_token_file=token)
    service = makeService(settings, reactor)
    service.startService()
    try:
        results = yield threads.deferToThread(_session, ssmp, f"http://127.0.0.1:{admin}", token, tmp_path)
    finally:
        yield service.stopService()
    status = results["status"].stdout.splitlines()
    assert results["status"].returncode == 0 and status[0].startswith(f"brokerd {__version__}, up "), status
    assert status[1:3] == ["connections: 1 open (ssmp 1), 0 refused", "sessions: ssmp 1; 1 topics, 1 subscriptions"]
    assert status[3].startswith("messages: 0.0/s accepted, 0.0/s delivered (totals 0 and 0, over ")
    assert status[4:] == ["dropped: none; slow consumers now: 0", "SMQP queues: no store", "cluster: single node"]
    assert results["status_json"].returncode == 0 and '"accepted": 1' in results["status_json"].stdout
    sessions = results["sessions"].stdout.splitlines()
    assert len(sessions) == 1 and sessions[0].split("\t")[1:3] == ["ssmp", "alice"]
    assert sessions[0].split("\t")[4] == "news"
    assert results["topics"].stdout == "1\tnews\n"
    assert results["reload"].stdout == "reloaded: nothing to reload\n"
    assert "brokerd_sessions{protocol=\"ssmp\"} 1.0" in results["metrics"].stdout
    assert results["close"].returncode == 0 and results["close"].stdout.startswith("closed ")
    assert results["closed"]
    assert results["close_again"].returncode == 1 and "404 no session" in results["close_again"].stderr
    assert results["no_token"].returncode == 1
    assert results["no_token"].stderr == "brokerd-ctl: 401 authentication required\n"
    assert results["unreachable"].returncode == 2 and "cannot reach" in results["unreachable"].stderr
    assert results["version"].stdout == f"brokerd-ctl {__version__}\n"


def _record(seq: int) -> MessageRecord:
    return MessageRecord(f"h/{seq}", "news", "alice:c1", f"C{seq}", 1.0, None, 1, b"kept", seq)


@pytest_twisted.inlineCallbacks
def test_backup_of_a_running_broker(tmp_path: Path) -> None:
    smqp = free_port()
    data = tmp_path / "data"
    settings = Settings(listeners={"smqp": [f"tcp:{smqp}:interface=127.0.0.1"]}, data_dir=data, event_log=False)
    service = makeService(settings, reactor)
    service.startService()
    store = service.runtime.store
    try:
        yield service.runtime.front_ends["smqp"].started
        seq = yield store.next_seq()
        yield store.publish(_record(seq), [("bob:c1", "ADD")])
        copy = tmp_path / "copy.sqlite3"
        done = yield threads.deferToThread(ctl, "backup", "--data-dir", str(data), str(copy))
        again = yield threads.deferToThread(ctl, "backup", "--data-dir", str(data), str(copy))
        missing = yield threads.deferToThread(ctl, "backup", "--data-dir", str(tmp_path / "nothing"),
                                              str(tmp_path / "x"))
        seq2 = yield store.next_seq()
        yield store.publish(_record(seq2), [])  # the broker goes on writing after the backup
    finally:
        yield service.stopService()
        yield store.close()
    assert done.returncode == 0 and "pages copied" in done.stdout, done.stderr
    with sqlite3.connect(copy) as backup:
        assert backup.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert backup.execute("SELECT seq, data FROM messages").fetchall() == [(seq, b"kept")]
        assert backup.execute("SELECT subscriber FROM deliveries").fetchall() == [("bob:c1",)]
    assert again.returncode == 2 and "already exists" in again.stderr
    assert missing.returncode == 2 and "no such store" in missing.stderr

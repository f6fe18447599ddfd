"""Accounts and access-list entries managed live with brokerd-ctl: an account added through
the admin listener logs in at once over SSMP (``password`` scheme) and SMQP together; a UAL
entry applies to a live session's next publish; a restart keeps both (they are in the files
the broker reads); a removed account is refused at login while another still logs in."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import endpoints, threads
from twisted.internet.protocol import Factory

from brokerd.auth import accounts as accounts_module
from brokerd.auth.accounts import read_accounts
from brokerd.config import Settings
from brokerd.protocols.smqp.client import SMQPClientProtocol, SMQPError
from brokerd.protocols.smqp.client import connect as smqp_connect
from brokerd.tap import makeService
from tests.support.broker import REPO, free_port
from tests.support.live import TIMEOUT, LineProtocol, reactor

pytestmark = pytest.mark.slow


def ctl(admin: int, *args: str, typed: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "brokerd.cli.ctl", "--admin", f"http://127.0.0.1:{admin}", *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO, input=typed)


def accounts_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "brokerd.cli.accounts", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO)


class Broker:
    def __init__(self, tmp_path: Path) -> None:
        self.ports = {name: free_port() for name in ("ssmp", "smqp", "admin")}
        self.settings = Settings(
            listeners={name: [f"tcp:{self.ports[name]}:interface=127.0.0.1"] for name in ("ssmp", "smqp")},
            admin=f"tcp:{self.ports['admin']}:interface=127.0.0.1", data_dir=tmp_path / "data", event_log=False,
            accounts_file=tmp_path / "accounts")
        self.service: Any = None
        self.clients: list[Any] = []

    async def start(self) -> None:
        self.service = makeService(self.settings, reactor())
        self.service.startService()
        await self.service.runtime.front_ends["smqp"].started

    async def stop(self) -> None:
        for client in self.clients:
            if client.transport is not None:
                client.transport.abortConnection()
        self.clients = []
        await self.service.stopService()

    def ctl(self, *args: str, typed: str | None = None) -> Any:
        return threads.deferToThread(ctl, self.ports["admin"], *args, typed=typed)

    async def ssmp(self, line: bytes) -> tuple[LineProtocol, bytes]:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.ports["ssmp"])
        client = await endpoint.connect(Factory.forProtocol(LineProtocol)).addTimeout(TIMEOUT, reactor())
        self.clients.append(client)
        client.send(line)
        await client.lines.count(1).addTimeout(TIMEOUT, reactor())
        return client, client.lines.items[0]

    async def smqp(self, account: str, password: str) -> SMQPClientProtocol:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.ports["smqp"])
        client: SMQPClientProtocol = await smqp_connect(endpoint).addTimeout(TIMEOUT, reactor())
        self.clients.append(client)
        await client.login(account, "c1", password).addTimeout(TIMEOUT, reactor())
        return client


async def mcast(client: LineProtocol, payload: bytes) -> bytes:
    before = len(client.lines.items)
    client.send(b"MCAST news " + payload)
    await client.lines.count(before + 1).addTimeout(TIMEOUT, reactor())
    return client.lines.items[before]


@pytest_twisted.ensureDeferred
async def test_accounts_and_access_entries_managed_live(tmp_path: Path) -> None:
    assert accounts_cli("add", str(tmp_path / "accounts"), "bob", "bobpw").returncode == 0
    broker = Broker(tmp_path)
    await broker.start()
    try:
        added = await broker.ctl("accounts", "add", "alice", typed="alicepw\n")
        assert added.returncode == 0 and added.stdout == "added alice\n", added.stderr
        assert oct(stat.S_IMODE((tmp_path / "accounts").stat().st_mode)) == "0o600"
        ssmp, answer = await broker.ssmp(b"LOGIN alice password alicepw")  # at once, both protocols
        assert answer == b"200"
        smqp = await broker.smqp("alice", "alicepw")
        assert smqp.transport is not None
        listed = await broker.ctl("accounts")
        assert listed.stdout == "alice\nbob\n"
        again = await broker.ctl("accounts", "add", "alice", "other")
        assert again.returncode == 1 and "409" in again.stderr and "exists" in again.stderr
        bad = await broker.ctl("accounts", "add", "9lives", "pw")
        assert bad.returncode == 1 and "400 bad account name" in bad.stderr

        # a UAL entry applies to the live session's next publish
        assert await mcast(ssmp, b"before") == b"200"
        entry = await broker.ctl("ual", "set", "/news", "alice", "s")
        assert entry.returncode == 0 and entry.stdout == "set /news alice s\n", entry.stderr
        refused = await mcast(ssmp, b"after")
        assert refused.startswith(b"4"), refused
        wrong = await broker.ctl("ual", "set", "/news", "alice", "xyz")
        assert wrong.returncode == 1 and "unknown permission" in wrong.stderr
        assert (await broker.ctl("ual")).stdout == "/news\talice\ts\n"
    finally:
        await broker.stop()

    broker = Broker(tmp_path)  # the broker started again on the same files: they kept the changes
    await broker.start()
    try:
        ssmp, answer = await broker.ssmp(b"LOGIN alice password alicepw")
        assert answer == b"200"
        assert (await mcast(ssmp, b"still")).startswith(b"4")  # the entry is kept
        assert (await broker.ctl("ual", "remove", "/news", "alice")).stdout == "removed /news alice\n"
        assert await mcast(ssmp, b"again") == b"200"

        # one principal in every protocol: carol's SMQP session closed --for keeps her SSMP logins out too
        assert (await broker.ctl("accounts", "add", "carol", "carolpw")).returncode == 0
        await broker.smqp("carol", "carolpw")
        listing = (await broker.ctl("sessions")).stdout.splitlines()
        carols = next(line.split("\t")[0] for line in listing
                      if line.split("\t")[1] == "smqp" and "carol" in line.split("\t")[2])
        kept = await broker.ctl("close", carols, "--for", "300")
        assert "account:carol is refused at login for 300 s" in kept.stdout, (kept.stdout, kept.stderr)
        with pytest.raises(SMQPError):
            await broker.smqp("carol", "carolpw")
        _client, answer = await broker.ssmp(b"LOGIN carol password carolpw")
        assert answer.startswith(b"401")
        assert (await broker.smqp("alice", "alicepw")).transport is not None  # positive control

        removed = await broker.ctl("accounts", "remove", "alice")
        assert removed.returncode == 0 and removed.stdout == "removed alice\n"
        _client, answer = await broker.ssmp(b"LOGIN alice password alicepw")
        assert answer.startswith(b"401")
        with pytest.raises(SMQPError):
            await broker.smqp("alice", "alicepw")
        _client, answer = await broker.ssmp(b"LOGIN bob password bobpw")  # positive control
        assert answer == b"200"
        assert (await broker.smqp("bob", "bobpw")).transport is not None
        assert "alice" not in (tmp_path / "accounts").read_text()
    finally:
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_the_accounts_file_is_read_once_for_ssmp_and_smqp(tmp_path: Path, monkeypatch) -> None:
    """SSMP's ``password`` scheme and SMQP's LOGIN check one copy of the accounts file: read
    at start, and once more after it changed, whichever protocol asks first."""
    reads: list[Path] = []

    def counted(path: Path) -> Any:
        reads.append(path)
        return read_accounts(path)

    monkeypatch.setattr(accounts_module, "read_accounts", counted)
    assert accounts_cli("add", str(tmp_path / "accounts"), "bob", "bobpw").returncode == 0
    broker = Broker(tmp_path)
    await broker.start()
    try:
        assert len(reads) == 1  # SMQP's start-up check of the file
        _client, answer = await broker.ssmp(b"LOGIN bob password bobpw")
        assert answer == b"200"
        assert (await broker.smqp("bob", "bobpw")).transport is not None
        assert len(reads) == 1
        assert (await threads.deferToThread(accounts_cli, "add", str(tmp_path / "accounts"), "carol",
                                            "carolpw")).returncode == 0
        _client, answer = await broker.ssmp(b"LOGIN carol password carolpw")  # the change is seen at once
        assert answer == b"200"
        assert (await broker.smqp("carol", "carolpw")).transport is not None
        assert len(reads) == 2
    finally:
        await broker.stop()

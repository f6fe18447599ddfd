"""Password guessing against a real broker, over real sockets: after --login-backoff-after
failed logins from one address (or for one account), the next check waits for the backoff,
in SSMP, MQTT and SMQP alike; meanwhile other clients are checked and answered at once;
once the backoff ends, the right password is accepted.  The backoff's clock is a test clock,
so "waits" is observed as effects (no check made, no answer sent) and ended by advancing it."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import ensureDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import Clock

from brokerd.auth.accounts import AccountsChecker
from brokerd.config import Settings
from brokerd.tap import makeService
from tests.integration.smqp_fixtures import write_test_accounts
from tests.integration.test_mqtt_bad_input import V311, connect_packet
from tests.support.broker import free_port
from tests.support.collect import Collector, eventually
from tests.support.live import reactor

pytestmark = pytest.mark.slow

AFTER = 3
"""--login-backoff-after of these brokers."""
ATTACKER, OWNER, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"


class Broker:
    """An in-process broker with SSMP, MQTT and SMQP listeners and accounts alice and bob."""

    def __init__(self, tmp_path: Path) -> None:
        self.ports = {name: free_port() for name in ("ssmp", "mqtt", "smqp")}
        write_test_accounts(tmp_path / "accounts")
        self.settings = Settings(
            listeners={name: [f"tcp:{port}:interface=127.0.0.1"] for name, port in self.ports.items()},
            data_dir=tmp_path / "data", event_log=False, accounts_file=tmp_path / "accounts",
            login_backoff_after=AFTER, login_backoff=2.0, login_backoff_max=30.0,
            login_timeout=120.0, mqtt_connect_timeout=120.0)  # no real timeout while the test clock stands
        self.service: Any = None
        self.clients: list[Collector] = []
        self.clock = Clock()

    async def start(self) -> None:
        self.service = makeService(self.settings, reactor())
        self.service.startService()
        await self.service.runtime.front_ends["smqp"].started
        self.throttle = self.service.runtime.services.login_throttle
        self.throttle.clock = self.clock

    async def stop(self) -> None:
        for client in self.clients:
            if client.transport is not None:
                client.transport.abortConnection()
        await self.service.stopService()

    async def connect(self, protocol: str, source: str) -> Collector:
        endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", self.ports[protocol], bindAddress=(source, 0))
        client = await connectProtocol(endpoint, Collector())
        self.clients.append(client)
        return client


async def ssmp_login(broker: Broker, account: str, password: str, source: str) -> bool:
    client = await broker.connect("ssmp", source)
    client.transport.write(b"LOGIN %s password %s\n" % (account.encode(), password.encode()))
    await client.until(lambda got: b"\n" in got)
    return bytes(client.received).startswith(b"200")


async def mqtt_login(broker: Broker, account: str, password: str, source: str) -> bool:
    client = await broker.connect("mqtt", source)
    client.transport.write(connect_packet(V311, f"{account}-{source}", username=account,
                                          password=password.encode()))
    await client.until(4)
    return bytes(client.received[:4]) == b"\x20\x02\x00\x00"  # CONNACK, accepted


async def smqp_login(broker: Broker, account: str, password: str, source: str) -> bool:
    client = await broker.connect("smqp", source)
    client.transport.write(b"LOGIN %s:c1 CLEAR/1.0\r\nPASS %s %s\r\n" % (
        account.encode(), account.encode(), password.encode()))
    await client.until(lambda got: b"\n401 " in got or got.count(b"\n200 ") >= 2)  # LOGIN's reply, then PASS's
    return b"\n401 " not in client.received


LOGINS: dict[str, Callable[[Broker, str, str, str], Awaitable[bool]]] = {
    "ssmp": ssmp_login, "mqtt": mqtt_login, "smqp": smqp_login}


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The account names the accounts checkers check passwords of, in order."""
    made: list[str] = []
    check = AccountsChecker._check

    def counted(self: AccountsChecker, username: str, password: str) -> bytes:
        made.append(username)
        return check(self, username, password)

    monkeypatch.setattr(AccountsChecker, "_check", counted)
    return made


@pytest.mark.parametrize("protocol", sorted(LOGINS))
@pytest_twisted.ensureDeferred
async def test_failures_from_one_address_hold_back_its_next_check(tmp_path: Path, checks: list[str],
                                                                  protocol: str) -> None:
    login = LOGINS[protocol]
    broker = Broker(tmp_path)
    await broker.start()
    try:
        for failures in range(1, AFTER + 1):  # checked and answered at once
            assert await login(broker, "alice", "guess", ATTACKER) is False
            assert checks.count("alice") == failures and broker.throttle.waiting == 0
        held = ensureDeferred(login(broker, "alice", "alicepw", ATTACKER))
        await eventually(lambda: broker.throttle.waiting == 1, "the next check to wait")
        assert checks.count("alice") == AFTER and not held.called  # neither checked nor answered
        # Positive control: meanwhile another client is checked and answered at once.
        assert await login(broker, "bob", "bobpw", OTHER) is True
        assert checks.count("bob") == 1 and not held.called
        broker.clock.advance(broker.throttle.backoff)  # the backoff ends
        assert await held is True  # the right password, after the backoff: accepted
        assert checks.count("alice") == AFTER + 1 and broker.throttle.waiting == 0
        assert await login(broker, "alice", "alicepw", ATTACKER) is True  # the success cleared the address
        assert broker.throttle.delayed == 1
    finally:
        await broker.stop()


@pytest_twisted.ensureDeferred
async def test_an_account_backs_off_for_new_addresses_and_not_where_its_owner_logged_in(
        tmp_path: Path, checks: list[str]) -> None:
    broker = Broker(tmp_path)
    await broker.start()
    try:
        assert await mqtt_login(broker, "alice", "alicepw", OWNER) is True  # the owner's usual address
        for failures in range(1, AFTER + 1):  # guesses over SSMP, one address each
            assert await ssmp_login(broker, "alice", "guess", f"127.0.1.{failures}") is False
        # The account backs off for every other address, over every protocol ...
        held = ensureDeferred(smqp_login(broker, "alice", "alicepw", OTHER))
        await eventually(lambda: broker.throttle.waiting == 1, "a check of alice from a new address to wait")
        checked = checks.count("alice")
        # ... but not where the owner logged in before: checked and accepted at once.
        assert await mqtt_login(broker, "alice", "alicepw", OWNER) is True
        assert checks.count("alice") == checked + 1 and not held.called
        broker.clock.advance(broker.throttle.backoff)
        assert await held is True
    finally:
        await broker.stop()

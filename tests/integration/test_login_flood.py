"""A login flood on a real ``twistd brokerd``: password checks (scrypt, tens of milliseconds
each) are queued at most ``--max-auth-queue`` deep; logins past that are refused at once with
SMQP's temporary failure (451), every connection gets an answer, and an innocent client of
every protocol is served afterwards."""
from __future__ import annotations

import pytest

from brokerd.auth.accounts import PasswordHash, write_accounts
from tests.support.broker import start_broker
from tests.support.innocent import ALL_PROTOCOLS, assert_serves_every_protocol, connect

pytestmark = pytest.mark.slow

FLOOD = 30


def test_a_login_flood_is_refused_early_not_queued(tmp_path):
    accounts = tmp_path / "accounts"
    write_accounts(accounts, {"alice": PasswordHash.create("alicepw")})  # the real scrypt cost
    broker = start_broker(
        tmp_path, "--open-login", "--accounts", str(accounts), "--max-auth-queue", "2",
        listeners=ALL_PROTOCOLS,
    )
    flood = [connect(broker.ports["smqp"], "127.0.0.4") for _ in range(FLOOD)]
    try:
        for client in flood:
            assert client.line().startswith(b"SMQP/1.0 Ready.")
        for number, client in enumerate(flood):
            client.send(f"LOGIN alice:c{number} CLEAR/1.0\r\nPASS alice alicepw\r\n".encode())
        answers = []
        for client in flood:  # every login is answered: logged in, or refused for now
            first = client.line()
            if first == b"200 OK\r":  # LOGIN passed; PASSWORD's answer follows
                first = client.line()
                if first.startswith(b"200-"):
                    while not client.line().startswith(b"200 Suid: "):
                        pass
            answers.append(first)
        refused = [a for a in answers if a.startswith(b"451 ")]
        assert refused and all(b"try again later" in a for a in refused), answers
        assert all(a == b"200-OK\r" or a.startswith(b"451 ") for a in answers), answers
        assert b"200-OK\r" in answers
        assert_serves_every_protocol(broker)
    finally:
        for client in flood:
            client.close()
        broker.stop()
    assert "Traceback" not in broker.log()

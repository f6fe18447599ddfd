"""What makes password guessing slow: an unknown account name costs the same scrypt work as a
known one, and the login backoff (brokerd.auth.throttle) on a test clock."""
from __future__ import annotations

from pathlib import Path

import pytest
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.task import Clock

import brokerd.auth.accounts as accounts_module
from brokerd.auth.accounts import AccountsChecker, PasswordHash, UnknownAccount, run_inline, write_accounts
from brokerd.auth.throttle import LoginThrottle, TooManyFailures


@pytest.fixture
def kdf_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int, int]]:
    """(n, r, p, salt length) of every scrypt run."""
    calls: list[tuple[int, int, int, int]] = []
    scrypt = accounts_module._scrypt

    def counted(password: str, salt: bytes, n: int, r: int, p: int, size: int) -> bytes:
        calls.append((n, r, p, len(salt)))
        return scrypt(password, salt, n, r, p, size)

    monkeypatch.setattr(accounts_module, "_scrypt", counted)
    return calls


def _refusal(checker: AccountsChecker, name: str) -> type:
    failure = checker.requestAvatarId(UsernamePassword(name.encode(), b"guess"))
    caught: list[type] = []
    failure.addErrback(lambda f: caught.append(f.type))
    return caught[0]


@pytest.mark.parametrize("n", [2, 1 << 10])
def test_an_unknown_name_costs_the_same_scrypt_work_as_a_known_one(tmp_path: Path, kdf_calls: list, n: int) -> None:
    path = tmp_path / "accounts"
    write_accounts(path, {"alice": PasswordHash.create("alicepw", n=n, r=4)})
    checker = AccountsChecker(path, guest=False, run=run_inline)
    del kdf_calls[:]  # the hash's own making
    assert _refusal(checker, "alice") is UnauthorizedLogin  # known, wrong password
    known = list(kdf_calls)
    assert known == [(n, 4, 1, 16)]
    for name in ("mallory", "no-such-name!"):
        del kdf_calls[:]
        assert _refusal(checker, name) is UnknownAccount
        assert kdf_calls == known  # one scrypt run with the accounts' own parameters


def test_an_empty_accounts_file_uses_the_default_parameters(tmp_path: Path, kdf_calls: list) -> None:
    path = tmp_path / "accounts"
    write_accounts(path, {})
    assert _refusal(AccountsChecker(path, guest=False, run=run_inline), "mallory") is UnknownAccount
    assert kdf_calls == [(accounts_module.SCRYPT_N, accounts_module.SCRYPT_R, accounts_module.SCRYPT_P, 16)]


def _throttle(**options: float) -> tuple[LoginThrottle, Clock]:
    clock = Clock()
    settings = {"after": 3, "backoff": 1.0, "maximum": 8.0, "entries": 100, **options}
    return LoginThrottle(clock, **settings), clock  # type: ignore[arg-type]


def _admitted(throttle: LoginThrottle, address: str | None, account: str | None) -> list:
    fired: list = []
    throttle.admit(address, account).addBoth(fired.append)
    return fired


def test_the_wait_doubles_with_each_failure_up_to_the_maximum() -> None:
    throttle, clock = _throttle()
    waits = []
    for _ in range(8):
        fired = _admitted(throttle, "10.0.0.1", "alice")
        waited = 0.0
        while not fired:
            clock.advance(0.25)
            waited += 0.25
        waits.append(waited)
        throttle.failed("10.0.0.1", "alice")
    assert waits == [0, 0, 0, 1, 2, 4, 8, 8]


def test_parallel_attempts_are_checked_one_after_the_other_and_an_overlong_wait_is_refused() -> None:
    throttle, clock = _throttle(maximum=4.0)
    for _ in range(3):
        throttle.failed("10.0.0.1", None)
    pending = [_admitted(throttle, "10.0.0.1", None) for _ in range(4)]  # waits 1, 2, 3, 4
    refused = _admitted(throttle, "10.0.0.1", None)  # would wait 5 > 4
    assert refused and refused[0].check(TooManyFailures) and throttle.refused == 1
    assert [bool(p) for p in pending] == [False] * 4
    for expected in range(1, 5):
        clock.advance(1.0)
        assert [bool(p) for p in pending] == [True] * expected + [False] * (4 - expected)
    assert _admitted(throttle, "10.0.0.2", None) == [None]  # positive control: another address, at once


def test_failures_are_forgotten_after_a_quiet_maximum_and_a_success_clears_its_address() -> None:
    throttle, clock = _throttle()
    for _ in range(3):
        throttle.failed("10.0.0.1", "alice")
    assert _admitted(throttle, "10.0.0.1", "alice") == []
    clock.advance(1.0 + 8.0)  # past the wait, then quiet for --login-backoff-max
    assert _admitted(throttle, "10.0.0.1", "alice") == [None]
    for _ in range(3):
        throttle.failed("10.0.0.5", None)
    throttle.succeeded("10.0.0.5", "bob")
    assert _admitted(throttle, "10.0.0.5", None) == [None]


def test_an_address_that_logged_in_skips_the_accounts_backoff_but_not_its_own() -> None:
    throttle, clock = _throttle()
    throttle.succeeded("10.0.0.9", "alice")
    for source in ("10.0.1.1", "10.0.1.2", "10.0.1.3"):
        throttle.failed(source, "alice")
    assert _admitted(throttle, "10.0.2.1", "alice") == []  # a new address waits for the account
    assert _admitted(throttle, "10.0.0.9", "alice") == [None]  # the owner's address does not
    for _ in range(3):
        throttle.failed("10.0.0.9", "alice")  # its own failures still count against it
    assert _admitted(throttle, "10.0.0.9", "alice") == []


def test_the_tables_are_bounded() -> None:
    throttle, _clock = _throttle(entries=10)
    for number in range(1000):
        throttle.failed(f"10.0.{number // 256}.{number % 256}", f"user{number}")
        throttle.succeeded(f"10.1.{number // 256}.{number % 256}", f"user{number}")
    assert len(throttle.addresses) == 10 and len(throttle.accounts) == 10 and len(throttle._trusted) == 10

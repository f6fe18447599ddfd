"""The accounts file (format, hashing, atomic locked updates), its twisted.cred checker, and
the ``python -m brokerd.cli.accounts`` command that the conformance kit runs."""
from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.python.failure import Failure

from brokerd.auth.accounts import (
    AccountsChecker,
    PasswordHash,
    UnknownAccount,
    format_accounts,
    is_account_name,
    parse_accounts,
    read_accounts,
    run_inline,
    update_accounts,
    write_accounts,
)
from brokerd.cli import accounts as cli
from brokerd.errors import ConfigurationError
from brokerd.protocols.smqp.codec import is_leaf


def outcome(d):
    seen = []
    d.addBoth(seen.append)
    return seen[0]


def cheap(password: str) -> PasswordHash:
    return PasswordHash.create(password, n=2)


def test_hashes_are_salted_and_verify():
    # "!" is outside the base64 alphabet: the password cannot turn up in salt or digest by chance
    first, second = PasswordHash.create("pw!"), PasswordHash.create("pw!")
    assert first.salt != second.salt and first.digest != second.digest
    assert first.verify("pw!") and not first.verify("pw! ") and not first.verify("")
    assert PasswordHash.decode(first.encode()) == first
    assert "pw!" not in first.encode() and first.n == 1 << 14
    blank = cheap("")
    assert blank.verify("") and not blank.verify("x")


@pytest.mark.parametrize("text", [
    "bcrypt$xx", "scrypt$n=3,r=8,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA",
    "scrypt$n=16384,r=8$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA", "scrypt$n=16384,r=8,p=1$!!$AAAA",
    "scrypt$n=1048576,r=16,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA",
])
def test_bad_hashes(text: str):
    with pytest.raises(ValueError):
        PasswordHash.decode(text)


def test_file_format_and_errors(tmp_path: Path):
    accounts = {"alice": cheap("a"), "guest": cheap("")}
    text = format_accounts(accounts)
    assert parse_accounts(text) == accounts
    assert parse_accounts("# c\n\n  Alice:" + accounts["alice"].encode() + "\n") == {"alice": accounts["alice"]}
    for bad, line in (("nocolon\n", 1), ("\n9x:" + accounts["alice"].encode(), 2),
                      ("a:" + accounts["alice"].encode() + "\nA:" + accounts["alice"].encode(), 2)):
        with pytest.raises(ConfigurationError, match=f"line {line}"):
            parse_accounts(bad)
    with pytest.raises(ConfigurationError, match="no such file"):
        read_accounts(tmp_path / "missing")


def test_account_names_are_topic_names():
    for name in ("alice", "Bob_2", "élodie", "a" * 32):
        assert is_account_name(name) == is_leaf(name) is True
    for name in ("", "2bob", "_x", "a-b", "a b", "a" * 33, "a:b"):
        assert is_account_name(name) == is_leaf(name) is False


def test_writes_are_atomic_and_private(tmp_path: Path):
    path = tmp_path / "accounts"
    write_accounts(path, {"alice": cheap("a")})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    update_accounts(path, lambda accounts: accounts.update(bob=cheap("b")))
    assert sorted(read_accounts(path)) == ["alice", "bob"]
    with pytest.raises(RuntimeError):
        update_accounts(path, lambda accounts: (accounts.clear(), (_ for _ in ()).throw(RuntimeError("x"))))
    assert sorted(read_accounts(path)) == ["alice", "bob"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    os.chmod(path, 0o440)  # the owner's bits survive a change; group and others lose theirs
    update_accounts(path, lambda accounts: accounts.pop("bob"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o400 and sorted(read_accounts(path)) == ["alice"]


def test_checker(tmp_path: Path):
    path = tmp_path / "accounts"
    write_accounts(path, {"alice": cheap("alicepw")})
    checker = AccountsChecker(path, run=run_inline)
    assert outcome(checker.requestAvatarId(UsernamePassword(b"Alice", b"alicepw"))) == b"alice"
    assert outcome(checker.requestAvatarId(UsernamePassword(b"alice", b"no"))).check(UnauthorizedLogin)
    unknown = outcome(checker.requestAvatarId(UsernamePassword(b"carol", b"x")))
    assert unknown.check(UnknownAccount)
    assert outcome(checker.requestAvatarId(UsernamePassword(b"guest", b""))) == b"guest"
    assert outcome(checker.requestAvatarId(UsernamePassword(b"guest", b"x"))).check(UnauthorizedLogin)
    assert outcome(checker.exists("ALICE")) is True and outcome(checker.exists("carol")) is False
    update_accounts(path, lambda accounts: accounts.update(carol=cheap("c"), guest=cheap("g")))
    assert outcome(checker.requestAvatarId(UsernamePassword(b"carol", b"c"))) == b"carol"
    assert outcome(checker.requestAvatarId(UsernamePassword(b"guest", b"g"))) == b"guest"
    outcome(checker.set_password("carol", "new"))
    assert read_accounts(path)["carol"].verify("new")
    assert outcome(checker.set_password("nobody", "x")).check(UnknownAccount)
    no_guest = AccountsChecker(None, guest=False, run=run_inline)
    assert outcome(no_guest.requestAvatarId(UsernamePassword(b"guest", b""))).check(UnknownAccount)


def test_the_cached_accounts_change_under_a_lock(tmp_path: Path, monkeypatch):
    """Pool threads check passwords at once: each reads the file and replaces the cached
    accounts and their stamp under the file's lock, so a slower reader cannot leave old
    accounts cached under a newer file's stamp."""
    from brokerd.auth import accounts as module

    path = tmp_path / "accounts"
    write_accounts(path, {"alice": cheap("alicepw")})
    checker = AccountsChecker(path, run=run_inline)
    held: list[bool] = []

    def read_while_watching(where: Path):
        held.append(checker.file._lock.locked())
        return read_accounts(where)

    with monkeypatch.context() as patch:
        patch.setattr(module, "read_accounts", read_while_watching)
        assert outcome(checker.requestAvatarId(UsernamePassword(b"alice", b"alicepw"))) == b"alice"
    outcome(checker.set_password("alice", "changed"))
    with monkeypatch.context() as patch:
        patch.setattr(module, "read_accounts", read_while_watching)
        assert outcome(checker.requestAvatarId(UsernamePassword(b"alice", b"changed"))) == b"alice"
    assert held == [True, True]


def test_checkers_with_and_without_the_guest_read_the_file_once(tmp_path: Path, monkeypatch):
    from brokerd.auth import accounts as module

    path = tmp_path / "accounts"
    write_accounts(path, {"alice": cheap("alicepw")})
    smqp = AccountsChecker(path, guest=True, run=run_inline)
    ssmp = smqp.with_guest(False)
    assert ICredentialsChecker.providedBy(ssmp) and ssmp.file is smqp.file
    reads: list[Path] = []
    monkeypatch.setattr(module, "read_accounts", lambda where: reads.append(where) or read_accounts(where))
    assert outcome(ssmp.requestAvatarId(UsernamePassword(b"alice", b"alicepw"))) == b"alice"
    assert outcome(smqp.requestAvatarId(UsernamePassword(b"alice", b"alicepw"))) == b"alice"
    assert reads == [path]
    assert outcome(smqp.requestAvatarId(UsernamePassword(b"guest", b""))) == b"guest"  # each its own guest rule
    assert isinstance(outcome(ssmp.requestAvatarId(UsernamePassword(b"guest", b""))), Failure)


def run_cli(*argv: str, stdin: str = "") -> tuple[int, str]:
    out = io.StringIO()
    args = cli.build_parser().parse_args(list(argv))
    try:
        cli.run(args, io.StringIO(stdin), out)
    except cli._Missing:
        return 1, out.getvalue()
    return 0, out.getvalue()


def test_cli_commands(tmp_path: Path):
    path = str(tmp_path / "sub" / "accounts")
    os.makedirs(tmp_path / "sub")
    assert run_cli("add", path, "alice", "alicepw") == (0, "")
    assert run_cli("add", path, "guest", "") == (0, "")
    assert run_cli("add", path, "bob", stdin="from stdin\n") == (0, "")
    assert read_accounts(Path(path))["bob"].verify("from stdin")
    assert read_accounts(Path(path))["guest"].verify("")
    assert run_cli("passwd", path, "alice", "changed")[0] == 0
    assert read_accounts(Path(path))["alice"].verify("changed")
    assert run_cli("passwd", path, "nobody", "x")[0] == 1
    assert run_cli("remove", path, "bob")[0] == 0
    assert run_cli("remove", path, "bob")[0] == 1
    assert run_cli("list", path) == (0, "alice\nguest\n")
    with pytest.raises(ValueError):
        run_cli("add", path, "2bad", "x")


def test_cli_as_the_conformance_kit_runs_it(tmp_path: Path):
    path = tmp_path / "accounts"
    for name, password in (("alice", "alicepw"), ("guest", "")):
        done = subprocess.run([sys.executable, "-m", "brokerd.cli.accounts", "add", str(path), name, password],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert read_accounts(path)["alice"].verify("alicepw")
    assert "alicepw" not in path.read_text()
    done = subprocess.run([sys.executable, "-m", "brokerd.cli.accounts", "add", str(path), "no way", "x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "bad account name" in done.stderr

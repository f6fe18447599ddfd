"""``brokerd-accounts`` (or ``python -m brokerd.cli.accounts``): manage the accounts file of ``--accounts``.

    python -m brokerd.cli.accounts add FILE NAME [PASSWORD]      add or replace (creates FILE)
    python -m brokerd.cli.accounts passwd FILE NAME [PASSWORD]   change an existing password
    python -m brokerd.cli.accounts remove FILE NAME
    python -m brokerd.cli.accounts list FILE

Without PASSWORD the password is asked for twice on a terminal, or read as one line from
standard input otherwise (so it stays out of the process list).  An empty password is allowed
(the SMQP guest account has one).  Exit codes: 0 done; 1 no such account; 2 usage or file
error.  The broker picks a changed file up at the next login.
"""
from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import NoReturn, TextIO

from brokerd import __version__
from brokerd.auth.accounts import (
    PasswordHash,
    check_password,
    normalize_name,
    read_accounts,
    update_accounts,
)
from brokerd.cli.common import EXIT_ERROR
from brokerd.errors import ConfigurationError

PROG = "brokerd-accounts"
EXIT_MISSING = 1


class _Missing(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Manage brokerd's accounts file (salted scrypt password hashes).",
        epilog="Exit codes: 0 ok, 1 no such account, 2 usage or file error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (("add", "Add an account, or replace its password (creates FILE)."),
                       ("passwd", "Change the password of an existing account.")):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("file", type=Path, metavar="FILE")
        sub.add_argument("name", metavar="NAME")
        sub.add_argument("password", nargs="?", metavar="PASSWORD",
                         help="the password ('' for a blank one); asked for when left out")
    sub = commands.add_parser("remove", help="Remove an account.")
    sub.add_argument("file", type=Path, metavar="FILE")
    sub.add_argument("name", metavar="NAME")
    sub = commands.add_parser("list", help="List the account names.")
    sub.add_argument("file", type=Path, metavar="FILE")
    return parser


def read_password(stdin: TextIO) -> str:
    """Ask twice on a terminal; otherwise one line of standard input (its line end removed)."""
    if stdin.isatty():
        first = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != first:
            raise ValueError("the passwords differ")
        return first
    line = stdin.readline()
    return line[:-1] if line.endswith("\n") else line


def run(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> None:
    """Carry out the command; raises ValueError/ConfigurationError/OSError/_Missing."""
    if args.command == "list":
        for name in sorted(read_accounts(args.file)):
            stdout.write(name + "\n")
        return
    name = normalize_name(args.name)
    if args.command == "remove":
        def remove(accounts: dict[str, PasswordHash]) -> None:
            if accounts.pop(name, None) is None:
                raise _Missing(name)

        update_accounts(args.file, remove)
        return
    password = args.password if args.password is not None else read_password(stdin)
    check_password(password)
    new_hash = PasswordHash.create(password)

    def store(accounts: dict[str, PasswordHash]) -> None:
        if args.command == "passwd" and name not in accounts:
            raise _Missing(name)
        accounts[name] = new_hash

    update_accounts(args.file, store, create=args.command == "add")


def main(argv: list[str] | None = None) -> NoReturn:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        run(args, sys.stdin, sys.stdout)
    except _Missing as exc:
        print(f"{PROG}: no account {exc.args[0]!r} in {args.file}", file=sys.stderr)
        raise SystemExit(EXIT_MISSING) from None
    except (ValueError, ConfigurationError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None
    except OSError as exc:
        print(f"{PROG}: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None
    raise SystemExit(0)


if __name__ == "__main__":
    main()

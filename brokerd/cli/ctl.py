"""``brokerd-ctl``: the admin listener's JSON API from the shell, and backups of the store.

    brokerd-ctl --admin http://127.0.0.1:8081 --token-file /etc/brokerd/admin-token status
    brokerd-ctl status [--json] | sessions | topics | close ID [--for SECONDS] | reload | metrics
    brokerd-ctl accounts [add NAME | passwd NAME | remove NAME] | ual [set TOPIC WHO PERMS | remove TOPIC WHO]
    brokerd-ctl backup --data-dir /var/lib/brokerd /backup/smqp-$(date +%F).sqlite3

Talks HTTP with the standard library (a short-lived command needs no reactor).  ``backup``
does not need the admin listener: it copies the SQLite store with SQLite's online backup API,
which reads a consistent snapshot while the broker keeps writing (WAL mode).

Exit codes: 0 done, 1 the broker refused (its answer is printed), 2 usage or connection error.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import ssl
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, TextIO
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from brokerd import __version__
from brokerd.cli.accounts import read_password
from brokerd.cli.common import EXIT_ERROR, CommandError, ConfigAddress
from brokerd.cli.ctlstatus import summary
from brokerd.config import read_first_line
from brokerd.errors import ConfigurationError
from brokerd.jsontypes import JSONValue

PROG = "brokerd-ctl"
DEFAULT_ADMIN = "http://127.0.0.1:8081"
STORE_FILE = "smqp.sqlite3"
EXIT_REFUSED = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Operate a running brokerd through its admin listener.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--admin", metavar="URL", default=os.environ.get("BROKERD_ADMIN", DEFAULT_ADMIN),
                        help=f"the admin listener [$BROKERD_ADMIN or {DEFAULT_ADMIN}]")
    parser.add_argument("--config", metavar="FILE", type=lambda path: ConfigAddress(path, "admin"),
                        help="the broker's config file: use its admin listener (and its admin-token-file)")
    parser.add_argument("--token-file", metavar="FILE", type=Path,
                        default=os.environ.get("BROKERD_ADMIN_TOKEN_FILE"),
                        help="file whose first line is the admin token [$BROKERD_ADMIN_TOKEN_FILE]")
    tls = parser.add_argument_group("https")
    tls.add_argument("--ca", metavar="FILE", help="CA certificates (PEM) to verify the admin listener with")
    tls.add_argument("--cert", metavar="FILE", help="client certificate (PEM) to log in with")
    tls.add_argument("--key", metavar="FILE", help="private key (PEM) of --cert [in the --cert file]")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer [10]")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    status = commands.add_parser("status", help="a short summary of the running broker (--json: every figure)")
    status.add_argument("--json", action="store_true", help="print /api/status as it is (JSON), for scripts")
    status.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between the two readings the rates are measured over [1]")
    commands.add_parser("sessions", help="one line per session: id protocol name source subscriptions")
    commands.add_parser("topics", help="one line per topic: subscribers name")
    close = commands.add_parser(
        "close", help="close a session (its id from 'sessions'); its client may reconnect at once unless --for")
    close.add_argument("id")
    close.add_argument("--for", dest="seconds", type=float, metavar="SECONDS",
                       help="and refuse its identity's logins for SECONDS, in every protocol, on every node")
    accounts = commands.add_parser("accounts", help="list, add, remove accounts or change a password (live)")
    account_commands = accounts.add_subparsers(dest="action", metavar="ACTION")
    for action, text in (("add", "add an account"), ("passwd", "change an account's password")):
        sub = account_commands.add_parser(action, help=text)
        sub.add_argument("name")
        sub.add_argument("password", nargs="?", help="the password ('' for a blank one); asked for when left out")
    account_commands.add_parser("remove", help="remove an account").add_argument("name")
    ual = commands.add_parser("ual", help="list, set or remove access-list entries (live)")
    ual_commands = ual.add_subparsers(dest="action", metavar="ACTION")
    sub = ual_commands.add_parser("set", help="add an entry or replace its permissions")
    sub.add_argument("topic")
    sub.add_argument("who", help="an account name, @accounts or '*'")
    sub.add_argument("permissions", help="letters of psacr, or - for none")
    sub = ual_commands.add_parser("remove", help="remove an entry")
    sub.add_argument("topic")
    sub.add_argument("who")
    commands.add_parser("reload", help="read the SMQP accounts and access lists again")
    commands.add_parser("metrics", help="the Prometheus exposition, as scraped")
    backup = commands.add_parser("backup", help="copy the SMQP store of a running broker (SQLite online backup)")
    backup.add_argument("--data-dir", type=Path, default=Path("brokerd-data"), help="the broker's data dir [./brokerd-data]")
    backup.add_argument("output", type=Path, help="the copy to write (must not exist)")
    return parser


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is None:
        return None
    try:
        return read_first_line(args.token_file, "--token-file").decode("utf-8", "replace")
    except ConfigurationError as exc:
        raise CommandError(EXIT_ERROR, str(exc)) from None


def _context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.admin.startswith("https:"):
        return None
    context = ssl.create_default_context(cafile=args.ca)
    if args.cert:
        context.load_cert_chain(args.cert, args.key)
    return context


def call(args: argparse.Namespace, method: str, path: str, body: JSONValue = None) -> tuple[bytes, str]:
    """One request to the admin API (a POST sends ``body`` as JSON, ``{}`` by default):
    (body, content type), or CommandError."""
    headers = {}
    token = _token(args)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if method in ("POST", "PUT", "DELETE"):
        data = json.dumps({} if body is None else body).encode()
        headers["Content-Type"] = "application/json"
    request = Request(args.admin.rstrip("/") + path, data=data, headers=headers, method=method)
    try:
        with urlopen(request, timeout=args.timeout, context=_context(args)) as response:
            return response.read(), response.headers.get("content-type", "")
    except HTTPError as exc:
        answer = exc.read()
        try:
            message = json.loads(answer)["error"]
        except (ValueError, KeyError, TypeError):
            message = answer.decode("utf-8", "replace").strip()
        raise CommandError(EXIT_REFUSED, f"{exc.code} {message}") from None
    except (URLError, OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CommandError(EXIT_ERROR, f"cannot reach {args.admin}: {reason}") from None


def _json(args: argparse.Namespace, method: str, path: str, body: JSONValue = None) -> Any:  # json.loads's
    answer, _type = call(args, method, path, body)
    return json.loads(answer)


def backup(data_dir: Path, output: Path) -> int:
    """Copy ``DATA_DIR/smqp.sqlite3`` to ``output`` with SQLite's online backup; the pages
    copied."""
    source_path = data_dir / STORE_FILE
    if not source_path.exists():
        raise CommandError(EXIT_ERROR, f"{source_path}: no such store")
    if output.exists():
        raise CommandError(EXIT_ERROR, f"{output}: already exists")
    pages = 0

    def progress(_status: int, _remaining: int, total: int) -> None:
        nonlocal pages
        pages = total

    try:
        source = sqlite3.connect(source_path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            target = sqlite3.connect(output)
            try:
                source.backup(target, progress=progress)
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        output.unlink(missing_ok=True)
        raise CommandError(EXIT_ERROR, f"backup of {source_path} failed: {exc}") from None
    return pages


def manage_accounts(args: argparse.Namespace, out: TextIO) -> None:
    """``accounts [add|passwd|remove]``: the broker's accounts file, through the admin API."""
    if args.action is None:
        listing = _json(args, "GET", "/api/accounts")
        for name in listing["accounts"]:
            out.write(name + "\n")
        return
    body = {"name": args.name}
    if args.action in ("add", "passwd"):
        try:
            body["password"] = args.password if args.password is not None else read_password(sys.stdin)
        except ValueError as exc:
            raise CommandError(EXIT_ERROR, str(exc)) from None
    done = _json(args, "POST", f"/api/accounts/{args.action}", body)
    what = {"add": "added", "passwd": "password changed:", "remove": "removed"}[args.action]
    out.write(f"{what} {done['account']}\n")


def manage_ual(args: argparse.Namespace, out: TextIO) -> None:
    """``ual [set|remove]``: the broker's access list, through the admin API."""
    if args.action is None:
        for entry in _json(args, "GET", "/api/ual")["entries"]:
            out.write(f"{entry['topic']}\t{entry['who']}\t{entry['permissions']}\n")
        return
    body = {"topic": args.topic, "who": args.who}
    if args.action == "set":
        body["permissions"] = args.permissions
    done = _json(args, "POST", f"/api/ual/{args.action}", body)
    if args.action == "set":
        out.write(f"set {done['topic']} {done['who']} {done['permissions']}\n")
    else:
        out.write(f"removed {done['topic']} {done['who']}\n")


def run(args: argparse.Namespace, out: TextIO) -> None:
    command = args.command
    if command == "status" and args.json:
        json.dump(_json(args, "GET", "/api/status"), out, indent=2, sort_keys=True)
        out.write("\n")
    elif command == "status":
        before = _json(args, "GET", "/api/status")
        interval = max(0.0, args.interval)
        if interval:
            time.sleep(interval)  # the second reading, for the rates
            after = _json(args, "GET", "/api/status")
        else:
            after = before
        out.write(summary(before, after, after["uptime_seconds"] - before["uptime_seconds"]))
    elif command == "sessions":
        for s in _json(args, "GET", "/api/sessions")["sessions"]:
            out.write(f"{s['id']}\t{s['protocol']}\t{s['name']}\t{s['source'] or '-'}\t{','.join(s['subscriptions'])}\n")
    elif command == "topics":
        for t in _json(args, "GET", "/api/topics")["topics"]:
            out.write(f"{t['subscribers']}\t{t['name']}\n")
    elif command == "close":
        if args.seconds is not None and not 0 < args.seconds <= 366 * 86400:
            raise CommandError(EXIT_ERROR, "--for: a number of seconds above 0, at most a year and a day")
        body = {} if args.seconds is None else {"for": args.seconds}
        answer = _json(args, "POST", f"/api/sessions/{args.id}/close", body)
        kept = answer.get("kept_out")
        if kept is None:
            out.write(f"closed {answer['closed']}; its client may reconnect at once (--for SECONDS keeps it out)\n")
        else:
            out.write(f"closed {answer['closed']}; {kept['principal']} is refused at login for {kept['seconds']:g} s"
                      " on every node\n")
    elif command == "accounts":
        manage_accounts(args, out)
    elif command == "ual":
        manage_ual(args, out)
    elif command == "reload":
        reloaded = _json(args, "POST", "/api/reload")["reloaded"]
        out.write(f"reloaded: {', '.join(reloaded) or 'nothing to reload'}\n")
    elif command == "metrics":
        out.write(call(args, "GET", "/metrics")[0].decode("utf-8"))
    elif command == "backup":
        pages = backup(args.data_dir, args.output)
        out.write(f"{args.output}: {pages} pages copied\n")


def _apply_config(args: argparse.Namespace, given: list[str]) -> None:
    """``--config``: its admin listener and token file, unless --admin/--token-file (or their
    environment variables) name others."""
    config = args.config
    if config is None:
        return
    if "--admin" not in given and "BROKERD_ADMIN" not in os.environ:
        args.admin = f"{'https' if config.tls else 'http'}://{config.host}:{config.port}"
    if args.token_file is None and config.values.get("admin-token-file"):
        args.token_file = Path(config.values["admin-token-file"])


def main(argv: list[str] | None = None) -> NoReturn:
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(given)
    _apply_config(args, [a.split("=")[0] for a in given])
    try:
        run(args, sys.stdout)
        sys.stdout.flush()
    except CommandError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None
    except BrokenPipeError:
        _reader_gone()
    raise SystemExit(0)


def _reader_gone() -> None:
    """``brokerd-ctl status --json | head``: the reader took what it wanted and left, which
    is no error.  Standard output goes to /dev/null so the flush at exit does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    main()

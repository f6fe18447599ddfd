"""``brokerd-smqp``: SMQP sessions and the topic tree from the shell.

    brokerd-smqp -u alice login                         log in, print the login attributes
    brokerd-smqp -u alice create /stocks -k IBM,STOCKS  CREATE TOPIC (--link /target: virtual)
    brokerd-smqp list /stocks                           LIST TOPIC (as guest by default)
    brokerd-smqp find /stocks/* -k BLUE --depth 4       FIND TOPIC
    brokerd-smqp count topic /stocks/*                  COUNT TOPIC|MESSAGE|SUBSCRIBERS
    brokerd-smqp -u alice rename /old /new | remove /old
    brokerd-smqp -u alice keywords /stocks [KW ...]     GET (or SET) TOPIC KEYWORDS
    brokerd-smqp -u alice delivery /stocks [ALL|ONE|NONE]
    brokerd-smqp -u alice timeout /stocks [SECONDS|INFINITE|DEFAULT]
    brokerd-smqp -u alice passwd                        SET LOGIN PASSWORD (asks twice)
    brokerd-smqp -u alice contact [--set FILE|-]        GET (or SET) LOGIN CONTACT
    brokerd-smqp -u alice channel                       GET LOGIN CHANNEL
    brokerd-smqp -u alice pub /stocks 'IBM 132.5'       PUBLISH MESSAGE (text/plain; -t TYPE, -f FILE)
    brokerd-smqp -u alice sub /stocks -C 10             SUBSCRIBE MESSAGE; print and acknowledge each
    brokerd-smqp -u alice sub /stocks --window 32       ... with up to 32 notifications in flight
    brokerd-smqp -u alice raw 'COUNT TOPIC /' ...       any command lines; prints the replies
    brokerd-smqp --tls --ca ca.pem --cert alice.pem --key alice.key -u alice list /

The password comes from --password-file, else $BROKERD_SMQP_PASSWORD, else a prompt on a
terminal, else it is blank (the guest's).  With --cert the login method is CERT (SMQPS).

Exit codes: 0 done; 1 the server refused a command (the line gives its reply); 2 a usage,
configuration or connection problem, or a subscription the broker closed (the line gives its
421; ``sub --retry`` connects again instead).
"""
from __future__ import annotations

import argparse
import getpass
import os
import secrets
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO

from twisted.internet import defer, task
from twisted.internet.error import ConnectError, ConnectionClosed
from twisted.internet.interfaces import IStreamClientEndpoint

from brokerd import __version__
from brokerd.cli import common
from brokerd.cli.common import EXIT_ERROR, CommandError, Interruption
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.smqp.client import SMQPClientProtocol, SMQPError, client_endpoint, connect
from brokerd.protocols.smqp.codec import format_timeout, parse_topic_timeout
from brokerd.protocols.smqp.events import Notify

PROG = "brokerd-smqp"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7720
"""The broker's default SMQP port (and the try-it broker's); the draft's 720 needs root."""
EXIT_REFUSED = 1
PASSWORD_ENV = "BROKERD_SMQP_PASSWORD"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="SMQP sessions and topics from the shell (brokerd's SMQP client).",
        epilog="Exit codes: 0 ok, 1 the server refused a command, 2 usage or connection error.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    group = parser.add_argument_group("connection")
    common.add_address_options(group, DEFAULT_HOST, DEFAULT_PORT, protocol="smqp")
    group.add_argument("-u", "--user", default="guest", help="account [guest]")
    group.add_argument("-c", "--channel", help="channel [cliXXXX]")
    group.add_argument("--password-file", type=Path, metavar="FILE",
                       help="read the password from the first line of FILE")
    common.add_tls_options(group, tls_help="SMQPS: connect over TLS",
                           ca_help="CA certificates to verify the broker",
                           cert_help="client certificate: CERT login",
                           key_help="the client certificate's key",
                           hostname_help="the name to verify the broker as")
    group.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each reply [10]")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("login", help="log in and print the login attributes")
    sub = commands.add_parser("list", help="LIST TOPIC")
    sub.add_argument("topic", nargs="?", default="/")
    sub = commands.add_parser("create", help="CREATE TOPIC")
    sub.add_argument("topic")
    sub.add_argument("-k", "--keywords", help="comma-separated keywords")
    sub.add_argument("--link", metavar="TARGET", help="make it a virtual topic of TARGET")
    sub = commands.add_parser("remove", help="REMOVE TOPIC (and everything below)")
    sub.add_argument("topic")
    sub = commands.add_parser("rename", help="SET TOPIC NAME")
    sub.add_argument("topic")
    sub.add_argument("new_topic")
    sub = commands.add_parser("keywords", help="GET TOPIC KEYWORDS, or SET them when given")
    sub.add_argument("topic")
    sub.add_argument("keywords", nargs="*")
    sub = commands.add_parser("delivery", help="GET TOPIC DELIVERY, or SET it when given")
    sub.add_argument("topic")
    sub.add_argument("mode", nargs="?", type=str.upper, choices=["ALL", "ONE", "NONE"])
    sub = commands.add_parser("timeout", help="GET TOPIC TIMEOUT, or SET it when given (brokerd's extension)")
    sub.add_argument("topic")
    sub.add_argument("value", nargs="?", type=_timeout_value,
                     help="seconds, HH:MM:SS, DD:HH:MM:SS, INFINITE, or DEFAULT (inherit again)")
    sub = commands.add_parser("find", help="FIND TOPIC")
    sub.add_argument("topic")
    sub.add_argument("-k", "--keywords", help="comma-separated keywords to look for")
    sub.add_argument("--depth", type=int)
    sub = commands.add_parser("count", help="COUNT TOPIC|MESSAGE|SUBSCRIBERS")
    sub.add_argument("resource", type=str.upper, choices=["TOPIC", "MESSAGE", "SUBSCRIBERS"])
    sub.add_argument("topic")
    sub = commands.add_parser("passwd", help="SET LOGIN PASSWORD (asks for the new one twice)")
    sub.add_argument("--new-password-file", type=Path, metavar="FILE")
    sub = commands.add_parser("contact", help="GET LOGIN CONTACT, or SET it with --set")
    sub.add_argument("--set", metavar="FILE", help="contact data to store ('-': standard input)")
    sub.add_argument("--mime", default="text/x-vcard")
    sub.add_argument("--account", help="read another account's contact")
    commands.add_parser("channel", help="GET LOGIN CHANNEL")
    sub = commands.add_parser("pub", help="PUBLISH MESSAGE: one data section; prints the SMUID")
    sub.add_argument("topic", help="a topic, or user[:channel]@domain")
    sub.add_argument("message", nargs="?", help="the data (or -f FILE)")
    sub.add_argument("-f", "--file", type=Path, help="read the data from FILE ('-': standard input)")
    sub.add_argument("-t", "--type", default="text/plain", help="Content-Type [text/plain]")
    sub.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                     help="a header attribute (Priority:3, Timeout:60, Guarantee:NO ...); repeatable")
    sub = commands.add_parser("sub", help="SUBSCRIBE MESSAGE; print each notification and acknowledge it")
    sub.add_argument("topic")
    sub.add_argument("-C", "--count", type=int, help="exit after COUNT messages")
    sub.add_argument("-v", "--verbose", action="store_true", help="print the header attributes too")
    sub.add_argument("--window", type=_window_size, default=1, metavar="N",
                     help="ask for up to N notifications in flight (SET NOTIFY WINDOW, a brokerd "
                          "extension; one at a time when the server refuses) [1]")
    sub.add_argument("--keep", action="store_true",
                     help="keep the (durable) subscription when exiting [UNSUBSCRIBE at exit]")
    common.add_retry_option(sub)
    sub = commands.add_parser("raw", help="send command lines, print each reply")
    sub.add_argument("lines", nargs="+", metavar="LINE")
    return parser


def _window_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if size < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return size


def _timeout_value(text: str) -> str:
    """A SET TOPIC TIMEOUT value, checked before connecting (argparse: exit 2 if bad)."""
    try:
        parse_topic_timeout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _first_line(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(EXIT_ERROR, f"{path}: {exc}") from None
    return text.splitlines()[0] if text else ""


def password_for(args: argparse.Namespace, stdin: TextIO) -> str:
    if args.password_file is not None:
        return _first_line(args.password_file)
    if PASSWORD_ENV in os.environ:
        return os.environ[PASSWORD_ENV]
    if args.user.lower() != "guest" and args.cert is None and stdin.isatty():
        return getpass.getpass(f"Password for {args.user}: ")
    return ""


def endpoint_for(reactor: IBrokerReactor, args: argparse.Namespace) -> IStreamClientEndpoint:
    description = common.endpoint_description(args, DEFAULT_HOST, DEFAULT_PORT)
    return common.build_endpoint(client_endpoint, reactor, description, args, args.tls_hostname or args.host)


def _keywords(text: str | None) -> list[str] | None:
    return None if text is None else [k.strip() for k in text.split(",") if k.strip()]


def where(args: argparse.Namespace) -> str:
    """The endpoint the options name, for the lines that say what failed."""
    return common.endpoint_description(args, DEFAULT_HOST, DEFAULT_PORT)


async def session(reactor: IBrokerReactor, args: argparse.Namespace, stdin: TextIO) -> SMQPClientProtocol:
    """A connected, logged-in client; CommandError otherwise (a refused login is retryable:
    an operator may keep the account out for a while)."""
    endpoint = endpoint_for(reactor, args)
    try:
        d = connect(endpoint)
        d.addTimeout(args.timeout, reactor)
        client = await d
    except (ConnectError, ConnectionClosed, defer.TimeoutError, OSError) as exc:
        raise CommandError(EXIT_ERROR, f"cannot connect to {where(args)}: {exc}", retryable=True) from None
    try:
        if args.cert is not None:
            await client.login_cert(args.user, args.channel)
        else:
            await client.login(args.user, args.channel, password_for(args, stdin))
    except SMQPError as exc:
        client.transport.loseConnection()
        raise CommandError(EXIT_REFUSED, f"{where(args)}: login as {args.user}:{args.channel} refused: "
                           f"{exc.code} {' '.join(exc.lines)}", retryable=True) from None
    return client


async def run_command(client: SMQPClientProtocol, args: argparse.Namespace, stdin: TextIO,
                      out: TextIO) -> None:
    command = args.command
    if command == "login":
        info = client.login_info
        for name in ("topic", "timeout", "time", "suid"):
            out.write(f"{name.capitalize()}: {getattr(info, name)}\n")
    elif command == "list":
        for line in await client.list_topics(args.topic):
            out.write(line + "\n")
    elif command == "create":
        await client.create_topic(args.topic, _keywords(args.keywords), args.link)
    elif command == "remove":
        pending = await client.remove_topic(args.topic)
        out.write(f"{pending} messages pending\n")
    elif command == "rename":
        await client.rename_topic(args.topic, args.new_topic)
    elif command == "keywords":
        if args.keywords:
            await client.set_keywords(args.topic, args.keywords)
        else:
            for keyword in await client.get_keywords(args.topic):
                out.write(keyword + "\n")
    elif command == "delivery":
        if args.mode:
            await client.set_delivery(args.topic, args.mode)
        else:
            out.write(await client.get_delivery(args.topic) + "\n")
    elif command == "timeout":
        if args.value:
            await client.set_timeout(args.topic, args.value)
        else:
            seconds, source = await client.get_timeout(args.topic)
            out.write(f"{format_timeout(seconds)} (from {source})\n")
    elif command == "find":
        for line in await client.find_topics(args.topic, _keywords(args.keywords), args.depth):
            out.write(line + "\n")
    elif command == "count":
        out.write(f"{await client.count(args.resource, args.topic)}\n")
    elif command == "passwd":
        await _passwd(client, args, stdin)
    elif command == "contact":
        await _contact(client, args, stdin, out)
    elif command == "channel":
        out.write(await client.get_channel() + "\n")
    elif command == "pub":
        await _publish(client, args, stdin, out)
    elif command == "sub":
        await _subscribe(client, args, out)
    elif command == "raw":
        for line in args.lines:
            try:
                reply = await client.command(line)
            except SMQPError as exc:
                reply = exc.reply
            for index, text in enumerate(reply.lines):
                sep = " " if index == len(reply.lines) - 1 else "-"
                out.write(f"{reply.code}{sep}{text}\n")


def _headers(values: list[str]) -> list[tuple[str, str]]:
    headers = []
    for value in values:
        name, sep, text = value.partition(":")
        if not sep or not name.strip():
            raise CommandError(EXIT_ERROR, f"--header {value!r}: use NAME:VALUE")
        headers.append((name.strip(), text.strip()))
    return headers


async def _publish(client: SMQPClientProtocol, args: argparse.Namespace, stdin: TextIO, out: TextIO) -> None:
    if (args.message is None) == (args.file is None):
        raise CommandError(EXIT_ERROR, "give the data either as MESSAGE or with -f FILE")
    if args.file is None:
        data = args.message.encode("utf-8")
    elif str(args.file) == "-":
        data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8")
    else:
        try:
            data = args.file.read_bytes()
        except OSError as exc:
            raise CommandError(EXIT_ERROR, f"{args.file}: {exc.strerror}") from None
    headers = _headers(args.header)
    cmuid = f"cli{secrets.token_hex(4)}"
    unacknowledged = any(n.lower() in ("guarantee", "guar") and v.upper() == "NO" for n, v in headers)
    d = client.publish(args.topic, cmuid, [(args.type, data)], headers)
    if unacknowledged:
        # Guarantee: NO publishes get no reply (the draft): nothing to wait for.
        out.write(f"{cmuid} sent without acknowledgement\n")
        return
    reply = await d
    out.write(" ".join(reply.values) + "\n")


async def _subscribe(client: SMQPClientProtocol, args: argparse.Namespace, out: TextIO) -> None:
    """Print and acknowledge notifications; the connection's end, which the queue hears of
    after the notifications before it, is a CommandError giving the server's 421."""
    notifications: defer.DeferredQueue[Notify | BaseException] = defer.DeferredQueue()

    def queue(notify: Notify) -> None:
        notifications.put(notify)

    client.notifyReceived = queue  # type: ignore[method-assign]  # the client's documented hook, set per connection
    client.when_closed().addCallback(notifications.put)
    if args.window > 1:
        window = await client.set_notify_window(args.window)
        if window != args.window:
            sys.stderr.write(f"{PROG}: the server refused a window of {args.window}; one at a time\n")
    await client.subscribe(args.topic)
    received = 0
    last: defer.Deferred | None = None
    try:
        while args.count is None or received < args.count:
            notify = await notifications.get()
            if isinstance(notify, BaseException):
                raise _closed_by_broker(client, args, notify)
            if notify.kind != "MESSAGE" or notify.body is None:
                continue
            received += 1
            _print_message(notify, args.verbose, out)
            if (notify.body.get("Guarantee") or "YES").upper() != "NO":
                if client.notify_window == 1:
                    await client.acknowledge()
                else:  # the server's 310s come in order; the next NOTIFYs do not wait for them
                    last = _chain(last, client.acknowledge())
        if last is not None:
            await last
    finally:
        if not args.keep and client.is_open:
            await client.unsubscribe(args.topic)


def _closed_by_broker(client: SMQPClientProtocol, args: argparse.Namespace, reason: BaseException) -> CommandError:
    reply = client.closing_reply
    why = common.closed_reason(reason) if reply is None else f"{reply.code} {' '.join(reply.lines)}"
    return CommandError(EXIT_ERROR, f"{where(args)}: the broker closed the connection ({why})", retryable=True)


def _chain(previous: defer.Deferred | None, answer: defer.Deferred) -> defer.Deferred:
    """The server's answers in order: a Deferred that fails with the first refusal among
    them and otherwise fires once ``answer`` (the latest) has."""
    if previous is None:
        return answer
    return previous.addCallback(lambda _: answer)


def _print_message(notify: Notify, verbose: bool, out: TextIO) -> None:
    body = notify.body
    assert body is not None  # the caller prints the MESSAGEs that have one
    topic = notify.args[0] if notify.args else "?"
    if verbose:
        for name, value in body.attributes:
            out.write(f"{name}: {value}\n")
    text = next((s.data for s in body.sections if s.content_type.startswith("text/")), None)
    if text is None:
        sizes = ", ".join(f"{s.content_type or '?'} {len(s.data)} bytes" for s in body.sections)
        out.write(f"{topic} [{sizes}]\n")
    else:
        out.write(f"{topic} {text.decode('utf-8', 'replace')}\n")
    out.flush()


async def _passwd(client: SMQPClientProtocol, args: argparse.Namespace, stdin: TextIO) -> None:
    old = password_for(args, stdin)
    if args.new_password_file is not None:
        new = _first_line(args.new_password_file)
    elif stdin.isatty():
        new = getpass.getpass("New password: ")
        if getpass.getpass("Again: ") != new:
            raise CommandError(EXIT_ERROR, "the passwords differ")
    else:
        raise CommandError(EXIT_ERROR, "give the new password with --new-password-file")
    await client.set_password(old, new)


async def _contact(client: SMQPClientProtocol, args: argparse.Namespace, stdin: TextIO, out: TextIO) -> None:
    if args.set is None:
        data = await client.get_contact(args.mime, args.account)
        out.write(data.decode("utf-8", "replace").replace("\r\n", "\n") + "\n")
        return
    if args.set == "-":
        text = stdin.read()
    else:
        try:
            text = Path(args.set).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(EXIT_ERROR, f"{args.set}: {exc}") from None
    try:
        await client.set_contact(args.mime, text.strip("\n").encode("utf-8"))
    except ValueError as exc:
        raise CommandError(EXIT_ERROR, str(exc)) from None


async def run(reactor: IBrokerReactor, args: argparse.Namespace, stdin: TextIO = sys.stdin,
              out: TextIO = sys.stdout) -> None:
    """The chosen command; expected failures leave as SystemExit with their code."""
    interruption = Interruption(reactor)
    if args.channel is None:  # chosen once: a retry logs in as the same session
        args.channel = f"cli{secrets.token_hex(2)}"

    async def attempt() -> None:
        client = None
        try:
            client = await session(reactor, args, stdin)
            await run_command(client, args, stdin, out)
            out.flush()
        finally:
            if client is not None and client.is_open:
                try:
                    await client.quit()
                except Exception:
                    if client.transport is not None:
                        client.transport.loseConnection()

    try:
        await common.with_retries(reactor, args, PROG, interruption, attempt)
    except SMQPError as exc:
        print(f"{PROG}: {exc.code} {' '.join(exc.lines)}", file=sys.stderr)
        raise SystemExit(EXIT_REFUSED) from None
    except CommandError as exc:
        if interruption.stopping:
            return  # Ctrl-C or SIGTERM closed the connection: a subscriber stopped by its user
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None
    except (ConnectionClosed, defer.TimeoutError) as exc:
        if interruption.stopping:
            return
        print(f"{PROG}: connection lost: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``brokerd-smqp`` entry point."""
    args = build_parser().parse_args(argv)
    task.react(lambda reactor: defer.ensureDeferred(run(reactor, args)))
    raise SystemExit(0)


if __name__ == "__main__":
    main()

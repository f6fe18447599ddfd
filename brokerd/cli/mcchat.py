"""``brokerd-mcchat``: subscribe, publish and list topics over MCCHAT from the shell.

    brokerd-mcchat sub news sport -C 10        print 10 messages as "TOPIC <USERNAME> MESSAGE"
    brokerd-mcchat sub ''                       watch topics become active (the discovery topic)
    brokerd-mcchat pub news "hello" -u alice   send one MSG, exit once the server handled it
    brokerd-mcchat pub news -s < lines.txt     send each line of standard input
    brokerd-mcchat topics                      list the active topics, one per line
    brokerd-mcchat --tls --ca ca.pem --cert alice.pem --key alice.key pub news hi

MCCHAT acknowledges nothing, so ``pub`` ends with a TLRQ and waits for its TL: once it is
back, the server has handled every MSG before it.

Exit codes: 0 done; 1 the broker closed the connection before we were done (``sub --retry``
connects again instead); 2 a usage, configuration or connection problem.
"""
from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any, BinaryIO, NoReturn, TypeVar

from twisted.internet import defer, task
from twisted.internet.defer import Deferred

from brokerd import __version__
from brokerd.cli import common
from brokerd.cli.common import EXIT_ERROR, CommandError, Interruption, error_text, uses_tls
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.mcchat.client import MCChatClientProtocol, MCChatError, MessageHandler, client_endpoint, connect
from brokerd.protocols.mcchat.codec import MAX_MESSAGE, MAX_USERNAME, check_string, check_topic

PROG = "brokerd-mcchat"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1502
EXIT_CLOSED = 1
_DEFAULT_FORMAT = "{topic} <{username}> {message}"

_T = TypeVar("_T")


# ---------------------------------------------------------------------------- arguments

def build_parser() -> argparse.ArgumentParser:
    """The command line; connection options go before or after the subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Subscribe, publish and list topics over MCCHAT (brokerd's MCCHAT v1 client).",
        epilog="Exit codes: 0 ok, 1 the broker closed the connection, 2 usage or connection error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_connection_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub = commands.add_parser("sub", help="Subscribe and print the messages that arrive.")
    sub.add_argument("topics", nargs="+", metavar="TOPIC", help="'' is the discovery topic")
    sub.add_argument("-C", "--count", type=int, metavar="COUNT", help="exit after COUNT messages")
    sub.add_argument(
        "--format", metavar="FORMAT",
        help="line format with the fields {topic} {username} {message} [{topic} <{username}> {message}]",
    )
    common.add_retry_option(sub)
    _add_connection_options(sub, suppress=True)

    pub = commands.add_parser("pub", help="Send messages to a topic.")
    pub.add_argument("topic", metavar="TOPIC")
    pub.add_argument("message", nargs="?", metavar="MESSAGE")
    pub.add_argument(
        "-s", "--stdin", action="store_true",
        help="send each line of standard input (read to its end) as a message",
    )
    pub.add_argument(
        "-u", "--username", help="the username shown with the messages [your login name]"
    )
    _add_connection_options(pub, suppress=True)

    topics = commands.add_parser("topics", help="List the active topics.")
    _add_connection_options(topics, suppress=True)
    return parser


def _add_connection_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    group = parser.add_argument_group("connection")
    common.add_address_options(group, DEFAULT_HOST, DEFAULT_PORT, suppress, protocol="mcchat")
    common.add_tls_options(
        group,
        cert_help="client certificate (PEM); a broker may bind your username to it",
        hostname_help="name the broker's certificate must carry [the --host]",
        suppress=suppress,
    )
    group.add_argument(
        "--timeout", type=float, metavar="SECONDS", default=common.option_default(10.0, suppress),
        help="give up when connecting (or, for pub and topics, the answer) takes longer [10]",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see; exits 2 through ``parser.error``."""
    common.check_address(parser, args)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.connect is not None and uses_tls(args) and args.tls_hostname is None:
        parser.error("TLS with --connect needs --tls-hostname")
    topics = args.topics if args.command == "sub" else [args.topic] if args.command == "pub" else []
    for topic in topics:
        try:
            check_topic(os.fsencode(topic))
        except ValueError as exc:
            parser.error(f"topic {topic!r}: {exc}")
    if args.command == "sub":
        if args.count is not None and args.count < 1:
            parser.error("-C/--count must be at least 1")
        if args.format is not None:
            try:
                args.format.format(topic="", username="", message="")
            except (KeyError, IndexError, ValueError) as exc:
                parser.error(f"--format {args.format!r}: {exc}")
    if args.command == "pub":
        if (args.message is not None) == args.stdin:
            parser.error("give exactly one of MESSAGE or -s")
        try:
            check_string("username", username(args), MAX_USERNAME)
        except ValueError as exc:
            parser.error(f"--username: {exc}")


def username(args: argparse.Namespace) -> bytes:
    if args.username is not None:
        return os.fsencode(args.username)
    try:
        return getpass.getuser().encode("utf-8", "replace")
    except Exception:
        return PROG.encode("ascii")


def endpoint_description(args: argparse.Namespace) -> str:
    return common.endpoint_description(args, DEFAULT_HOST, DEFAULT_PORT)


def read_messages(args: argparse.Namespace, stdin: BinaryIO) -> list[bytes]:
    """The messages to send, each checked before connecting, so a bad one is a usage error
    rather than a half-sent batch."""
    if args.stdin:
        messages = stdin.read().splitlines()
    else:
        messages = [os.fsencode(args.message)]
    for number, message in enumerate(messages, 1):
        try:
            check_string("message", message, MAX_MESSAGE)
        except ValueError as exc:
            raise CommandError(EXIT_ERROR, f"message {number}: {exc}") from None
    return messages


# ---------------------------------------------------------------------------- running

async def connected(reactor: IBrokerReactor, args: argparse.Namespace, on_message: MessageHandler | None = None) -> MCChatClientProtocol:
    """The connection once the server's INFO arrived, or CommandError (exit 2)."""
    where = endpoint_description(args)
    endpoint = common.build_endpoint(
        client_endpoint, reactor, where, args, args.tls_hostname or args.host or DEFAULT_HOST
    )
    d = defer.ensureDeferred(connect(endpoint, on_message))
    d.addTimeout(args.timeout, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise CommandError(EXIT_ERROR, f"{where}: no MCCHAT INFO within {args.timeout:g} s", retryable=True) from None
    except MCChatError as exc:
        raise CommandError(EXIT_ERROR, f"{where}: {exc}", retryable=True) from None
    except Exception as exc:
        raise CommandError(EXIT_ERROR, f"cannot connect to {where}: {error_text(exc)}", retryable=True) from None


async def _answer(reactor: IBrokerReactor, args: argparse.Namespace, d: Deferred[_T], what: str) -> _T:
    d.addTimeout(args.timeout, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise CommandError(EXIT_ERROR, f"no answer to {what} within {args.timeout:g} s") from None
    except Exception as exc:
        raise CommandError(EXIT_CLOSED, f"connection lost before the answer to {what} ({error_text(exc)})") from None


class Printer:
    """Turns MSG packets into output lines and counts them towards ``-C``."""

    def __init__(self, out: BinaryIO, template: str, count: int | None) -> None:
        self.out = out
        self.template = template
        self.left = count
        self.done: Deferred = Deferred()

    def message(self, topic: str, username: str, message: str) -> None:
        if self.done.called:
            return
        line = self.template.format(topic=topic, username=username, message=message)
        self.out.write(line.encode("utf-8") + b"\n")
        self.out.flush()
        if self.left is not None:
            self.left -= 1
            if self.left == 0:
                self.done.callback(None)


async def run_sub(reactor: IBrokerReactor, args: argparse.Namespace, out: BinaryIO, interruption: Interruption) -> None:
    printer = Printer(out, args.format or _DEFAULT_FORMAT, args.count)

    async def subscription() -> None:
        protocol = await connected(reactor, args, printer.message)
        try:
            for topic in args.topics:
                protocol.subscribe(os.fsencode(topic))
            closed = protocol.when_closed()
            finished = await defer.DeferredList([printer.done, closed], fireOnOneCallback=True)
            if finished[1] == 1:  # MCCHAT has no word for why: an operator's close, a limit
                raise CommandError(
                    EXIT_CLOSED,
                    f"{endpoint_description(args)}: the broker closed the connection "
                    f"({common.closed_reason(finished[0])})",
                    retryable=True,
                )
        finally:
            await protocol.close()

    await common.with_retries(reactor, args, PROG, interruption, subscription)


async def run_pub(reactor: IBrokerReactor, args: argparse.Namespace, stdin: BinaryIO) -> None:
    messages = read_messages(args, stdin)
    protocol = await connected(reactor, args)
    try:
        topic, name = os.fsencode(args.topic), username(args)
        for message in messages:
            protocol.publish(topic, name, message)
        await _answer(reactor, args, protocol.sync(), "the closing TLRQ")
    finally:
        await protocol.close()


async def run_topics(reactor: IBrokerReactor, args: argparse.Namespace, out: BinaryIO) -> None:
    protocol = await connected(reactor, args)
    try:
        topics = await _answer(reactor, args, protocol.topics(), "TLRQ")
    finally:
        await protocol.close()
    for topic in topics:
        out.write(topic.encode("utf-8") + b"\n")
    out.flush()


async def run(reactor: IBrokerReactor, args: argparse.Namespace) -> None:
    """The chosen command; every expected failure leaves as SystemExit with its code."""
    interruption = Interruption(reactor)
    try:
        if args.command == "sub":
            await run_sub(reactor, args, sys.stdout.buffer, interruption)
        elif args.command == "pub":
            await run_pub(reactor, args, sys.stdin.buffer)
        else:
            await run_topics(reactor, args, sys.stdout.buffer)
    except CommandError as exc:
        if interruption.stopping:
            return
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``brokerd-mcchat`` entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    task.react(lambda reactor: defer.ensureDeferred(run(reactor, args)))
    raise SystemExit(0)


if __name__ == "__main__":
    main()

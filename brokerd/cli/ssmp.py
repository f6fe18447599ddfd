"""``brokerd-ssmp``: publish and subscribe over SSMP from the shell, in the spirit of
mosquitto_pub and mosquitto_sub.

    brokerd-ssmp sub news sport -C 10         print 10 messages as "TOPIC PAYLOAD" lines
    brokerd-ssmp pub news "hello"             MCAST one message, exit after its 200
    brokerd-ssmp ucast bob "hi" / bcast "all"
    brokerd-ssmp --tls --ca ca.pem --cert alice.pem --key alice.key --id alice pub news hi

Exit codes: 0 everything was accepted; 1 the server refused a request (the line says which
and its code); 2 a usage, configuration or connection problem, or a subscription the broker
closed (``--retry`` connects again instead).
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, TypeVar

from brokerd import __version__
from brokerd.cli import common, oneshot
from brokerd.cli.common import EXIT_ERROR, CommandError, Interruption, error_text, start_debug_log
from brokerd.protocols.ssmp.codec import is_id, wire_payload
from brokerd.protocols.ssmp.events import Response

# Twisted and the Twisted client are imported where they are used, not here: 'pub' over plain
# TCP needs neither (brokerd.cli.oneshot), and importing them takes longer than the publish.
if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from brokerd.interfaces import IBrokerReactor
    from brokerd.protocols.ssmp.client import SSMPClient, SSMPClientProtocol, SSMPError

ID_RULE = "1 to 64 letters, digits or .:@/_-+=~"
"""What an SSMP identifier, topic or recipient may be (the usage errors say it)."""

PROG = "brokerd-ssmp"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
EXIT_REFUSED = 1

_CODE_MEANINGS = {
    b"400": "bad request",
    b"401": "unauthorized",
    b"404": "not found",
    b"405": "not allowed",
    b"409": "already subscribed",
    b"413": "too many subscriptions",
    b"501": "not implemented",
}
_DEFAULT_FORMAT = "{topic} {payload}"
_VERBOSE_FORMAT = "{sender} {topic} {payload}"

_T = TypeVar("_T")


# ---------------------------------------------------------------------------- arguments

COMMANDS = {
    "sub": "subscribe and print the messages that arrive",
    "pub": "MCAST messages to a topic",
    "ucast": "send messages to one peer",
    "bcast": "send messages to every peer sharing a topic with us",
}
_SEND_TARGETS = {"pub": ("topic", "TOPIC"), "ucast": ("recipient", "ID"), "bcast": None}


def build_parser() -> argparse.ArgumentParser:
    """The main parser: connection options, then the command and its arguments, which
    :func:`command_parser` reads.  Two stages rather than argparse subparsers, because a
    subparser cannot take options between positionals (``pub news --binary MESSAGE``)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Publish and subscribe over SSMP (brokerd's SSMP 1.1 client).",
        epilog="commands: "
        + "; ".join(f"{name}: {summary}" for name, summary in COMMANDS.items())
        + f". '{PROG} COMMAND --help' describes each. "
        "Exit codes: 0 ok, 1 the server refused a request, 2 usage or connection error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_connection_options(parser, suppress=False)
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=", ".join(COMMANDS))
    rest = parser.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    rest.required = False  # argparse would otherwise name it when COMMAND is missing
    return parser


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one command's arguments (connection options are accepted here too)."""
    parser = argparse.ArgumentParser(
        prog=f"{PROG} [options] {command}",
        description=COMMANDS[command][0].upper() + COMMANDS[command][1:] + ".",
    )
    if command == "sub":
        _add_sub(parser)
    else:
        _add_send(parser, _SEND_TARGETS[command])
    _add_connection_options(parser, suppress=True)
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """Everything on the command line, checked; usage errors exit 2 with argparse's message."""
    args = build_parser().parse_args(argv)
    parser = command_parser(args.command)
    parser.parse_intermixed_args(args.arguments, namespace=args)
    del args.arguments
    check_arguments(parser, args)
    return args


def _add_connection_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """On the main parser with real defaults; on subcommands with SUPPRESS, so that an option
    given before the subcommand is not overwritten by the subcommand's default."""

    def default(value: _T) -> _T | str:
        return common.option_default(value, suppress)

    group = parser.add_argument_group("connection")
    common.add_address_options(group, DEFAULT_HOST, DEFAULT_PORT, suppress, protocol="ssmp")
    group.add_argument(
        "-i", "--id", dest="identifier", metavar="ID", default=default(None),
        help="identifier to log in with [brokerd-ssmp-XXXX]; '.' is anonymous (publish only)",
    )
    group.add_argument(
        "--scheme", default=default(None),
        help="login scheme: open, secret, cert... [cert with --cert, secret with "
        "--secret-file, else open]",
    )
    group.add_argument(
        "--secret-file", type=Path, metavar="FILE", default=default(None),
        help="send the first line of FILE as the login credential",
    )
    common.add_tls_options(
        group,
        cert_help="client certificate (PEM) for 'cert' login",
        hostname_help="name the broker's certificate must carry [the host connected to]",
        suppress=suppress,
    )
    group.add_argument(
        "--timeout", type=float, metavar="SECONDS", default=default(10.0),
        help="give up when connecting and logging in takes longer [10]",
    )
    group.add_argument(
        "-d", "--debug", action="store_true", default=default(False),
        help="log what the client does to stderr",
    )


def _add_sub(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("topics", nargs="+", metavar="TOPIC")
    common.add_retry_option(sub)
    sub.add_argument(
        "--presence", action="store_true",
        help="also print who joins and leaves the topics (TOPIC SUBSCRIBE|UNSUBSCRIBE ID)",
    )
    sub.add_argument(
        "-C", "--count", type=int, metavar="COUNT", help="exit after COUNT messages"
    )
    sub.add_argument(
        "-v", "--verbose", action="store_true", help="print the sender first (SENDER TOPIC PAYLOAD)"
    )
    sub.add_argument(
        "--format", metavar="FORMAT",
        help="line format with the fields {sender} {verb} {topic} {payload} {size} "
        "[{topic} {payload}]",
    )
    sub.add_argument(
        "--binary-hex", action="store_true", help="print binary payloads in hexadecimal"
    )


def _add_send(send: argparse.ArgumentParser, target: tuple[str, str] | None) -> None:
    if target is not None:
        send.add_argument(target[0], metavar=target[1])
    send.add_argument("message", nargs="?", metavar="MESSAGE")
    source = send.add_argument_group("message source (instead of MESSAGE)")
    source.add_argument("-f", "--file", type=Path, metavar="FILE", help="send FILE as one message")
    source.add_argument(
        "-s", "--stdin", action="store_true",
        help="send each line of standard input (read to its end) as a message; "
        "empty lines are skipped",
    )
    send.add_argument("--binary", action="store_true", help="send binary SSMP payloads")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors that argparse cannot see; exits 2 through ``parser.error``."""
    common.check_address(parser, args)
    if args.identifier is not None and not _is_identifier(args.identifier):
        parser.error(f"--id {args.identifier!r}: {ID_RULE}")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if scheme(args) == "secret" and args.secret_file is None:
        parser.error("--scheme secret needs --secret-file")
    if args.command == "sub":
        _check_sub(parser, args)
    else:
        _check_send(parser, args)
    if args.identifier is None:  # chosen once: a retry logs in as the same identity
        args.identifier = f"brokerd-ssmp-{os.urandom(2).hex()}"


def _is_identifier(text: str) -> bool:
    return is_id(os.fsencode(text))


def _check_sub(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for topic in args.topics:
        if not _is_identifier(topic):
            parser.error(f"topic {topic!r}: {ID_RULE}")
    if args.count is not None and args.count < 1:
        parser.error("-C/--count must be at least 1")
    if args.format is not None:
        try:
            args.format.format(sender="", verb="", topic="", payload="", size=0)
        except (KeyError, IndexError, ValueError) as exc:
            parser.error(f"--format {args.format!r}: {exc}")


def _check_send(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    sources = [args.message is not None, args.file is not None, args.stdin]
    if sum(sources) != 1:
        parser.error("give exactly one of MESSAGE, -f FILE or -s")
    for name in ("topic", "recipient"):
        value = getattr(args, name, None)
        if value is not None and not _is_identifier(value):
            parser.error(f"{name} {value!r}: {ID_RULE}")


def scheme(args: argparse.Namespace) -> str:
    """The login scheme: as given, else what the credentials on the command line suggest."""
    if args.scheme is not None:
        return args.scheme
    if args.cert is not None:
        return "cert"
    if args.secret_file is not None:
        return "secret"
    return "open"


def endpoint_description(args: argparse.Namespace) -> str:
    return common.endpoint_description(args, DEFAULT_HOST, DEFAULT_PORT)


def read_secret(path: Path) -> bytes:
    """The secret file's first line, read exactly as the broker reads its own --secret-file."""
    from brokerd.config import read_secret_file
    from brokerd.errors import ConfigurationError

    try:
        return read_secret_file(path)
    except ConfigurationError as exc:
        raise CommandError(EXIT_ERROR, str(exc)) from None


def read_messages(args: argparse.Namespace, stdin: BinaryIO) -> list[bytes]:
    """The messages to send, each checked against SSMP's payload limits before connecting, so
    a bad one is a usage error rather than a half-sent batch."""
    if args.file is not None:
        try:
            messages = [args.file.read_bytes()]
        except OSError as exc:
            raise CommandError(EXIT_ERROR, f"-f {args.file}: {exc.strerror}") from None
    elif args.stdin:
        messages = [line for line in stdin.read().splitlines() if line]
    else:
        messages = [os.fsencode(args.message)]
    for number, message in enumerate(messages, 1):
        try:
            wire_payload(message, args.binary)
        except ValueError as exc:
            raise CommandError(EXIT_ERROR, f"message {number}: {exc}") from None
    return messages


# ---------------------------------------------------------------------------- connecting

def make_client(reactor: IBrokerReactor, args: argparse.Namespace, **handlers: Any) -> SSMPClient:
    """An SSMPClient for the connection options; CommandError for unusable ones."""
    from brokerd.protocols.ssmp.client import SSMPClient, client_endpoint

    endpoint = common.build_endpoint(
        client_endpoint, reactor, endpoint_description(args), args, args.tls_hostname or args.host
    )
    identifier = args.identifier
    credential = read_secret(args.secret_file) if args.secret_file is not None else None
    return SSMPClient(
        endpoint,
        os.fsencode(identifier),
        os.fsencode(scheme(args)),
        credential,
        reactor=reactor,
        **handlers,
    )


async def connected(
    reactor: IBrokerReactor, client: SSMPClient, args: argparse.Namespace
) -> SSMPClientProtocol:
    """The logged-in connection, or CommandError: 1 for a refused login, 2 for the rest.  One
    attempt only: a command line tool should say what is wrong, not retry quietly."""
    from twisted.internet import defer
    from twisted.internet.error import ConnectionDone, ConnectionLost

    from brokerd.protocols.ssmp.client import SSMPError

    where = endpoint_description(args)
    d = client.whenConnected(failAfterFailures=1)
    d.addTimeout(args.timeout, reactor)
    try:
        return await d
    except SSMPError as exc:
        raise CommandError(EXIT_REFUSED, f"{where}: {_login_refused(exc, client)}", retryable=True) from None
    except (ConnectionDone, ConnectionLost):
        raise CommandError(
            EXIT_ERROR, f"{where}: the broker closed the connection without answering the login",
            retryable=True,
        ) from None
    except defer.TimeoutError:
        raise CommandError(
            EXIT_ERROR, f"{where}: no login answer within {args.timeout:g} s", retryable=True
        ) from None
    except Exception as exc:
        raise CommandError(
            EXIT_ERROR, f"cannot connect to {where}: {error_text(exc)}", retryable=True
        ) from None


def _login_refused(error: SSMPError, client: SSMPClient) -> str:
    return _login_refused_line(error.code, error.content, client.identifier, client.scheme)


def _login_refused_line(code: bytes, content: bytes | None, identifier: bytes, scheme: bytes) -> str:
    who = identifier.decode("utf-8", "replace")
    how = scheme.decode("ascii", "replace")
    line = f"login as {who} with scheme {how} refused: {_describe(code)}"
    if code == b"401":
        accepted = (content or b"").decode("utf-8", "replace")
        line += f" (the broker accepts: {accepted or 'no scheme'})"
        if how in accepted.split():
            line += f"; the operator may keep {who} out for a while"
    return line


def _describe(code: bytes) -> str:
    meaning = _CODE_MEANINGS.get(code, "refused")
    return f"{code.decode('ascii', 'replace')} {meaning}"


# ---------------------------------------------------------------------------- commands

class Printer:
    """Turns events into output lines and counts messages towards ``-C``."""

    def __init__(self, out: BinaryIO, template: str, count: int | None, binary_hex: bool) -> None:
        self.out = out
        self.template = template
        self.left = count
        self.binary_hex = binary_hex
        from twisted.internet.defer import Deferred

        self.done: Deferred = Deferred()
        """Fires once ``count`` messages were printed (never without a count)."""

    def message(
        self, sender: bytes, verb: bytes, target: bytes | None, content: bytes, binary: bool
    ) -> None:
        """For UCAST the topic column shows the recipient (us); for BCAST it shows ``*``."""
        if self.done.called:
            return
        payload = content.hex() if binary and self.binary_hex else _text(content)
        line = self.template.format(
            sender=_text(sender),
            verb=_text(verb),
            topic=_text(target) if target is not None else "*",
            payload=payload,
            size=len(content),
        )
        self._write(line)
        if self.left is not None and not self.done.called:
            self.left -= 1
            if self.left == 0:
                self.done.callback(None)

    def presence(self, sender: bytes, verb: bytes, topic: bytes, presence: bool) -> None:
        if not self.done.called:
            self._write(f"{_text(topic)} {_text(verb)} {_text(sender)}")

    def _write(self, line: str) -> None:
        try:
            self.out.write(line.encode("utf-8", "surrogateescape") + b"\n")
            self.out.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        """``sub ... | head -1``: the reader left, so stop as mosquitto_sub does, quietly.
        Standard output goes to /dev/null so the flush at exit does not complain either."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.out.fileno())
        os.close(devnull)
        if not self.done.called:
            self.done.callback(None)


def _text(data: bytes) -> str:
    """Bytes as str such that encoding back with surrogateescape gives the same bytes."""
    return data.decode("utf-8", "surrogateescape")


async def run_sub(reactor: IBrokerReactor, args: argparse.Namespace, out: BinaryIO, interruption: Interruption) -> None:
    template = args.format or (_VERBOSE_FORMAT if args.verbose else _DEFAULT_FORMAT)
    printer = Printer(out, template, args.count, args.binary_hex)
    handlers: dict[str, Callable[..., object]] = {"on_message": printer.message}
    if args.presence:
        handlers["on_presence"] = printer.presence

    async def subscription() -> None:
        client = make_client(reactor, args, **handlers)
        client.startService()
        try:
            protocol = await connected(reactor, client, args)
            await _settle(
                [
                    (f"SUBSCRIBE {topic}", client.subscribe(os.fsencode(topic), args.presence))
                    for topic in args.topics
                ]
            )
            from twisted.logger import Logger

            Logger().info("Subscribed to {topics}", topics=" ".join(args.topics))
            await _until_done_or_closed(printer, protocol, args)
        finally:
            await client.stopService()

    await common.with_retries(reactor, args, PROG, interruption, subscription)


async def _until_done_or_closed(printer: Printer, protocol: SSMPClientProtocol, args: argparse.Namespace) -> None:
    """Wait for the count of messages; a connection the broker ends first is a CommandError.
    SSMP says no reason when it closes: an operator's ``brokerd-ctl close``, or a newer login
    as the same identifier, the two causes the line names."""
    from twisted.internet import defer

    finished = await defer.DeferredList([printer.done, protocol.when_closed()], fireOnOneCallback=True)
    if finished[1] == 1:
        raise CommandError(
            EXIT_ERROR,
            f"{endpoint_description(args)}: the broker closed the connection ({common.closed_reason(finished[0])}: "
            f"closed by the operator, or {args.identifier} logged in elsewhere)",
            retryable=True,
        )


async def run_send(
    reactor: IBrokerReactor, args: argparse.Namespace, stdin: BinaryIO
) -> None:
    """pub, ucast and bcast: send every message at once (SSMP answers in order), then wait
    for all the answers, so the exit status covers each message."""
    messages = read_messages(args, stdin)
    client = make_client(reactor, args)
    client.startService()
    try:
        protocol = await connected(reactor, client, args)
        await _settle([_send(protocol, args, message) for message in messages])
    finally:
        await client.stopService()


def _send(
    protocol: SSMPClientProtocol, args: argparse.Namespace, message: bytes
) -> tuple[str, Deferred]:
    """The request for one message, and how to name it in an error line."""
    if args.command == "pub":
        return (
            f"MCAST to {args.topic}",
            protocol.mcast(os.fsencode(args.topic), message, args.binary),
        )
    if args.command == "ucast":
        return (
            f"UCAST to {args.recipient}",
            protocol.ucast(os.fsencode(args.recipient), message, args.binary),
        )
    return "BCAST", protocol.bcast(message, args.binary)


async def _settle(requests: list[tuple[str, Deferred]]) -> None:
    """Wait for every answer; then raise CommandError for the first refusal (exit 1) or, when
    none was refused, for a lost connection (exit 2)."""
    from brokerd.protocols.ssmp.client import SSMPError

    refused: str | None = None
    lost: str | None = None
    for what, d in requests:
        try:
            await d
        except SSMPError as exc:
            refused = refused or f"{what} refused: {_describe(exc.code)}"
        except Exception as exc:
            lost = lost or f"{what}: connection lost before the answer ({error_text(exc)})"
    if refused is not None:
        raise CommandError(EXIT_REFUSED, refused)
    if lost is not None:
        raise CommandError(EXIT_ERROR, lost)


async def run(reactor: IBrokerReactor, args: argparse.Namespace) -> None:
    """The chosen command; every expected failure leaves as SystemExit with its code."""
    interruption = Interruption(reactor)
    try:
        if args.command == "sub":
            await run_sub(reactor, args, sys.stdout.buffer, interruption)
        else:
            await run_send(reactor, args, sys.stdin.buffer)
    except CommandError as exc:
        if interruption.stopping:
            return  # Ctrl-C or SIGTERM closed the connection: a subscriber stopped by its user
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None


def send_at_once(args: argparse.Namespace, stdin: BinaryIO) -> bool:
    """pub, ucast and bcast over plain TCP without Twisted (brokerd.cli.oneshot): the same
    requests, lines and exit statuses as :func:`run_send`.  False when the options need the
    Twisted client (TLS, another endpoint, --debug)."""
    address = oneshot.plain_address(endpoint_description(args), args)
    if address is None:
        return False
    messages = read_messages(args, stdin)
    identifier, how = os.fsencode(args.identifier), os.fsencode(scheme(args))
    login = [identifier, how]
    if args.secret_file is not None:
        login.append(wire_payload(read_secret(args.secret_file)))

    def refused(what: str, answer: Response) -> CommandError:
        if what == "LOGIN":
            line = _login_refused_line(answer.code, _content(answer.payload), identifier, how)
            return CommandError(EXIT_REFUSED, f"{endpoint_description(args)}: {line}", retryable=True)
        return CommandError(EXIT_REFUSED, f"{what} refused: {_describe(answer.code)}")

    requests = [oneshot.cast_line(args.command, args, message) for message in messages]
    oneshot.ssmp_send(address, endpoint_description(args), login, requests, args.timeout, refused)
    return True


def _content(payload: bytes | None) -> bytes | None:
    from brokerd.protocols.ssmp.codec import payload_content

    return None if payload is None else payload_content(payload)[0]


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``brokerd-ssmp`` entry point."""
    args = parse_arguments(argv)
    if args.command != "sub":
        try:
            if send_at_once(args, sys.stdin.buffer):
                raise SystemExit(0)
        except CommandError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            raise SystemExit(exc.code) from None
    if args.debug:
        start_debug_log()
    from twisted.internet import defer, task

    task.react(lambda reactor: defer.ensureDeferred(run(reactor, args)))
    raise SystemExit(0)  # react never returns; this keeps the NoReturn promise for type checkers


if __name__ == "__main__":
    main()

"""``brokerd-mqtt``: publish and subscribe over MQTT 3.1.1 or 5.0 from the shell, in the spirit
of mosquitto_pub and mosquitto_sub.

    brokerd-mqtt sub 'sensors/#' --count 10      print 10 messages as "TOPIC PAYLOAD" lines
    brokerd-mqtt pub sensors/1 21.5 --qos 1      publish, exit once the server acknowledged it
    brokerd-mqtt --mqtt-version 5 --server tcp:broker.example:1883 pub news hi --retain
    brokerd-mqtt --username alice --password-file pw.txt sub news

``pub`` exits once the message's flow is complete (written at QoS 0, PUBACK at QoS 1, PUBCOMP at
QoS 2).  ``sub`` prints each message as one line, the payload decoded as UTF-8 (undecodable
bytes replaced), flushed at once; it exits after ``--count`` messages, else when interrupted
(Ctrl-C, SIGTERM) or, when standard input is a terminal or a pipe, at its end (Ctrl-D).

Exit codes: 0 done; 1 the command failed (the server could not be reached, refused the
connection or a subscription, failed a message, or closed the connection); 2 a usage or
configuration problem.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, TypeVar

from brokerd import __version__
from brokerd.cli import common, oneshot
from brokerd.cli.common import (
    EXIT_ERROR,
    CommandError,
    Interruption,
    error_text,
    start_debug_log,
)
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311, Publish
from brokerd.protocols.mqtt.reasons import describe_reason
from brokerd.protocols.mqtt.topics import topic_filter_problem, topic_name_problem

# Twisted and the Twisted client are imported where they are used: 'pub' at QoS 0 over plain
# TCP needs neither (brokerd.cli.oneshot), and importing them takes longer than the publish.
if TYPE_CHECKING:
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    from brokerd.interfaces import IBrokerReactor
    from brokerd.protocols.mqtt.client import MessageHandler, MQTTClientProtocol

_T = TypeVar("_T")
PROG = "brokerd-mqtt"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1883
EXIT_FAILED = 1
VERSIONS = {"3.1.1": MQTT_311, "5": MQTT_5}


# ---------------------------------------------------------------------------- arguments

def build_parser() -> argparse.ArgumentParser:
    """The command line; connection options go before or after the subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Publish and subscribe over MQTT 3.1.1 or 5.0 (brokerd's MQTT client).",
        epilog="Exit codes: 0 ok, 1 the command failed (connection, refusal), 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_connection_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pub = commands.add_parser("pub", help="Publish one message.")
    pub.add_argument("topic", metavar="TOPIC")
    pub.add_argument("message", metavar="MESSAGE")
    pub.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0, help="QoS [0]")
    pub.add_argument("-r", "--retain", action="store_true", help="ask the server to retain it")
    _add_connection_options(pub, suppress=True)

    sub = commands.add_parser("sub", help="Subscribe and print the messages that arrive.")
    sub.add_argument("filters", nargs="+", metavar="FILTER", help="topic filter (+ and # wildcards)")
    sub.add_argument(
        "-q", "--qos", type=int, choices=(0, 1, 2), default=0, help="maximum QoS to receive at [0]"
    )
    sub.add_argument("-C", "--count", type=int, metavar="N", help="exit after N messages")
    common.add_retry_option(sub)
    _add_connection_options(sub, suppress=True)
    return parser


def _add_connection_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """On the main parser with real defaults; on subcommands with SUPPRESS (see
    :func:`common.option_default`)."""

    def default(value: _T) -> _T | str:
        return common.option_default(value, suppress)

    group = parser.add_argument_group("connection")
    group.add_argument(
        "--server", dest="connect", metavar="ENDPOINT", default=default(None),
        help=f"Twisted client endpoint string [tcp:{DEFAULT_HOST}:{DEFAULT_PORT}] (as --connect)",
    )
    common.add_address_options(group, DEFAULT_HOST, DEFAULT_PORT, suppress)
    group.add_argument(
        "-V", "--mqtt-version", choices=VERSIONS, default=default("3.1.1"),
        help="protocol version [3.1.1]",
    )
    group.add_argument(
        "-i", "--client-id", metavar="ID", default=default(None),
        help="client identifier [brokerd-mqtt-XXXXXXXX]",
    )
    group.add_argument("-u", "--username", metavar="NAME", default=default(None), help="user name")
    group.add_argument(
        "--password-file", type=Path, metavar="FILE", default=default(None),
        help="send the first line of FILE as the password",
    )
    group.add_argument(
        "-k", "--keep-alive", type=int, metavar="SECONDS", default=default(60),
        help="Keep Alive: PINGREQ when idle, 0 for never [60]",
    )
    common.add_tls_options(
        group,
        cert_help="client certificate (PEM) to present",
        hostname_help="name the server's certificate must carry [the host connected to]",
        suppress=suppress,
    )
    group.add_argument(
        "--timeout", type=float, metavar="SECONDS", default=default(10.0),
        help="give up when connecting (or, for pub, the message's flow; for sub, the SUBACK) "
        "takes longer [10]",
    )
    group.add_argument(
        "-d", "--debug", action="store_true", default=default(False),
        help="log what the client does to stderr",
    )


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """Everything on the command line, checked; usage errors exit 2 with argparse's message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see; exits 2 through ``parser.error``.  Topics and filters
    are checked here so that a bad one never costs a connection."""
    common.check_address(parser, args)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if not 0 <= args.keep_alive <= 65_535:
        parser.error("--keep-alive is 0-65535 seconds")
    if args.connect is not None and common.uses_tls(args) and args.tls_hostname is None:
        parser.error("TLS with --server/--connect needs --tls-hostname")
    if args.password_file is not None and args.username is None and args.mqtt_version == "3.1.1":
        parser.error("MQTT 3.1.1 sends a password only with a user name (--username)")
    if args.command == "pub":
        problem = topic_name_problem(args.topic)
        if problem is not None:
            parser.error(f"topic {args.topic!r}: {problem}")
    else:
        for topic_filter in args.filters:
            problem = topic_filter_problem(topic_filter)
            if problem is not None:
                parser.error(f"filter {topic_filter!r}: {problem}")
        if args.count is not None and args.count < 1:
            parser.error("-C/--count must be at least 1")


def endpoint_description(args: argparse.Namespace) -> str:
    return common.endpoint_description(args, DEFAULT_HOST, DEFAULT_PORT)


def read_password(path: Path) -> bytes:
    """The password file's first line, stripped, as the broker's own secret files are read."""
    from brokerd.config import read_first_line
    from brokerd.errors import ConfigurationError

    try:
        return read_first_line(path, "--password-file")
    except ConfigurationError as exc:
        raise CommandError(EXIT_ERROR, str(exc)) from None


# ---------------------------------------------------------------------------- connecting

async def connected(reactor: IBrokerReactor, args: argparse.Namespace, on_message: MessageHandler | None = None) -> MQTTClientProtocol:
    """The connection once the CONNACK accepted it, or CommandError (exit 1)."""
    from twisted.internet import defer

    from brokerd.protocols.mqtt.client import MQTTConnectError, MQTTError, client_endpoint, connect

    where = endpoint_description(args)
    endpoint = common.build_endpoint(client_endpoint, reactor, where, args, args.tls_hostname or args.host)
    password = read_password(args.password_file) if args.password_file is not None else None
    d = connect(
        reactor,
        endpoint,
        client_id=client_id(args),
        version=VERSIONS[args.mqtt_version],
        keep_alive=args.keep_alive,
        username=args.username,
        password=password,
        on_message=on_message,
    )
    d.addTimeout(args.timeout, reactor)
    try:
        return await d
    except MQTTConnectError as exc:
        raise CommandError(EXIT_FAILED, f"{where}: {exc}", retryable=True) from None
    except defer.TimeoutError:
        raise CommandError(EXIT_FAILED, f"{where}: no CONNACK within {args.timeout:g} s", retryable=True) from None
    except MQTTError as exc:
        raise CommandError(EXIT_FAILED, f"{where}: {exc}", retryable=True) from None
    except Exception as exc:  # noqa: BLE001 - whatever stopped the connection is one error line
        raise CommandError(EXIT_FAILED, f"cannot connect to {where}: {error_text(exc)}", retryable=True) from None


async def _answer(reactor: IBrokerReactor, args: argparse.Namespace, d: Deferred[_T], what: str) -> _T:
    """What ``d`` fires with, or CommandError (exit 1) naming ``what`` it waited for."""
    from twisted.internet import defer

    from brokerd.protocols.mqtt.client import MQTTError

    d.addTimeout(args.timeout, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise CommandError(EXIT_FAILED, f"no answer to {what} within {args.timeout:g} s") from None
    except MQTTError as exc:
        raise CommandError(EXIT_FAILED, f"{what}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a lost connection is one error line
        raise CommandError(EXIT_FAILED, f"connection lost before the answer to {what} ({error_text(exc)})") from None


# ---------------------------------------------------------------------------- commands

class Printer:
    """Turns messages into ``TOPIC PAYLOAD`` lines and counts them towards ``--count``."""

    def __init__(self, out: BinaryIO, count: int | None) -> None:
        self.out = out
        self.left = count
        from twisted.internet.defer import Deferred

        self.done: Deferred = Deferred()
        """Fires once ``count`` messages were printed, or the reader of our output left."""

    def message(self, packet: Publish) -> None:
        if self.done.called:
            return
        line = f"{packet.topic} {packet.payload.decode('utf-8', 'replace')}\n"
        try:
            self.out.write(line.encode("utf-8", "surrogateescape"))
            self.out.flush()
        except BrokenPipeError:
            self._reader_gone()
            return
        if self.left is not None:
            self.left -= 1
            if self.left == 0:
                self.done.callback(None)

    def _reader_gone(self) -> None:
        """``sub ... | head -1``: the reader left, so stop quietly, as mosquitto_sub does;
        standard output goes to /dev/null so the flush at exit does not complain either."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.out.fileno())
        os.close(devnull)
        if not self.done.called:
            self.done.callback(None)


def watch_end_of_input(ended: Deferred[None]) -> None:
    """Fire ``ended`` at the end of standard input when it is a terminal or a pipe: the way
    to stop ``sub`` from a script (close its input) or a terminal (Ctrl-D).  /dev/null and files
    are left alone, so ``sub < /dev/null &`` runs until stopped, as a daemonised one must."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return
    if not (os.isatty(0) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return
    from twisted.internet import stdio
    from twisted.internet.protocol import Protocol

    class EndOfInput(Protocol):
        """Fires ``ended`` when standard input reaches its end (Ctrl-D on a terminal)."""

        def dataReceived(self, data: bytes) -> None:
            """What is typed is not for us."""

        def connectionLost(self, reason: Failure | None = None) -> None:
            if not ended.called:
                ended.callback(None)

    stdio.StandardIO(EndOfInput(), stdin=0, stdout=os.open(os.devnull, os.O_WRONLY))  # type: ignore[call-arg]  # mypy reads Twisted's Windows StandardIO


async def run_pub(reactor: IBrokerReactor, args: argparse.Namespace) -> None:
    protocol = await connected(reactor, args)
    try:
        what = f"PUBLISH to {args.topic} at QoS {args.qos}"
        try:
            d = protocol.publish(args.topic, os.fsencode(args.message), args.qos, args.retain)
        except ValueError as exc:
            raise CommandError(EXIT_ERROR, f"{what}: {exc}") from None
        await _answer(reactor, args, d, what)
        from twisted.logger import Logger

        Logger().info("Published to {topic}", topic=args.topic)
    finally:
        await protocol.disconnect()


async def run_sub(reactor: IBrokerReactor, args: argparse.Namespace, out: BinaryIO, interruption: Interruption) -> None:
    from twisted.internet import defer

    printer = Printer(out, args.count)
    args.client_id = client_id(args)  # chosen once: a retry connects as the same client
    end_of_input: defer.Deferred = defer.Deferred()
    watch_end_of_input(end_of_input)

    async def subscription() -> None:
        protocol = await connected(reactor, args, printer.message)
        # Ctrl-C or SIGTERM: say DISCONNECT first, so the server ends the session cleanly.
        trigger = reactor.addSystemEventTrigger("before", "shutdown", protocol.disconnect)
        try:
            await _subscribe(reactor, args, protocol)
            closed = protocol.when_closed()
            finished = await defer.DeferredList(
                [printer.done, end_of_input, closed], fireOnOneCallback=True, consumeErrors=True
            )
            if finished[1] == 2:  # v5 says why (Administrative action, Session taken over); 3.1.1 cannot
                raise CommandError(
                    EXIT_FAILED,
                    f"{endpoint_description(args)}: the broker closed the connection "
                    f"({common.closed_reason(finished[0])})",
                    retryable=True,
                )
        finally:
            reactor.removeSystemEventTrigger(trigger)
            await protocol.disconnect()

    await common.with_retries(reactor, args, PROG, interruption, subscription)


async def _subscribe(reactor: IBrokerReactor, args: argparse.Namespace, protocol: MQTTClientProtocol) -> None:
    """SUBSCRIBE to every filter; CommandError for a refused one."""
    suback = await _answer(
        reactor, args, protocol.subscribe([(topic_filter, args.qos) for topic_filter in args.filters]),
        "SUBSCRIBE",
    )
    for topic_filter, code in zip(args.filters, suback.reason_codes, strict=False):
        if code >= 0x80:
            raise CommandError(EXIT_FAILED, f"subscription to {topic_filter} refused: {describe_reason(code)}")
    from twisted.logger import Logger

    Logger().info("Subscribed to {filters}", filters=" ".join(args.filters))


async def run(reactor: IBrokerReactor, args: argparse.Namespace) -> None:
    """The chosen command; every expected failure leaves as SystemExit with its code and one
    line on stderr."""
    interruption = Interruption(reactor)
    try:
        if args.command == "sub":
            await run_sub(reactor, args, sys.stdout.buffer, interruption)
        else:
            await run_pub(reactor, args)
    except CommandError as exc:
        if interruption.stopping:
            return
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None


def client_id(args: argparse.Namespace) -> str:
    """``--client-id``, else a random ``brokerd-mqtt-XXXXXXXX``."""
    return args.client_id if args.client_id is not None else f"{PROG}-{os.urandom(4).hex()}"


def publish_at_once(args: argparse.Namespace) -> bool:
    """``pub`` at QoS 0 over plain TCP without Twisted (brokerd.cli.oneshot): CONNECT, the
    PUBLISH and DISCONNECT, with the lines and exit statuses of :func:`run_pub`.  False when
    the options need the Twisted client (QoS 1 and 2, TLS, another endpoint, --debug)."""
    where = endpoint_description(args)
    address = oneshot.plain_address(where, args)
    if address is None or args.qos != 0:
        return False
    password = read_password(args.password_file) if args.password_file is not None else None
    oneshot.mqtt_publish(address, where, VERSIONS[args.mqtt_version], client_id(args), args.keep_alive,
                         args.username, password, args.topic, os.fsencode(args.message), args.retain, args.timeout)
    return True


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``brokerd-mqtt`` entry point."""
    args = parse_arguments(argv)
    if args.command == "pub":
        try:
            if publish_at_once(args):
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

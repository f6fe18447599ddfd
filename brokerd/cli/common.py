"""What the protocol command-line clients (brokerd-ssmp, brokerd-mcchat, brokerd-smqp,
brokerd-mqtt) share: the options that say where and how to connect, the endpoint they describe,
the error that ends a command, and ``--retry``.

Each command keeps its own default host and port, and the help texts that speak of its own
protocol (what a client certificate is for, which name TLS verifies).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from brokerd.errors import ConfigurationError

if TYPE_CHECKING:  # Twisted is imported by what connects, not by every command's start
    from twisted.internet.interfaces import IStreamClientEndpoint

    from brokerd.interfaces import IBrokerReactor

EXIT_ERROR = 2
"""The exit status of a usage, configuration or connection problem."""


RETRY_SECONDS = 3.0
"""How long ``--retry`` waits before connecting again."""


class CommandError(Exception):
    """Ends the command with one line on stderr and ``code`` as the exit status.
    ``retryable``: the broker refused or ended the connection (or could not be reached), which
    ``--retry`` answers with another attempt rather than an exit."""

    def __init__(self, code: int, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


_T = TypeVar("_T")


class OptionGroup(Protocol):
    """An argparse parser or argument group: where options are added."""

    def add_argument(self, *names: str, **options: Any) -> argparse.Action: ...


class Interruption:
    """Whether the reactor is shutting down because the command was interrupted (Ctrl-C,
    SIGTERM): the connection it then loses is not an error, and the command ends quietly
    with status 0, as a subscriber stopped by its user should."""

    def __init__(self, reactor: IBrokerReactor) -> None:
        self.stopping = False
        reactor.addSystemEventTrigger("before", "shutdown", self._stopping)

    def _stopping(self) -> None:
        self.stopping = True


def add_retry_option(group: OptionGroup, suppress: bool = False) -> None:
    """``--retry``: see :func:`with_retries`."""
    group.add_argument(
        "--retry", action="store_true", default=option_default(False, suppress),
        help="when the broker cannot be reached, refuses the login or closes the connection, "
        f"say why and connect again every {RETRY_SECONDS:g} s instead of exiting",
    )


async def with_retries(
    reactor: IBrokerReactor, args: argparse.Namespace, prog: str, interruption: Interruption,
    attempt: Callable[[], Awaitable[None]],
) -> None:
    """Run ``attempt`` (one connection, to its end) once; with ``--retry``, again after each
    refused or ended connection, with one line on stderr per attempt saying why.  Without it,
    a subscriber the broker closes ends (its caller prints the line and exits non-zero): an
    operator's ``brokerd-ctl close`` or a second login of the same identity is then seen,
    not answered by a silent reconnect."""
    from twisted.internet import task

    while True:
        try:
            await attempt()
            return
        except CommandError as exc:
            if not (exc.retryable and getattr(args, "retry", False)) or interruption.stopping:
                raise
            print(f"{prog}: {exc}; connecting again in {RETRY_SECONDS:g} s", file=sys.stderr, flush=True)
            await task.deferLater(reactor, RETRY_SECONDS, lambda: None)


def closed_reason(reason: BaseException | None) -> str:
    """Why the broker ended a connection, for the line that says so: its own words when the
    protocol carried them, else that it gave none."""
    from twisted.internet.error import ConnectionDone

    if reason is None or isinstance(reason, ConnectionDone):
        return "no reason given"
    return error_text(reason)


def option_default(value: _T, suppress: bool) -> _T | str:
    """``value``, or SUPPRESS for options repeated on a subcommand's parser (``suppress``), so
    that an option given before the subcommand is not overwritten by the subcommand's
    default."""
    return argparse.SUPPRESS if suppress else value


class ConfigAddress:
    """Where a broker's config file (``--config``, TOML, docs/operations.md) says its listener
    of one protocol is: the first ``tcp:`` or ``tls:`` endpoint of that key.  An interface of
    every address (0.0.0.0, ::) or none is reached on 127.0.0.1."""

    def __init__(self, path: str, key: str) -> None:
        import re
        import tomllib

        try:
            with open(path, "rb") as handle:
                values = tomllib.load(handle)
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{path}: {exc}") from None
        self.values = values
        given = values.get(key)
        endpoints = [given] if isinstance(given, str) else list(given or [])
        for endpoint in endpoints:
            found = re.match(r"(tcp|tls):(\d+)(?::(.*))?$", str(endpoint))
            if found is None:
                continue
            options = dict(part.partition("=")[::2] for part in (found.group(3) or "").split(":") if part)
            interface = options.get("interface", "")
            self.host = interface if interface not in ("", "0.0.0.0", "::") else "127.0.0.1"
            self.port = int(found.group(2))
            self.tls = found.group(1) == "tls"
            return
        raise argparse.ArgumentTypeError(f"{path}: no tcp: or tls: listener for {key!r}")


def add_address_options(
    group: OptionGroup, default_host: str, default_port: int, suppress: bool = False, protocol: str | None = None
) -> None:
    """``--connect ENDPOINT``, or ``-H/--host`` and ``-p/--port``, or ``--config FILE`` (the
    ``protocol`` listener of a broker's config file; see :func:`endpoint_description`)."""
    if protocol is not None:
        group.add_argument(
            "--config", metavar="FILE", type=lambda path: ConfigAddress(path, protocol),
            default=option_default(None, suppress),
            help=f"the broker's config file: connect to its {protocol} listener",
        )
    group.add_argument(
        "--connect", metavar="ENDPOINT", default=option_default(None, suppress),
        help=f"Twisted client endpoint string [tcp:{default_host}:{default_port}]",
    )
    group.add_argument(
        "-H", "--host", default=option_default(None, suppress), help=f"broker host [{default_host}]"
    )
    group.add_argument(
        "-p", "--port", type=int, default=option_default(None, suppress),
        help=f"broker port [{default_port}]",
    )


def add_tls_options(
    group: OptionGroup,
    *,
    cert_help: str,
    hostname_help: str,
    tls_help: str = "connect over TLS (implied by --ca, --cert and --key)",
    ca_help: str = "CA certificates (PEM) to verify the broker with [the system's]",
    key_help: str = "private key (PEM) of --cert [in the --cert file]",
    suppress: bool = False,
) -> None:
    """``--tls``, ``--ca``, ``--cert``, ``--key`` and ``--tls-hostname`` (see
    :func:`uses_tls` and :func:`build_endpoint`)."""
    group.add_argument(
        "--tls", action="store_true", default=option_default(False, suppress), help=tls_help
    )
    group.add_argument(
        "--ca", type=Path, metavar="FILE", default=option_default(None, suppress), help=ca_help
    )
    group.add_argument(
        "--cert", type=Path, metavar="FILE", default=option_default(None, suppress),
        help=cert_help,
    )
    group.add_argument(
        "--key", type=Path, metavar="FILE", default=option_default(None, suppress), help=key_help
    )
    group.add_argument(
        "--tls-hostname", metavar="NAME", default=option_default(None, suppress),
        help=hostname_help,
    )


def check_address(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2 through ``parser.error``) for --connect with --host or --port,
    or --config with --connect."""
    if args.connect is not None and (args.host is not None or args.port is not None):
        parser.error("give either --connect or --host/--port")
    if args.connect is not None and getattr(args, "config", None) is not None:
        parser.error("give either --connect or --config")


def tcp_description(host: str | None, port: int | None, default_host: str, default_port: int) -> str:
    """``tcp:HOST:PORT``, the defaults standing in for what is not given; a colon in the host
    (an IPv6 address) is escaped as endpoint strings want it."""
    escaped = (host or default_host).replace(":", "\\:")
    return f"tcp:{escaped}:{port or default_port}"


def endpoint_description(args: argparse.Namespace, default_host: str, default_port: int) -> str:
    """The endpoint string the options name: ``--connect`` as given, else ``tcp:`` with
    ``--host`` and ``--port`` (what they leave out from ``--config``, then the defaults)."""
    if args.connect is not None:
        return args.connect
    config = getattr(args, "config", None)
    if config is not None:
        default_host, default_port = config.host, config.port
    return tcp_description(args.host, args.port, default_host, default_port)


def uses_tls(args: argparse.Namespace) -> bool:
    """``--tls``, or any of the certificate options that only make sense with it."""
    from_config = getattr(getattr(args, "config", None), "tls", False)
    return bool(args.tls or from_config or any(p is not None for p in (args.ca, args.cert, args.key)))


def build_endpoint(
    make: Callable[..., IStreamClientEndpoint],
    reactor: IBrokerReactor,
    description: str,
    args: argparse.Namespace,
    hostname: str | None,
) -> IStreamClientEndpoint:
    """``make(reactor, description, tls=..., hostname=..., ca=..., cert=..., key=...)`` (the
    protocol client's ``client_endpoint``) for the TLS options, verifying the broker as
    ``hostname``; an unusable description or certificate file is a CommandError (exit 2)."""
    try:
        return make(
            reactor,
            description,
            tls=uses_tls(args),
            hostname=hostname,
            ca=args.ca,
            cert=args.cert,
            key=args.key,
        )
    except (ValueError, ConfigurationError) as exc:
        raise CommandError(EXIT_ERROR, str(exc)) from None


def error_text(exc: BaseException) -> str:
    """An exception as one line for an error message (its type when it says nothing)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def start_debug_log() -> None:
    """``-d``: Twisted's log (the client protocol's own lines) on stderr."""
    from twisted.logger import globalLogBeginner, textFileLogObserver

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)

"""``brokerd-certs``: make development certificates for TLS listeners and ``cert`` login.

    brokerd-certs init DIR [--days N] [--server-name NAME ...] [--force]
    brokerd-certs client DIR NAME [--san DNS:x|URI:y ...] [--days N] [--force]

Exit status: 0 done, 1 the files could not be made (they exist, the CA is missing...),
2 bad command line.
"""
from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from brokerd import __version__
from brokerd.auth import devcerts

_FILE_SAFE_NAME = re.compile(r"[A-Za-z0-9_@+=~-][A-Za-z0-9._@+=~-]*")
"""Client names become a CN and a file name: SSMP ID characters minus ``/`` and ``:``, and no
leading dot."""
_DNS_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*)(\.[A-Za-z0-9_]([A-Za-z0-9_-]*))*")
_RESERVED_NAMES = frozenset({"ca", "server"})
"""``init``'s files: a client named like them would replace the CA or the server's key."""
_MAX_DAYS = 36500
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[!-~]+")


class CommandError(Exception):
    """The command cannot do what was asked; the message is shown as is, exit status 1."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    try:
        options.run(options)
    except CommandError as error:
        print(f"brokerd-certs: {error}", file=sys.stderr)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brokerd-certs",
        description="Make development certificates for brokerd's TLS listeners.",
    )
    parser.add_argument("--version", action="version", version=f"brokerd-certs {__version__}")
    commands = parser.add_subparsers(metavar="COMMAND", required=True)

    init = commands.add_parser(
        "init", help="create DIR/ca.pem, ca.key (a new CA) and server.pem, server.key"
    )
    init.add_argument("directory", metavar="DIR", type=Path)
    init.add_argument(
        "--server-name",
        metavar="NAME",
        action="append",
        default=[],
        help="a DNS name or IP address of the server (repeatable); localhost and 127.0.0.1 "
        "are always included; the first name given is the CN",
    )
    _add_common(init)
    init.set_defaults(run=_init, parser=init)

    client = commands.add_parser(
        "client", help="create DIR/NAME.pem and NAME.key, signed by DIR's CA"
    )
    client.add_argument("directory", metavar="DIR", type=Path)
    client.add_argument("name", metavar="NAME", help="the client's name: the certificate's CN")
    client.add_argument(
        "--san",
        metavar="DNS:x|URI:y",
        action="append",
        default=[],
        help="another name the client may log in as (repeatable)",
    )
    _add_common(client)
    client.set_defaults(run=_client, parser=client)
    return parser


def _add_common(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--days",
        type=_positive,
        default=devcerts.DEFAULT_DAYS,
        help=f"validity in days (default {devcerts.DEFAULT_DAYS})",
    )
    command.add_argument("--force", action="store_true", help="replace existing files")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    if not 1 <= value <= _MAX_DAYS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {_MAX_DAYS}: {text!r}")
    return value


def _init(options: argparse.Namespace) -> None:
    for name in options.server_name:
        if not (_DNS_NAME.fullmatch(name) or _is_ip_address(name)):
            options.parser.error(f"--server-name must be a DNS name or IP address: {name!r}")
    directory: Path = options.directory
    targets = ["ca.pem", "ca.key", "server.pem", "server.key"]
    _prepare(directory, targets, options.force, create=True)
    ca = devcerts.make_ca(days=options.days)
    server = devcerts.make_server_cert(ca, options.server_name, days=options.days)
    _write(ca, directory / "ca.pem", directory / "ca.key")
    _write(server, directory / "server.pem", directory / "server.key")
    print(f"wrote {', '.join(str(directory / name) for name in targets)}")
    print(
        f"start the broker with: --tls-cert {directory / 'server.pem'} "
        f"--tls-key {directory / 'server.key'} --tls-ca {directory / 'ca.pem'}"
    )


def _client(options: argparse.Namespace) -> None:
    name: str = options.name
    if not _FILE_SAFE_NAME.fullmatch(name) or len(name) > 64:
        options.parser.error(f"NAME must be 1-64 of A-Z a-z 0-9 ._@+=~- (no leading .): {name!r}")
    if name in _RESERVED_NAMES:
        options.parser.error(f"NAME {name!r} is taken by the CA and server files")
    dns_names, uris = _split_sans(options.parser, options.san)
    directory: Path = options.directory
    _prepare(directory, [f"{name}.pem", f"{name}.key"], options.force, create=False)
    try:
        ca = devcerts.read_pem(directory / "ca.pem", directory / "ca.key")
    except (OSError, ValueError) as error:
        raise CommandError(f"cannot load the CA from {directory} (run 'init' first?): {error}")
    issued = devcerts.make_client_cert(
        ca, name, dns_names=dns_names, uris=uris, days=options.days
    )
    _write(issued, directory / f"{name}.pem", directory / f"{name}.key")
    print(f"wrote {directory / f'{name}.pem'}, {directory / f'{name}.key'}")


def _split_sans(
    parser: argparse.ArgumentParser, sans: list[str]
) -> tuple[list[str], list[str]]:
    dns_names: list[str] = []
    uris: list[str] = []
    for san in sans:
        kind, _, value = san.partition(":")
        if kind.upper() == "DNS" and _DNS_NAME.fullmatch(value):
            dns_names.append(value)
        elif kind.upper() == "URI" and _URI.fullmatch(value):
            uris.append(value)
        else:
            parser.error(f"--san must be DNS:name or URI:scheme:rest (ASCII), not {san!r}")
    return dns_names, uris


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _prepare(directory: Path, names: list[str], force: bool, *, create: bool) -> None:
    """Refuse to overwrite keys by accident: a replaced CA silently invalidates every client
    certificate it signed."""
    if create:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CommandError(f"cannot create {directory}: {error.strerror or error}")
    elif not directory.is_dir():
        raise CommandError(f"{directory} is not a directory (run 'init' first?)")
    existing = [str(directory / name) for name in names if (directory / name).exists()]
    if existing and not force:
        raise CommandError(f"{', '.join(existing)} already exist(s); use --force to replace")


def _write(issued: devcerts.Issued, cert: Path, key: Path) -> None:
    try:
        devcerts.write_pem(issued, cert, key)
    except OSError as error:
        raise CommandError(f"cannot write {cert} or {key}: {error.strerror or error}")


if __name__ == "__main__":
    sys.exit(main())

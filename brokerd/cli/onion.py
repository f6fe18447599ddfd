"""``brokerd-onion``: the client keys of onion services with client authorization.

    brokerd-onion add DIR NAME --address ADDRESS.onion [--private FILE]
    brokerd-onion list DIR

``add`` makes an x25519 key pair: ``DIR/NAME.auth`` (the public key, for the broker's
``--onion-client-auth DIR``) and the client's ``NAME.auth_private`` (``--private``, default
in the current directory, mode 600: it goes into the client tor's ``ClientOnionAuthDir``).
``list`` prints each authorized client's name and public key.  The broker reads DIR when it
starts: restart it after a change (docs/tor.md).

Exit status: 0 done, 1 the files could not be made or read, 2 bad command line.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from brokerd import __version__
from brokerd.errors import ConfigurationError
from brokerd.protocols.onion.keys import (
    ONION_ADDRESS,
    auth_line,
    auth_private_line,
    authorized_clients,
    check_client_name,
    make_client_key,
    write_private,
)

PROG = "brokerd-onion"


def add(options: argparse.Namespace) -> None:
    name = check_client_name(options.name)
    address = options.address.strip().lower()
    if not ONION_ADDRESS.fullmatch(address):
        raise ConfigurationError(f"--address {options.address}: not a v3 onion address (56 letters and digits .onion)")
    directory: Path = options.directory
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_path = options.private or Path(f"{name}.auth_private")
    public_path = directory / f"{name}.auth"
    for path in (public_path, private_path):
        if path.exists():
            raise ConfigurationError(f"{path} exists: remove it first to replace the client's key")
    private, public = make_client_key()
    write_private(private_path, auth_private_line(address, private))
    public_path.write_text(auth_line(public))
    print(f"{public_path}: {name} may reach {address} (restart the broker to apply)")
    print(f"{private_path}: give it to {name}, for their tor's ClientOnionAuthDir (keep it secret)")


def list_clients(options: argparse.Namespace) -> None:
    for name, public in authorized_clients(options.directory).items():
        print(f"{name}\t{public}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Client keys of brokerd's onion services.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(metavar="COMMAND", required=True)
    making = commands.add_parser("add", help="make a client's key pair: DIR/NAME.auth and NAME.auth_private")
    making.add_argument("directory", metavar="DIR", type=Path, help="the broker's --onion-client-auth directory")
    making.add_argument("name", metavar="NAME")
    making.add_argument("--address", required=True, help="the onion service's address (DATA_DIR/onion/*.hostname)")
    making.add_argument("--private", metavar="FILE", type=Path, help="where the client's key goes [./NAME.auth_private]")
    making.set_defaults(run=add)
    listing = commands.add_parser("list", help="the authorized clients: name and public key")
    listing.add_argument("directory", metavar="DIR", type=Path)
    listing.set_defaults(run=list_clients)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    try:
        options.run(options)
    except (ConfigurationError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The names this broker answers to: the ``Host`` check that keeps DNS-rebinding pages out.

A web page may send requests only to its own origin, but "its own origin" is a name, and the
name's owner decides what it resolves to.  An attacker who makes ``rebind.attacker.example``
resolve to 127.0.0.1 gets a page whose same-origin requests reach a loopback listener, with
``Host: rebind.attacker.example`` (and, for a WebSocket or a POST, the same name in
``Origin``).  Comparing Origin with Host cannot tell such a page from a real one; comparing
Host with the names the broker is known by can.

The broker's own names are:

- ``localhost`` and ``localhost.localdomain``;
- every IP address literal (``127.0.0.1``, ``[::1]``, ``192.0.2.7``): a browser sends one
  only when the page's URL names the address, so the page came from that address and port,
  which is this listener; DNS rebinding always needs a name;
- the listeners' own ``interface=`` names, and the machine's host name;
- what the operator lists in ``--server-names`` (the DNS names users and tools reach the
  broker by).

Ports are not compared: a rebinding page has the listener's port anyway, and a proxy may
change it.  A request without ``Host`` (an HTTP/1.0 program; browsers always send one) is
not a page's and passes.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from brokerd.auth.tls import split_escaped

_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
"""A DNS name as a Host header may carry it (lower-cased)."""
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})


def listener_interface(description: str) -> str:
    """The interface a server endpoint string binds (``interface=`` or ``tcp:PORT:ADDR``), ''
    for none (every interface) or a non-TCP endpoint."""
    fields = split_escaped(description)
    if fields[0].lower() not in ("tcp", "tcp6", "tls", "ssl"):
        return ""
    interface = ""
    positional = [field for field in fields[1:] if "=" not in field]
    for field in fields[1:]:
        name, equals, value = field.partition("=")
        if equals and name == "interface":
            interface = value
    if not interface and fields[0].lower() in ("tcp", "tcp6") and len(positional) >= 2:
        interface = positional[1]  # tcp:PORT:INTERFACE
    return interface


def split_names(value: str | Iterable[str] | None) -> list[str]:
    """``--server-names``: one string separated by commas or spaces, or (in the TOML file) a
    list of strings."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    return [entry.strip() for entry in value if entry.strip()]


def host_name(host: str) -> str | None:
    """The name part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower-cased
    and without a trailing dot; None when it does not parse."""
    try:
        parts = urlsplit("//" + host.strip())
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return None
    name = parts.hostname
    if not name or parts.path or parts.query or parts.username is not None:
        return None
    name = name.rstrip(".")
    if not (_NAME.fullmatch(name) or _is_address(name)):
        return None
    return name


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class OwnNames:
    """The names of this broker (see the module docstring); :meth:`owns` checks a Host."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = frozenset(name.lower().rstrip(".") for name in names if name) | LOCAL_NAMES

    @classmethod
    def of(cls, listeners: Iterable[str], server_names: str | Iterable[str] | None) -> OwnNames:
        """The own names for listeners bound by these endpoint strings, plus ``--server-names``."""
        names = [listener_interface(description) for description in listeners]
        names.append(socket.gethostname())
        return cls([*names, *split_names(server_names)])

    def owns(self, host: str | None) -> bool:
        """Is ``host`` (a Host header's value; None: absent) one of this broker's names?"""
        if host is None:
            return True
        name = host_name(host)
        if name is None:
            return False
        return _is_address(name) or name in self.names

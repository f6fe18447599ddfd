"""Client endpoints from Twisted endpoint strings, wrapped in TLS when asked.

The SSMP, MCCHAT and SMQP clients (and so their command-line tools) all connect this way.  The
front ends never import each other, so the one implementation lives here, and each client's
``client_endpoint`` only adds its own rule for the TLS host name nobody gave.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from twisted.internet.interfaces import IStreamClientEndpoint

from brokerd.interfaces import IBrokerReactor


def client_endpoint(
    reactor: IBrokerReactor | None,
    description: str,
    *,
    tls: bool = False,
    hostname: str | None = None,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    default_host: Callable[[str], str | None] | None = None,
) -> IStreamClientEndpoint:
    """The endpoint for a Twisted client endpoint string (``tcp:HOST:PORT``, ``unix:PATH``...),
    wrapped in TLS when ``tls`` is set: the server is verified as ``hostname`` (when None, as
    ``default_host(description)`` if that is given) against ``ca`` (the system's trust store
    when None) and ``cert`` (its key in ``key``, or in the same file) is presented.

    ValueError for a description Twisted cannot parse or a TLS connection whose host name is
    unknown; :class:`~brokerd.errors.ConfigurationError` for unreadable certificate files.
    brokerd.auth.tls (and with it OpenSSL) is imported only for TLS.
    """
    from twisted.internet.endpoints import wrapClientTLS

    try:
        endpoint = client_from_string(reactor, description)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a client endpoint: {description!r} ({exc})") from None
    if not tls:
        return endpoint
    from brokerd.auth.tls import client_context

    if hostname is None and default_host is not None:
        hostname = default_host(description)
    if hostname is None:
        raise ValueError(f"TLS over {description!r}: give the server's hostname to verify")
    return wrapClientTLS(client_context(hostname, ca, cert, key), endpoint)


TOR_USAGE = "tor:HOST:PORT[:socksPort=N][:socksHostname=ADDRESS]"
DEFAULT_SOCKS_PORT = 9050
"""A system tor's SOCKS port: where ``tor:`` connects without ``socksPort``."""


def client_from_string(reactor: IBrokerReactor | None, description: str) -> IStreamClientEndpoint:
    """Twisted's ``clientFromString``, except for ``tor:HOST:PORT[:socksPort=N]`` (txtorcon's
    syntax): a connection through Tor's SOCKS port (socksHostname 127.0.0.1, socksPort 9050
    unless given) with brokerd's own SOCKS5 client (brokerd.protocols.socks says why).
    ``reactor`` None: an endpoint to check the description with, never to connect."""
    from twisted.internet.endpoints import clientFromString

    if description.split(":", 1)[0].lower() != "tor":
        return clientFromString(reactor, description)
    from brokerd.auth.tls import split_escaped

    positional, named = [], {}
    for field in split_escaped(description)[1:]:
        name, equals, value = field.partition("=")
        if equals:
            named[name] = value
        else:
            positional.append(field)
    host = named.pop("host", positional[0] if positional else "")
    port = named.pop("port", positional[1] if len(positional) > 1 else "")
    socks_port = named.pop("socksPort", str(DEFAULT_SOCKS_PORT))
    socks_host = named.pop("socksHostname", "127.0.0.1")
    if not host or not port.isdigit() or named or len(positional) > 2 or not socks_port.isdigit():
        raise ValueError(f"expected {TOR_USAGE}")
    from twisted.internet.endpoints import HostnameEndpoint

    from brokerd.protocols.socks import SOCKS5ClientEndpoint

    return SOCKS5ClientEndpoint(HostnameEndpoint(reactor, socks_host, int(socks_port)), host, int(port))


def endpoint_host(description: str) -> str | None:
    """The host named by a ``tcp:`` (or ``tor:``) client endpoint string (positional or ``host=``), else
    None: the name TLS should verify when nobody gave one."""
    # Imported here: splitting a string should not load OpenSSL for a plain-TCP client.
    from brokerd.auth.tls import split_escaped

    fields = split_escaped(description)
    if fields[0] not in ("tcp", "tcp6", "tor") or len(fields) < 2:
        return None
    positional = []
    for field in fields[1:]:
        name, equals, value = field.partition("=")
        if equals and name == "host":
            return value or None
        if not equals:
            positional.append(field)
    return positional[0] if positional else None

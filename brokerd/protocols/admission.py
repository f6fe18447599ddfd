"""How a front end asks the Broker to admit a new connection (brokerd.core.admission).

The keys come from the transport, so every front end counts the same way: a listener is its
local port (one factory may serve several listeners; a listener on every interface sees
connections on several local addresses but one port) or its UNIX socket path, a source is the
peer's IP address.  A UNIX socket's peer has no address and is counted by its listener only.
"""
from __future__ import annotations

from collections.abc import Hashable

from twisted.internet.interfaces import ITransport

from brokerd.core.admission import Admission
from brokerd.core.broker import Broker


def listener_key(transport: ITransport | None) -> Hashable | None:
    """The listener a connection came in on, as a key (None when the transport cannot tell)."""
    if transport is None:
        return None
    try:
        host = transport.getHost()
    except Exception:
        return None
    port = getattr(host, "port", None)
    if port is not None:
        return (getattr(host, "type", "TCP"), port)
    name = getattr(host, "name", None)
    return ("UNIX", name) if name is not None else None


def source_key(transport: ITransport | None) -> Hashable | None:
    """The IP address a connection comes from (None for UNIX sockets and unknown peers)."""
    if transport is None:
        return None
    try:
        peer = transport.getPeer()
    except Exception:
        return None
    return getattr(peer, "host", None)


def admit(broker: Broker, transport: ITransport | None) -> Admission | None:
    """``broker.admit`` for a new connection on ``transport``: an Admission, or None when a
    connection limit is full (the front end refuses the connection in its own words)."""
    return broker.admit(listener_key(transport), source_key(transport))

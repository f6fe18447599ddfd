"""Who can reach a listener: loopback only, or the network.

The admin listener may run without a token only where nobody else can connect, and open or
anonymous logins on a listener the network reaches deserve a warning in the log.  Both ask
the same question of an endpoint string.
"""
from __future__ import annotations

import ipaddress

from brokerd.auth.hosts import LOCAL_NAMES, listener_interface
from brokerd.auth.tls import split_escaped


def binds_loopback(description: str) -> bool:
    """True when a server endpoint string accepts connections from this host only: a
    ``tcp:``/``tls:``/``ssl:`` listener whose interface is a loopback address, or a ``unix:``
    socket (guarded by its file permissions).  Anything else (no interface: every one; an
    onion service; an endpoint type we do not know) counts as reachable."""
    kind = split_escaped(description)[0].lower()
    if kind == "unix":
        return True
    if kind not in ("tcp", "tcp6", "tls", "ssl"):
        return False
    interface = listener_interface(description)
    if interface.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(interface).is_loopback
    except ValueError:
        return False

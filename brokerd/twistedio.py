"""Twisted internals brokerd's fast writes rely on, checked per release, in one place.

Twisted's ``transport.write`` never writes at once: it queues the bytes, asks the reactor for
writability (an ``epoll_ctl``), and writes in a later ``doWrite`` round, then stops asking
(another ``epoll_ctl``).  For a connection whose queue is empty, one ``send()`` at once does
the same work in a fraction of the CPU.  No public API offers that, so it is taken only on
the Twisted releases whose ``FileDescriptor`` and ``tcp.Connection`` code was read and
checked (tests/protocols/test_flow.py fails on any other release and on any change of that
code); elsewhere brokerd uses ``transport.write``, which is public, correct and slower.

The front ends' flow control (brokerd.protocols.flow) uses it for deliveries, the cluster
engine (brokerd.cluster.shards) for its pipelined writes to Redis.
"""
from __future__ import annotations

from typing import Any

import twisted
from twisted.internet.tcp import Connection

CHECKED_TWISTED = ((26, 10),)
"""(major, minor) of the Twisted releases whose internals the fast paths were checked on."""


def twisted_release() -> tuple[int, int]:
    """The installed Twisted's (major, minor)."""
    version = twisted.version
    return (version.major, version.minor)


FAST_PATHS = twisted_release() in CHECKED_TWISTED
"""Whether this Twisted is one the fast paths were checked on."""


def direct_writes(transport: Any) -> bool:
    """True for a plain TCP transport on a checked Twisted, whose socket brokerd may write
    itself (not TLS: its bytes must go through the TLS layer)."""
    return FAST_PATHS and isinstance(transport, Connection) and not getattr(transport, "TLS", False)


def send_now(transport: Any, data: bytes) -> None:
    """Write ``data`` with one ``send()`` when the transport allows direct writes and nothing
    is queued for it; else, or for what the kernel did not take, queue it behind the rest as
    ``transport.write`` does (so the order of the bytes is kept either way)."""
    if not direct_writes(transport) or transport._tempDataLen or transport.dataBuffer or transport.disconnecting:
        transport.write(data)
        return
    try:
        sent = transport.socket.send(data)
    except BlockingIOError:
        sent = 0
    except OSError:
        transport.write(data)  # Twisted finds and reports the broken connection
        return
    if sent < len(data):
        transport.write(data[sent:])

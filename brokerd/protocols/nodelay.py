"""TCP_NODELAY for every brokerd connection, server and client side, plain TCP and TLS.

Without it, Nagle's algorithm holds back a small segment while an earlier one is not yet
acknowledged, and the peer delays its acknowledgement (up to 40 ms on Linux) hoping to
piggyback it on data.  A broker writes small segments back to back all the time (an event,
then the reply to the request that caused it; a message, then the next one): each such pair
cost a delayed-ACK timeout.  brokerd coalesces what one read produces into one write, and
turns Nagle off so that what still leaves as two writes is not held back either.

Shared here because the front ends never import each other.
"""
from __future__ import annotations

from twisted.internet.interfaces import ITCPTransport


def no_delay(transport: object) -> None:
    """Set TCP_NODELAY on ``transport``'s TCP connection, as twisted.web does for HTTP.

    A TLS layer provides the interfaces of the TCP transport it wraps and passes the call
    down; a UNIX socket transport ignores it; a transport that is not TCP (a test double) is
    left alone."""
    if ITCPTransport.providedBy(transport):
        transport.setTcpNoDelay(True)

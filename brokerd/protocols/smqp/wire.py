"""How broker events look to SMQP sessions (the SMQP IWireFormat), and the topic mapping.

Topics: SMQP ``/a/b`` is core topic ``a/b``, lower-cased (SMQP topics are case-insensitive);
a core topic is reachable from SMQP when ``/`` + its name is a valid SMQP path.

The core hands SMQP sessions only what was never stored: another protocol's unicast to an
SMQP address, and an SMQP ``Guarantee: NO`` message to the durable subscribers of its topic
(the router's ``Unstored`` publication).  It reaches the session as ``NOTIFY MESSAGE <topic> ADD`` with ``Guarantee:
NO``, so the session must not expect (or send) the two-phase 310 ACK; its attributes are
made as :func:`~brokerd.protocols.smqp.mapping.to_body` says, with a ``Smuid`` from this
server's counter.  Messages to topics reach SMQP subscribers through the durable service
(stored, acknowledged), never through this renderer.

Presence has no per-member form in SMQP (NOTIFY SUBSCRIBERS carries counts), so
:meth:`SMQPWireFormat.render_presence` renders nothing.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

from zope.interface import implementer

from brokerd.core.message import MULTICAST, UNICAST, Message
from brokerd.interfaces import ISubscriber, IWireFormat, WireFormat
from brokerd.protocols.smqp.codec import encode_notify, format_datetime, parse_topic
from brokerd.protocols.smqp.events import TopicRef
from brokerd.protocols.smqp.mapping import to_body

def core_topic(ref: TopicRef) -> bytes:
    """The core topic of an SMQP path: ``/Stocks/IBM`` -> ``b"stocks/ibm"``."""
    return ref.key.encode("utf-8")


def smqp_topic(core: bytes) -> str | None:
    """The SMQP path of a core topic, or None when SMQP cannot name it."""
    try:
        path = "/" + core.decode("utf-8")
        parse_topic(path)
    except (UnicodeDecodeError, ValueError):
        return None
    return path.lower()


def _login_topic(address: bytes) -> str | None:
    """``smqp:account:channel`` -> ``/accounts/account/channel`` (a unicast's topic)."""
    parts = address.decode("utf-8", "replace").split(":")
    if len(parts) != 3:
        return None
    return smqp_topic(f"accounts/{parts[1]}/{parts[2]}".encode("utf-8"))


@implementer(IWireFormat)
class SMQPWireFormat(WireFormat):
    """Renders core messages as NOTIFY MESSAGE.  ``server_id`` prefixes the Smuids (the
    server's SUID), ``domain`` names this server in Cmuids, ``clock`` gives the time,
    ``display`` the path a topic key is shown as (the names as created)."""

    protocol = "smqp"
    queued_delivery = True
    """The core hands messages to a queue (the store, an outbox), not to a socket: SMQP logs
    the write itself (``delivered``), so the delivery-latency sampler leaves it out."""

    def __init__(self, server_id: str, domain: str, clock: Callable[[], float],
                 display: Callable[[str], str] | None = None) -> None:
        self.server_id = server_id
        self.display = display
        self.domain = domain
        self.clock = clock
        self._numbers = itertools.count(1)
        self.unrepresentable = 0
        """Messages SMQP could not carry (a topic SMQP cannot name)."""

    def render_message(self, message: Message) -> bytes | None:
        target = message.target or b""  # set for a multicast and a unicast (None for a broadcast)
        if message.kind == MULTICAST:
            topic = smqp_topic(target)
            if topic is not None and self.display is not None:
                topic = self.display(target.decode("utf-8"))
        elif message.kind == UNICAST:
            topic = _login_topic(target)
        else:
            topic = None
        if topic is None:
            self.unrepresentable += 1
            return None
        now = self.clock()
        volatile_id = f"{self.server_id}/x{next(self._numbers)}({format_datetime(now)})"
        return encode_notify("MESSAGE", topic, "ADD", body=to_body(message, self.domain, now, volatile_id))

    def render_presence(self, topic: bytes, member: ISubscriber, joined: bool,
                        presence: bool) -> bytes | None:
        return None

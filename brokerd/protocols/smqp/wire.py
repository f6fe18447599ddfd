"""How broker events look to SMQP sessions (the SMQP IWireFormat), and the topic mapping.

Topics: SMQP ``/a/b`` is core topic ``a/b``, lower-cased (SMQP topics are case-insensitive);
a core topic is reachable from SMQP when ``/`` + its name is a valid SMQP path.

A message from another protocol reaches an SMQP session as ``NOTIFY MESSAGE <topic> ADD``
with ``Guarantee: NO``: it was never persisted, so the session must not expect (or send) the
two-phase 310 ACK.  The server supplies the REQUIRED attributes: a ``Smuid`` from this
server's counter and a ``Cmuid`` naming the sender as ``<protocol>:<name>@<domain>``.
A message that carries ``headers["smqp"]`` (an SMQP publisher's, see
:func:`notify_body`) is rendered from those attributes and sections instead.

Presence has no per-member form in SMQP (NOTIFY SUBSCRIBERS carries counts), so
:meth:`SMQPWireFormat.render_presence` renders nothing.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

from zope.interface import implementer

from brokerd.core.message import MULTICAST, UNICAST, Message
from brokerd.interfaces import ISubscriber, IWireFormat
from brokerd.protocols.smqp.codec import encode_notify, format_datetime, parse_topic
from brokerd.protocols.smqp.events import Body, Section, TopicRef

_NAME_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


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


def _safe(name: bytes) -> str:
    text = name.decode("utf-8", "replace")
    return "".join(c if c in _NAME_SAFE else "_" for c in text)[:64] or "_"


def _login_topic(address: bytes) -> str | None:
    """``smqp:account:channel`` -> ``/accounts/account/channel`` (a unicast's topic)."""
    parts = address.decode("utf-8", "replace").split(":")
    if len(parts) != 3:
        return None
    return smqp_topic(f"accounts/{parts[1]}/{parts[2]}".encode("utf-8"))


def notify_body(attributes: tuple[tuple[str, str], ...], sections: tuple[Section, ...]) -> dict:
    """The ``Message.headers`` an SMQP publisher's message carries for other SMQP sessions."""
    return {"smqp": Body(attributes, sections)}


@implementer(IWireFormat)
class SMQPWireFormat:
    """Renders core messages as NOTIFY MESSAGE.  ``server_id`` prefixes the Smuids (the
    server's SUID), ``domain`` names this server in Cmuids, ``clock`` gives the time."""

    protocol = "smqp"

    def __init__(self, server_id: str, domain: str, clock: Callable[[], float]) -> None:
        self.server_id = server_id
        self.domain = domain
        self.clock = clock
        self._numbers = itertools.count(1)
        self.unrepresentable = 0
        """Messages SMQP could not carry (a topic SMQP cannot name)."""

    def render_message(self, message: Message) -> bytes | None:
        if message.kind == MULTICAST:
            topic = smqp_topic(message.target)  # type: ignore[arg-type]
        elif message.kind == UNICAST:
            topic = _login_topic(message.target)  # type: ignore[arg-type]
        else:
            topic = None
        if topic is None:
            self.unrepresentable += 1
            return None
        now = self.clock()
        number = next(self._numbers)
        stamp = format_datetime(now)
        carried = (message.headers or {}).get("smqp")
        if isinstance(carried, Body):
            return encode_notify("MESSAGE", topic, "ADD", body=carried)
        sender = f"{message.protocol}:{_safe(message.sender_name)}@{self.domain}"
        attributes = (
            ("Created", stamp),
            ("Smuid", f"{self.server_id}/x{number}({stamp})"),
            ("Cmuid", f"{sender}/{number}({stamp})"),
            ("Guarantee", "NO"),
        )
        if message.binary:
            kind = "application/octet-stream"
        else:
            try:
                message.payload.decode("utf-8")
                kind = "text/plain; charset=utf-8"
            except UnicodeDecodeError:
                kind = "application/octet-stream"
        section = Section((("Content-Type", kind),), message.payload)
        return encode_notify("MESSAGE", topic, "ADD", body=Body(attributes, (section,)))

    def render_presence(self, topic: bytes, member: ISubscriber, joined: bool,
                        presence: bool) -> bytes | None:
        return None

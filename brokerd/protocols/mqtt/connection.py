"""What MQTT's packet mixins need of the connection they are part of: one typing.Protocol.

MQTTServerProtocol (:mod:`.server`) is assembled from three mixins, CONNECT (:mod:`.connect`),
PUBLISH (:mod:`.publishing`) and SUBSCRIBE (:mod:`.subscribing`), which share the
connection's state and call the server's helpers.  :class:`MQTTConnection` writes that
contract down once, so a type checker sees each mixin's ``self`` as the whole connection.
The mixins inherit it only while type checking (:data:`ConnectionBase`): at run time their
base is ``object`` and MQTTServerProtocol is what implements it.

The listener the mixins reach through ``self.factory`` is a Protocol too
(:class:`MQTTListener`): the factory lives beside the protocol in :mod:`.server`, which
imports the mixins, and naming it here would close an import cycle.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from twisted.cred.portal import Portal
    from twisted.internet.base import DelayedCall
    from twisted.internet.interfaces import IReactorTime
    from twisted.logger import Logger

    from brokerd.config import Settings
    from brokerd.core.broker import Broker
    from brokerd.core.message import Message
    from brokerd.events.log import IEventRecorder
    from brokerd.protocols.lifecycle import LivenessSweep
    from brokerd.protocols.mqtt.decoder import MQTTServerDecoder
    from brokerd.protocols.mqtt.packets import Connect, Properties, Will
    from brokerd.protocols.mqtt.reasons import MQTTProtocolError
    from brokerd.protocols.mqtt.session import MQTTSession
    from brokerd.protocols.mqtt.sessions import MQTTSessions
    from brokerd.store.records import PacketFlow


class PendingAnswer:
    """The acknowledgement of one QoS 1 or 2 PUBLISH in its turn (4.6): ``data`` is written
    once it is ``ready`` and every one before it was; ``released_by`` is the Packet Identifier
    whose PUBREL the client still owes after it (an accepting PUBREC), else None."""

    __slots__ = ("ready", "data", "released_by")

    def __init__(self, ready: bool, data: bytes, released_by: int | None) -> None:
        self.ready = ready
        self.data = data
        self.released_by = released_by


class MQTTListener(Protocol):
    """An MQTT listener's factory as its connections see it (:class:`.server.MQTTServerFactory`)."""

    broker: Broker
    portal: Portal
    settings: Settings
    clock: IReactorTime
    events: IEventRecorder
    sessions: MQTTSessions
    liveness: LivenessSweep
    """The logged-in connections, closed when silent too long (the keep-alive)."""
    forbidden: int
    refused_properties: int


class MQTTConnection(Protocol):
    """One MQTT connection as its packet mixins see it."""

    factory: MQTTListener
    transport: Any
    """Twisted's transport: a TCP, TLS or WebSocket one, which no single Twisted interface
    describes (writes, the producer's pause and resume, the peer and its certificate)."""
    _log: Logger
    # The state the mixins set has its initial values here: an attribute a subclass of a
    # Protocol assigns would otherwise take the type of that assignment (mypy).
    version: int = 4
    session: MQTTSession | None = None
    """The session of the client identifier, once the CONNECT was accepted."""
    closed: bool = False
    congested: bool = False
    """Past the output buffer's limit (see MQTTServerProtocol.congested)."""
    keep_alive: int = 0
    heard: bool = True
    last_heard: float = 0.0
    _decoder: MQTTServerDecoder | None = None
    _connect_timer: DelayedCall | None = None
    _connect: Connect | None = None
    _will: Will | None = None
    _client_id: str = ""
    _normal_end: bool = False
    """The client ended with a DISCONNECT that asks for no will: none is published."""
    _assigned: str | None = None
    """The client identifier the server made up for a CONNECT with none."""
    _logging_in: bool = False
    _pending: list[object] = []
    """Packets and the decoder's error read while the login is checked, handled after it."""
    _topic_aliases: dict[int, str] | None = None
    _acks: deque[PendingAnswer]
    _unacknowledged: int = 0
    _run: list[tuple[Message, int, int]] = []
    """PUBLISHes of this read to one topic, not yet routed: (message, QoS, packet id; 0 at QoS 0)."""
    _run_acks: int = 0
    _run_flows: list[PacketFlow] = []
    _releasing: set[int]

    # -- provided by MQTTServerProtocol (brokerd.protocols.mqtt.server)

    def _handle(self, packets: Sequence[object], error: MQTTProtocolError | None) -> None: ...

    def _close(self) -> None: ...

    def _disconnect(self, reason_code: int, reason: str | None = None) -> None: ...

    def _problem(self, reason: str | None) -> Properties: ...

    @property
    def _problem_information(self) -> bool: ...

    def write_now(self, data: bytes) -> None: ...

    def closed_by_operator(self) -> None: ...

    def taken_over(self) -> None: ...

    # -- provided by ConnectionLifecycle (brokerd.protocols.lifecycle)

    def logged_in(self) -> None: ...

    @staticmethod
    def cancel_timer(call: DelayedCall | None) -> None: ...


if TYPE_CHECKING:
    ConnectionBase = MQTTConnection
else:
    ConnectionBase = object
"""The mixins' base: the connection protocol for the type checker, ``object`` at run time."""

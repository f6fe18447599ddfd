"""The MQTT 3.1.1 and 5.0 server: one MQTTServerProtocol per connection, one factory per listener.

A connection reads packets with the sans-IO decoder (:mod:`.decoder`), logs in through the
portal every protocol shares (username and password against the accounts file, or the TLS
client certificate; no username is the anonymous principal unless ``--no-mqtt-anonymous``),
and binds to its :class:`~.session.MQTTSession`, which is what the core knows.  Publishing,
subscribing and the access list are the core's (Broker.publish, subscribe_filter,
may_publish); this module only speaks MQTT: the packet flows of each QoS (4.3), the order of
acknowledgements (4.6), keep-alive (3.1.2.10), wills (3.1.3.2), and the answers to bad input
(a v5 DISCONNECT with the reason code, or a closed connection in 3.1.1).

Who may write to this socket: anyone who can reach the listener (loopback by default).  Before
CONNECT is accepted a connection costs at most ``--mqtt-max-packet-size`` bytes of buffer and
``--mqtt-connect-timeout`` seconds, and counts against ``--max-connections``; nothing it sends
reaches the core until the portal accepted its credentials.  A client identifier names a session
only for the principal that made it: another principal's CONNECT with it is refused (Not
authorized), so no login can take over or read someone else's session.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence

from twisted.cred.portal import Portal
from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.message import Message
from brokerd.events.log import NULL_EVENT_LOG, IEventRecorder
from brokerd.protocols.dispatch import command_table
from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.connect import Login
from brokerd.protocols.mqtt.connection import PendingAnswer
from brokerd.protocols.mqtt.decoder import MQTTServerDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    Auth,
    Connect,
    Disconnect,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
    Will,
)
from brokerd.protocols.mqtt.publishing import Publishing
from brokerd.protocols.mqtt.session import MQTTSession
from brokerd.protocols.mqtt.sessions import MQTTSessions
from brokerd.protocols.mqtt.subscribing import Subscribing
from brokerd.protocols.lifecycle import ConnectionLifecycle, LivenessSweep
from brokerd.store.records import PacketFlow
from brokerd.twistedio import DirectWrites

PINGRESP = b"\xd0\x00"
_V3_CONNACK_FOR = frozenset((reasons.CLIENT_IDENTIFIER_NOT_VALID,))
"""Refusals of a CONNECT the decoder finds that 3.1.1 has a CONNACK return code for."""


@implementer(IPushProducer)
class MQTTServerProtocol(Login, Publishing, Subscribing, ConnectionLifecycle, DirectWrites, Protocol):
    """One MQTT network connection (see the module docstring)."""

    _log = Logger()
    factory: MQTTServerFactory
    version = MQTT_311
    session: MQTTSession | None = None
    closed = False
    congested = False
    """Past ``--max-output-buffer`` bytes unwritten: QoS 0 messages are dropped and QoS 1
    and 2 ones wait in the session until the client reads again."""
    keep_alive = 0
    heard = True
    last_heard = 0.0
    _will: Will | None = None
    _connect: Connect | None = None
    _normal_end = False
    _topic_aliases: dict[int, str] | None = None
    _held: list[bytes] | None = None
    """While the client's acknowledgements of one read are handled: the packets they let out
    (the window's next PUBLISHes), written together after the last (:meth:`write_now`); a
    send() for each would cost a system call per message where Twisted's queue made one."""

    def __init__(self) -> None:
        self._decoder: MQTTServerDecoder | None = None
        self._connect_timer: DelayedCall | None = None
        self._pending: list[object] = []
        """Packets read while the login is checked, handled after it."""
        self._logging_in = False
        self._acks: deque[PendingAnswer] = deque()
        """Acknowledgements of QoS 1 and 2 PUBLISHes in the order they came (4.6); one
        waiting for a commit holds back those after it."""
        self._unacknowledged = 0
        self._run: list[tuple[Message, int, int]] = []
        """PUBLISHes of this read to one topic, not yet routed: (message, QoS, packet id; 0 at QoS 0)."""
        self._run_acks = 0
        self._run_flows: list[PacketFlow] = []
        """The run's QoS 2 PUBLISHes as a persistent session stores them (store PacketFlows)."""
        self._releasing: set[int] = set()
        """Packet Identifiers of QoS 2 PUBLISHes of this connection answered PUBREC and
        waiting for their PUBREL: they count against the Receive Maximum until it comes."""

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        settings = self.factory.settings
        if not self.open_connection(settings.max_output_buffer):
            self.closed = True  # MQTT has no packet to refuse a connection before its CONNECT
            self.transport.abortConnection()
            return
        self.check_direct_writes()
        self._decoder = MQTTServerDecoder(settings.mqtt_max_packet_size)
        self.register_producer()
        self._connect_timer = self.call_later(settings.mqtt_connect_timeout, self._connect_timed_out)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed = True
        self._connect_timer = None
        if not self.release_connection():
            return
        factory = self.factory
        factory.liveness.forget(self)
        session = self.session
        if session is not None and session.retained_out is not None and session.retained_out.connection is self:
            session.retained_out.stop()
            session.retained_out = None
        if session is not None and session.unbind(self):
            if not self._normal_end and self._will is not None:
                factory.sessions.will_of_lost_connection(session, self._will)
            factory.sessions.connection_ended(session)
        self._will = None

    def _connect_timed_out(self) -> None:
        self._connect_timer = None
        self._close()

    def _close(self) -> None:
        if self._held is not None:
            self._release_held()
        if self._run and not self.closed:
            self._publish_run()  # the valid PUBLISHes read before the reason to close
        if not self.closed:
            self.closed = True
            self.unregister_producer()
            self.transport.loseConnection()

    def _disconnect(self, reason_code: int, reason: str | None = None) -> None:
        """End the connection for a protocol violation or by the server's choice: a v5
        DISCONNECT with ``reason_code`` first; 3.1.1 just closes (3.14: only clients send it)."""
        if self.closed:
            return
        if self.version == MQTT_5 and self.session is not None:
            properties = Properties(reason_string=reason) if reason and self._problem_information else NO_PROPERTIES
            self.transport.write(encode(Disconnect(reason_code, properties), MQTT_5))
        self._close()

    def _problem(self, reason: str | None) -> Properties:
        """The v5 properties of an acknowledgement that refuses: ``reason`` as its Reason
        String, unless the client set Request Problem Information to 0 (3.1.2.11.7: then
        only CONNACK, PUBLISH and DISCONNECT may carry one) or there is none."""
        if reason and self.version == MQTT_5 and self._problem_information:
            return Properties(reason_string=reason)
        return NO_PROPERTIES

    @property
    def _problem_information(self) -> bool:
        connect = self._connect
        return connect is None or connect.properties.request_problem_information != 0

    def closed_by_operator(self) -> None:
        self._disconnect(reasons.ADMINISTRATIVE_ACTION, "closed by the operator")

    def taken_over(self) -> None:
        """A newer connection took this client identifier's session (3.1.4 step 3)."""
        self._disconnect(reasons.SESSION_TAKEN_OVER, "another connection took the session over")

    # ------------------------------------------------------------------ flow control

    def pauseProducing(self) -> None:
        self.congested = True
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self.congested = False
        if not self.closed:
            self.transport.resumeProducing()
            if self.session is not None:
                self.session.send_queued()  # also resumes the retained messages

    def stopProducing(self) -> None:
        self.congested = True

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if self.closed or self._decoder is None:
            return
        self.heard = True
        packets, error = self._decoder.feed(data)
        if self._logging_in:
            self._pending.extend(packets)
            if error is not None:
                self._pending.append(error)
            return
        self._handle(packets, error)

    def _handle(self, packets: Sequence[object], error: reasons.MQTTProtocolError | None) -> None:
        try:
            self._handle_packets(packets)
        finally:
            if self._held is not None:
                self._release_held()
        if self.closed:
            return
        if self._run:
            self._publish_run()
        if error is not None and not self.closed:
            if self._logging_in:
                self._pending.append(error)
            else:
                self._refuse_input(error)

    def _handle_packets(self, packets: Sequence[object]) -> None:
        for packet in packets:
            if self.closed:
                return
            if self._logging_in:
                self._pending.append(packet)
                continue
            if isinstance(packet, reasons.MQTTProtocolError):
                self._refuse_input(packet)
                return
            kind = type(packet)
            if kind is not Publish and self._run:
                self._publish_run()  # what came before it is routed and answered first
            if kind in _HOLDING:
                if self._held is None:
                    self._held = []
            elif self._held is not None:
                self._release_held()
            handler = _HANDLERS.get(kind)
            if handler is None:
                self._disconnect(reasons.PROTOCOL_ERROR, f"{kind.__name__} is not handled")
                return
            handler(self, packet)

    def write_now(self, data: bytes) -> None:
        """Send ``data`` at once (:class:`DirectWrites`), or while the client's PUBACKs and
        PUBCOMPs of one read are handled, with what the others release, in one send."""
        held = self._held
        if held is None:
            DirectWrites.write_now(self, data)
        else:
            held.append(data)

    def _release_held(self) -> None:
        held, self._held = self._held, None
        if held:
            DirectWrites.write_now(self, held[0] if len(held) == 1 else b"".join(held))

    def _refuse_input(self, error: reasons.MQTTProtocolError) -> None:
        """Bad bytes: the v5 DISCONNECT with the codec's reason code (or the CONNACK that
        refuses the protocol version); 3.1.1 closes."""
        if self.session is None:
            if error.reason_code == reasons.UNSUPPORTED_PROTOCOL_VERSION:
                # 3.1.2.2: answer 0x01 in the 3.1.1 form (0x84 for a v5 client) and close.
                version = error.version or MQTT_311
                self._write_connack(False, reasons.UNSUPPORTED_PROTOCOL_VERSION, NO_PROPERTIES, version)
            elif error.packet_type == 1 and (error.version == MQTT_5 or error.reason_code in _V3_CONNACK_FOR):
                # A CONNECT that breaks the rules: v5 says why in the CONNACK; 3.1.1 has a return
                # code for an identifier it refuses ([MQTT-3.1.3-8]), else it just closes.
                self._write_connack(False, error.reason_code, NO_PROPERTIES, error.version or MQTT_311)
            self._close()
            return
        self._disconnect(error.reason_code, str(error))

    # ------------------------------------------------------------------ the rest

    def do_PINGREQ(self, packet: Pingreq) -> None:
        self.transport.write(PINGRESP)

    def do_DISCONNECT(self, packet: Disconnect) -> None:
        session = self.session
        expiry = packet.properties.session_expiry_interval
        if expiry is not None and session is not None:
            if session.expiry == 0 and expiry:
                self._disconnect(reasons.PROTOCOL_ERROR, "a session that ends with its connection cannot be kept at DISCONNECT")
                return
            session.expiry = min(expiry, self.factory.settings.mqtt_max_session_expiry)
        self._normal_end = packet.reason_code != reasons.DISCONNECT_WITH_WILL_MESSAGE
        self._close()

    def do_AUTH(self, packet: Auth) -> None:
        self._disconnect(reasons.PROTOCOL_ERROR, "no enhanced authentication was begun")


# The decoder's packet classes and their packet names (brokerd.protocols.dispatch): one
# ``do_<PACKET>`` each, looked up once here.
_PACKETS: dict[Hashable, str] = {
    Connect: "CONNECT", Publish: "PUBLISH", Puback: "PUBACK", Pubrec: "PUBREC", Pubrel: "PUBREL",
    Pubcomp: "PUBCOMP", Subscribe: "SUBSCRIBE", Unsubscribe: "UNSUBSCRIBE", Disconnect: "DISCONNECT",
    Pingreq: "PINGREQ", Auth: "AUTH",
}
_HANDLERS: dict[type, Callable[..., None]] = command_table(MQTTServerProtocol, _PACKETS)


_HOLDING = frozenset((Puback, Pubcomp))
"""Acknowledgements whose handling writes only through :meth:`MQTTServerProtocol.write_now`."""


class MQTTServerFactory(Factory[MQTTServerProtocol]):
    """One per MQTT listener; the sessions are the front end's, shared by its listeners
    through :class:`MQTTSessions`."""

    protocol = MQTTServerProtocol
    _log = Logger()

    def __init__(self, broker: Broker, portal: Portal, settings: Settings, clock: IReactorTime, sessions: MQTTSessions,
                 events: IEventRecorder = NULL_EVENT_LOG) -> None:
        self.broker = broker
        self.portal = portal
        self.settings = settings
        self.clock = clock
        self.events = events
        self.sessions = sessions
        self.liveness = LivenessSweep(clock, 1.0, self._silent)
        """Connections past their CONNECT, closed when silent too long (3.1.2.10)."""
        self.live: dict[MQTTServerProtocol, None] = self.liveness.live
        self.forbidden = 0
        self.refused_properties = 0
        """PUBLISHes refused for their message properties: over --max-user-properties or
        --max-property-bytes, or a payload that is not what its Payload Format Indicator says."""

    def startFactory(self) -> None:
        self.liveness.start()
        self.sessions.listening(True)

    def stopFactory(self) -> None:
        self.liveness.stop()
        self.sessions.listening(False)

    def _silent(self, connection: MQTTServerProtocol, now: float) -> None:
        """Close a connection silent for one and a half times its keep-alive (3.1.2.10), with
        the v5 DISCONNECT 0x8D."""
        if connection.keep_alive and now - connection.last_heard >= 1.5 * connection.keep_alive:
            connection._disconnect(reasons.KEEP_ALIVE_TIMEOUT, "keep-alive timeout")


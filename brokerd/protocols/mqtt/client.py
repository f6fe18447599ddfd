"""A Twisted MQTT client (3.1.1 and 5.0), for brokerd's own tools and for any Twisted program.

:class:`MQTTClientProtocol` is one connection.  Bytes go through the sans-IO
:class:`~brokerd.protocols.mqtt.decoder.MQTTClientDecoder`, bounded by its
``max_packet_size`` (told to a v5 server as our Maximum Packet Size, so it drops what we could
not read instead of costing us the connection).  The protocol sends CONNECT as soon as it is
connected; :meth:`~MQTTClientProtocol.when_connected` fires with the CONNACK, or fails with
:class:`MQTTConnectError` when the server refused.  After that:

- :meth:`~MQTTClientProtocol.subscribe` and :meth:`~MQTTClientProtocol.unsubscribe` fire with
  the SUBACK and UNSUBACK (a SUBACK carries one reason code per filter: some may be refused
  while others are granted, so the caller reads them);
- :meth:`~MQTTClientProtocol.publish` fires when the message's flow is over: at once at QoS 0,
  with the PUBACK at QoS 1, with the PUBCOMP at QoS 2; a v5 acknowledgement with a failure
  reason code fails it with :class:`MQTTReasonCodeError`.  Messages beyond the server's
  Receive Maximum wait here for a free slot rather than being refused by the server;
- incoming PUBLISH packets are answered per QoS (PUBACK; PUBREC, then PUBCOMP on PUBREL) and
  handed to :meth:`~MQTTClientProtocol.on_message` once each (a QoS 2 message the server sends
  again before its PUBREL is acknowledged, not delivered twice).  A handler that returns a
  Deferred holds the message's PUBACK or PUBREC back until it fires, answers staying in the
  order the messages came (4.6); when it fails the connection is dropped unanswered, so a
  server that keeps the session sends the message again (a bridge answers only once it stored
  what it received);
- a ``LoopingCall`` on the injectable ``clock`` sends PINGREQ when nothing else went out for
  half the Keep Alive (the server's, in v5, when it set one), and drops the connection when a
  PINGREQ stays unanswered for a whole Keep Alive;
- :meth:`~MQTTClientProtocol.disconnect` says DISCONNECT (so the server discards the will) and
  closes.

Packet Identifiers are 1-65535, each reused only once its flow is over.  Nothing is kept across
connections: an operation still waiting when the connection is lost fails with the reason, and
is not sent again (a session the server kept may still redeliver to a new connection, which
this client acknowledges as usual).  Enhanced authentication (AUTH) is not supported.

:func:`connect` opens a connection from an endpoint string (:func:`client_endpoint`, which
also does TLS) and fires with the protocol once the CONNACK accepted it.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IAddress, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.errors import BrokerError
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols import endpoints
from brokerd.protocols.closing import ClosedNotifier, abort_connection
from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.reasons import connack_refusal, describe_reason
from brokerd.protocols.mqtt.decoder import MAX_PACKET_SIZE, MQTTClientDecoder
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    PINGREQ_PACKET,
    VERSIONS,
    Acknowledgement,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from brokerd.protocols.nodelay import no_delay

MessageHandler = Callable[[Publish], object]
"""Called with every PUBLISH the server sends (its topic resolved when it came as an alias)."""

MAX_PACKET_ID = 65_535

class MQTTError(BrokerError):
    """The server broke the protocol, or went away saying why (a v5 DISCONNECT), or cannot
    take what was asked of it (a QoS above its maximum, a packet above its size limit)."""


class MQTTConnectError(MQTTError):
    """The CONNACK refused the connection: ``reason_code`` is the byte on the wire (a v5 reason
    code, or a 3.1.1 return code 1-5), ``connack`` the whole packet."""

    def __init__(self, connack: Connack, version: int) -> None:
        self.connack = connack
        self.reason_code = connack.reason_code
        self.version = version
        super().__init__(connack_refusal(connack.reason_code, version, connack.properties.reason_string))


class MQTTReasonCodeError(MQTTError):
    """A v5 PUBACK, PUBREC or PUBCOMP said the message failed: ``packet`` is that
    acknowledgement and ``reason_code`` its code (0x80 and above)."""

    def __init__(self, packet: Acknowledgement) -> None:
        self.packet = packet
        self.reason_code = packet.reason_code
        text = f"{type(packet).__name__.upper()} {describe_reason(packet.reason_code)}"
        if packet.properties.reason_string:
            text += f": {packet.properties.reason_string}"
        super().__init__(text)


def with_bridge_flag(connect: bytes) -> bytes:
    """A 3.1.1 CONNECT with the top bit of its protocol level set (0x84): Mosquitto's bridge
    flag (its ``try_private``), which asks a server that knows it not to send a bridge back
    what the bridge published.  The level follows the fixed header and the protocol name."""
    index = 1
    while connect[index] & 0x80:  # the Remaining Length's continuation bytes
        index += 1
    index += 1 + 6  # its last byte, then the length-prefixed "MQTT"
    return connect[:index] + bytes((connect[index] | 0x80,)) + connect[index + 1:]


class _Flow:
    """One exchange this client started that waits for the server: the packet type it expects
    next (a class) and the Deferred to fire when the exchange is over."""

    __slots__ = ("deferred", "expects", "publish")

    def __init__(self, expects: type, deferred: Deferred, publish: bool) -> None:
        self.expects = expects
        self.deferred = deferred
        self.publish = publish
        """Whether it counts against the server's Receive Maximum (QoS 1 and 2 PUBLISH)."""


class MQTTClientProtocol(ClosedNotifier, Protocol):
    """One MQTT connection seen from the client side (see the module docstring).

    ``version`` is the protocol level, 4 (3.1.1) or 5.  ``clock`` provides the time for the
    keep-alive (a ``Clock`` in tests; the global reactor when None).  ``max_packet_size``
    bounds what the decoder keeps of one incoming packet.  ``bridge`` (3.1.1 only) sends the
    CONNECT with Mosquitto's bridge flag (:func:`with_bridge_flag`).
    """

    _log = Logger()
    factory: MQTTClientFactory | None = None

    def __init__(
        self,
        client_id: str = "",
        *,
        version: int = MQTT_311,
        clean_start: bool = True,
        keep_alive: int = 60,
        username: str | None = None,
        password: bytes | str | None = None,
        will: Will | None = None,
        properties: Properties = NO_PROPERTIES,
        on_message: MessageHandler | None = None,
        clock: IReactorTime | None = None,
        max_packet_size: int = MAX_PACKET_SIZE,
        bridge: bool = False,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"MQTT protocol level 4 (3.1.1) or 5, not {version!r}")
        if not 0 <= keep_alive <= MAX_PACKET_ID:
            raise ValueError(f"Keep Alive is 0-65535 seconds, not {keep_alive!r}")
        if isinstance(password, str):
            password = password.encode("utf-8")
        if version == MQTT_5 and properties.maximum_packet_size is None:
            properties = replace(properties, maximum_packet_size=max_packet_size)
        self.version = version
        self.client_id = client_id
        """As given, or the identifier a v5 server assigned (Assigned Client Identifier)."""
        self._connect = Connect(client_id, clean_start, keep_alive, will, username, password, properties)
        self._connect_bytes = encode(self._connect, version)  # ValueError now, not once connected
        if bridge and version == MQTT_311:
            self._connect_bytes = with_bridge_flag(self._connect_bytes)
        self.keep_alive = keep_alive
        """Seconds: as asked for, then the server's Server Keep Alive when a v5 server set one."""
        self._on_message = on_message
        self._clock: Any = clock
        self._decoder = MQTTClientDecoder(version, max_packet_size)
        self.connack: Connack | None = None
        """The CONNACK that accepted the connection."""
        self._connect_waiters: list[Deferred] = []
        self._flows: dict[int, _Flow] = {}
        self._last_packet_id = 0
        self._waiting_publishes: deque[tuple[Publish, Deferred]] = deque()
        self._publishes_in_flight = 0
        self._send_quota = MAX_PACKET_ID
        """The server's Receive Maximum (v5): QoS 1 and 2 PUBLISH packets unacknowledged at once."""
        self._maximum_qos = 2
        self._retain_available = True
        self._server_maximum_packet_size: int | None = None
        self._incoming_qos2: set[int] = set()
        """Packet Identifiers of QoS 2 messages delivered whose PUBREL has not come yet."""
        self._answers: deque[list[Any]] = deque()
        """[ready, bytes] of PUBACKs and PUBRECs in the order their messages came: a handler's
        Deferred holds its answer (and those after it) back until it fires."""
        self._aliases: dict[int, str] = {}
        self._pings: deque[tuple[float, Deferred]] = deque()
        self._keep_alive_call: LoopingCall | None = None
        self._last_sent = 0.0
        self._usable = False
        self._reading = True
        self._error: BaseException | None = None
        """Why the connection ended when we know better than the transport (a refusal, a
        server's DISCONNECT, a protocol violation): what still-waiting Deferreds fail with."""
        self._lost: BaseException | None = None
        self._lost_waiters: list[Deferred] = []

    @property
    def is_open(self) -> bool:
        """True while packets can be sent: connected, and neither closing nor closed."""
        return self._usable

    @property
    def is_connected(self) -> bool:
        """True once the CONNACK accepted the connection, while it is open."""
        return self._usable and self.connack is not None

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        no_delay(self.transport)
        if self._clock is None:
            from twisted.internet import reactor

            self._clock = reactor
        self._usable = True
        self._send(self._connect_bytes)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Fail whatever still waits for the server: it may or may not have reached it."""
        self._usable = False
        self._reading = False
        self._stop_keep_alive()
        failure = Failure(self._error) if self._error is not None else reason
        self._lost = failure.value
        waiting: list[Deferred] = list(self._connect_waiters)
        self._connect_waiters = []
        flows, self._flows = self._flows, {}
        waiting.extend(flow.deferred for flow in flows.values())
        queued, self._waiting_publishes = self._waiting_publishes, deque()
        waiting.extend(d for _packet, d in queued)
        pings, self._pings = self._pings, deque()
        waiting.extend(d for _sent, d in pings)
        self._answers.clear()
        for d in waiting:
            if not d.called:
                d.errback(failure)
        self._notify_closed()

    def when_connected(self) -> Deferred:
        """Fires with the CONNACK once it accepted the connection; fails with
        :class:`MQTTConnectError` when it refused, or with the reason the connection was lost
        before it came."""
        if self.connack is not None:
            return succeed(self.connack)
        if self._lost is not None:
            return fail(self._lost)
        d: Deferred = Deferred()
        self._connect_waiters.append(d)
        return d

    def disconnect(
        self, reason_code: int = reasons.NORMAL_DISCONNECTION, properties: Properties = NO_PROPERTIES
    ) -> Deferred:
        """Send DISCONNECT (v5: with ``reason_code``; 0x04 asks the server to publish the will
        all the same) and close; fires once the connection is gone.  Whatever still waits for
        the server fails."""
        d = self.when_closed()
        if self._usable:
            data = encode(Disconnect(reason_code, properties), self.version)
            self._send(data)
            self._usable = False
            self._stop_keep_alive()
            self._reading = False
            self._made().loseConnection()
        return d

    def abort(self) -> None:
        """Drop the connection now, without DISCONNECT (the server then publishes the will)."""
        self._usable = False
        self._reading = False
        self._stop_keep_alive()
        if self.transport is not None and self._lost is None:
            abort_connection(self.transport)

    def _violation(self, why: str, reason_code: int = reasons.PROTOCOL_ERROR) -> None:
        """The server broke MQTT: say so (v5 DISCONNECT) and close; every waiting Deferred
        fails with an MQTTError saying why."""
        self._log.warn("MQTT server broke the protocol, closing: {why}", why=why)
        self._error = MQTTError(f"the server broke MQTT: {why}")
        self._reading = False
        if self.version == MQTT_5 and self._usable:
            if reason_code not in reasons.DISCONNECT_REASONS:
                reason_code = reasons.PROTOCOL_ERROR
            self._usable = False
            self._stop_keep_alive()
            self._made().write(encode(Disconnect(reason_code), MQTT_5))
            self._made().loseConnection()
        else:
            self.abort()

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if not self._reading:
            return
        packets, error = self._decoder.feed(data)
        for packet in packets:
            if not self._reading:
                return
            self._packet_received(packet)
        if error is not None and self._reading:
            self._violation(str(error), error.reason_code)

    def _packet_received(self, packet: Packet) -> None:
        name = type(packet).__name__.upper()
        if self.connack is None:
            if isinstance(packet, Connack):
                self._connack(packet)
            elif isinstance(packet, Auth):
                self._violation("AUTH, but this client does not do enhanced authentication")
            else:
                self._violation(f"{name} before CONNACK")
            return
        match packet:
            case Publish():
                self._publish_received(packet)
            case Pubrel():
                self._pubrel_received(packet)
            case Puback() | Pubrec() | Pubcomp() | Suback() | Unsuback():
                self._answer_received(packet)
            case Pingresp():
                if self._pings:
                    sent, d = self._pings.popleft()
                    d.callback(self._clock.seconds() - sent)
            case Disconnect():
                self._server_disconnected(packet)
            case Connack():
                self._violation("a second CONNACK")
            case _:
                self._violation(f"{name}, which this client does not support")

    def _connack(self, connack: Connack) -> None:
        if connack.reason_code != reasons.SUCCESS:
            self._error = MQTTConnectError(connack, self.version)
            self._reading = False
            waiters, self._connect_waiters = self._connect_waiters, []
            for d in waiters:
                if not d.called:
                    d.errback(self._error)
            self._usable = False
            self._made().loseConnection()
            return
        self.connack = connack
        if self.version == MQTT_5:
            properties = connack.properties
            if properties.server_keep_alive is not None:
                self.keep_alive = properties.server_keep_alive
            if properties.assigned_client_identifier is not None:
                self.client_id = properties.assigned_client_identifier
            if properties.receive_maximum is not None:
                self._send_quota = properties.receive_maximum
            if properties.maximum_qos is not None:
                self._maximum_qos = properties.maximum_qos
            if properties.retain_available is not None:
                self._retain_available = bool(properties.retain_available)
            self._server_maximum_packet_size = properties.maximum_packet_size
        if self.keep_alive:
            self._keep_alive_call = LoopingCall(self._keep_alive_tick)
            self._keep_alive_call.clock = self._clock
            self._keep_alive_call.start(self.keep_alive / 2, now=False)
        waiters, self._connect_waiters = self._connect_waiters, []
        for d in waiters:
            if not d.called:  # a cancelled wait (connect() given up) is over already
                d.callback(connack)

    def _server_disconnected(self, packet: Disconnect) -> None:
        """A v5 server says goodbye, with a reason; it closes the connection next."""
        text = describe_reason(packet.reason_code)
        if packet.properties.reason_string:
            text += f": {packet.properties.reason_string}"
        self._log.info("The MQTT server disconnected: {why}", why=text)
        self._error = MQTTError(f"the server disconnected: {text}")
        self._reading = False
        self._usable = False
        self._stop_keep_alive()
        self._made().loseConnection()

    def _publish_received(self, packet: Publish) -> None:
        alias = packet.properties.topic_alias
        if alias is not None:
            if packet.topic:
                self._aliases[alias] = packet.topic
            elif alias in self._aliases:
                packet.topic = self._aliases[alias]
            else:
                self._violation(f"Topic Alias {alias} was never set", reasons.TOPIC_ALIAS_INVALID)
                return
        qos = packet.qos
        if qos == 2:
            packet_id = packet.packet_id
            assert packet_id is not None  # the decoder refuses a QoS 2 PUBLISH without one
            handled = None
            if packet_id not in self._incoming_qos2:
                self._incoming_qos2.add(packet_id)
                handled = self._deliver(packet)
            self._answer(Pubrec(packet_id), handled)
            return
        handled = self._deliver(packet)
        if qos == 1:
            assert packet.packet_id is not None  # as at QoS 2
            self._answer(Puback(packet.packet_id), handled)
        elif handled is not None:
            handled.addErrback(self._not_handled, packet)

    def _answer(self, answer: Puback | Pubrec, handled: Deferred | None) -> None:
        """Send ``answer`` once ``handled`` fired (now when None), after those before it."""
        entry = [handled is None, encode(answer, self.version)]
        self._answers.append(entry)
        if handled is None:
            self._send_answers()
            return

        def done(_result: object) -> None:
            entry[0] = True
            self._send_answers()

        def failed(failure: Failure) -> None:
            self._log.warn("Handling MQTT message {id} failed ({error}); the connection is dropped unanswered",
                           id=answer.packet_id, error=failure.getErrorMessage())
            if self._usable:
                self._error = MQTTError(f"the message handler failed: {failure.getErrorMessage()}")
                self.abort()

        handled.addCallbacks(done, failed)

    def _send_answers(self) -> None:
        answers = self._answers
        ready = []
        while answers and answers[0][0]:
            ready.append(answers.popleft()[1])
        if ready and self._usable:
            self._send(b"".join(ready))

    def _not_handled(self, failure: Failure, packet: Publish) -> None:
        self._log.failure("Handling MQTT message {packet!r}", failure, packet=packet)

    def _pubrel_received(self, packet: Pubrel) -> None:
        """The server's QoS 2 message is released: forget its identifier, say PUBCOMP (v5:
        0x92 when we never had it, as after a reconnect to a session the server kept)."""
        if packet.packet_id in self._incoming_qos2:
            self._incoming_qos2.discard(packet.packet_id)
            code = reasons.SUCCESS
        else:
            code = reasons.PACKET_IDENTIFIER_NOT_FOUND if self.version == MQTT_5 else reasons.SUCCESS
        self._send(encode(Pubcomp(packet.packet_id, code), self.version))

    def _deliver(self, packet: Publish) -> Deferred | None:
        """Hand ``packet`` to :meth:`on_message`; the Deferred it returned, if any."""
        try:
            handled = self.on_message(packet)
        except Exception:  # noqa: BLE001 - the application's bug must not cost the connection
            self._log.failure("Handling MQTT message {packet!r}", packet=packet)
            return None
        return handled if isinstance(handled, Deferred) else None

    def on_message(self, packet: Publish) -> object:
        """A message arrived (answered by the protocol itself, once a Deferred returned here
        fired).  Override it, or give the protocol or its factory an ``on_message`` callable."""
        handler = self._on_message
        if handler is None:
            handler = getattr(self.factory, "on_message", None)
        if handler is not None:
            return handler(packet)
        return None

    def _answer_received(self, packet: Acknowledgement | Suback | Unsuback) -> None:
        flow = self._flows.get(packet.packet_id)
        kind = type(packet)
        if flow is None:
            if kind is Pubrec and self.version == MQTT_5:
                # Not ours (a session the server kept from an earlier connection): end its flow.
                self._send(encode(Pubrel(packet.packet_id, reasons.PACKET_IDENTIFIER_NOT_FOUND), MQTT_5))
            elif kind is Pubrec:
                self._send(encode(Pubrel(packet.packet_id), MQTT_311))
            else:
                self._log.info("Ignored {packet!r}: no exchange has that identifier", packet=packet)
            return
        if kind is not flow.expects:
            self._violation(
                f"{kind.__name__.upper()} for packet {packet.packet_id}, which waits for "
                f"{flow.expects.__name__.upper()}"
            )
            return
        if isinstance(packet, Pubrec):
            if packet.reason_code >= 0x80:
                self._end_flow(packet.packet_id, MQTTReasonCodeError(packet))
            else:
                flow.expects = Pubcomp
                self._send(encode(Pubrel(packet.packet_id), self.version))
            return
        if isinstance(packet, (Puback, Pubcomp)) and packet.reason_code >= 0x80:
            self._end_flow(packet.packet_id, MQTTReasonCodeError(packet))
            return
        self._end_flow(packet.packet_id, packet)

    def _end_flow(self, packet_id: int, result: object) -> None:
        flow = self._flows.pop(packet_id)
        if flow.publish:
            self._publishes_in_flight -= 1
        if isinstance(result, BaseException):
            flow.deferred.errback(result)
        else:
            flow.deferred.callback(result)
        self._send_waiting()

    # ------------------------------------------------------------------ output

    def _send(self, data: bytes) -> None:
        self._last_sent = self._clock.seconds()
        self._made().write(data)

    def _not_ready(self) -> Deferred | None:
        """A failed Deferred when nothing can be sent yet or any more, else None."""
        if not self._usable:
            return fail(self._lost or ConnectionClosed("the MQTT connection is not open"))
        if self.connack is None:
            return fail(MQTTError("not connected yet: wait for when_connected()"))
        return None

    def _new_packet_id(self) -> int | None:
        """The next Packet Identifier no exchange uses, or None when all 65,535 are taken."""
        if len(self._flows) >= MAX_PACKET_ID:
            return None
        packet_id = self._last_packet_id
        while True:
            packet_id = packet_id % MAX_PACKET_ID + 1
            if packet_id not in self._flows:
                self._last_packet_id = packet_id
                return packet_id

    def _start_flow(self, make: Callable[[int], Packet], expects: type) -> Deferred:
        """Send the packet ``make(packet_id)`` builds and wait for its ``expects`` answer."""
        failed = self._not_ready()
        if failed is not None:
            return failed
        packet_id = self._new_packet_id()
        if packet_id is None:
            return fail(MQTTError("all 65535 Packet Identifiers are in use"))
        data = encode(make(packet_id), self.version)
        d: Deferred = Deferred()
        self._flows[packet_id] = _Flow(expects, d, publish=False)
        self._send(data)
        return d

    def subscribe(
        self, filters: Iterable[tuple[str, int] | Subscription], properties: Properties = NO_PROPERTIES
    ) -> Deferred:
        """SUBSCRIBE to each ``(topic filter, maximum QoS)`` (or v5 :class:`Subscription`, for
        its options); fires with the :class:`Suback`, one reason code per filter in order: the
        granted QoS, or 0x80 and above for a filter the server refused."""
        subscriptions = tuple(
            item if isinstance(item, Subscription) else Subscription(item[0], item[1]) for item in filters
        )
        encode(Subscribe(1, subscriptions, properties), self.version)  # ValueError before anything is sent
        return self._start_flow(lambda packet_id: Subscribe(packet_id, subscriptions, properties), Suback)

    def unsubscribe(self, filters: Iterable[str], properties: Properties = NO_PROPERTIES) -> Deferred:
        """UNSUBSCRIBE from the topic filters; fires with the :class:`Unsuback` (v5: one reason
        code per filter, 0x11 for a subscription that did not exist)."""
        topic_filters = tuple(filters)
        encode(Unsubscribe(1, topic_filters, properties), self.version)
        return self._start_flow(lambda packet_id: Unsubscribe(packet_id, topic_filters, properties), Unsuback)

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties = NO_PROPERTIES,
    ) -> Deferred:
        """PUBLISH ``payload`` (str is sent as UTF-8) to ``topic``; fires once the flow is over:
        with None at QoS 0 (written), the :class:`Puback` at QoS 1, the :class:`Pubcomp` at
        QoS 2.  ValueError or TypeError, before anything is sent, for what MQTT cannot carry;
        a failed Deferred (:class:`MQTTError`) for what this server said it would not take."""
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        packet = Publish(topic, payload, qos, retain, packet_id=1 if qos else None, properties=properties)
        data = encode(packet, self.version)
        failed = self._not_ready()
        if failed is not None:
            return failed
        if qos > self._maximum_qos:
            return fail(MQTTError(f"the server takes messages of QoS {self._maximum_qos} at most, not {qos}"))
        if retain and not self._retain_available:
            return fail(MQTTError("the server does not keep retained messages"))
        limit = self._server_maximum_packet_size
        if limit is not None and len(data) > limit:
            return fail(MQTTError(f"a PUBLISH of {len(data)} bytes; the server takes {limit} at most"))
        if qos == 0:
            self._send(data)
            return succeed(None)
        d: Deferred = Deferred()
        self._waiting_publishes.append((packet, d))
        self._send_waiting()
        return d

    def _send_waiting(self) -> None:
        """Send the QoS 1 and 2 messages that wait, as far as the server's Receive Maximum and
        the free Packet Identifiers allow."""
        while self._waiting_publishes and self._publishes_in_flight < self._send_quota and self._usable:
            packet_id = self._new_packet_id()
            if packet_id is None:
                return
            packet, d = self._waiting_publishes.popleft()
            packet.packet_id = packet_id
            self._flows[packet_id] = _Flow(Puback if packet.qos == 1 else Pubrec, d, publish=True)
            self._publishes_in_flight += 1
            self._send(encode(packet, self.version))

    def ping(self) -> Deferred:
        """Send PINGREQ; fires with the round trip in seconds (on ``clock``) at its PINGRESP."""
        failed = self._not_ready()
        if failed is not None:
            return failed
        d: Deferred = Deferred()
        self._pings.append((self._clock.seconds(), d))
        self._send(encode(PINGREQ_PACKET, self.version))
        return d

    # ------------------------------------------------------------------ keep-alive

    def _keep_alive_tick(self) -> None:
        """Every half Keep Alive: drop a server that left a PINGREQ unanswered for a whole one
        ([MQTT-3.1.2-24] lets the server wait one and a half before it gives up on us), else
        PINGREQ when nothing went out for half of one, so no gap exceeds the Keep Alive."""
        now = self._clock.seconds()
        if self._pings:
            if now - self._pings[0][0] >= self.keep_alive:
                self._log.warn("No PINGRESP within {seconds} s; closing the connection", seconds=self.keep_alive)
                self._error = MQTTError(f"no PINGRESP within the Keep Alive ({self.keep_alive} s)")
                self.abort()
            return
        if now - self._last_sent >= self.keep_alive / 2 and self._usable:
            self.ping().addErrback(lambda _failure: None)

    def _stop_keep_alive(self) -> None:
        call, self._keep_alive_call = self._keep_alive_call, None
        if call is not None and call.running:
            call.stop()


class MQTTClientFactory(ClientFactory):
    """Builds :class:`MQTTClientProtocol` instances with the same options (the keyword
    arguments of :class:`MQTTClientProtocol`)."""

    protocol = MQTTClientProtocol  # type: ignore[assignment]  # Twisted's Factory[P] wants P.factory set, a client protocol may have none
    noisy = False

    def __init__(self, client_id: str = "", **options: Any) -> None:
        self.client_id = client_id
        self.options = options
        self.on_message = options.get("on_message")
        MQTTClientProtocol(client_id, **options)  # refuse bad options now, not once connected

    def buildProtocol(self, addr: IAddress) -> MQTTClientProtocol:  # type: ignore[override]  # as for protocol
        protocol = self.protocol(self.client_id, **self.options)
        protocol.factory = self
        return protocol


def connect(reactor: IBrokerReactor, endpoint: str | IStreamClientEndpoint, **options: Any) -> Deferred[MQTTClientProtocol]:
    """Connect to the MQTT server at ``endpoint`` (a Twisted client endpoint string, such as
    ``tcp:127.0.0.1:1883``, or an endpoint) and fire with the :class:`MQTTClientProtocol`
    once its CONNACK accepted the connection.

    ``options`` are :class:`MQTTClientProtocol`'s (``client_id``, ``version``, ``username``,
    ``password``, ``will``, ``keep_alive``, ``on_message``...); ``clock`` defaults to
    ``reactor``.  Fails with :class:`MQTTConnectError` when the server refused, with the
    connection's error when it could not be made; cancelling the Deferred drops the connection.
    """
    if isinstance(endpoint, str):
        endpoint = client_endpoint(reactor, endpoint)
    options.setdefault("clock", reactor)
    factory = MQTTClientFactory(**options)
    return Deferred.fromCoroutine(_connected(endpoint, factory))


async def _connected(endpoint: IStreamClientEndpoint, factory: MQTTClientFactory) -> MQTTClientProtocol:
    protocol = cast(MQTTClientProtocol, await endpoint.connect(factory))  # what the factory built
    try:
        await protocol.when_connected()
    except BaseException:
        protocol.abort()
        raise
    return protocol


def client_endpoint(
    reactor: IBrokerReactor | None,
    description: str,
    *,
    tls: bool = False,
    hostname: str | None = None,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> IStreamClientEndpoint:
    """The endpoint for a Twisted client endpoint string (``tcp:HOST:PORT``, ``unix:PATH``...;
    ``clientFromString``), wrapped in TLS when ``tls`` is set: the server is verified as
    ``hostname`` (by default the host of a ``tcp:`` description) against ``ca`` (the system's
    trust store when None), and ``cert`` (its key in ``key``, or in the same file) is presented.
    ValueError for a description Twisted cannot parse; ConfigurationError for unreadable
    certificate files."""
    return endpoints.client_endpoint(
        reactor,
        description,
        tls=tls,
        hostname=hostname or None,
        ca=ca,
        cert=cert,
        key=key,
        default_host=endpoints.endpoint_host,
    )

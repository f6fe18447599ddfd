"""MQTT bridges: this broker connects to another MQTT broker as a client and carries the
messages of its ``topic`` patterns across, each way (docs/mqtt.md, Bridges; the
configuration is :mod:`.bridges`).

A :class:`Bridge` is a session of the local core of its own (protocol ``bridge``, principal
``sys/bridge/<name>`` of the broker's own SERVICE realm: the operator's configuration is
what lets it publish and subscribe) and one connection to the other broker, made with the
project's MQTT client (:mod:`.client`), remade after a loss with a doubling delay up to the
bridge's ``restart-timeout``.

- **out**: a QoS 0 pattern is a live filter subscription of the core; a QoS 1 or 2 one is a
  durable FILTER subscription whose messages wait in the store (:mod:`.bridgequeue`,
  bounded) until the other broker acknowledged them.  A message goes at the lower of its own
  QoS and the pattern's, to the pattern's topic below the remote prefix.
- **in**: the bridge subscribes there to the patterns below the remote prefix and publishes
  what comes into the core below the local prefix (retained ones retained), and answers the
  other broker (PUBACK, PUBREC) only once the core stored the message for its durable
  subscribers (``Broker.keep``): a message it acknowledged is not lost.
- **loops**: what the bridge brings in carries its marker (protocol ``mqtt``, sender
  ``sys/bridge/<name>``, a name no login can take; a client identifier that copies it only
  keeps that client's own messages in): it is never sent back out over the same bridge, live
  or stored.  On the other broker, a v5 bridge subscribes with No Local, and a
  3.1.1 bridge connects with Mosquitto's bridge flag (protocol level 0x84, ``try-private``),
  tried once without it when that broker refuses the flag.

The state of each bridge and its counts are :meth:`Bridge.status` (``brokerd-ctl status``,
``/metrics``, the ``~sys`` topics).
"""
from __future__ import annotations

import socket
from typing import TypedDict, TypeVar, cast

from twisted.internet.defer import Deferred, fail, gatherResults
from twisted.internet.interfaces import IDelayedCall, IProtocol, IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.config import Settings
from brokerd.core.access import system_topic
from brokerd.core.broker import Broker
from brokerd.core.subscriber import SubscriberId
from brokerd.core.filters import matches
from brokerd.core.message import Message
from brokerd.core.principal import SERVICE, Principal
from brokerd.core.publication import Multicast
from brokerd.core.subscriptions import ADD, FILTER
from brokerd.errors import AlreadySubscribed, BrokerError, ConfigurationError
from brokerd.interfaces import IBrokerReactor, ISubscriber
from brokerd.protocols.mqtt.bridgequeue import BridgeQueue, BridgeWireFormat
from brokerd.protocols.mqtt.bridges import BridgeSpec, TopicRule
from brokerd.protocols.mqtt.client import (
    MQTTClientFactory,
    MQTTClientProtocol,
    MQTTConnectError,
    client_endpoint,
)
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    RETAIN_SEND_IF_NEW,
    Properties,
    Publish,
    Suback,
    Subscription,
)
from brokerd.protocols.mqtt.topics import topic_name_problem
from brokerd.protocols.mqtt.wire import core_message
from brokerd.store.base import log_unless_outage
from brokerd.store.records import Delivery, SubscriptionRecord
from brokerd.twistedio import queued_bytes

FIRST_DELAY = 0.5
"""Seconds before the first reconnection attempt; doubled after each failure up to the
bridge's ``restart-timeout``."""
CONNACK_TIMEOUT = 30.0
"""Seconds a connection may take to be accepted (CONNACK) before it is dropped and retried."""
SENDER_PREFIX = "sys/bridge/"
"""The head of a bridge's sender name (a reserved name: brokerd.core.principal.reserved_name)."""
UNACCEPTABLE_PROTOCOL_VERSION = 1
"""The 3.1.1 CONNACK return code of a broker that does not take the bridge flag."""


_T = TypeVar("_T")


class BridgeStatus(TypedDict):
    """A bridge as ``brokerd-ctl status``, ``/metrics`` and the ``~sys`` topics show it."""

    name: str
    address: str
    state: str
    reason: str
    connects: int
    sent: int
    received: int
    dropped: int
    refused: int
    queued: int
    queued_bytes: int
    queue_dropped: int


def bridge_endpoint(reactor: IBrokerReactor | None, spec: BridgeSpec) -> IStreamClientEndpoint:
    """The client endpoint of ``spec``'s address, with its TLS: ConfigurationError (naming the
    bridge) for an address that is no endpoint or an unusable certificate file, so that the
    broker does not start rather than the bridge failing later.  The start-up check builds it
    without a reactor (parsing and certificate files only)."""
    try:
        return client_endpoint(reactor, spec.address, tls=spec.tls, hostname=spec.tls_hostname, ca=spec.tls_ca,
                               cert=spec.tls_cert, key=spec.tls_key)
    except (ValueError, TypeError, KeyError, ConfigurationError) as exc:
        raise ConfigurationError(f"mqtt-bridge {spec.name}: {exc}") from None


def _topic_of(message: Message) -> str:
    """The local topic of a multicast (the only kind a bridge is handed)."""
    target = message.target
    assert target is not None  # a multicast's topic
    return target.decode("utf-8", "replace")


@implementer(ISubscriber)
class Bridge:
    """One bridge (see the module docstring): a core session and a connection."""

    protocol = "bridge"
    address = None
    _log = Logger()

    def __init__(self, spec: BridgeSpec, broker: Broker, settings: Settings, reactor: IBrokerReactor) -> None:
        self.spec = spec
        self.broker = broker
        self.settings = settings
        self.reactor = reactor
        self.name = (SENDER_PREFIX + spec.name).encode("utf-8")
        self.principal = Principal(SENDER_PREFIX + spec.name, SERVICE)
        self.wire_format = BridgeWireFormat()
        self.client_id = spec.client_id or f"{socket.gethostname()}.{spec.name}"
        self.outgoing = [rule for rule in spec.topics if rule.outgoing]
        self.incoming = [rule for rule in spec.topics if rule.incoming]
        self.durable_name: str | None = None
        """The core's durable subscriber of the QoS 1 and 2 ``out`` patterns (None: none, or no store)."""
        self.queue: BridgeQueue | None = None
        self.client: MQTTClientProtocol | None = None
        self.state = "stopped"
        self.reason = ""
        self.counts = {"connects": 0, "sent": 0, "received": 0, "dropped": 0, "refused": 0}
        self.inflight: dict[int, Delivery] = {}
        """Stored deliveries published to the other broker and not acknowledged yet, by seq."""
        self._password = spec.password()
        self._endpoint = bridge_endpoint(reactor, spec)
        self._private = spec.try_private and spec.protocol == MQTT_311
        self._delay = FIRST_DELAY
        self._timer: IDelayedCall | None = None
        self._running = False

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._running = True
        self.broker.attach(self)
        stored_rules = [rule for rule in self.outgoing if rule.qos > 0]
        durable = self.broker.durable
        for rule in self.outgoing:
            if rule.qos == 0 or durable is None:
                self._subscribe_live(rule)
        if durable is None:
            if stored_rules:
                self._log.warn("MQTT bridge {name}: no store, so its QoS 1 and 2 out patterns are forwarded live "
                               "only (nothing waits for the other broker)", name=self.spec.name)
            self._connect()
            return
        if stored_rules:
            self.durable_name = SubscriberId(self.principal, "bridge", self.spec.name, "1").encode()
        # The connection waits for the store: what comes in is then stored for the durable
        # subscribers (it is acknowledged as kept), and what goes out was subscribed to first.
        d = durable.when_started().addCallbacks(
            lambda _: self._open_queue(stored_rules) if stored_rules else None, self._no_store)
        d.addBoth(lambda _: self._connect())

    def stop(self) -> Deferred | None:
        self._running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        self.broker.detach(self)
        self._set_state("stopped")
        client, self.client = self.client, None
        if client is not None and client.is_open:
            return client.disconnect()
        return None

    def _subscribe_live(self, rule: TopicRule) -> None:
        try:
            self.broker.subscribe_filter(self, rule.local_filter.encode("utf-8"))
        except AlreadySubscribed:
            pass  # two patterns, one filter
        except (BrokerError, ValueError) as exc:
            self._log.warn("MQTT bridge {name}: cannot subscribe to {filter} here: {error}", name=self.spec.name,
                           filter=rule.local_filter, error=exc)

    def _open_queue(self, rules: list[TopicRule]) -> Deferred | None:
        """The store is read: make the durable subscriptions the configuration names (and
        end those it no longer does), then attach the queue.  Fires once they are committed."""
        durable = self.broker.durable
        name = self.durable_name
        if not self._running or durable is None or name is None:
            return None
        wanted: dict[str, int] = {}
        for rule in rules:
            wanted[rule.local_filter] = max(rule.qos, wanted.get(rule.local_filter, 0))
        existing = {sub.record.topic: sub for sub in durable.index.of(name) if sub.record.kind == FILTER}
        extra = [sub for topic, sub in existing.items() if topic not in wanted]
        if extra:
            durable.unsubscribe(name, extra, lambda _sub: ()).addErrback(
                log_unless_outage, self._log, "Ending an old subscription of MQTT bridge {name}", name=self.spec.name)
        commits = []
        for topic_filter, qos in wanted.items():
            changes = (ADD, f"q{qos}")
            sub = existing.get(topic_filter)
            if sub is None or tuple(sub.record.changes) != changes:
                record = SubscriptionRecord(name, FILTER, topic_filter, changes)
                commits.append(durable.subscribe(record, []).addErrback(
                    log_unless_outage, self._log, "Storing a subscription of MQTT bridge {name}", name=self.spec.name))
        self.queue = BridgeQueue(self, durable, self.settings.max_output_buffer, self.spec.max_queued,
                                 self.spec.max_queued_bytes)
        self.queue.open()
        durable.start_sweeps()  # expiry and dead letters, which a node without MQTT or SMQP listener would not run
        return gatherResults(commits) if commits else None

    def _no_store(self, failure: Failure) -> None:
        self._log.warn("MQTT bridge {name}: the store did not open ({error}); nothing is kept for the other broker",
                       name=self.spec.name, error=failure.getErrorMessage())

    def status(self) -> BridgeStatus:
        queue, counts = self.queue, self.counts
        return {"name": self.spec.name, "address": self.spec.address, "state": self.state, "reason": self.reason,
                "connects": counts["connects"], "sent": counts["sent"], "received": counts["received"],
                "dropped": counts["dropped"], "refused": counts["refused"],
                "queued": queue.queued if queue is not None else 0,
                "queued_bytes": queue.counted_bytes if queue is not None else 0,
                "queue_dropped": queue.dropped if queue is not None else 0}

    def _set_state(self, state: str, reason: str = "") -> None:
        self.reason = reason
        if state != self.state:
            self.state = state
            self._log.info("MQTT bridge {name} ({address}) is {state}{reason}", name=self.spec.name,
                           address=self.spec.address, state=state, reason=f": {reason}" if reason else "")

    # ------------------------------------------------------------------ the connection

    def _factory(self) -> MQTTClientFactory:
        spec = self.spec
        properties = NO_PROPERTIES
        if spec.protocol == MQTT_5 and not spec.clean_session:
            properties = Properties(session_expiry_interval=spec.session_expiry)
        return MQTTClientFactory(
            self.client_id, version=spec.protocol, clean_start=spec.clean_session, keep_alive=spec.keepalive,
            username=spec.username, password=self._password, properties=properties, on_message=self._received,
            clock=self.reactor, max_packet_size=self.settings.mqtt_max_packet_size, bridge=self._private)

    def _connect(self) -> None:
        self._timer = None
        if not self._running:
            return
        self._set_state("connecting")
        d = self._endpoint.connect(self._factory())
        d.addCallback(self._accepted)
        d.addCallbacks(self._connected, self._failed)

    def _accepted(self, built: IProtocol) -> Deferred[MQTTClientProtocol]:
        """Wait for the CONNACK, at most :data:`CONNACK_TIMEOUT` seconds."""
        client = cast(MQTTClientProtocol, built)  # what MQTTClientFactory builds
        timer = self.reactor.callLater(CONNACK_TIMEOUT, client.abort)

        def answered(result: _T) -> _T:
            if timer.active():
                timer.cancel()
            return result

        return client.when_connected().addBoth(answered).addCallback(lambda _connack: client)

    def _connected(self, client: MQTTClientProtocol) -> None:
        if not self._running:
            client.disconnect()
            return
        self.client = client
        client.when_closed().addBoth(self._lost, client)
        self.counts["connects"] += 1
        self._delay = FIRST_DELAY
        if self.queue is not None:
            self.queue.refresh()
        wanted: dict[str, int] = {}
        for rule in self.incoming:
            wanted[rule.remote_filter] = max(rule.qos, wanted.get(rule.remote_filter, 0))
        if wanted:
            if self.spec.protocol == MQTT_5:
                filters: list[tuple[str, int] | Subscription] = [Subscription(topic_filter, qos, no_local=True, retain_as_published=True,
                                                   retain_handling=RETAIN_SEND_IF_NEW)
                                      for topic_filter, qos in wanted.items()]
            else:
                filters = list(wanted.items())
            d = client.subscribe(filters)
            d.addCallbacks(self._subscribed, lambda _failure: None, callbackArgs=(client, list(wanted)))
        else:
            self._set_state("up")

    def _subscribed(self, suback: Suback, client: MQTTClientProtocol, filters: list[str]) -> None:
        """The other broker answered the subscriptions of the ``in`` patterns: the bridge is up."""
        if client is self.client:
            self._set_state("up")
        for topic_filter, code in zip(filters, suback.reason_codes):
            if code >= 0x80:
                self.counts["refused"] += 1
                self._log.warn("MQTT bridge {name}: the other broker refused the subscription to {filter} ({code})",
                               name=self.spec.name, filter=topic_filter, code=f"0x{code:02X}")

    def _failed(self, failure: Failure) -> None:
        error = failure.value
        if isinstance(error, MQTTConnectError):
            code = error.reason_code
            if self._private and code == UNACCEPTABLE_PROTOCOL_VERSION:
                self._private = False
                self._log.info("MQTT bridge {name}: the other broker does not take the bridge flag; "
                               "connecting without it", name=self.spec.name)
                self._delay = 0.0
            self._set_state("refused", failure.getErrorMessage())
        else:
            self._set_state("down", failure.getErrorMessage())
        self._retry()

    def _lost(self, result: object, client: MQTTClientProtocol) -> None:
        if client is not self.client:
            return
        self.client = None
        if self.queue is not None:
            self.queue.disconnected()
        reason = result.getErrorMessage() if isinstance(result, Failure) else "connection closed"
        self._set_state("down", reason)
        self._retry()

    def _retry(self) -> None:
        if not self._running or self._timer is not None:
            return
        delay, self._delay = self._delay, min(max(self._delay * 2, FIRST_DELAY), self.spec.restart_timeout)
        self._timer = self.reactor.callLater(delay, self._connect)

    # ------------------------------------------------------------------ in: from the other broker

    def _received(self, packet: Publish) -> Deferred | None:
        """A message from the other broker: published here below the local prefix; the
        Deferred of its storing holds the acknowledgement back (the client's)."""
        local = None
        for rule in self.incoming:
            if matches(rule.remote_filter.encode("utf-8"), packet.topic.encode("utf-8")):
                local = rule.to_local(packet.topic)
                if local is not None:
                    break
        if local is None or topic_name_problem(local) is not None or system_topic(local.encode("utf-8")):
            self.counts["dropped"] += 1
            return None
        message = core_message(local.encode("utf-8"), packet.payload, packet.qos, packet.retain, packet.properties,
                               self.name, self.principal, self.reactor.seconds())
        self.counts["received"] += 1
        publication = Multicast([message], self)
        self.broker.route(publication)  # retained by the router's retain stage, kept by its durable stage
        kept = publication.kept
        if kept is not None and packet.qos == 0:  # no acknowledgement waits for it
            kept.addErrback(log_unless_outage, self._log, "Storing a message of MQTT bridge {name}",
                            name=self.spec.name)
            return None
        return kept

    # ------------------------------------------------------------------ out: to the other broker

    def for_remote(self, message: Message) -> bool:
        """Whether ``message`` may go to the other broker: not what this bridge brought in."""
        return not (message.protocol == "mqtt" and message.sender_name == self.name)

    def out_rule(self, topic: str) -> TopicRule | None:
        """The first ``out`` pattern (in the configuration's order) that matches local ``topic``;
        the broker's ``~sys`` statistics only for a pattern that names them (as Mosquitto's
        bridges leave ``$SYS`` to a ``$SYS/#`` line)."""
        target = topic.encode("utf-8")
        statistics = system_topic(target)
        for rule in self.outgoing:
            if statistics and not system_topic(rule.local_filter.encode("utf-8")):
                continue
            if matches(rule.local_filter.encode("utf-8"), target):
                return rule
        return None

    def send(self, data: bytes) -> None:
        """ISubscriber: live messages of the QoS 0 patterns (and of every pattern without a store)."""
        for message in getattr(data, "items", ()):
            rule = self._live_rule(message)
            if rule is not None:
                self._send_now(message, rule, min(rule.qos, message.qos))

    def deliver(self, message: Message, kept: bool = False) -> None:
        """A message never stored (SMQP's ``Guarantee: NO``) for the stored patterns: sent as it is."""
        rule = self.out_rule(_topic_of(message)) if self.for_remote(message) else None
        if rule is not None:
            self._send_now(message, rule, 0)

    def _live_rule(self, message: Message) -> TopicRule | None:
        if not self.for_remote(message):
            return None
        rule = self.out_rule(_topic_of(message))
        if rule is None or (rule.qos > 0 and self.durable_name is not None):
            return None  # a stored pattern's: it comes from the store
        return rule

    def _send_now(self, message: Message, rule: TopicRule, qos: int) -> None:
        """Publish a live message now, or drop and count it: as a QoS 0 message for a client
        that is away, or whose connection holds more than --max-output-buffer bytes unsent."""
        client = self.client
        if client is None or not client.is_connected:
            self.counts["dropped"] += 1
            return
        queued = queued_bytes(client.transport)
        if queued is not None and queued > self.settings.max_output_buffer:
            self.counts["dropped"] += 1
            return
        self._publish(client, rule, message, qos).addErrback(lambda _failure: None)
        self.counts["sent"] += 1

    def _publish(self, client: MQTTClientProtocol, rule: TopicRule, message: Message, qos: int) -> Deferred:
        topic = rule.to_remote(_topic_of(message))
        properties = NO_PROPERTIES
        if self.spec.protocol == MQTT_5 and (message.content_type is not None or message.expires is not None):
            expiry = None if message.expires is None else max(0, int(message.expires - self.reactor.seconds()))
            properties = Properties(content_type=message.content_type, message_expiry_interval=expiry)
        try:
            return client.publish(topic, message.payload, qos, message.retained, properties)
        except (ValueError, TypeError) as exc:
            return fail(exc)

    # the stored ones: BridgeQueue asks these (IDurableSession's session side, as MQTTSession's)

    def can_send_stored(self) -> bool:
        client = self.client
        return client is not None and client.is_connected and len(self.inflight) < self.settings.mqtt_max_inflight

    def stored_in_flight(self) -> set[int]:
        return set(self.inflight)

    def send_stored(self, message: Message, delivery: Delivery) -> bool:
        """Publish stored ``message`` there; True when it waits for the acknowledgement,
        False when it is done already (sent at QoS 0, expired, no pattern, our own)."""
        expires = message.expires
        if expires is not None and expires <= self.reactor.seconds():
            return False
        rule = self.out_rule(_topic_of(message)) if self.for_remote(message) else None
        client = self.client
        if rule is None or client is None:
            return False
        # another protocol's message was stored before its publisher was answered: at least once
        qos = min(rule.qos, message.qos if message.protocol == "mqtt" else 1)
        d = self._publish(client, rule, message, qos)
        if qos == 0:
            d.addErrback(lambda _failure: None)
            self.counts["sent"] += 1
            return False
        if d.called:  # failed before anything was sent: a size, QoS or retain the other broker does not take
            d.addErrback(self._refused, delivery)
            return False  # settled by the queue
        self.inflight[delivery.seq] = delivery
        d.addCallbacks(self._acknowledged, self._not_acknowledged, callbackArgs=(delivery,),
                       errbackArgs=(delivery, client))
        return True

    def _acknowledged(self, _answer: object, delivery: Delivery) -> None:
        self.inflight.pop(delivery.seq, None)
        self.counts["sent"] += 1
        queue = self.queue
        if queue is not None:
            queue.settle(delivery)
            queue.pump()

    def _not_acknowledged(self, failure: Failure, delivery: Delivery, client: MQTTClientProtocol) -> None:
        """The connection went (sent again once it is back), or the other broker refused the
        message (a v5 reason code, a QoS or size it does not take): dropped and counted."""
        self.inflight.pop(delivery.seq, None)
        queue = self.queue
        if queue is None:
            return
        if client is self.client and client.is_connected:
            self._refused(failure, delivery)
            queue.settle(delivery)
        else:
            queue.forget(delivery)
        queue.pump()

    def _refused(self, failure: Failure, delivery: Delivery) -> None:
        self.counts["refused"] += 1
        self._log.warn("MQTT bridge {name}: the other broker does not take a message to {topic}: {error}; dropped",
                       name=self.spec.name, topic=delivery.topic, error=failure.getErrorMessage())

    # ISubscriber's rest

    def replaced(self) -> None:
        """A bridge has no address: no other session can take it."""

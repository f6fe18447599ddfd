"""The MQTT front end's sessions by client identifier, and what outlives a connection.

Persistent sessions wait here (attached to the core, so they keep receiving) until they expire;
a CONNECT with a known client identifier takes the session over if it is the same principal's
and is refused otherwise; wills are published from here; retained messages are the core's
(``Broker.retained``).  One instance serves every MQTT listener of the node.
"""
from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.message import Message
from brokerd.core.principal import Principal
from brokerd.core.retained import RetainRefused
from brokerd.errors import (
    Forbidden,
)
from brokerd.protocols.mqtt.packets import (
    Will,
)
from brokerd.protocols.mqtt.session import MQTTSession
from brokerd.protocols.mqtt.wire import core_message, wire_formats
from brokerd.store.base import is_outage


class MQTTSessions:
    """The MQTT front end's sessions by client identifier, and what outlives a connection:
    persistent sessions until they expire, wills, retained messages (the core's)."""

    _log = Logger()

    def __init__(self, broker: Broker, settings: Settings, clock: Any) -> None:
        self.broker = broker
        self.settings = settings
        self.clock = clock
        self.formats = wire_formats(clock.seconds)
        self.by_id: dict[str, MQTTSession] = {}
        self._assigned = 0
        self.refused_retains = 0

    def assign_client_id(self) -> str:
        self._assigned += 1
        return f"brokerd-{id(self) & 0xFFFFFF:06x}-{self._assigned}"

    def open(self, client_id: str, principal: Principal, version: int,
             clean_start: bool) -> tuple[MQTTSession | None, bool]:
        """The session a CONNECT binds to and whether it existed (Session Present); None
        when the identifier is another principal's."""
        existing = self.by_id.get(client_id)
        if existing is not None:
            if existing.principal != principal:
                return None, False
            connection = existing.connection
            if connection is not None:
                connection.taken_over()
                if existing.connection is connection:  # not unbound by the close yet
                    existing.unbind(connection)
                    if connection._will is not None and not connection._normal_end:
                        self.publish_will(existing, connection._will)
                    connection._will = None
            if clean_start or existing.version != version:
                self._end(existing)
            else:
                return existing, True
        session = MQTTSession(client_id, principal, self.formats[version], self.settings.mqtt_max_inflight,
                              self.settings.mqtt_max_queued)
        session.on_replaced = self._replaced_elsewhere
        self.by_id[client_id] = session
        self.broker.attach(session)
        return session, False

    def _replaced_elsewhere(self, session: MQTTSession) -> None:
        """Another node's connection took this client identifier: forget the session here
        (the session there starts empty: sessions are a node's own, docs/mqtt.md)."""
        if self.by_id.get(session.client_id) is session:
            del self.by_id[session.client_id]
        if session.connection is None:
            self._end(session)

    def connection_ended(self, session: MQTTSession) -> None:
        if session.expiry <= 0:
            self._end(session)
            return
        session.expiry_timer = self.clock.callLater(session.expiry, self._expired, session)

    def _expired(self, session: MQTTSession) -> None:
        session.expiry_timer = None
        if session.connection is None:
            self._end(session)

    def _end(self, session: MQTTSession) -> None:
        if self.by_id.get(session.client_id) is session:
            del self.by_id[session.client_id]
        timer = session.will_timer
        if timer is not None and timer.active():  # the session ends before the will's delay
            timer.cancel()
            timer.func(*timer.args)
        if session.expiry_timer is not None and session.expiry_timer.active():
            session.expiry_timer.cancel()
        session.expiry_timer = None
        self.broker.detach(session)
        session.subscriptions.clear()
        session.queued.clear()
        session.inflight.clear()

    def will_of_lost_connection(self, session: MQTTSession, will: Will) -> None:
        """A connection of ``session`` ended without DISCONNECT: publish its will now, or
        (v5 Will Delay Interval) once the delay or the session is over, whichever comes first,
        unless the client is back by then."""
        delay = will.properties.will_delay_interval or 0
        if delay and session.expiry > 0:
            session.will_timer = self.clock.callLater(min(delay, session.expiry), self._will_due, session, will)
        else:
            self.publish_will(session, will)

    def _will_due(self, session: MQTTSession, will: Will) -> None:
        session.will_timer = None
        self.publish_will(session, will)

    def publish_will(self, session: MQTTSession, will: Will) -> None:
        """Publish a connection's will for it (3.1.2.5), if its principal may."""
        target = will.topic.encode("utf-8")
        if not self.broker.may_publish(session.principal, target):
            return
        message = core_message(target, will.payload, will.qos, will.retain, will.properties, session.name,
                               session.principal, self.clock.seconds())
        if will.retain:
            self.retain(message)
        try:
            self.broker.publish(message)
        except Forbidden:
            return
        kept = self.broker.keep([message])
        if kept is not None:
            kept.addErrback(lambda failure: None if is_outage(failure) else self._log.failure(
                "Storing an MQTT will for durable subscribers", failure))

    def retain(self, message: Message) -> None:
        """Keep ``message`` as its topic's retained message (the core's, in the store); a
        retain over the core's limits is dropped and counted."""
        try:
            self.broker.retained.retain(message)
        except RetainRefused:
            self.refused_retains += 1

    def retained_matching(self, topic_filter: bytes) -> list[Message]:
        return self.broker.retained.matching(topic_filter)



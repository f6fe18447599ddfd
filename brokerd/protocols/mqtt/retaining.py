"""The retained messages a new subscription gets (MQTT 5.0 3.3.1.3, 3.8.4; 3.1.1 the same),
sent a page at a time.

A subscription to ``#`` on a node with 100,000 retained topics matches them all: sent in one
go, they held the reactor for a second per SUBSCRIBE, and past ``--max-output-buffer`` the
QoS 0 ones were dropped, the others past ``--mqtt-max-queued``.  Here they go :data:`PAGE` at a
time, one page per reactor turn (``callLater(0)``: every other connection is served between
two pages), each page found by the core without looking at the topics before it
(:meth:`brokerd.core.retained.RetainedMessages.page`), and only while the connection takes
them: a congested connection (its output buffer full) or a session whose window is full (QoS 1
and 2 messages waiting) stops the sending until it takes more (:meth:`RetainedDelivery.resume`,
which the connection and the session call).  So a subscription gets every retained message
it matches, in topic order, however slowly its client reads.

Each page goes through the router as a :class:`brokerd.core.publication.RetainedReplay`, whose
sink this sender is: a message is sent only if the access list lets the subscriber read its
topic, the decision a live message takes, and is counted and reported as a live delivery is
(:meth:`brokerd.core.router.Router.route`).  Only messages whose Message Expiry Interval has not
passed are in a page (v5 3.3.2.3.3; each goes with what is left of it).  Live messages are sent
as they come, between pages: a topic published to while its retained message waits in a later
page gets the live message first.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall, IReactorTime

    from brokerd.protocols.mqtt.connection import MQTTConnection
    from brokerd.protocols.mqtt.session import MQTTSession

from brokerd.core.message import Message
from brokerd.core.publication import RetainedReplay

PAGE = 256
"""Retained messages sent in one reactor turn at most."""
SCAN = 1024
"""Retained topics examined in one reactor turn at most (a filter that matches few of many)."""


class RetainedDelivery:
    """What one connection still has to send of its subscriptions' retained messages: the
    filters in the order they were subscribed, each with the topic it goes on after."""

    def __init__(self, connection: MQTTConnection, session: MQTTSession, clock: IReactorTime) -> None:
        self.connection = connection
        self.session = session
        self.clock = clock
        self._filters: deque[list[Any]] = deque()
        """[filter (str), the topic to go on after (bytes, None: from the start)] each."""
        self._call: IDelayedCall | None = None

    def add(self, topic_filter: str) -> None:
        """Send the retained messages ``topic_filter`` matches (after those of the filters
        added before).  A filter already waiting starts over (a new subscription with it
        replaced the old one, 3.8.4); filters no longer subscribed are left out, so what waits
        is bounded by the subscriptions a session may have."""
        subscribed = self.session.subscriptions
        self._filters = deque(entry for entry in self._filters
                              if entry[0] != topic_filter and entry[0] in subscribed)
        self._filters.append([topic_filter, None])
        self.resume()

    def resume(self) -> None:
        """Send the next page in the next reactor turn, if there is one and the connection
        takes it (called when it may again: its output drained, its window freed)."""
        if self._call is None and self._filters and not self._blocked():
            self._call = self.clock.callLater(0, self._turn)

    def stop(self) -> None:
        """The connection ended: nothing more is sent."""
        self._filters.clear()
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _blocked(self) -> bool:
        connection = self.connection
        return connection.closed or connection.congested or bool(self.session.queued)

    full = _blocked
    """The replay's sink (brokerd.core.publication.ReplaySink): whether the connection takes
    no more now."""

    def send_retained(self, message: Message) -> bool:
        """The replay's sink: queue ``message`` for the session as a retained message; False
        when the session's format cannot carry it."""
        session = self.session
        item = session.wire_format.rendered(message)
        if item is None:
            return False
        session.deliver(item, retained=True)
        return True

    def _turn(self) -> None:
        self._call = None
        connection = self.connection
        session = self.session
        if connection.closed or session.connection is not connection:
            self.stop()
            return
        if self._blocked():
            return  # resumed by the connection or the session when it takes more
        entry = self._filters[0]
        topic_filter, after = entry
        if topic_filter not in session.subscriptions:
            after = None  # unsubscribed meanwhile: its retained messages are not wanted
        else:
            broker = connection.factory.broker
            encoded = topic_filter.encode("utf-8")
            found, after = broker.retained.page(encoded, after, PAGE, SCAN)
            now = self.clock.seconds()
            current = [message for message in found
                       if message.details.expires is None or message.details.expires > now]
            if current:
                taken = broker.route(RetainedReplay(session, encoded, current, self))
                if taken < len(current):
                    after = current[taken - 1].target  # the rest of the page goes when it takes more
        if after is None:
            self._filters.popleft()
        else:
            entry[1] = after
        self.resume()

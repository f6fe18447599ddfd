"""SUBSCRIBE and UNSUBSCRIBE (MQTT 5.0 3.8-3.11; 3.1.1 3.8-3.11): a connection's subscriptions.

A subscription is the core's: a live topic filter or shared group (``Broker.subscribe_filter``),
or, for a stored session's QoS 1 or 2 subscription (:mod:`.stored`), a durable FILTER
subscription in the store, whose SUBACK waits for its commit.  The access list and the
subscription limit decide either way, with the v5 reason codes (3.1.1: 0x80).  Retained
messages the filter matches follow the SUBACK (Retain Handling), a page at a time
(:mod:`.retaining`).  A mixin of
:class:`~.server.MQTTServerProtocol`, which has the connection's state.
"""
from __future__ import annotations

from twisted.internet.defer import Deferred, gatherResults
from twisted.python.failure import Failure

from brokerd.errors import (
    AlreadySubscribed,
    BrokerError,
    Forbidden,
    NotSubscribed,
    SubscriptionLimit,
)
from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.connection import ConnectionBase
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    RETAIN_DO_NOT_SEND,
    RETAIN_SEND_IF_NEW,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from brokerd.protocols.mqtt.retaining import RetainedDelivery
from brokerd.protocols.mqtt.session import MQTTSession, SubscriptionOptions
from brokerd.protocols.mqtt.topics import SharedSubscription, shared_subscription, topic_filter_problem
from brokerd.store.base import log_unless_outage


_REFUSALS = {
    reasons.NOT_AUTHORIZED: "not authorized",
    reasons.QUOTA_EXCEEDED: "over the subscription limit",
    reasons.TOPIC_FILTER_INVALID: "not a valid topic filter",
    reasons.IMPLEMENTATION_SPECIFIC_ERROR: "refused by the broker",
    reasons.UNSPECIFIED_ERROR: "could not be stored",
}


def refusals(codes: tuple[int, ...]) -> str | None:
    """A v5 SUBACK's Reason String: which subscriptions (1 the first) were refused and why."""
    refused = [f"{number}: {_REFUSALS.get(code, f'0x{code:02X}')}"
               for number, code in enumerate(codes, 1) if code >= 0x80]
    return "refused " + "; ".join(refused) if refused else None


class Subscribing(ConnectionBase):
    """The SUBSCRIBE and UNSUBSCRIBE half of an MQTT connection (see the module docstring)."""

    def do_SUBSCRIBE(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        settings = self.factory.settings
        identifiers = packet.properties.subscription_identifiers
        identifier = identifiers[0] if identifiers else None
        codes: list[int] = []
        stored: dict[int, Deferred[int]] = {}  # the SUBACK codes the store decides, by their place in codes
        retained: list[tuple[str, int]] = []
        for subscription in packet.subscriptions:
            topic_filter = subscription.topic_filter
            problem = topic_filter_problem(topic_filter, settings.mqtt_max_topic_length, settings.mqtt_max_topic_levels)
            if problem is not None:
                codes.append(reasons.TOPIC_FILTER_INVALID if self.version == MQTT_5 else 0x80)
                continue
            shared = shared_subscription(topic_filter)
            if shared is not None and subscription.no_local and self.version == MQTT_5:
                # 3.8.3.1: No Local on a shared subscription is a Protocol Error
                self._disconnect(reasons.PROTOCOL_ERROR, "No Local on a shared subscription")
                return
            matched = topic_filter if shared is None else shared.topic_filter
            options = SubscriptionOptions(subscription.qos, subscription.no_local,
                                          subscription.retain_as_published, identifier, matched.encode("utf-8"))
            kept = shared is None and subscription.qos > 0 and session.durable_name is not None
            if self.factory.sessions.quotas.subscriptions_exceeded(session, topic_filter):
                codes.append(reasons.QUOTA_EXCEEDED if self.version == MQTT_5 else 0x80)
                continue
            refusal = self._subscribe(session, topic_filter, shared, options, kept)
            if refusal is not None:
                codes.append(refusal if self.version == MQTT_5 else 0x80)
                continue
            new = session.subscribed(topic_filter, options, kept)
            if session.durable_name is not None and shared is None:
                stored[len(codes)] = self._store_subscription(session, topic_filter, options)
                codes.append(0)  # the store's answer, below, takes its place
            else:
                codes.append(subscription.qos)
            handling = subscription.retain_handling
            # 4.8.2: retained messages are not sent for a shared subscription when it is made
            if shared is None and handling != RETAIN_DO_NOT_SEND and (new or handling != RETAIN_SEND_IF_NEW):
                retained.append((topic_filter, subscription.qos))
        if not stored:
            self._subscribed(packet.packet_id, codes, retained)
            return

        def committed(results: list[int]) -> None:
            for place, code in zip(stored, results):
                codes[place] = code
            self._subscribed(packet.packet_id, codes, retained)

        # A stored session's SUBACK says the subscription is committed: it waits for the store.
        gatherResults(list(stored.values())).addCallback(committed)

    def _subscribe(self, session: MQTTSession, topic_filter: str, shared: SharedSubscription | None,
                   options: SubscriptionOptions, kept: bool) -> int | None:
        """Make one subscription with the core: None when it is made, else the v5 reason code
        that refuses it.  A ``kept`` one (a stored session's QoS 1 or 2) is the store's, not a
        live one: the access list and the subscription limit are asked here."""
        broker = self.factory.broker
        live = topic_filter in session.subscriptions and topic_filter not in session.kept
        if kept:
            if not broker.may_subscribe(session.principal, topic_filter.encode("utf-8")):
                return reasons.NOT_AUTHORIZED
            if topic_filter not in session.subscriptions and len(session.subscriptions) >= broker.max_subscriptions:
                return reasons.QUOTA_EXCEEDED
            if live:  # was QoS 0, live: its messages come from the store now
                broker.unsubscribe_filter(session, topic_filter.encode("utf-8"))
            return None
        try:
            if shared is None:
                broker.subscribe_filter(session, topic_filter.encode("utf-8"))
            else:
                broker.subscribe_filter(session, shared.topic_filter.encode("utf-8"),
                                        share=shared.share_name.encode("utf-8"))
        except AlreadySubscribed:
            pass  # 3.8.4: a new subscription with the same filter replaces the old one
        except Forbidden:
            return reasons.NOT_AUTHORIZED
        except SubscriptionLimit:
            return reasons.QUOTA_EXCEEDED
        except ValueError:
            return reasons.TOPIC_FILTER_INVALID
        except BrokerError:
            return reasons.IMPLEMENTATION_SPECIFIC_ERROR
        return None

    def _store_subscription(self, session: MQTTSession, topic_filter: str, options: SubscriptionOptions) -> Deferred:
        """Commit a stored session's subscription; a Deferred of its SUBACK code (0x80 when
        the store failed: the client is told it has no subscription)."""
        def failed(failure: Failure) -> int:
            log_unless_outage(failure, self._log, "Storing an MQTT subscription")
            session.unsubscribed(topic_filter)
            return reasons.UNSPECIFIED_ERROR

        d = self.factory.sessions.store_subscription(session, topic_filter, options)
        return d.addCallbacks(lambda _: options.qos, failed)

    def _subscribed(self, packet_id: int, codes: list[int], retained: list[tuple[str, int]]) -> None:
        if self.closed or self.session is None:
            return
        session = self.session
        final = tuple(codes)
        self.transport.write(encode(Suback(packet_id, final, self._problem(refusals(final))), self.version))
        if retained:
            # A page at a time, each message only if the access list lets the subscriber read
            # its topic (brokerd/protocols/mqtt/retaining.py).
            delivery = session.retained_out
            if delivery is None or delivery.connection is not self:
                delivery = session.retained_out = RetainedDelivery(self, session, self.factory.clock)
            for topic_filter, _qos in retained:
                delivery.add(topic_filter)

    def do_UNSUBSCRIBE(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        broker = self.factory.broker
        codes = []
        for topic_filter in packet.topic_filters:
            if session.durable_name is not None and not topic_filter.startswith("$share/"):
                self.factory.sessions.drop_subscription(session, topic_filter).addErrback(
                    log_unless_outage, self._log, "Removing an MQTT subscription from the store")
                if topic_filter in session.kept:
                    session.unsubscribed(topic_filter)
                    codes.append(0)
                    continue
            try:
                shared = shared_subscription(topic_filter)
                if shared is None:
                    broker.unsubscribe_filter(session, topic_filter.encode("utf-8"))
                else:
                    broker.unsubscribe_filter(session, shared.topic_filter.encode("utf-8"),
                                              share=shared.share_name.encode("utf-8"))
            except (NotSubscribed, ValueError):
                session.unsubscribed(topic_filter)
                codes.append(reasons.NO_SUBSCRIPTION_EXISTED)
                continue
            session.unsubscribed(topic_filter)
            codes.append(0)
        missing = [str(number) for number, code in enumerate(codes, 1) if code == reasons.NO_SUBSCRIPTION_EXISTED]
        why = self._problem(f"no subscription existed for {', '.join(missing)}" if missing else None)
        self.transport.write(encode(Unsuback(packet.packet_id, tuple(codes) if self.version == MQTT_5 else (), why),
                                    self.version))

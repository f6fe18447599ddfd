"""One running broker as its operations side sees it: the :class:`Services` its front ends were
built over, and what was built (each front end's factory, the MQTT bridges, the broker's tor).

brokerd.compose makes it, the admin listener and the statistics read it, and an embedding program
finds it as ``service.runtime`` (docs/embedding.md).  Every attribute is typed: what the admin
side reads of one front end (SMQP's links, MQTT's sessions) is a property over that front end's
factory, not a string key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from twisted.cred.portal import Portal
from twisted.internet.interfaces import IProtocolFactory

from brokerd.auth.policy import AccessListFile
from brokerd.auth.tls import ServerTLS
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.events.log import EventLog, IEventRecorder
from brokerd.frontend import Services
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.mqtt.bridgeservice import Bridges
from brokerd.protocols.mqtt.server import MQTTServerFactory
from brokerd.protocols.mqtt.sessions import MQTTSessions
from brokerd.protocols.onion.control import TorControl
from brokerd.protocols.smqp.links import Links
from brokerd.protocols.smqp.server import SMQPServerFactory
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.server import SocketMQSite
from brokerd.store.base import IStore


@dataclass
class Runtime:
    """The shared pieces of one running broker and what its front ends built from them."""

    services: Services
    event_log_service: EventLog | None = None
    """The event log's writer (``--event-log``), or None when it is off."""
    tor: TorControl | None = None
    """The broker's tor, when a listener is an ``onion:`` one (docs/tor.md)."""
    bridges: Bridges | None = None
    """The MQTT bridges to other brokers (``--mqtt-bridge``), if any."""
    front_ends: dict[str, IProtocolFactory] = field(default_factory=dict)
    """Each running front end's factory by the front end's name (``smqp``): one per front end,
    shared by its listeners."""

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def broker(self) -> Broker:
        return self.services.broker

    @property
    def portal(self) -> Portal:
        return self.services.portal

    @property
    def reactor(self) -> IBrokerReactor:
        return self.services.reactor

    @property
    def tls(self) -> ServerTLS | None:
        return self.services.tls

    @property
    def store(self) -> IStore | None:
        return self.services.store

    @property
    def event_log(self) -> IEventRecorder:
        return self.services.event_log

    @property
    def access_list(self) -> AccessListFile:
        return self.services.access_list

    @property
    def smqp_links(self) -> Links | None:
        """The SMQP server links (``--smqp-link``) when SMQP runs."""
        factory = self.front_ends.get("smqp")
        return factory.links if isinstance(factory, SMQPServerFactory) else None

    @property
    def mqtt_sessions(self) -> MQTTSessions | None:
        """MQTT's persistent sessions when MQTT runs."""
        factory = self.front_ends.get("mqtt")
        return factory.sessions if isinstance(factory, MQTTServerFactory) else None

    @property
    def socketmq_hub(self) -> Hub | None:
        """socket.mq's hub (its applications, its keys) when socket.mq runs."""
        factory = self.front_ends.get("socketmq")
        return factory.hub if isinstance(factory, SocketMQSite) else None

"""The MQTT front end as brokerd builds it: its :class:`~brokerd.frontend.IFrontEnd` plugin."""
from __future__ import annotations

from brokerd.frontend import FrontEndPlugin, Services
from brokerd.protocols.mqtt.server import MQTTServerFactory
from brokerd.protocols.mqtt.sessions import MQTTSessions
from brokerd.protocols.mqtt.websocket import mount


class MQTTPlugin(FrontEndPlugin):
    name = "mqtt"
    title = "MQTT"

    def build(self, services: Services) -> MQTTServerFactory:
        """The factory of every ``--mqtt`` listener, with the front end's persistent sessions;
        it is also served at ``/mqtt`` on the socket.mq listeners (MQTT over WebSocket)."""
        sessions = MQTTSessions(services.broker, services.settings, services.reactor)
        factory = MQTTServerFactory(services.broker, services.portal, services.settings, services.reactor,
                                    sessions, services.event_log)
        mount(services.websocket_mounts, factory)
        return factory


front_end = MQTTPlugin()

"""The node's MQTT bridges as one service, and the two hooks brokerd.tap calls by name:
:func:`check_bridges` among the start-up checks and :func:`build_bridges` when it builds the
services (the bridges themselves: :mod:`.bridge`; their configuration: :mod:`.bridges`)."""
from __future__ import annotations

from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults

from brokerd.config import Settings
from brokerd.frontend import Services
from brokerd.protocols.mqtt.bridge import Bridge, BridgeStatus, bridge_endpoint
from brokerd.protocols.mqtt.bridges import parse_bridges


class Bridges(Service):
    """Every bridge of the node, started and stopped with the broker."""

    def __init__(self, bridges: list[Bridge]) -> None:
        self.setName("mqtt-bridges")  # Twisted's Service types its class attribute name as None
        self.bridges = bridges

    def startService(self) -> None:
        super().startService()
        for bridge in self.bridges:
            bridge.start()

    def stopService(self) -> Deferred | None:
        super().stopService()
        durable = self.bridges[0].broker.durable if self.bridges else None
        if durable is not None:
            durable.stop_sweeps()  # the node is stopping: its front ends' listeners stop theirs too
        waits = [d for d in (bridge.stop() for bridge in self.bridges) if d is not None]
        return gatherResults(waits, consumeErrors=True).addErrback(lambda _failure: None) if waits else None

    def status(self) -> dict[str, BridgeStatus]:
        """Each bridge's state and counts, by name."""
        return {bridge.spec.name: bridge.status() for bridge in self.bridges}


def check_bridges(settings: Settings) -> None:
    """The start-up check of ``--mqtt-bridge``: ConfigurationError for the first mistake.  It
    runs while the options are parsed, before twistd chose its reactor: the endpoints are
    built without one (parsing and certificate files only)."""
    for spec in parse_bridges(settings.mqtt_bridge):
        spec.password()
        bridge_endpoint(None, spec)


def build_bridges(services: Services) -> Bridges | None:
    """The node's bridges (None when none is configured)."""
    specs = parse_bridges(services.settings.mqtt_bridge)
    if not specs:
        return None
    return Bridges([Bridge(spec, services.broker, services.settings, services.reactor) for spec in specs])

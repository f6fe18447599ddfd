"""The MCCHAT front end as brokerd builds it: its :class:`~brokerd.frontend.IFrontEnd` plugin."""
from __future__ import annotations

from brokerd.frontend import FrontEndPlugin, Services
from brokerd.protocols.mcchat.server import MCChatServerFactory


class MCChatPlugin(FrontEndPlugin):
    name = "mcchat"
    title = "MCCHAT"

    def build(self, services: Services) -> MCChatServerFactory:
        """The factory of every ``--mcchat`` listener (MCCHAT has no login: no portal)."""
        return MCChatServerFactory(services.broker, services.settings, services.reactor, events=services.event_log)


front_end = MCChatPlugin()

"""The SSMP front end as brokerd builds it: its :class:`~brokerd.frontend.IFrontEnd` plugin."""
from __future__ import annotations

from brokerd.frontend import FrontEndPlugin, Services
from brokerd.protocols.ssmp.server import SSMPServerFactory


class SSMPPlugin(FrontEndPlugin):
    name = "ssmp"
    title = "SSMP"

    def build(self, services: Services) -> SSMPServerFactory:
        """The factory of every ``--ssmp`` listener."""
        return SSMPServerFactory(services.broker, services.portal, services.settings, services.reactor,
                                 services.event_log)


front_end = SSMPPlugin()

"""The SMQP front end as brokerd builds it: its :class:`~brokerd.frontend.IFrontEnd` plugin."""
from __future__ import annotations

from brokerd.auth.accounts import thread_runner
from brokerd.errors import ConfigurationError
from brokerd.frontend import FrontEndPlugin, Services
from brokerd.protocols.smqp.server import SMQPServerFactory


class SMQPPlugin(FrontEndPlugin):
    name = "smqp"
    title = "SMQP"

    def build(self, services: Services) -> SMQPServerFactory:
        """The factory of every ``--smqp`` listener, over the node's store and durable service.

        Logins go through the services' accounts portal, checked against the accounts file
        (read now: a malformed file raises ConfigurationError at start, not at the first
        login); the UAL is the broker's access list.  The delivery constants (retry timeout,
        attempts, Trash retention) come from the settings."""
        services.accounts.load()
        if services.store is None or services.durable is None:
            raise ConfigurationError("SMQP needs the node's store and durable service (brokerd.compose builds them)")
        factory = SMQPServerFactory(
            services.broker, services.settings, services.reactor, services.store, services.accounts,
            portal=services.accounts_portal, access_list=services.access_list, durable=services.durable,
            run=thread_runner(services.reactor), events=services.event_log,
        )
        factory.disk = services.disk
        factory.start()
        return factory


front_end = SMQPPlugin()

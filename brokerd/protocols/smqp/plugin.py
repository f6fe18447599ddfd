"""The SMQP front end as brokerd builds it: its :class:`~brokerd.frontend.IFrontEnd` plugin."""
from __future__ import annotations

from brokerd.auth.accounts import AccountsChecker, thread_runner
from brokerd.errors import ConfigurationError
from brokerd.frontend import FrontEndPlugin, Services
from brokerd.protocols.smqp.server import SMQPServerFactory


class SMQPPlugin(FrontEndPlugin):
    name = "smqp"
    title = "SMQP"

    def build(self, services: Services) -> SMQPServerFactory:
        """The factory of every ``--smqp`` listener, over the node's store and durable service.

        Logins are checked against ``settings.accounts_file``; the UAL is the broker's access
        list.  Files that are unreadable or malformed raise ConfigurationError now, not at the
        first login.  The delivery constants (retry timeout, attempts, Trash retention) come
        from the settings."""
        settings = services.settings
        checker = AccountsChecker(settings.accounts_file, guest=settings.smqp_guest, run=services.work_queue.run)
        checker.load()
        if services.store is None or services.durable is None:
            raise ConfigurationError("SMQP needs the node's store and durable service (brokerd.tap builds them)")
        factory = SMQPServerFactory(
            services.broker, settings, services.reactor, services.store, checker,
            access_list=services.access_list, run=thread_runner(services.reactor), events=services.event_log,
            throttle=services.login_throttle,
        )
        factory.disk = services.disk
        factory.start()
        return factory


front_end = SMQPPlugin()

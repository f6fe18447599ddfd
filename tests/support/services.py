"""The :class:`~brokerd.frontend.Services` a front end's plugin builds over, for tests that run a
front end outside ``makeService``: the same kinds of pieces brokerd.compose makes, each replaceable
by the test's own (a Broker it inspects, a MemoryStore, a recording event log)."""
from __future__ import annotations

from typing import Any

from twisted.cred.portal import Portal

from brokerd.auth.policy import access_list_for
from brokerd.auth.accounts import AccountsChecker
from brokerd.auth.realm import accounts_portal, build_portal
from brokerd.auth.throttle import LoginThrottle
from brokerd.auth.tls import ServerTLS
from brokerd.auth.workers import WorkQueue
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.durable import attach_durable
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.frontend import Services
from brokerd.store.disk import DiskSpace


def services_for(settings: Settings, reactor: Any, *, broker: Broker | None = None, portal: Portal | None = None,
                 store: Any = None, events: Any = NULL_EVENT_LOG, tls: ServerTLS | None = None) -> Services:
    """Services over ``settings`` and ``reactor``.  With a ``store`` the core's durable service
    is built over it and the store opened, as brokerd.compose does; ``portal`` defaults to one with
    the settings' open login, throttled as brokerd.tap's is."""
    broker = broker if broker is not None else Broker()
    throttle = LoginThrottle.from_settings(settings, reactor)
    work_queue = WorkQueue(reactor, settings.max_auth_queue)
    accounts = AccountsChecker(settings.accounts_file, guest=settings.smqp_guest, run=work_queue.run)
    durable = None
    if store is not None:
        opened = store.open()
        durable = attach_durable(broker, store, opened, reactor, events, settings)
        opened.addErrback(lambda _failure: None)  # the front end reports it (start_error), as under tap
    return Services(
        settings=settings, reactor=reactor, broker=broker,
        portal=portal if portal is not None else build_portal(open_login=settings.open_login, broker=broker,
                                                              throttle=throttle),
        accounts=accounts, accounts_portal=accounts_portal(broker, accounts, throttle),
        event_log=events, login_throttle=throttle, work_queue=work_queue,
        access_list=access_list_for(settings, broker, reactor),
        disk=DiskSpace(settings.data_dir, settings.disk_free_limit, reactor),
        tls=tls, store=store, durable=durable,
    )

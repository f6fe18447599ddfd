"""An SMQP factory for tests that drive it on a StringTransport or an iosim pump, outside
brokerd.tap: what the factory is given and constructs nothing of (the Portal, the access list,
the core's durable service) is built here as brokerd.compose builds it."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred

from brokerd.auth.accounts import AccountsChecker, run_inline
from brokerd.auth.policy import AccessListFile
from brokerd.auth.realm import accounts_portal
from brokerd.auth.throttle import LoginThrottle
from brokerd.auth.ual import AccessList
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.durable import attach_durable
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.protocols.smqp.server import SMQPServerFactory


def smqp_factory(broker: Broker, settings: Settings, clock: Any, store: Any, checker: AccountsChecker, *,
                 ual: AccessList | None = None, ual_file: Path | None = None, throttle: LoginThrottle | None = None,
                 run: Callable[..., Deferred] = run_inline, events: Any = NULL_EVENT_LOG) -> SMQPServerFactory:
    """An SMQP front end over ``store``: its logins through ``checker`` (and client
    certificates), the access list ``ual`` (read from ``ual_file``, which its ``access_list``
    watches once started), and the core's durable service, started by the factory's
    ``start``."""
    durable = broker.durable if broker.durable is not None else attach_durable(broker, store, None, clock, events,
                                                                                settings)
    return SMQPServerFactory(
        broker, settings, clock, store, checker,
        portal=accounts_portal(broker, checker, throttle),
        access_list=AccessListFile(ual_file, ual if ual is not None else AccessList(), broker, clock, run),
        durable=durable, run=run, events=events,
    )

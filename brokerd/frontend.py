"""What a front end is to the broker: the :class:`IFrontEnd` plugin interface, and the typed
:class:`Services` every front end's ``build`` gets.

brokerd.compose builds the shared pieces of one broker once (the Broker, the Portal, the store and
its durable service, the event log, the access list, the work queue) and hands them to each
front end in one frozen :class:`Services`: a front end names what it uses as attributes, so a
missing piece is a type error and not a ``KeyError`` at start-up, and it constructs nothing the
core owns.  The front ends themselves are Twisted plugins (``twisted.plugin.IPlugin`` and
:class:`IFrontEnd`, the shape of twisted.words' ``IProtocolPlugin``): brokerd.frontends lists
them by ordinary imports, which import-linter sees, and twisted/plugins/brokerd_frontends.py
offers the same objects to ``getPlugins``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

from autobahn.twisted.websocket import WebSocketServerFactory
from twisted.cred.portal import Portal
from twisted.internet.interfaces import IProtocolFactory
from twisted.plugin import IPlugin
from zope.interface import Attribute, Interface, implementer

from brokerd.auth.accounts import AccountsChecker
from brokerd.auth.policy import AccessListFile
from brokerd.auth.throttle import LoginThrottle
from brokerd.auth.tls import ServerTLS
from brokerd.auth.workers import WorkQueue
from brokerd.config import Settings, setting_fields
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService
from brokerd.errors import ConfigurationError
from brokerd.events.log import IEventRecorder
from brokerd.interfaces import IBrokerReactor
from brokerd.store.base import IStore
from brokerd.store.disk import DiskSpace


class WebSocketMounts:
    """The WebSockets served on socket.mq's listeners besides its own: one top-level path
    segment (``b"mqtt"``) -> an Autobahn factory.  MQTT mounts, socket.mq serves: the two meet
    here and never import each other.  Read per request, so a front end built after socket.mq
    may still mount."""

    def __init__(self) -> None:
        self._factories: dict[bytes, WebSocketServerFactory] = {}

    def mount(self, segment: bytes, factory: WebSocketServerFactory) -> None:
        """Serve ``factory`` at ``/<segment>``; a segment is mounted once."""
        if segment in self._factories:
            raise ConfigurationError(f"two WebSockets at /{segment.decode('ascii', 'replace')}")
        self._factories[segment] = factory

    def get(self, segment: bytes) -> WebSocketServerFactory | None:
        return self._factories.get(segment)

    def __contains__(self, segment: object) -> bool:
        return segment in self._factories

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._factories)


@dataclass(frozen=True)
class Services:
    """The shared pieces of one broker, as every front end's ``build`` gets them.

    Frozen: a front end reads what it needs and adds nothing; what a front end makes for others
    (the WebSockets it serves on socket.mq) goes into a typed registry (``websocket_mounts``).
    """

    settings: Settings
    reactor: IBrokerReactor
    """The reactor (in tests, a Clock with a thread pool, standing for it)."""
    broker: Broker
    portal: Portal
    """Every front end's logins (brokerd.auth.realm.build_portal), shared with its throttle."""
    accounts: AccountsChecker
    """The accounts file (``--accounts``), the guest account as ``--smqp-guest`` says."""
    accounts_portal: Portal
    """Logins against ``accounts`` alone and client certificates (SMQP's LOGIN), same throttle."""
    event_log: IEventRecorder
    """The operator log over the event log (NULL_EVENT_LOG's behaviour when the log is off)."""
    login_throttle: LoginThrottle
    work_queue: WorkQueue
    """The bounded queue of blocking work (scrypt, OpenPGP) every front end shares."""
    access_list: AccessListFile
    """The UAL, the core's access policy (watched for changes while the broker runs)."""
    disk: DiskSpace
    tls: ServerTLS | None = None
    store: IStore | None = None
    """The node's store, or None when nothing on this node outlives a connection."""
    durable: DurableService | None = None
    """The core's durable service over ``store`` (None exactly when ``store`` is None)."""
    websocket_mounts: WebSocketMounts = field(default_factory=WebSocketMounts)


class IFrontEnd(Interface):
    """One protocol brokerd serves: a Twisted plugin (with ``twisted.plugin.IPlugin``)."""

    name = Attribute("The protocol's name: its listener option (``--ssmp``) and config key.")
    title = Attribute("How the start-up log names its listeners (``SSMP``, ``socket.mq``).")
    settings = Attribute("The option names of the settings that are this front end's own.")

    def build(services):
        """The IProtocolFactory every listener of this front end listens with (one per
        broker, shared by its listeners), built over ``services`` (a :class:`Services`).
        Unusable files or settings raise ConfigurationError."""


def own_settings(name: str) -> tuple[str, ...]:
    """The option names that start with ``<name>-``: a front end's own settings."""
    return tuple(option for option in setting_fields() if option.startswith(f"{name}-"))


@implementer(IPlugin, IFrontEnd)
class FrontEndPlugin(ABC):
    """What the five front ends' plugins share: the name, the title and the own settings;
    each subclass says how its factory is built over the services."""

    name: str
    title: str

    def __init__(self) -> None:
        self.settings = own_settings(self.name)

    def __repr__(self) -> str:
        return f"<brokerd front end {self.name}>"

    @abstractmethod
    def build(self, services: Services) -> IProtocolFactory:
        """See :meth:`IFrontEnd.build`."""


def build_front_end(front_end: FrontEndPlugin, services: Services) -> IProtocolFactory:
    """``front_end``'s factory over ``services``, checked to be a protocol factory."""
    factory = front_end.build(services)
    if not IProtocolFactory.providedBy(factory):
        raise TypeError(f"the {front_end.name} front end built {factory!r}, not a protocol factory")
    return factory

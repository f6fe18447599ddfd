"""How brokerd.tap puts the operations pieces together: the operator log in front of the
event log, connection counting on every listener, the admin site, the statistics topics,
and the start-up checks of their options."""
from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IProtocolFactory
from twisted.logger import Logger
from twisted.web import http
from twisted.web.server import Site

from brokerd.admin.connections import ConnectionCounts, ConnectionLog
from brokerd.admin.dashboard import Events
from brokerd.admin.exposure import binds_loopback
from brokerd.admin.figures import Figures
from brokerd.admin.history import RateHistory
from brokerd.admin.hostcheck import HostCheck
from brokerd.admin.logs import check_log_settings
from brokerd.admin.oplog import OperatorLog
from brokerd.admin.systopics import StatisticsTopics
from brokerd.admin.web import Access, AdminRoot
from brokerd.auth.hosts import OwnNames
from brokerd.auth.tls import split_escaped
from brokerd.config import Settings, read_first_line
from brokerd.errors import ConfigurationError
from brokerd.runtime import Runtime

_log = Logger(namespace="brokerd")


def certificate_names(settings: Settings) -> frozenset[str]:
    text = settings.admin_cert_names or ""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


ADMIN_SOCKET_MODE = 0o600
"""File mode of a ``unix:`` admin socket whose endpoint string gives none: the broker's
user only (``mode=660`` in the string lets the socket's group in)."""


def _unix_mode(description: str) -> int | None:
    """The ``mode=`` of a ``unix:`` endpoint string (None: not given, or not unix:)."""
    fields = split_escaped(description)
    if fields[0].lower() != "unix":
        return None
    for field in fields[1:]:
        name, equals, value = field.partition("=")
        if equals and name == "mode":
            try:
                return int(value, 8)
            except ValueError:
                raise ConfigurationError(f"--admin {description}: mode={value} is not an octal file mode") from None
    return None


def admin_endpoint(settings: Settings) -> str:
    """The endpoint string the admin listener listens on: ``--admin``, with ``mode=600``
    added to a ``unix:`` socket that names no mode.  Twisted sets the mode between bind and
    listen, so the socket accepts no connection before it has it."""
    description = settings.admin or ""
    if split_escaped(description)[0].lower() == "unix" and _unix_mode(description) is None:
        return f"{description}:mode={ADMIN_SOCKET_MODE:o}"
    return description


def admin_access(settings: Settings) -> Access:
    """The admin listener's Access, or ConfigurationError when it would be open to the
    network, or a certificate rule could never apply."""
    endpoint = settings.admin or ""
    token_file = settings.admin_token_file
    token = read_first_line(token_file, "--admin-token-file") if token_file is not None else None
    names = certificate_names(settings)
    if names and not (endpoint.startswith("tls:") and settings.tls_ca is not None):
        raise ConfigurationError("--admin-cert-names needs a tls: --admin listener and --tls-ca")
    access = Access(token, names)
    mode = _unix_mode(endpoint)
    if access.open and mode is not None and mode & 0o007:
        raise ConfigurationError(
            f"--admin {endpoint}: mode={mode:o} lets every local user in without a token; give "
            "--admin-token-file, or a mode without access for others (the default is 600)")
    if access.open and not binds_loopback(endpoint):
        raise ConfigurationError(
            f"--admin {endpoint}: reachable from the network without a token; give --admin-token-file "
            "(or bind it to loopback: tcp:PORT:interface=127.0.0.1)")
    return access


def check_operations_settings(settings: Settings) -> None:
    """Start-up checks of the admin and logging options (ConfigurationError)."""
    check_log_settings(settings)
    if settings.admin is not None:
        admin_access(settings)
    elif settings.admin_token_file is not None or settings.admin_cert_names:
        raise ConfigurationError("--admin-token-file and --admin-cert-names need --admin")


class AdminSite(Site):
    """The admin listener's site: no HTTP access line per request.  The requests that change
    something write their own operator line (``admin: closed ...``), and the dashboard and
    ``brokerd-ctl status --interval`` poll the API often enough to bury the log otherwise."""

    def log(self, request: http.Request) -> None:
        """No access log."""


class Operations:
    """The operations pieces of one broker, made before its listeners."""

    def __init__(self, runtime: Runtime, operator_log: OperatorLog) -> None:
        self.runtime = runtime
        self.operator_log = operator_log
        """What the front ends' ``event_log`` is: the operator's lines over the event log."""
        self.connections = ConnectionCounts()
        self.figures = Figures(runtime, self.operator_log, self.connections)
        self._streams: DashboardStreams | None = None
        self._history: RateHistory | None = None

    def counted(self, protocol: str, factory: IProtocolFactory) -> ConnectionLog:
        """``factory`` behind connection counting and logging, for one listener."""
        return ConnectionLog(protocol, factory, self.connections)

    def admin_site(self) -> Site:
        settings = self.runtime.settings
        self._history = RateHistory(self.figures, self.runtime.reactor)
        root = AdminRoot(self.figures, admin_access(settings), self.runtime.reactor, self._history)
        self._streams = DashboardStreams(root.events)
        site = AdminSite(HostCheck(root, OwnNames.of([settings.admin or ""], settings.server_names)))
        site.displayTracebacks = False
        site.noisy = False
        return site

    def services(self) -> list[Service]:
        """The services to run beside the listeners: the statistics topics (with
        --sys-interval) and, with the admin listener, the end of its event streams and the
        rate history it serves."""
        made: list[Service] = []
        interval = self.runtime.settings.sys_interval
        if interval is not None:
            made.append(StatisticsTopics(self.figures, interval, self.runtime.reactor))
        if self._streams is not None:
            made.append(self._streams)
        if self._history is not None:
            made.append(self._history)
        return made


class DashboardStreams(Service):
    """Ends the dashboards' event streams when the broker stops (a stopped listener keeps
    its open connections)."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def stopService(self) -> None:
        super().stopService()
        self.events.stop()

"""The SMQP front end's shared state: one SMQPFrontEnd per broker (the topic tree, the UAL,
the accounts checker, the store and the message service, shared by every SMQP connection and
listener).

The connection's modules (the session's contract, its command mixins, the protocol) name this
class as their factory's type, so it names none of them: the Twisted factory that builds
connections, :class:`~brokerd.protocols.smqp.server.SMQPServerFactory`, is this class with its
protocol, in :mod:`~brokerd.protocols.smqp.server`; :mod:`~brokerd.protocols.smqp.plugin` builds
it for brokerd.tap.  Of a session it reads only :class:`SessionState`.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.auth.accounts import GUEST, AccountsChecker, run_inline
from brokerd.auth.policy import AccessListFile, ual_account
from brokerd.auth.ual import AccessList, Perm
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.core.durable import DurableService, server_domain
from brokerd.core.principal import Principal
from brokerd.errors import ConfigurationError
from brokerd.events.log import NULL_EVENT_LOG, IEventRecorder
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.smqp.codec import encode_notify
from brokerd.protocols.smqp.connectto import parse_allow_list
from brokerd.protocols.smqp.delivery import MessageService
from brokerd.protocols.smqp.federation import Forwarded
from brokerd.protocols.smqp.links import Links, parse_links, read_password
from brokerd.protocols.smqp.topictree import TopicTree
from brokerd.protocols.smqp.wire import SMQPWireFormat
from brokerd.store.base import IStore
from brokerd.store.disk import DiskSpace
from brokerd.store.records import TopicRecord, trash_owner

MAX_REDIRECTING = 256
"""Connections over a connection limit held open at once to be answered ``311`` (more are
refused with ``SMQP/1.0 Not Available.`` as without redirect targets)."""


class SessionState(Protocol):
    """What the front end reads of one of its sessions: whose login it is, and whether it
    is still there to be told SERVER BYE (the whole session is
    :class:`~brokerd.protocols.smqp.session.SMQPSession`, which names this module)."""

    account: str | None
    closed: bool
    server_bye: bool
    transport: Any


class SMQPFrontEnd(Factory):
    """The SMQP front end: the topic tree, the UAL, the accounts checker and the store,
    shared by every SMQP connection (and every SMQP listener).  Every limit and timeout
    comes from ``settings`` (brokerd.config.Settings, the ``smqp_*`` fields).

    It constructs nothing the core owns: the Portal its logins go through, the access list
    (the core's policy, watched by its own service) and the core's durable service over
    ``store`` are given, by the front end's plugin from the broker's Services."""

    _log = Logger()
    disk: DiskSpace | None = None
    """brokerd.store.disk.DiskSpace: below ``--disk-free-limit`` stored publishes are refused."""

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        clock: IBrokerReactor,
        store: IStore,
        checker: AccountsChecker,
        *,
        portal: Portal,
        access_list: AccessListFile,
        durable: DurableService,
        run: Callable[..., Deferred] = run_inline,
        events: IEventRecorder = NULL_EVENT_LOG,
    ) -> None:
        self.broker = broker
        self.events = events
        """The event log's IEventRecorder (auth failures here, outcomes in the service)."""
        self.settings = settings
        self.clock = clock
        self.store = store
        self.checker = checker
        self.portal = portal
        """Password logins against ``checker`` and verified client certificates."""
        self.access_list = access_list
        """The UAL: the core's access policy, which SMQP's commands read and edit."""
        self.domain = server_domain(settings)
        self.message_timeout: float | None = settings.durable_message_timeout
        """The server's default message timeout (the login reply's Timeout attribute)."""
        self._run_in_thread = run
        self.max_topics_per_account = settings.smqp_max_topics_per_account
        self.max_message_size = settings.smqp_max_message_size
        """Bytes of one message body as received, attribute lines included (413 beyond)."""
        self.connectto_allow = parse_allow_list(settings.smqp_connectto_allow)
        """Where CONNECTTO may connect besides the client's own address (--smqp-connectto-allow)."""
        self.redirects = parse_redirects(settings.smqp_redirect)
        """``311 Redirect`` targets (--smqp-redirect), taken in turn."""
        self._redirect_turn = 0
        self.redirecting = 0
        """Connections over a connection limit kept open only to answer their LOGIN 311."""
        self.draining = False
        """Shutting down: a LOGIN gets 311 when redirect targets are configured."""
        self.forwarded = Forwarded(self)
        """Stores what the links bring from other domains (brokerd.protocols.smqp.federation)."""
        self.links = Links(self, parse_links(settings.smqp_link), settings.smqp_link_account,
                           read_password(settings.smqp_link_password_file))
        self._links_started = False
        self.tree = TopicTree(max_owned=self.max_topics_per_account)
        self.wire = SMQPWireFormat("", self.domain, clock.seconds, self.display)
        self.durable = durable
        """The core's durable service (brokerd.compose builds it over the node's store): SMQP's
        subscriptions are its durable subscriptions, and the stored topics it reads are the
        tree SMQP's commands change."""
        self.durable.on_tree_changed = self._tree_read
        self.service = MessageService(self.durable, broker, self.wire, self.display, events, domain=self.domain)
        self.service.max_queued_bytes = settings.smqp_max_queued_bytes
        self.service.max_one_held = settings.smqp_max_one_held
        self.max_notify_window = settings.smqp_max_notify_window
        """The largest SET NOTIFY WINDOW granted (--smqp-max-notify-window)."""
        self.domains = {self.domain.lower(), "localhost"}
        """Domains that name this server in ``user@domain`` (the SUID's domain joins them)."""
        self.volatile_numbers = itertools.count(1)
        self.sessions: dict[str, set[SessionState]] = {}
        self.start_error: Failure | None = None
        self.started: Deferred = Deferred()
        self._factory_started = False

    # ------------------------------------------------------------------ start-up

    @property
    def suid(self) -> str:
        """The server's unique id (the core's: the head of every stored message's id)."""
        return self.durable.server_id

    def start(self) -> Deferred:
        """Once the core's durable service has read the store (topics, SUID,
        subscriptions), build the tree from its topics; connections are greeted once done
        (``SMQP/1.0 Not Available.`` if it failed)."""
        d = self.durable.when_started()
        d.addCallback(lambda _: self._tree_loaded(self.durable.topics.records()))
        d.addCallbacks(self._ready, self._start_failed)
        return self.started

    def _tree_loaded(self, records: list[TopicRecord]) -> Deferred:
        self._tree_read(records)
        return self.durable.put_topics(self.tree.ensure_account(GUEST, self.clock.seconds()))

    def _tree_read(self, records: list[TopicRecord]) -> None:
        """The stored topics, read at start or again after another node changed them (the
        core's StoredTopics already left out, and logged, any record without a parent)."""
        self.tree, _skipped = TopicTree.from_records(records, max_owned=self.max_topics_per_account)

    def _ready(self, _result: object) -> None:
        self.wire.server_id = self.suid
        self.domains.add(self.suid.partition("/")[0].lower())
        if self._factory_started:
            self.durable.start_sweeps()
        self.started.callback(None)

    def message_timeout_for(self, key: str) -> float | None:
        """The timeout (seconds; None: INFINITE) of a message kept in queue ``key`` that
        has no Timeout attribute: the topic's own (SET TOPIC TIMEOUT), else its nearest
        ancestor's, else the server default (``--durable-message-timeout``): the core's answer,
        the same for every protocol's messages."""
        return self.durable.topics.timeout_for(key)

    def display(self, key: str) -> str:
        """The path of a topic key as notifications show it (the names as created)."""
        owner = trash_owner(key)
        base = key if owner is None else owner
        node = self.tree.get(base)
        path = node.display if node is not None and base else "/" + base
        return path if owner is None else path.rstrip("/") + "/Trash"

    def _start_failed(self, failure: Failure) -> None:
        self._log.failure("The SMQP front end could not start", failure)
        self.start_error = failure
        self.started.callback(None)

    # ------------------------------------------------------------------ sessions

    def logged_in(self, session: SessionState) -> None:
        if session.account is not None:
            self.sessions.setdefault(session.account, set()).add(session)

    def logged_out(self, session: SessionState) -> None:
        if session.account is None:
            return
        sessions = self.sessions.get(session.account)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self.sessions[session.account]

    # ------------------------------------------------------------------ factory life

    def startFactory(self) -> None:
        self._factory_started = True
        if not self._links_started:
            self._links_started = True
            self.started.addCallback(self._start_links)
        if self.started.called and self.start_error is None:
            self.durable.start_sweeps()

    def _start_links(self, result: object) -> object:
        if self.start_error is None and self._factory_started:
            self.links.start()
        return result

    def subscriptions_changed(self) -> None:
        """A MESSAGE subscription came or went: the links subscribe on the other servers
        to match."""
        self.links.changed()

    def may_redirect(self, session: SessionState) -> bool:
        """A connection over a connection limit: keep it open to answer its LOGIN with
        ``311`` when redirect targets are configured and fewer than
        :data:`MAX_REDIRECTING` such connections are open (each also has the login timeout)."""
        if not self.redirects or self.redirecting >= MAX_REDIRECTING:
            return False
        self.redirecting += 1
        return True

    def next_redirect(self) -> str | None:
        """The next ``311`` target, round robin (None when none is configured).  A target
        named for a cluster node (``NAME=host:port``) is taken only while the engine's
        directory lists NAME among the other live nodes, so that every node may be given the
        same list: a node never sends clients to itself nor to a node that died or left.
        None when no target is live (the caller then says Not Available)."""
        live = self.broker.engine.other_nodes()
        for _ in range(len(self.redirects)):
            item = self.redirects[self._redirect_turn % len(self.redirects)]
            self._redirect_turn += 1
            node, equals, target = item.rpartition("=")
            if not equals or live is None or node in live:
                return target
        return None

    def stopFactory(self) -> None:
        """Tell every session the server goes away (NOTIFY SERVER BYE, which every client is
        subscribed to) before the connections drop."""
        self._factory_started = False
        self.draining = True
        self.links.stop()
        self.durable.stop_sweeps()
        bye = encode_notify("SERVER", "BYE", "00:00:00")
        for sessions in list(self.sessions.values()):
            for session in list(sessions):
                if not session.closed and session.server_bye:
                    session.transport.write(bye)

    def permissions(self, principal: Principal, key: str) -> Perm:
        """What ``principal`` may do on topic ``key`` (``a/b``; ``""`` the root).

        With an access list the core decides (its policy, its cached decision per
        (principal, topic)): the same answer SSMP, MCCHAT and socket.mq get, and the one the
        core applies again when the message reaches it.  Without one the core allows
        everything, and SMQP's own built-in defaults apply to its commands (the guest only
        reads, ``/accounts`` is the server's), as they always have."""
        access = self.broker.access
        if access.policy is not None:
            return access.permissions(principal, key.encode("utf-8"))
        return self.ual.permissions(ual_account(principal), tuple(key.split("/")) if key else ())

    @property
    def ual(self) -> AccessList:
        return self.access_list.current

    def reload_ual(self) -> Deferred:
        """Read the UAL file again if it changed (see brokerd.auth.policy.AccessListFile)."""
        return self.access_list.reload()

    def reload_files(self) -> Deferred:
        """Read the accounts file and the UAL file again now (the admin API's reload).  Fails
        with ConfigurationError, keeping the old ones, when a file is bad."""
        d = self._run_in_thread(self.checker.load)
        return d.addCallback(lambda _: self.access_list.reload_now())


def parse_redirects(value: str | list[str] | None) -> tuple[str, ...]:
    """``--smqp-redirect``: ``host:port`` targets separated by commas or blanks (or a TOML
    list), as the draft's ``311`` reply names them, each optionally ``NAME=host:port``: the
    SMQP address of cluster node NAME (``--node-name``), used while that node is live.
    Raises ConfigurationError."""
    if not value:
        return ()
    items = value.replace(",", " ").split() if isinstance(value, str) else [str(v) for v in value]
    for item in items:
        node, equals, target = item.rpartition("=")
        if equals and not node:
            raise ConfigurationError(f"smqp-redirect: {item!r} names no node before '='")
        host, colon, port = target.rpartition(":")
        if not colon or not host or not (port.isdigit() and 0 < int(port) < 65536) \
                or any(c.isspace() or ord(c) < 32 for c in host):
            raise ConfigurationError(f"smqp-redirect: {item!r} is not host:port")
    return tuple(items)

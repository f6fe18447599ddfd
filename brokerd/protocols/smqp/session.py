"""What SMQP's command mixins need of the session they are part of: one typing.Protocol.

SMQPServerProtocol is assembled from five mixins (login, topic, messaging, subscription and
queue commands), each in its own module.  They share the connection's state and call each
other's helpers; :class:`SMQPSession` writes that contract down once, so a type checker
sees every mixin's ``self`` as the whole session instead of each mixin assuming, untyped,
what the others provide.  The mixins inherit it only while type checking
(:data:`SessionBase`): at run time their base is ``object`` and SMQPServerProtocol is what
implements it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred

from brokerd.core.principal import NOBODY

if TYPE_CHECKING:
    from brokerd.auth.ual import Perm
    from brokerd.core.principal import Principal
    from brokerd.protocols.smqp.delivery import MessageService
    from brokerd.protocols.smqp.events import TopicRef
    from brokerd.protocols.smqp.factory import SMQPFrontEnd
    from brokerd.protocols.smqp.connectto import NotificationConnection
    from brokerd.protocols.smqp.outbox import Outbox
    from brokerd.protocols.smqp.topictree import Found, Node
    from brokerd.store.records import MessageRecord


class SMQPSession(Protocol):
    """One SMQP connection as its command mixins see it."""

    factory: SMQPFrontEnd
    transport: Any
    # The state the mixins set have their initial values here: an attribute a subclass of a
    # Protocol assigns would otherwise take the type of that assignment (mypy).
    account: str | None = None
    """The logged-in account (None before LOGIN succeeded)."""
    channel: str | None = None
    principal: Principal = NOBODY
    outbox: Outbox | None = None
    """The session's durable notification queue, once logged in."""
    notifier: NotificationConnection | None = None
    """The CONNECTTO notification connection, when the client opened one."""
    closed: bool = False
    server_bye: bool = True
    server_timeout: bool = False
    redirect_only: bool = False
    name: bytes = b""
    """``account:channel`` as the Broker names the session."""
    address: bytes | None = None
    _failures: int = 0
    """Failed logins on this connection."""
    _pending_login: tuple[str, str] | None = None
    """(account, channel) of a LOGIN waiting for its PASSWORD."""
    _password_change: str | None = None
    """The stage of SET LOGIN PASSWORD: ``old``, ``new``, or None."""

    @property
    def subscriber(self) -> str:
        """``account:channel``: the session's name as a durable subscriber."""

    @property
    def service(self) -> MessageService: ...

    @property
    def notifications(self) -> Outbox:
        """The logged-in session's outbox."""

    # -- provided by SMQPServerProtocol (brokerd.protocols.smqp.server)

    def _reply(self, code: int, *lines: str) -> None: ...

    def _reply_raw(self, data: bytes) -> None: ...

    def _after_reply(self, callback: Callable[[], None]) -> None: ...

    def _close(self, code: int | None = None, text: str = "") -> None: ...

    def _cancel_login_timer(self) -> None: ...

    def write_notify(self, parts: list[bytes]) -> None: ...

    def can_notify(self) -> bool: ...

    # -- provided by ConnectionLifecycle (brokerd.protocols.lifecycle)

    def logged_in(self) -> None: ...

    def stream_reply(self, head: bytes, source: Callable[[], Deferred], tail: bytes) -> Deferred: ...

    # -- provided by TopicCommands (brokerd.protocols.smqp.topic_commands)

    def _permissions(self, node: Node) -> Perm: ...

    def _resolve(self, ref: TopicRef, *, follow: bool = True, need: Perm = ..., trash: bool = False) -> Found: ...

    # -- provided by MessagingCommands (brokerd.protocols.smqp.messaging)

    def _publish_topic(self, ref: TopicRef, need: Perm) -> tuple[str, str]: ...

    def _owned(self, record: MessageRecord, key: str) -> bool: ...


if TYPE_CHECKING:
    SessionBase = SMQPSession
else:
    SessionBase = object
"""The mixins' base: the session protocol for the type checker, ``object`` at run time."""

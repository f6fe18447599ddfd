"""The SMQP server: one SMQPServerProtocol per connection, one factory per broker.

This module is the connection: greeting, reading and dispatching commands, ordering their
replies, flow control, and the session as the core sees it.  The commands live in mixins, one
module per responsibility: :mod:`~brokerd.protocols.smqp.login`,
:mod:`~brokerd.protocols.smqp.topic_commands`, :mod:`~brokerd.protocols.smqp.messaging`
(PUBLISH and the client's acknowledgements), :mod:`~brokerd.protocols.smqp.subscribing` and
:mod:`~brokerd.protocols.smqp.queue_commands`; the shared state is the factory
(:mod:`~brokerd.protocols.smqp.factory`).

The protocol object is the session's "mind" (ISubscriber) once logged in; it is named
``account:channel`` and reachable at the core address ``smqp:account:channel``.  A newer
login of the same account and channel replaces the older connection (the core's rule).

Commands run one at a time, in order: a command that waits (a password check, a store write)
holds the ones behind it, so replies always come back in the order of the commands, and a
client may pipeline.  Replies of the commands handled in one read are written together.

Reading stops while more than :data:`MAX_PIPELINE` commands wait, and while the connection's
output buffer holds more than ``max_output_buffer`` bytes (the client does not read its
replies): memory per connection stays bounded either way.

See docs/smqp.md for the commands, the reply codes and the permission model.

Event log (docs/events.md): the core logs sessions and the messages it routes; every refused
login (unknown account, wrong password, unsupported method, a certificate that does not name
the account, too many logins) is an ``auth_failure`` logged here, and the message outcomes are
logged by the message service (brokerd.protocols.smqp.delivery).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IHandshakeListener, IPushProducer, ISSLTransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd import __version__
from brokerd.core.principal import NOBODY, Principal
from brokerd.errors import Busy
from brokerd.interfaces import ISubscriber
from brokerd.protocols.dispatch import command_table, verbs_of
from brokerd.protocols.lifecycle import ConnectionLifecycle
from brokerd.protocols.smqp.codec import SMQPParser, encode_greeting, encode_reply
from brokerd.protocols.smqp.connectto import NotificationConnection
from brokerd.protocols.smqp.events import ClientReply, Command, Rejected
from brokerd.protocols.smqp.factory import SMQPFrontEnd
from brokerd.protocols.smqp.login import LoginCommands
from brokerd.protocols.smqp.messaging import MessagingCommands, Overlap
from brokerd.protocols.smqp.outbox import Outbox
from brokerd.protocols.smqp.queue_commands import QueueCommands
from brokerd.protocols.smqp.refusal import Refused
from brokerd.protocols.smqp.streaming import ReplyStream
from brokerd.protocols.smqp.subscribing import SubscriptionCommands
from brokerd.protocols.smqp.topic_commands import TopicCommands
from brokerd.protocols.smqp.topictree import TopicError
from brokerd.protocols.smqp.wire import SMQPWireFormat
from brokerd.store.base import is_outage

_T = TypeVar("_T")

SERVER_IDENT = f"brokerd SMQP Server/{__version__}"
MAX_PIPELINE = 64
"""Commands parsed but not yet answered before the connection stops reading."""

_BEFORE_LOGIN = {"LOGIN", "PASSWORD", "NOOP", "QUIT"}


class _Slot:
    """The reply of one command: written once it and every earlier one are ready (a
    streamed reply: its pieces are written while it is first in line, see ReplyStream)."""

    __slots__ = ("data", "ready", "after", "stream")

    def __init__(self, ready: bool = True) -> None:
        self.data: list[bytes] = []
        self.ready = ready
        self.after: list[Callable[[], None]] = []
        self.stream: ReplyStream | None = None


@implementer(ISubscriber, IPushProducer, IHandshakeListener)
class SMQPServerProtocol(LoginCommands, TopicCommands, MessagingCommands, SubscriptionCommands,
                         QueueCommands, ConnectionLifecycle, Protocol):
    """One SMQP connection; once logged in also its session as the Broker sees it."""

    _log = Logger()
    protocol = "smqp"
    name = b""
    address: bytes | None = None
    principal: Principal = NOBODY
    factory: SMQPFrontEnd

    def __init__(self) -> None:
        self._parser = SMQPParser()
        self._queue: deque[Command | ClientReply | Rejected] = deque()
        self._slots: deque[_Slot] = deque()
        self._slot: _Slot | None = None
        self._busy = False
        self._running = False
        self._greeted = False
        self._login_timer: DelayedCall | None = None
        self._paused_reading = False
        self._paused_output = False
        self._failures = 0
        self._pending_login: tuple[str, str] | None = None
        self._password_change: str | None = None
        self.account: str | None = None
        self.channel: str | None = None
        self.closed = False
        self.outbox: Outbox | None = None
        self.notifier: NotificationConnection | None = None
        """The CONNECTTO notification connection, when the client opened one."""
        self._stream: ReplyStream | None = None
        """The reply being written a piece at a time (GET MESSAGE), if any."""
        self.server_bye = True
        """NOTIFY SERVER BYE at shutdown (every client is subscribed by default)."""
        self.server_timeout = False
        self.redirect_only = False
        """Over a connection limit with redirect targets configured: greeted, and its LOGIN
        answered ``311`` (brokerd.protocols.smqp.login)."""

    @property
    def wire_format(self) -> SMQPWireFormat:
        return self.factory.wire

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        factory = self.factory
        if not self.admit_connection():
            if not factory.may_redirect(self):
                self.transport.write(encode_greeting(SERVER_IDENT, ready=False))
                self.closed = True
                self.transport.loseConnection()
                return
            self.redirect_only = True
        self._parser = SMQPParser(max_body=factory.max_message_size)
        self.prepare_transport(factory.settings.max_output_buffer)
        self.register_producer()
        self._login_timer = self.call_later(factory.settings.login_timeout, self._login_timed_out)
        if not ISSLTransport.providedBy(self.transport):
            self._ready_to_greet()

    def handshakeCompleted(self) -> None:
        """SMQPS: greet once TLS is up (TLS buffers earlier writes and pauses us meanwhile)."""
        self._ready_to_greet()

    def _ready_to_greet(self) -> None:
        factory = self.factory
        if self.closed:
            return
        if factory.started.called:
            self._greet(factory.start_error)
        else:
            self.transport.pauseProducing()
            factory.started.addBoth(self._greet_later)

    def _greet_later(self, result: _T) -> _T:
        if not self.closed:
            self.transport.resumeProducing()
            self._greet(self.factory.start_error)
        return result

    def _greet(self, error: Failure | None) -> None:
        if error is not None:
            self.transport.write(encode_greeting(SERVER_IDENT, ready=False))
            self._close()
            return
        self._greeted = True
        self.transport.write(encode_greeting(SERVER_IDENT))

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closed = True
        self._queue.clear()
        self._login_timer = None  # cancelled by release_connection, with any other timer
        if self._stream is not None:
            self._stream.stop()
        if self.outbox is not None:
            self.factory.service.detach(self.outbox)
        if self.notifier is not None:
            self.notifier.close()
        if self.redirect_only:
            self.redirect_only = False
            self.factory.redirecting -= 1
        if self.release_connection():
            self.factory.logged_out(self)
            self.factory.broker.detach(self)

    def _cancel_login_timer(self) -> None:
        self.cancel_timer(self._login_timer)
        self._login_timer = None

    def _close(self, code: int | None = None, text: str = "") -> None:
        """Reply ``code text`` (if given), write what is pending, and close."""
        if self.closed:
            return
        if code is not None:
            self._slot = None
            self._reply(code, text)
        self._flush(closing=True)
        self.closed = True
        self._queue.clear()
        self.transport.loseConnection()

    def _login_timed_out(self) -> None:
        """No login in time (counted from the connection, TLS handshake included)."""
        self._login_timer = None
        if self.account is None:
            if not self._greeted:
                self._close()
                return
            self._close(421, f"Login timeout: no login within {self.factory.settings.login_timeout:g} s")

    # ------------------------------------------------------------------ ISubscriber

    def replaced(self) -> None:
        """A newer login of this account and channel took over."""
        self._close(421, f"Replaced by a newer login of {self.account}:{self.channel}")

    def close_transport(self) -> None:
        """An operator closes the session (``brokerd-ctl close``): 421 tells the client why,
        as for the other ways the server ends a session."""
        self._close(421, "Closed by the operator")

    def window_timed_out(self) -> None:
        """A notification of the session's window, or a ONE message, went unanswered
        (brokerd.protocols.smqp.outbox)."""
        self._close(421, "Service closing: a notification was not acknowledged in time")

    def send(self, data: bytes) -> None:
        """A message from the core (another protocol's UCAST to this session): queued with
        the notifications that need no acknowledgement."""
        if self.outbox is not None:
            self.outbox.offer_volatile(data)

    def write_notify(self, parts: list[bytes]) -> None:
        if self.closed:
            return
        if self.notifier is not None:
            self.notifier.write(parts)
        else:
            self.transport.writeSequence(parts)

    def can_notify(self) -> bool:
        """NOTIFYs wait while the output is full and while a reply is being streamed (on
        a CONNECTTO notification connection: while its own output is full)."""
        if self.notifier is not None:
            return not self.closed and self.notifier.can_write()
        return not self.closed and not self._paused_output and self._stream is None

    # ------------------------------------------------------------------ flow control

    def pauseProducing(self) -> None:
        """Our output buffer is full: stop reading until the client reads its replies."""
        if self.closed:
            return
        self._paused_output = True
        self._regulate()

    def resumeProducing(self) -> None:
        if self.closed:
            return
        self._paused_output = False
        self._regulate()
        if self._stream is not None:
            self._stream.pump()
        if self.outbox is not None:
            self.outbox.pump()

    def stopProducing(self) -> None:
        """The transport is going away; connectionLost follows."""
        self._paused_output = True

    def _regulate(self) -> None:
        """Read while the output drains and few commands wait; pause otherwise."""
        if self.closed:
            return
        waiting = len(self._queue) + len(self._slots)
        wanted = self._paused_output or waiting > MAX_PIPELINE
        if wanted and not self._paused_reading:
            self._paused_reading = True
            self.transport.pauseProducing()
        elif not wanted and self._paused_reading and waiting <= MAX_PIPELINE // 2:
            self._paused_reading = False
            self.transport.resumeProducing()

    # ------------------------------------------------------------------ input

    def dataReceived(self, data: bytes) -> None:
        if self.closed or not self._greeted:
            return
        self._queue.extend(self._parser.feed(data))
        self._run()

    def _run(self) -> None:
        """Handle queued commands in order until one has to wait."""
        if self._running:
            return
        self._running = True
        try:
            while self._queue and not self._busy and not self.closed:
                slot = self._slot = _Slot()
                self._slots.append(slot)
                result = self._handle(self._queue.popleft())
                if isinstance(result, Overlap):
                    slot.ready = False
                    self._slot = None
                    if result.after is not None:
                        slot.after.append(result.after)
                    result.d.addCallbacks(self._overlap_done, self._overlap_failed,
                                          callbackArgs=(slot,), errbackArgs=(slot,))
                elif isinstance(result, Deferred):
                    slot.ready = False
                    self._busy = True
                    result.addErrback(self._failed)
                    result.addBoth(self._resume, slot)
                else:
                    self._slot = None
        finally:
            self._running = False
        self._flush()
        self._regulate()

    def _resume(self, _result: object, slot: _Slot) -> None:
        self._busy = False
        slot.ready = True
        self._slot = None
        if not self._running:
            self._run()

    def _overlap_done(self, data: bytes, slot: _Slot) -> None:
        if data:
            slot.data.append(data)
        slot.ready = True
        if not self._running:
            self._flush()
            self._regulate()

    def _overlap_failed(self, failure: Failure, slot: _Slot) -> None:
        error = failure.value
        if isinstance(error, (Refused, TopicError)):
            slot.data.append(encode_reply(error.code, error.text))
        else:
            if not is_outage(failure):  # the store logs its outage once
                self._log.failure("SMQP publish failed", failure)
            slot.data.append(encode_reply(451, "Local error: the message was not stored"))
        self._overlap_done(b"", slot)

    def _handle(self, event: Command | ClientReply | Rejected) -> Overlap | Deferred | None:
        try:
            if isinstance(event, Rejected):
                self._reply(event.code, event.text)
                return None
            if isinstance(event, ClientReply):
                if self.outbox is None:
                    raise Refused(503, "Bad sequence: no notification to acknowledge")
                return self.client_reply(event)
            if event.name != "PASSWORD":
                self._password_change = None
            if self.account is None and event.name not in _BEFORE_LOGIN:
                raise Refused(403, "Forbidden: log in first")
            handler = _COMMANDS.get(event.name)
            if handler is None:
                raise Refused(502, f"Not implemented: {event.name}")
            return handler(self, event)
        except Refused as exc:
            self._reply(exc.code, exc.text)
        except TopicError as exc:
            self._reply(exc.code, exc.text)
        except Exception:
            self._log.failure("SMQP command {name}", name=getattr(event, "name", event))
            self._reply(451, "Local error in processing")
        return None

    def _failed(self, failure: Failure) -> None:
        error = failure.value
        if isinstance(error, (Refused, TopicError)):
            self._reply(error.code, error.text)
        elif isinstance(error, Busy):
            self._reply(451, "Local error: too many logins are being checked; try again later")
        else:
            if not is_outage(failure):  # the store logs its outage once
                self._log.failure("SMQP command failed", failure)
            self._reply(451, "Local error in processing")

    # ------------------------------------------------------------------ output

    def _reply(self, code: int, *lines: str) -> None:
        self._reply_raw(encode_reply(code, *lines))

    def _reply_raw(self, data: bytes) -> None:
        """Bytes of the current command's reply (or, outside a command, a reply of its own)."""
        if self.closed:
            return
        slot = self._slot
        if slot is None:
            slot = _Slot()
            self._slots.append(slot)
        slot.data.append(data)

    def _after_reply(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the current reply has been written (the server's 310
        before the next NOTIFY)."""
        slot = self._slot
        if slot is None:
            callback()
        else:
            slot.after.append(callback)

    def _flush(self, closing: bool = False) -> None:
        """Write the replies that are ready, in command order (all of them when closing).
        A streamed reply first in line gets its head written and goes on by itself; the
        replies behind it wait until it is done."""
        slots = self._slots
        out: list[bytes] = []
        after: list[Callable[[], None]] = []
        stream = None
        while slots:
            slot = slots[0]
            if slot.stream is not None and not closing:
                out.extend(slot.data)
                slot.data = []
                stream = slot.stream
                break
            if not (slot.ready or closing):
                break
            slots.popleft()
            out.extend(slot.data)
            after.extend(slot.after)
        if out and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        for callback in after:
            callback()
        if stream is not None:
            stream.pump()

    def stream_reply(self, head: bytes, source: Callable[[], Deferred], tail: bytes) -> Deferred:
        """Answer the current command with ``head``, then the pieces ``source`` gives, then
        ``tail``, written as the client reads (see brokerd.protocols.smqp.streaming); the
        Deferred fires once all of it is written or the connection is gone."""
        slot = self._slot
        if slot is None:
            slot = _Slot(ready=False)
            self._slots.append(slot)
        stream = self._stream = slot.stream = ReplyStream(self, source, tail)
        slot.data.append(head)

        def ended(result: _T) -> _T:
            slot.stream = None
            if self._stream is stream:
                self._stream = None
            if self.outbox is not None and not self.closed:
                self.outbox.pump()
            return result

        stream.done.addCallback(ended)
        self._flush()
        return stream.done

    def may_stream(self, stream: ReplyStream) -> bool:
        """Whether ``stream`` may write now: first in line and the output under its limit."""
        return not self._paused_output and bool(self._slots) and self._slots[0].stream is stream


_COMMANDS = command_table(SMQPServerProtocol, verbs_of(SMQPServerProtocol))
"""Every SMQP command verb and its ``do_<VERB>`` (brokerd.protocols.dispatch)."""


class SMQPServerFactory(SMQPFrontEnd):
    """The front end's shared state (:class:`~brokerd.protocols.smqp.factory.SMQPFrontEnd`)
    as the Twisted factory of its connections: one per broker, shared by every SMQP listener.
    (Twisted types ``protocol`` as a maker of protocols whose ``factory`` is exactly a
    ``Factory[Self]``; the connection's is the typed front end.)"""

    protocol = SMQPServerProtocol  # type: ignore[assignment]  # the docstring says why


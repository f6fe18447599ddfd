"""The life of a server connection, written once for every front end.

Every front end (SSMP, MCCHAT, SMQP, socket.mq, MQTT) lives through the same steps:

1. **admit**: ask the Broker whether one more connection fits (brokerd.protocols.admission);
   a refused one is answered in the protocol's own words and closed;
2. **no delay**: TCP_NODELAY (brokerd.protocols.nodelay);
3. **output limit**: the transport pauses its producer past ``--max-output-buffer`` bytes;
4. **producer**: the connection registers itself as its transport's streaming producer
   (brokerd.protocols.flow says what a paused connection does with its messages);
5. **timers**: the login (or CONNECT) deadline and any other one-shot timer, on the
   factory's clock;
6. **dispatch** the lines or frames a read brings (brokerd.protocols.dispatch);
7. **liveness**: a silent connection is pinged or closed by its factory's sweep;
8. **close** with the answer the protocol specifies;
9. **release**: the admission is given back, every timer still pending is cancelled, and the
   front end detaches the session from the Broker.

:class:`ConnectionLifecycle` is steps 1-5 and 9 as a mixin of the protocol class, and
:class:`LivenessSweep` is step 7 for a factory.  A mixin, not a
``twisted.protocols.policies`` wrapper: a wrapper puts a second protocol object and one more
call on every ``dataReceived`` and ``write``, and the read/write path is the broker's hot
path; the steps here run once per connection (or once per sweep), never per read.

Why a sweep and not ``TimeoutMixin``: ``TimeoutMixin.resetTimeout`` moves a delayed call on
every read, a heap operation per read on the hot path.  A read here only sets ``heard``; one
``LoopingCall`` per factory turns it into ``last_heard`` a few times per timeout.  What a
silent connection gets (a PING, a DISCONNECT with a reason code, a plain close) is the
protocol's, passed to the sweep as ``visit``.

Every timer is taken from an injected clock (the factory's ``clock``: the reactor, or a
``task.Clock`` in tests), never from a reactor imported here.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall

from brokerd.core.admission import Admission
from brokerd.core.broker import Broker
from brokerd.protocols.admission import admit
from brokerd.protocols.nodelay import no_delay
from brokerd.twistedio import limit_output_buffer


class ConnectionLifecycle:
    """Mixin for a server connection: admission, TCP_NODELAY, the output limit, the producer
    registration, timers on the factory's clock, and their release.

    The class using it has ``transport`` and ``factory`` (with ``broker`` and ``clock``);
    one whose broker or clock is found elsewhere overrides :meth:`lifecycle_broker` or
    :meth:`lifecycle_clock`.  Its ``connectionMade`` calls :meth:`open_connection` and
    answers a refusal; its ``connectionLost`` calls :meth:`release_connection` and, when that
    returns True, detaches from the Broker.  The state lives on the class until first set, so
    a connection pays for no instance attribute it does not use.
    """

    transport: Any
    factory: Any
    _admission: Admission | None = None
    _timers: list[DelayedCall] | None = None
    _registered = False
    """Whether this connection is its transport's producer (see :meth:`register_producer`)."""

    def lifecycle_broker(self) -> Broker:
        """The Broker that admits this connection."""
        return self.factory.broker

    def lifecycle_clock(self) -> Any:
        """The clock of this connection's timers (IReactorTime)."""
        return self.factory.clock

    def open_connection(self, output_limit: int | None) -> bool:
        """Admit the connection, set TCP_NODELAY and the output limit (when given); False,
        with nothing set, when a connection limit is full (the caller answers and closes)."""
        if not self.admit_connection():
            return False
        self.prepare_transport(output_limit)
        return True

    def admit_connection(self) -> bool:
        """Step 1 alone: False when a connection limit is full.  For a front end that still
        serves a refused connection a little (SMQP redirects it) before
        :meth:`prepare_transport`."""
        admission = admit(self.lifecycle_broker(), self.transport)
        if admission is None:
            return False
        self._admission = admission
        return True

    def prepare_transport(self, output_limit: int | None) -> None:
        """Steps 2 and 3: TCP_NODELAY, and the output limit when given."""
        no_delay(self.transport)
        if output_limit is not None:
            limit_output_buffer(self.transport, output_limit)

    def logged_in(self) -> None:
        """The connection logged in: it no longer counts as unauthenticated."""
        if self._admission is not None:
            self._admission.login()

    def take_admission(self) -> Admission | None:
        """Hand the admission over to whatever carries the connection on (an HTTP
        connection upgraded to a WebSocket); this connection no longer releases it."""
        admission, self._admission = self._admission, None
        return admission

    def adopt_admission(self, admission: Admission | None) -> None:
        """Release ``admission`` when this connection ends (see :meth:`take_admission`)."""
        self._admission = admission

    def register_producer(self) -> None:
        """Become the transport's streaming producer: paused past the output limit."""
        self.transport.registerProducer(self, True)
        self._registered = True

    def unregister_producer(self) -> None:
        """Stop being the transport's producer.  A transport with a registered producer
        (TLS especially) waits for the producer to go away before it closes, so a
        connection closing itself calls this first."""
        if self._registered:
            self._registered = False
            self.transport.unregisterProducer()

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> DelayedCall:
        """A one-shot timer on the connection's clock, cancelled by :meth:`release_connection`
        if it is still pending then."""
        call = self.lifecycle_clock().callLater(delay, callback, *args)
        timers = self._timers
        if timers is None:
            self._timers = [call]
        else:
            timers[:] = [timer for timer in timers if timer.active()]
            timers.append(call)
        return call

    @staticmethod
    def cancel_timer(call: DelayedCall | None) -> None:
        """Cancel ``call`` unless it already ran or was cancelled (None: nothing to do)."""
        if call is not None and call.active():
            call.cancel()

    def cancel_timers(self) -> None:
        """Cancel every timer of this connection that is still pending."""
        timers, self._timers = self._timers, None
        for call in timers or ():
            if call.active():
                call.cancel()

    def release_connection(self) -> bool:
        """The end of the connection: cancel its timers and give its admission back.  True
        the first time for an admitted connection (the caller then detaches its session);
        False for a refused one and on every later call."""
        self.cancel_timers()
        admission, self._admission = self._admission, None
        if admission is None:
            return False
        admission.release()
        return True


class Silent(Protocol):
    """What :class:`LivenessSweep` reads and writes on a connection."""

    heard: bool
    """Set by the connection on every read."""
    last_heard: float
    """When the sweep last saw ``heard`` set (or the connection began to be watched)."""


_Watched = TypeVar("_Watched", bound=Silent)


class LivenessSweep(Generic[_Watched]):
    """A factory's watch over its connections' silence: one ``LoopingCall`` on the factory's
    clock, every ``interval`` seconds, calls ``visit(connection, now)`` for each watched
    connection that sent nothing since the previous sweep (``now - connection.last_heard``
    is how long it has been silent).  ``visit`` is the protocol's rule: PING it, close it
    with the protocol's answer, or leave it.

    ``live`` is the watched connections (a dict used as an ordered set, so that a connection
    closed during a sweep is simply gone from the next one).
    """

    def __init__(self, clock: IReactorTime, interval: float, visit: Callable[[_Watched, float], None]) -> None:
        self.clock = clock
        self.interval = interval
        self.visit = visit
        self.live: dict[_Watched, None] = {}
        self._call: LoopingCall | None = None

    def watch(self, connection: _Watched) -> None:
        """Watch ``connection`` from now on; its silence counts from now."""
        connection.last_heard = self.clock.seconds()
        self.live[connection] = None

    def forget(self, connection: _Watched) -> None:
        """Stop watching ``connection`` (it ended); harmless if it was not watched."""
        self.live.pop(connection, None)

    def start(self) -> None:
        """Begin sweeping (from the factory's ``startFactory``)."""
        if self._call is None:
            call = self._call = LoopingCall(self.sweep)
            call.clock = self.clock
            call.start(self.interval, now=False)

    def stop(self) -> None:
        """Stop sweeping (from the factory's ``stopFactory``): no delayed call is left."""
        call, self._call = self._call, None
        if call is not None and call.running:
            call.stop()

    def sweep(self) -> None:
        """One pass: a connection heard since the last pass is marked silent from now; the
        others are visited."""
        now = self.clock.seconds()
        visit = self.visit
        for connection in tuple(self.live):
            if connection.heard:
                connection.heard = False
                connection.last_heard = now
            else:
                visit(connection, now)

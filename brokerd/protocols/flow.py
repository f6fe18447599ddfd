"""Flow control shared by the front ends: bounded output per recipient, then drop and count.

Each connection registers itself as a streaming producer of its own transport.  Twisted calls
``pauseProducing`` when more than the transport's ``bufferSize`` bytes wait to be written; from
then on the broker's messages for that connection are dropped and counted, and its own requests
are not read (so its replies cannot pile up) until ``resumeProducing``.

The drops of one congestion episode (from the pause to the resume, or to the end of the
connection) go to the event log as one ``dropped`` record whose ``dropped`` field is the count
of writes dropped, as in ``broker.stats.slow_consumer_drops`` (a write is one message, or a run
of messages one publisher sent to one topic in one read, which the core hands over as one): a
slow reader costs the hot path an integer increment per write, never a log entry.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.events.schema import DROPPED, SLOW_CONSUMER
from brokerd.protocols.lifecycle import ConnectionLifecycle
from brokerd.twistedio import DirectWrites

if TYPE_CHECKING:
    from brokerd.core.broker import Broker
    from brokerd.events.log import IEventRecorder

# The fast paths (a queue limit apart from the recv() size, and a write that skips the queue
# when it is empty) use Twisted internals no public API reaches; brokerd.twistedio keeps them,
# each behind its release check with the public fallback (docs/performance-history.md).


_corked: list[DropWhenCongested] | None = None
"""The connections holding deliveries during the current read (None outside a read)."""


def begin_read() -> bool:
    """The start of a read that may deliver to other connections: until :func:`end_read`
    their deliveries are held, and each gets one write (see :meth:`DropWhenCongested.deliver`).
    False if a read is already in progress (a callback inside it), which then ends it."""
    global _corked
    if _corked is not None:
        return False
    _corked = []
    return True


_after_read: list[Callable[[], None]] = []
"""Called once the current read's held writes are written (:func:`after_read`)."""


def after_read(callback: Callable[[], None]) -> bool:
    """Run ``callback`` right after the read being handled wrote what it held (the delivery
    latency sampler times those writes, brokerd.core.sampling); False when no read is being
    handled (deliveries are then written as they are handed over)."""
    if _corked is None:
        return False
    _after_read.append(callback)
    return True


def end_read() -> None:
    """Write what the read held, one write per connection."""
    global _corked
    corked, _corked = _corked, None
    for session in corked or ():
        session.uncork()
    if _after_read:
        callbacks = _after_read[:]
        _after_read.clear()
        for callback in callbacks:
            callback()


def record_drops(events: IEventRecorder, protocol: str, session: bytes | str, count: int,
                 reason: str = SLOW_CONSUMER) -> None:
    """One ``dropped`` event standing for ``count`` writes ``session`` did not get."""
    events.record(DROPPED, protocol, session=session, reason=reason, dropped=count, outcome=DROPPED)


class CountingFactory(Protocol):
    """What :class:`DropWhenCongested` needs of its connection's factory: where it counts
    and logs the drops."""

    @property
    def broker(self) -> Broker: ...

    @property
    def events(self) -> IEventRecorder: ...


class DropWhenCongested(ConnectionLifecycle, DirectWrites):
    """IPushProducer half of a session whose ``send`` is its transport's ``write``, on the
    shared connection lifecycle (brokerd.protocols.lifecycle).

    The class using it has ``transport``, ``closed``, ``dropped``, ``protocol``, ``name``,
    ``factory.broker`` and ``factory.events`` (the event log's IEventRecorder), and calls
    :meth:`report_drops` when its connection ends (before it detaches from the broker, so the
    record comes before the session's logout).
    """

    factory: CountingFactory
    closed: bool
    dropped: int
    protocol: str
    name: bytes
    episode_drops = 0
    """Messages dropped since the last pause that are not logged yet."""

    def start_flow_control(self, limit: int) -> None:
        """From ``connectionMade``, once :meth:`open_connection` set the transport's output
        limit to ``limit``: deliveries go through :meth:`deliver` (Twisted pauses this
        producer, once registered, past ``limit`` bytes)."""
        self.check_direct_writes()
        self._output_limit = limit
        self.send = self.deliver

    def close_transport(self) -> None:
        """Close the connection once its queued output is written.  A transport with a
        registered producer (TLS especially) waits for the producer to go away before it
        closes, so unregister it first.  What the current read made for this connection
        (see :meth:`hold_writes`) is written before the end."""
        held = self.release_writes()
        if held:
            self.transport.write(b"".join(held))
            held.clear()
        self.unregister_producer()
        self.transport.loseConnection()

    _read_held: list[bytes] | None = None
    """While a read is handled: where ``send`` puts this connection's data (see
    :meth:`hold_writes` and :meth:`deliver`)."""
    _read_held_size = 0
    _output_limit = 1 << 20
    """Set by :meth:`start_flow_control`; also the most a read holds for one connection."""

    def deliver(self, data: bytes) -> None:
        """``send`` of a connection that keeps up.  During a read (see :func:`begin_read`) the
        data is held and written when the read is done, together with everything else the
        read makes for this connection: a read of 16 UCASTs to one peer is one send() to it,
        not 16.  Otherwise it is written at once."""
        corked = _corked
        if corked is None:
            self.write_now(data)
            return
        if self._read_held is not None:
            self._hold_during_read(data)
            return
        # ``send`` stays this method: most recipients get one delivery per read (UCASTs to
        # many peers), and switching it to _hold_during_read and back cost more than the
        # test above.
        self._read_held = [data]
        self._read_held_size = len(data)
        corked.append(self)

    def hold_writes(self, into: list[bytes]) -> None:
        """From the start of its own read until :meth:`release_writes`, what the broker sends
        this connection is appended to ``into`` (the list of this read's replies), so that an
        event the read caused for its own sender (an UCAST to itself, a copy of its MSG, an
        answer) and the replies leave in order and in one write.  Two writes in a row would be
        two segments, and the second would wait for the peer's delayed acknowledgement of the
        first wherever TCP_NODELAY is not in effect.  A congested or closed connection is
        left as it is."""
        if self.send == self.deliver:
            self._read_held = into
            self._read_held_size = 0
            self.send = self._hold_during_read

    def release_writes(self) -> list[bytes] | None:
        """End of the read: ``send`` writes again (unless congestion or the end of the
        connection changed it meanwhile); returns what is held, for the caller to write."""
        held = self._read_held
        if held is not None:
            self._read_held = None
            if self.send == self._hold_during_read:
                self.send = self.deliver
        return held

    def write_piece(self, data: bytes) -> None:
        """Write ``data`` (a piece of a reply produced under the output limit, e.g. an MCCHAT
        topic list) now, after what the broker sent this connection earlier in the read
        being handled, in one write; later sends of the read are held as usual.  Holding the
        piece itself would let a reply grow past the output limit before the transport sees
        it."""
        held = self._read_held
        if held:
            data = b"".join(held) + data
            held.clear()
            self._read_held_size = 0
        self.write_now(data)

    def steady_send(self) -> Any:
        """The ``send`` of a connection that keeps up, now: holding while one of its reads is
        handled (see :meth:`hold_writes`), else :meth:`deliver`."""
        return self._hold_during_read if self._read_held is not None else self.deliver

    def uncork(self) -> None:
        """Write what :meth:`deliver` held during a read (see :func:`end_read`)."""
        # release_writes, inlined: this runs once per recipient per read.
        held = self._read_held
        if held is None:
            return
        self._read_held = None
        if self.send == self._hold_during_read:
            self.send = self.deliver
        if held:
            self.write_now(held[0] if len(held) == 1 else b"".join(held))

    def _hold_during_read(self, data: bytes) -> None:
        """``send`` while a read is handled.  Past the output limit what is held is written
        at once (and congestion applies as usual: it may pause us, which makes ``send``
        drop)."""
        held: list[bytes] = self._read_held  # type: ignore[assignment]  # send is this method only while a read holds a list
        held.append(data)
        self._read_held_size += len(data)
        if self._read_held_size > self._output_limit:
            self._read_held_size = 0
            joined = b"".join(held)
            held.clear()
            self.write_now(joined)

    def _drop(self, data: bytes) -> None:
        """``send`` while congested: count instead of writing."""
        self.dropped += 1
        self.episode_drops += 1
        self.factory.broker.stats.slow_consumer_drops += 1

    def pauseProducing(self) -> None:
        if self.closed:
            return
        self.send = self._drop
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        if self.closed:
            return
        self.send = self.deliver
        self.transport.resumeProducing()
        if self.episode_drops:
            self.report_drops()

    def stopProducing(self) -> None:
        self.send = self._drop

    def report_drops(self) -> None:
        """Log the drops of the current episode (if any) as one event; idempotent."""
        count = self.episode_drops
        if count:
            self.episode_drops = 0
            record_drops(self.factory.events, self.protocol, self.name, count)

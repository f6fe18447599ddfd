"""The client's answers to an SMQP session's notifications (mixed into
:class:`~brokerd.protocols.smqp.outbox.Outbox`): ``310 ACK``, ``312``, ``416``, the retry
timeout of a notification nobody answered, giving a delivery up.

Kept apart from the outbox's queue and sending so each stays readable; the two share the
outbox's state (``sent``, ``settles``, ``known``...), documented in
:mod:`~brokerd.protocols.smqp.outbox`.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.store.base import is_outage
from brokerd.store.memory import StoreClosed
from brokerd.store.records import Delivery


_T = TypeVar("_T")


class NoNotification(Exception):
    """A 310/312/416 with no notification outstanding."""


class _Sent:
    """A notification written to the client and not answered yet."""

    __slots__ = ("delivery", "parts", "call")

    def __init__(self, delivery: Delivery, parts: list[bytes]) -> None:
        self.delivery = delivery
        self.parts = parts
        self.call: IDelayedCall | None = None
        """The retry timeout's DelayedCall."""

    def cancel(self) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None


class Answers:
    """Mixin: the client's answers and the retry timeout, over the outbox's state."""

    _log = Logger()
    sent: deque[_Sent]
    sent_bytes: int
    one_held: int
    settles: int
    window: int
    known: set[int]
    closed: bool
    durable: Any  # the DurableService, which takes the whole Outbox (this mixin alone is no IDurableSession)
    session: Any
    name: str
    _counting: bool
    _resend_attempt: int
    _resending: set[int]
    _later: dict[int, IDelayedCall]

    if TYPE_CHECKING:  # the outbox's (brokerd.protocols.smqp.outbox.Outbox)
        def suspend(self, topic: str | None) -> None: ...

        def offer(self, delivery: Delivery) -> None: ...

        def pump(self) -> None: ...

    # ------------------------------------------------------------------ the client's answer

    def acknowledge(self, wait: bool = False) -> Deferred:
        """The client's ``310 ACK`` (``wait``: its ``312``): fires once stored."""
        delivery = self._take()
        self.settles += 1
        if wait:
            self.suspend(delivery.topic)
        d = self.durable.acknowledged(self, delivery)

        def done(result: _T) -> _T:
            self.settles -= 1
            self.known.discard(delivery.seq)
            return result

        return d.addBoth(done)

    def refuse(self) -> Deferred:
        """The client's ``416``: try again later (a ONE message: someone else first)."""
        delivery = self._take()
        if delivery.mode == "ONE":
            self.durable.release(delivery.seq, self)
        self.settles += 1
        d = self.durable.attempt(self.name, delivery)

        def counted(attempts: int) -> Deferred | None:
            self.settles -= 1
            if attempts == 0:
                self.known.discard(delivery.seq)
                return None
            if attempts >= self.durable.max_attempts:
                return self._give_up(delivery)
            durable = self.durable
            self._later[delivery.seq] = durable.clock.callLater(durable.retry_timeout, self._again, delivery)
            return None

        def failed(failure: Failure) -> None:
            self.settles -= 1
            self.known.discard(delivery.seq)
            if not expected_store_failure(failure):
                self._log.failure("Counting a refused delivery", failure)

        return d.addCallbacks(counted, failed)

    def _take(self) -> Delivery:
        """The oldest notification not answered: the one the client's answer is for."""
        if not self.sent or self._counting:
            raise NoNotification()
        entry = self.sent.popleft()
        entry.cancel()
        self.sent_bytes -= len(entry.delivery.data)
        if entry.delivery.mode == "ONE":
            self.one_held -= 1
        self._resend_attempt = 0
        return entry.delivery

    def _again(self, delivery: Delivery) -> None:
        self._later.pop(delivery.seq, None)
        if self.closed or delivery.seq not in self.known:
            return
        self.known.discard(delivery.seq)
        self._resending.add(delivery.seq)
        self.offer(delivery)
        if delivery.seq not in self.known:  # not taken (suspended, full window): forget it
            self._resending.discard(delivery.seq)

    def _retry(self, entry: _Sent) -> None:
        """No acknowledgement in time: count the attempt, send again or give up (with a
        window: close the session once counted, see the module docstring)."""
        entry.call = None
        delivery = entry.delivery
        if self.closed or not self.sent or entry not in self.sent:
            return
        # A ONE message is not sent again to a session that left it unanswered: the session
        # is closed like a window's, so the message goes to a subscriber that answers.
        windowed = self.window > 1 or len(self.sent) > 1 or delivery.mode == "ONE"
        self._counting = not windowed  # a window's answers go on meanwhile
        d = self.durable.attempt(self.name, delivery)

        def counted(attempts: int) -> Deferred | None:
            self._counting = False
            if self.closed or entry not in self.sent:
                return None
            if windowed:
                return self._window_timed_out(entry, attempts)
            if attempts == 0:
                self._abandon(entry)
                return None
            if attempts >= self.durable.max_attempts:
                self._drop(entry)
                return self._give_up(delivery)
            self._resend_attempt = attempts + 1
            self.pump()  # now if the output is under its limit, else once it drains
            return None

        def failed(failure: Failure) -> None:
            self._counting = False
            if failure.check(StoreClosed):
                return  # the broker is stopping: the delivery stays pending for the next start
            if not is_outage(failure):
                self._log.failure("Counting a delivery attempt", failure)
            if entry in self.sent and not self.closed:
                entry.call = self.durable.clock.callLater(self.durable.retry_timeout, self._retry, entry)

        d.addCallbacks(counted, failed)

    def _window_timed_out(self, entry: _Sent, attempts: int) -> Deferred | None:
        """A notification of a window was not answered in time: give it up when its
        attempts are spent, then end the session (what is unanswered stays pending)."""
        close = getattr(self.session, "window_timed_out", None)
        if attempts and attempts >= self.durable.max_attempts:
            self._drop(entry)
            d = self._give_up(entry.delivery)
            if close is not None:
                d.addBoth(lambda result: (close(), result)[1])
            return d
        if close is not None:
            close()
        return None

    def _drop(self, entry: _Sent) -> None:
        """``entry`` leaves the notifications outstanding without an answer."""
        entry.cancel()
        self.sent.remove(entry)
        self.sent_bytes -= len(entry.delivery.data)
        if entry.delivery.mode == "ONE":
            self.one_held -= 1

    def _resend(self) -> None:
        """The retry of the notification in flight, written under the same output limit as
        any notification; its retry timeout starts once it is written."""
        attempt, self._resend_attempt = self._resend_attempt, 0
        entry = self.sent[0]
        self.durable.redelivered(self, entry.delivery, attempt)
        self.session.write_notify(entry.parts)
        entry.call = self.durable.clock.callLater(self.durable.retry_timeout, self._retry, entry)

    def _abandon(self, entry: _Sent) -> None:
        """The delivery vanished from the store (expired, removed): move on."""
        self._drop(entry)
        delivery = entry.delivery
        if delivery.mode == "ONE":
            self.durable.release(delivery.seq, self)
        self.known.discard(delivery.seq)
        self.pump()

    def _give_up(self, delivery: Delivery) -> Deferred:
        if delivery.mode == "ONE":
            self.durable.release(delivery.seq, self)
        self._counting = True

        def done(result: _T) -> _T:
            self._counting = False
            self.known.discard(delivery.seq)
            self.pump()
            return result

        return self.durable.give_up(self, delivery).addBoth(done)


def expected_store_failure(failure: Failure) -> bool:
    """A store that is closed (the broker is stopping) or away (it logged that once, with
    its state): what a delivery's bookkeeping gets then is no error of its own to log."""
    return failure.check(StoreClosed) is not None or is_outage(failure)

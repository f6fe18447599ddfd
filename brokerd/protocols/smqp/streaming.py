"""Replies written a piece at a time, as the client reads them.

Most SMQP replies are a few lines.  GET MESSAGE is not: up to 1000 messages of up to
``--smqp-max-message-size`` bytes each, for one short command.  Built whole, a client that
sends it and never reads would make the broker hold gigabytes, and keep holding them after it
left.  A :class:`ReplyStream` instead fetches one piece (one message) when the connection's
output is under ``--max-output-buffer`` and writes it, and fetches the next once the transport
took it (the connection is the transport's streaming producer: Twisted pauses it past the
limit and resumes it when the client has read).  What a connection holds for such a reply is
one piece and the list of what is left to fetch; when the connection ends, the stream stops
and the piece in flight is dropped when it arrives.

The session (SMQPServerProtocol) writes replies in command order: a stream starts when every
earlier reply is written, and the replies after it (and NOTIFYs) wait until it is done.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure


class ReplyStream:
    """One reply whose body comes from ``source``: each call gives a Deferred of the next
    piece (bytes, possibly empty), or of None when there is no more; ``tail`` ends it.
    ``done`` fires once everything is written (or the connection is gone)."""

    _log = Logger()

    def __init__(self, session: Any, source: Callable[[], Deferred], tail: bytes) -> None:
        self.session = session
        self.source = source
        self.tail = tail
        self.done: Deferred = Deferred()
        self._fetching = False
        self._pumping = False
        self._finished = False

    def pump(self) -> None:
        """Fetch and write pieces while the session may write (its output under the limit,
        this reply next in line).  Safe to call at any time."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while not self._fetching and not self._finished:
                if self.session.closed:
                    self._finish()
                    return
                if not self.session.may_stream(self):
                    return
                self._fetching = True
                self.source().addCallbacks(self._got, self._failed)
        finally:
            self._pumping = False

    def _got(self, piece: bytes | None) -> None:
        self._fetching = False
        if self._finished:
            return
        if self.session.closed:
            self._finish()
            return
        if piece is None:
            self.session.transport.write(self.tail)
            self._finish()
            return
        if piece:
            self.session.transport.write(piece)
        self.pump()

    def _failed(self, failure: Failure) -> None:
        """The store failed in the middle of a reply: no reply code can be sent any more,
        and a list cut short must not look complete, so the connection is closed."""
        self._fetching = False
        self._log.failure("Reading the messages of a GET MESSAGE reply", failure)
        self._finish()
        self.session.transport.loseConnection()

    def stop(self) -> None:
        """The connection is gone: stop fetching (a piece in flight is dropped)."""
        self._finish()

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.done.callback(None)

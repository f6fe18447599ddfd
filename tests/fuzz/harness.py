"""What the targets share: how an input is cut into reads, and the stream property.

An input is one selector byte and the bytes the decoder reads.  A stream decoder is fed the
bytes three ways (whole, cut in two where the selector says, one byte at a time), each time
by a new decoder, and must give the same outcome each way; a message decoder lets the
selector choose among its variants.  Keeping the selector in front leaves the rest of a
corpus file as the wire bytes the project's encoders write."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

Step = Callable[[Any, bytes], tuple[list[Any], Any]]
"""Feed one read to a decoder: (what it completed, its error or None)."""


def selector_and_payload(data: bytes) -> tuple[int, bytes]:
    """The selector byte (0 for an empty input) and the bytes the decoder reads."""
    return (data[0], data[1:]) if data else (0, b"")


def chunkings(selector: int, payload: bytes) -> list[list[bytes]]:
    """The three ways a stream decoder is fed ``payload``: whole, cut at the point the
    selector picks (0-255 over the payload's length), byte by byte."""
    cut = selector * len(payload) // 255
    return [[payload], [payload[:cut], payload[cut:]], [payload[i:i + 1] for i in range(len(payload))]]


def plain(value: Any) -> Any:
    """``value`` with exceptions made comparable ((type name, text)); lists and tuples kept."""
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    return value


def error_kind(error: BaseException) -> tuple[str, Any]:
    """What of an error the chunking may not change: its type and the reason code it
    answers with (its text may name where it was noticed: a line too long is seen before
    its end arrives when fed byte by byte, and refused for what it holds when whole)."""
    return type(error).__name__, getattr(error, "reason_code", None)


@dataclass(frozen=True)
class Stream:
    """A stream decoder under test.

    ``make`` builds a new decoder; ``step`` feeds it one read; ``held`` reads how many bytes
    it holds and ``limit`` is the most it may hold; ``errors`` are the exception types its
    specification allows it to raise (a decoder that returns its error rather than raising
    it has none).  ``keeps_before_error`` says whether what a read completed before the
    error is still returned (a raising decoder loses it)."""

    make: Callable[[], Any]
    step: Step
    held: Callable[[Any], int]
    limit: int
    errors: tuple[type[BaseException], ...] = ()
    keeps_before_error: bool = True

    def outcome(self, chunks: Iterable[bytes]) -> tuple[list[Any] | None, Any]:
        """Feed ``chunks`` to a new decoder: everything it completed and its first error."""
        decoder = self.make()
        events: list[Any] = []
        for chunk in chunks:
            try:
                got, error = self.step(decoder, chunk)
            except self.errors as exc:
                got, error = [], exc
            events += got
            if error is not None:  # the connection ends: what the decoder still holds is freed
                return (events if self.keeps_before_error else None), error_kind(error)
            held = self.held(decoder)
            assert held <= self.limit, f"holds {held} bytes, more than its limit {self.limit}"
        return events, None

    def check(self, data: bytes) -> tuple[list[Any] | None, Any]:
        """The property: the same outcome whatever the chunking; the whole read's outcome."""
        selector, payload = selector_and_payload(data)
        whole, *others = [self.outcome(chunks) for chunks in chunkings(selector, payload)]
        for other in others:
            assert plain(other) == plain(whole), f"chunking changed the outcome: {other!r} != {whole!r}"
        return whole


def refused(call: Callable[[], Any], errors: tuple[type[BaseException], ...]) -> tuple[Any, Any]:
    """A message decoder's outcome: (its result, None), or (None, its specified error);
    any other exception escapes (a finding)."""
    try:
        return call(), None
    except errors as exc:
        return None, plain(exc)

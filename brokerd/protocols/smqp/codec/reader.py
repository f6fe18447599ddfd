"""SMQP input framing, server side: lines and counted bytes, the message-body and contact
readers, and :class:`SMQPParser` (bytes from a client in, one event per command out)."""
from __future__ import annotations

import dataclasses
import re
from enum import Enum
from typing import Final, Literal

from brokerd.protocols.smqp.codec.grammar import (
    BODY_MESSAGE,
    BODY_NONE,
    _BODY_COMMANDS,
    body_follows,
    parse_command,
)
from brokerd.protocols.smqp.codec.values import (
    BAD_REQUEST,
    MAX_CONTACT,
    MAX_HEADER_ATTRIBUTES,
    MAX_LINE,
    MAX_MESSAGE,
    MAX_SECTIONS,
    MAX_SECTION_ATTRIBUTES,
    TOO_LARGE,
)
from brokerd.protocols.smqp.events import Body, ClientReply, Command, Rejected, Section

class _Long(Enum):
    LONG = "long"


_LONG: Final = _Long.LONG
"""What :meth:`_Input.line` returns for a line longer than the limit (already discarded): an
enum member, so that ``line is _LONG`` narrows the type of what the reader got."""
_PREFIX = 64
_BLANKS = re.compile(rb"[ \t]+")
_ATTRIBUTE = re.compile(rb"([A-Za-z][A-Za-z0-9_-]*)[ \t]*:[ \t]*(.*?)[ \t]*")


class _Input:
    """A byte buffer consumed from the front: lines (CRLF or LF) and counted bytes.  A line
    longer than ``max_line`` is discarded as it arrives (only its first words are kept, in
    ``long_prefix``: enough to tell whether a body follows), so the buffer never holds more
    than one line's worth of it."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.buf = bytearray()
        self.pos = 0
        self.scan = 0
        self.skipping = False
        self.long_prefix = b""

    def add(self, data: bytes) -> None:
        if self.pos:
            del self.buf[: self.pos]
            self.scan -= self.pos
            self.pos = 0
        self.buf += data

    @property
    def available(self) -> int:
        return len(self.buf) - self.pos

    def line(self) -> bytes | Literal[_Long.LONG] | None:
        buf = self.buf
        if self.skipping:
            i = buf.find(b"\n", self.pos)
            self._note_long(bytes(buf[self.pos : len(buf) if i < 0 else i]))
            if i < 0:
                self.pos = self.scan = len(buf)
                return None
            self.pos = self.scan = i + 1
            self.skipping = False
            return _LONG
        i = buf.find(b"\n", max(self.scan, self.pos))
        if i < 0:
            if len(buf) - self.pos > self.max_line + 1:
                self.long_prefix = b""
                self._note_long(bytes(buf[self.pos :]))
                self.pos = self.scan = len(buf)
                self.skipping = True
            else:
                self.scan = len(buf)
            return None
        line = bytes(buf[self.pos : i])
        self.pos = self.scan = i + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_line:
            self.long_prefix = b""
            self._note_long(line)
            return _LONG
        return line

    def _note_long(self, piece: bytes) -> None:
        """Keep the first words of a long line (blank runs made one space, leading blanks
        dropped), whatever the blanks before and between them, across reads."""
        if len(self.long_prefix) >= _PREFIX:
            return
        self.long_prefix = _BLANKS.sub(b" ", self.long_prefix + piece).lstrip(b" ")[:_PREFIX]

    def take(self, n: int) -> bytes:
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += len(data)
        self.scan = max(self.scan, self.pos)
        return data

    def skip(self, n: int) -> int:
        count = min(n, self.available)
        self.pos += count
        self.scan = max(self.scan, self.pos)
        return count

    def peek(self, n: int) -> bytes:
        return bytes(self.buf[self.pos : self.pos + n])


def _attribute(line: bytes) -> tuple[str, str] | None:
    m = _ATTRIBUTE.fullmatch(line)
    if m is None:
        return None
    try:
        value = m.group(2).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not value.isprintable():
        return None
    return m.group(1).decode("ascii"), value


class _BodyError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


_NEED = object()


class _BodyReader:
    """Reads one message body from an :class:`_Input`, a step at a time.

    :meth:`step` returns ``_NEED`` (more bytes needed) or the finished :class:`Body`; a
    malformed body raises :class:`_BodyError` once it has been consumed entirely, so the next
    command starts on a clean line.  With ``keep=False`` (a body whose command was already
    refused) the structure is followed but no data is kept.
    """

    def __init__(self, source: _Input, keep: bool = True, max_message: int = MAX_MESSAGE,
                 max_body: int | None = None) -> None:
        self.input = source
        self.keep = keep
        self.max_message = max_message
        self.max_body = max_body
        """Bytes of the whole body (attribute lines, blank lines, data); None: no limit."""
        self.size = 0
        self.state = self._head
        self.header: list[tuple[str, str]] = []
        self.sections: list[Section] = []
        self.section: list[tuple[str, str]] = []
        self.remaining = 0
        self.total = 0
        self.data: list[bytes] = []
        self.error: _BodyError | None = None

    def step(self) -> object:
        while True:
            outcome = self.state()
            if outcome is not None:
                return outcome

    # Each state returns None to continue with the (possibly new) state, _NEED, or the Body.

    def _fail(self, code: int, text: str, scan: bool) -> None:
        if self.error is None:
            self.error = _BodyError(code, text)
        self.keep = False
        if scan:
            self.state = self._scan

    def _next_line(self) -> bytes | Literal[_Long.LONG] | None:
        line = self.input.line()
        if line is not None and line is not _LONG:
            self._grow(len(line) + 2)
        return line

    def _grow(self, count: int) -> None:
        """Count ``count`` more bytes of the body; past ``max_body`` the rest is followed
        (data skipped by its Content-Length) but not kept, and the answer is 413."""
        self.size += count
        if self.max_body is not None and self.size > self.max_body:
            self._fail(TOO_LARGE, f"message over {self.max_body} bytes", scan=False)

    def _finish(self) -> object:
        if self.error is not None:
            raise self.error
        return Body(tuple(self.header), tuple(self.sections))

    def _head(self) -> object:
        line = self._next_line()
        if line is None:
            return _NEED
        if line is _LONG:
            self._fail(BAD_REQUEST, "message header line too long", scan=True)
            return None
        if line == b"":
            self.state = self._between
            return None
        if line == b".":
            return self._finish()
        attr = _attribute(line)
        if attr is None:
            self._fail(BAD_REQUEST, "message header: expected 'Name: value'", scan=True)
            return None
        if attr[0].lower().startswith("content-"):
            self._open_section(attr)
            return None
        if len(self.header) >= MAX_HEADER_ATTRIBUTES:
            self._fail(BAD_REQUEST, f"more than {MAX_HEADER_ATTRIBUTES} header attributes", scan=True)
            return None
        self.header.append(attr)
        return None

    def _open_section(self, attr: tuple[str, str]) -> None:
        if len(self.sections) >= MAX_SECTIONS:
            self._fail(BAD_REQUEST, f"more than {MAX_SECTIONS} data sections", scan=True)
            return
        self.section = [attr]
        self.state = self._section_head

    def _section_head(self) -> object:
        line = self._next_line()
        if line is None:
            return _NEED
        if line is _LONG:
            self._fail(BAD_REQUEST, "data section attribute line too long", scan=True)
            return None
        if line == b".":
            self._fail(BAD_REQUEST, "data section without data", scan=False)
            return self._finish()
        if line == b"":
            self._start_data()
            return None
        attr = _attribute(line)
        if attr is None:
            self._fail(BAD_REQUEST, "data section: expected 'Name: value'", scan=True)
            return None
        if len(self.section) >= MAX_SECTION_ATTRIBUTES:
            self._fail(BAD_REQUEST, f"more than {MAX_SECTION_ATTRIBUTES} section attributes", scan=True)
            return None
        self.section.append(attr)
        return None

    def _start_data(self) -> None:
        attrs = tuple(self.section)
        length = next((v for k, v in attrs if k.lower() == "content-length"), None)
        if length is None or not (length.isascii() and length.isdigit()) or len(length) > 15:
            self._fail(BAD_REQUEST, "data section without a valid Content-Length", scan=True)
            return None
        if not any(k.lower() == "content-type" and v for k, v in attrs):
            self._fail(BAD_REQUEST, "data section without a Content-Type", scan=False)
        self.remaining = int(length)
        self.total += self.remaining
        self._grow(self.remaining)
        if self.total > self.max_message:
            self._fail(TOO_LARGE, f"message data over {self.max_message} bytes", scan=False)
        self.data = []
        self.state = self._data
        return None

    def _data(self) -> object:
        if self.remaining:
            if self.keep:
                chunk = self.input.take(self.remaining)
                self.data.append(chunk)
                self.remaining -= len(chunk)
            else:
                self.remaining -= self.input.skip(self.remaining)
            if self.remaining:
                return _NEED
        if self.keep:
            self.sections.append(Section(tuple(self.section), b"".join(self.data)))
        else:
            self.sections.append(Section(tuple(self.section), b""))
        self.data = []
        self.state = self._after_data
        return None

    def _after_data(self) -> object:
        """An optional line end right after the data (the draft's examples have one)."""
        head = self.input.peek(2)
        if not head or head == b"\r":
            return _NEED
        if head.startswith(b"\n"):
            self.input.skip(1)
        elif head == b"\r\n":
            self.input.skip(2)
        self.state = self._between
        return None

    def _between(self) -> object:
        line = self._next_line()
        if line is None:
            return _NEED
        if line is _LONG:
            self._fail(BAD_REQUEST, "message line too long", scan=True)
            return None
        if line == b"":
            return None
        if line == b".":
            return self._finish()
        attr = _attribute(line)
        if attr is None:
            self._fail(BAD_REQUEST, "expected a data section or the final '.'", scan=True)
            return None
        self._open_section(attr)
        return None

    def _scan(self) -> object:
        """Error recovery: skip lines up to the final ``.``."""
        while True:
            line = self.input.line()
            if line is None:
                return _NEED
            if line == b".":
                return self._finish()


_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""Bytes a contact line may not hold (a tab may)."""


class _ContactReader:
    """Reads SET LOGIN CONTACT lines up to a ``.`` line; the data is the lines joined with
    CRLF (line ends normalised, the text otherwise byte for byte)."""

    def __init__(self, source: _Input, keep: bool = True, max_size: int = MAX_CONTACT) -> None:
        self.input = source
        self.keep = keep
        self.max_size = max_size
        self.lines: list[bytes] = []
        self.size = 0
        self.error: _BodyError | None = None

    def step(self) -> object:
        while True:
            line = self.input.line()
            if line is None:
                return _NEED
            if line == b".":
                if self.error is not None:
                    raise self.error
                return b"\r\n".join(self.lines)
            if line is _LONG:
                self.error = self.error or _BodyError(BAD_REQUEST, "contact line too long")
                continue
            if _CONTROL.search(line):
                # a bare CR, NUL...: no reply line could carry it back (GET LOGIN CONTACT)
                self.error = self.error or _BodyError(BAD_REQUEST, "control characters in contact data")
                continue
            self.size += len(line) + 2
            if self.size > self.max_size:
                self.error = self.error or _BodyError(TOO_LARGE, f"contact data over {self.max_size} bytes")
            if self.keep and self.error is None:
                self.lines.append(line)


class SMQPParser:
    """Server side: bytes from a client in, :class:`Command`, :class:`ClientReply` and
    :class:`Rejected` events out, one per command (a command's body included)."""

    def __init__(
        self, max_line: int = MAX_LINE, max_message: int = MAX_MESSAGE, max_contact: int = MAX_CONTACT,
        max_body: int | None = None,
    ) -> None:
        self._input = _Input(max_line)
        self._max_message = max_message
        self._max_body = max_body
        self._max_contact = max_contact
        self._reader: _BodyReader | _ContactReader | None = None
        self._pending: Command | Rejected | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into events."""
        return self._input.available

    @property
    def in_body(self) -> bool:
        """True while a message body or contact data is being read."""
        return self._reader is not None

    def feed(self, data: bytes) -> list[Command | ClientReply | Rejected]:
        source = self._input
        source.add(data)
        events: list[Command | ClientReply | Rejected] = []
        while True:
            if self._reader is not None:
                try:
                    result = self._reader.step()
                except _BodyError as exc:
                    pending = self._pending
                    name = pending.name if pending is not None else None
                    events.append(pending if isinstance(pending, Rejected) else Rejected(exc.code, exc.text, name))
                    self._reader = self._pending = None
                    continue
                if result is _NEED:
                    break
                events.append(self._complete(result))
                self._reader = self._pending = None
                continue
            line = source.line()
            if line is None:
                break
            if line is _LONG:
                kind = body_follows(source.long_prefix)
                rejected = Rejected(BAD_REQUEST, f"line longer than {source.max_line} bytes")
                if kind == BODY_NONE:
                    events.append(rejected)
                else:
                    self._start(kind, rejected)
                continue
            if not line.strip(b" \t"):
                continue
            kind = body_follows(line)
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                event: Command | ClientReply | Rejected = Rejected(BAD_REQUEST, "not UTF-8")
            else:
                if not text.replace("\t", " ").isprintable():
                    event = Rejected(BAD_REQUEST, "control characters in the command line")
                else:
                    event = parse_command(text)
            if isinstance(event, Command) and event.name in _BODY_COMMANDS:
                kind = _BODY_COMMANDS[event.name]  # a parsed command's body is never run as commands
            if kind == BODY_NONE or isinstance(event, ClientReply):
                events.append(event)
            else:
                self._start(kind, event)
        return events

    def _start(self, kind: int, pending: Command | Rejected) -> None:
        keep = isinstance(pending, Command)
        self._pending = pending
        if kind == BODY_MESSAGE:
            self._reader = _BodyReader(self._input, keep, self._max_message, self._max_body)
        else:
            self._reader = _ContactReader(self._input, keep, self._max_contact)

    def _complete(self, result: object) -> Command | Rejected:
        pending = self._pending
        if isinstance(pending, Rejected) or pending is None:
            return pending or Rejected(BAD_REQUEST, "malformed command")
        if isinstance(result, Body):
            return _replace(pending, body=result)
        return _replace(pending, data=result)


def _replace(command: Command, **changes: object) -> Command:
    return dataclasses.replace(command, **changes)  # type: ignore[arg-type]  # body: a Body, data: bytes, as _complete passes them

"""SMQP server output, client side: :class:`SMQPClientParser` (greeting, replies and
notifications, with their bodies)."""
from __future__ import annotations

import re

from brokerd.protocols.smqp.codec.reader import _BodyError, _BodyReader, _Input, _LONG, _NEED
from brokerd.protocols.smqp.codec.values import MAX_MESSAGE, MAX_SERVER_LINE, SMQPProtocolError
from brokerd.protocols.smqp.events import Body, Greeting, Notify, Reply

_REPLY = re.compile(r"([0-9]{3})(?:([ -])(.*))?")
_NOTIFY_KINDS = {"MESSAGE": "MESSAGE", "MESS": "MESSAGE", "RECEIPT": "RECEIPT", "TOPIC": "TOPIC",
                 "SUBSCRIBERS": "SUBSCRIBERS", "SUB": "SUBSCRIBERS", "SERVER": "SERVER",
                 "SERV": "SERVER"}
_NOTIFY_WORDS = {"REN": "RENAME", "RENAME": "RENAME", "DEL": "DELETE", "DELETE": "DELETE",
                 "KEY": "KEYWORDS", "KEYWORDS": "KEYWORDS", "ADD": "ADD", "MOVE": "MOVE",
                 "REPLACE": "REPLACE", "BYE": "BYE", "TIMEOUT": "TIMEOUT"}


class SMQPClientParser:
    """Client side: bytes from a server in, :class:`Greeting`, :class:`Reply` and
    :class:`Notify` events out.  Raises :class:`SMQPProtocolError` on anything else (a
    client cannot resynchronise with a server that breaks the grammar)."""

    def __init__(
        self, expect_greeting: bool = True, max_line: int = MAX_SERVER_LINE, max_message: int = MAX_MESSAGE
    ) -> None:
        self._input = _Input(max_line)
        self._max_message = max_message
        self._greeting = expect_greeting
        self._reply_code: int | None = None
        self._reply_lines: list[str] = []
        self._reader: _BodyReader | None = None
        self._notify: tuple[str, tuple[str, ...]] | None = None
        self.failed: SMQPProtocolError | None = None

    def feed(self, data: bytes) -> list[Greeting | Reply | Notify]:
        if self.failed is not None:
            raise self.failed
        try:
            return self._feed(data)
        except SMQPProtocolError as exc:
            self.failed = exc
            raise

    def _feed(self, data: bytes) -> list[Greeting | Reply | Notify]:
        source = self._input
        source.add(data)
        events: list[Greeting | Reply | Notify] = []
        while True:
            if self._reader is not None:
                try:
                    result = self._reader.step()
                except _BodyError as exc:
                    raise SMQPProtocolError(f"bad notification body: {exc.text}") from None
                if result is _NEED:
                    break
                notify = self._notify
                assert notify is not None and isinstance(result, Body)  # the NOTIFY the body reader was started for
                kind, args = notify
                events.append(Notify(kind, args, result))
                self._reader = self._notify = None
                continue
            line = source.line()
            if line is None:
                break
            if line is _LONG:
                raise SMQPProtocolError(f"server line longer than {source.max_line} bytes")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise SMQPProtocolError("server line is not UTF-8") from None
            if self._greeting:
                events.append(_parse_greeting(text))
                self._greeting = False
                continue
            event = self._line(text)
            if event is not None:
                events.append(event)
        return events

    def _line(self, text: str) -> Reply | Notify | None:
        m = _REPLY.fullmatch(text)
        if m is not None:
            code = int(m.group(1))
            if self._reply_code is not None and code != self._reply_code:
                raise SMQPProtocolError(f"multi-line reply {self._reply_code} continued by {code}")
            self._reply_lines.append(m.group(3) or "")
            if m.group(2) == "-":
                self._reply_code = code
                return None
            lines, self._reply_lines, self._reply_code = tuple(self._reply_lines), [], None
            return Reply(code, lines)
        if self._reply_code is not None:
            raise SMQPProtocolError(f"expected the rest of a {self._reply_code} reply, got {text[:80]!r}")
        if not text.strip():
            return None
        words = text.split()
        if words[0].upper() != "NOTIFY" or len(words) < 2:
            raise SMQPProtocolError(f"not a reply or notification: {text[:80]!r}")
        kind = _NOTIFY_KINDS.get(words[1].upper())
        if kind is None:
            raise SMQPProtocolError(f"unknown notification {words[1][:32]!r}")
        args = tuple(words[2:])
        if kind == "TOPIC" and len(args) >= 2:
            args = (args[0], _NOTIFY_WORDS.get(args[1].upper(), args[1].upper())) + args[2:]
            if args[1] == "KEYWORDS":
                args = args[:2] + (text.split(None, 4)[4] if len(text.split(None, 4)) > 4 else "",)
        elif kind in ("MESSAGE", "RECEIPT") and len(args) >= 2:
            args = (args[0], _NOTIFY_WORDS.get(args[1].upper(), args[1].upper())) + args[2:]
        elif kind == "SERVER" and args:
            args = (_NOTIFY_WORDS.get(args[0].upper(), args[0].upper()),) + args[1:]
        if kind in ("MESSAGE", "RECEIPT"):
            self._notify = (kind, args)
            self._reader = _BodyReader(self._input, True, self._max_message)
            return None
        return Notify(kind, args)


def _parse_greeting(text: str) -> Greeting:
    if not text.startswith("SMQP/"):
        raise SMQPProtocolError(f"not an SMQP greeting: {text[:80]!r}")
    head, _sp, rest = text.partition(" ")
    version = head[len("SMQP/"):]
    status, dot, ident = rest.partition(".")
    if not dot:
        status, ident = rest, ""
    return Greeting(version, status.strip(), ident.strip())

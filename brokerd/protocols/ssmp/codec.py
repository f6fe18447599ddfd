"""SSMP 1.1 wire codec, sans-IO: bytes in, requests/responses/events out; and back.

Framing is the subtle part.  Lines end with LF, except that a *binary* payload (first byte
0x00-0x03) is its two length bytes (big-endian, plus one) and then exactly that many bytes,
which may include LF.  Where a payload may start depends on the verb, so a line holding a
binary payload is framed by counting fields.  That careful path only runs on a read that
contains a byte 0x00-0x03 at all; every other read is split on LF in one C call, which is what
keeps the server fast.

Nothing here touches a socket, a reactor or a clock.
"""
from __future__ import annotations

import re

from brokerd.errors import ProtocolError
from brokerd.protocols.ssmp.events import Event, Request, Response

MAX_ID = 64
"""Identifiers and topics: 1 to 64 ID characters."""
MAX_PAYLOAD = 1024
"""Payload content: 1 to 1024 bytes, text or binary."""
MAX_VERB = 16
MAX_LINE = len(b"LOGIN") + 1 + MAX_ID + 1 + MAX_ID + 1 + 2 + MAX_PAYLOAD
"""The longest line the grammar allows (a LOGIN with a 64-character id and scheme and a
full binary credential), LF excluded.  A longer line can only be a grammar violation."""
MAX_EVENT_LINE = 4 + MAX_ID + 1 + MAX_VERB + 1 + MAX_ID + 1 + 2 + MAX_PAYLOAD
"""The longest server line a client has to accept."""

ID_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.:@/_-+=~"
ANONYMOUS = b"."

_ID = re.compile(rb"[A-Za-z0-9.:@/_\-+=~]{1,64}")
_VERB = re.compile(rb"[A-Z]{1,16}")
_CODE = re.compile(rb"[0-9]{3}")
_PRESENCE = b"PRESENCE"


class SSMPProtocolError(ProtocolError):
    """Input that violates the SSMP grammar.  A server answers ``400`` and closes."""

    reply = b"400\n"


_KNOWN_IDS: dict[bytes, None] = {}
_KNOWN_IDS_LIMIT = 65_536
_new = tuple.__new__
_MCAST = b"MCAST"
_UCAST = b"UCAST"


def is_id(value: bytes) -> bool:
    """True if ``value`` is 1-64 ID characters.

    Topics and peers repeat on every line, so valid ids are remembered (in a dict bounded to
    65,536 entries, emptied when full): a dict lookup is several times cheaper than the regex.
    """
    if value in _KNOWN_IDS:
        return True
    if _ID.fullmatch(value) is None:
        return False
    if len(_KNOWN_IDS) >= _KNOWN_IDS_LIMIT:
        _KNOWN_IDS.clear()
    _KNOWN_IDS[value] = None
    return True


# ---------------------------------------------------------------------------- payloads

def check_payload(payload: bytes) -> None:
    """Raise SSMPProtocolError unless ``payload`` is a well-formed wire payload."""
    size = len(payload)
    if size == 0:
        raise SSMPProtocolError("empty payload")
    first = payload[0]
    if first > 3:
        if size > MAX_PAYLOAD:
            raise SSMPProtocolError(f"text payload of {size} bytes (at most {MAX_PAYLOAD})")
    elif size < 3 or (first << 8 | payload[1]) + 3 != size:
        raise SSMPProtocolError("binary payload length does not match its length bytes")


def payload_content(payload: bytes) -> tuple[bytes, bool]:
    """The content of a well-formed wire payload and whether it was binary."""
    if payload[0] > 3:
        return payload, False
    return payload[2:], True


def encode_payload(content: bytes, binary: bool = False) -> bytes | None:
    """The wire form of ``content``: as text when asked and possible, else binary.  None when
    no SSMP payload can carry it (empty, or more than 1024 bytes)."""
    size = len(content)
    if size == 0 or size > MAX_PAYLOAD:
        return None
    if not binary and content[0] > 3 and 10 not in content:  # 10: LF (an int needle: see _LineFramer.frame)
        return content
    return bytes(((size - 1) >> 8, (size - 1) & 0xFF)) + content


# ---------------------------------------------------------------------------- requests

def _no_args(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    if has_rest:
        raise SSMPProtocolError(f"{verb.decode()} takes no arguments")
    return Request(verb)


def _parse_login(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    ident, sp, rest = rest.partition(b" ")
    scheme, sp2, credential = rest.partition(b" ")
    if not (has_rest and sp and is_id(ident) and is_id(scheme)):
        raise SSMPProtocolError("LOGIN needs an identifier and a scheme")
    if sp2:
        check_payload(credential)
        return Request(verb, ident, credential, scheme)
    return Request(verb, ident, None, scheme)


def _parse_subscribe(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    topic, sp, flag = rest.partition(b" ")
    if not (has_rest and is_id(topic)) or (sp and flag != _PRESENCE):
        raise SSMPProtocolError("SUBSCRIBE needs a topic and at most the PRESENCE flag")
    return Request(verb, topic, None, _PRESENCE if sp else None)


def _parse_unsubscribe(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    if not (has_rest and is_id(rest)):
        raise SSMPProtocolError("UNSUBSCRIBE needs a topic")
    return Request(verb, rest)


def parse_cast(verb: bytes, rest: bytes, has_rest: bool = True) -> Request:
    """An MCAST or UCAST line's request (``rest``: what follows the verb and its space)."""
    return _parse_cast(verb, rest, has_rest)


def _parse_cast(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    # The hot path of the whole broker: keep it to a partition, a dict lookup and a tuple.
    target, sp, payload = rest.partition(b" ")
    if not sp or (target not in _KNOWN_IDS and not is_id(target)):
        raise SSMPProtocolError(f"{verb.decode()} needs an id and a payload")
    if not (payload and payload[0] > 3 and len(payload) <= MAX_PAYLOAD):
        check_payload(payload)
    return _new(Request, (verb, target, payload, None, True))


def _parse_bcast(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    if not has_rest:
        raise SSMPProtocolError("BCAST needs a payload")
    check_payload(rest)
    return Request(verb, None, rest)


def _is_payload(value: bytes) -> bool:
    try:
        check_payload(value)
    except SSMPProtocolError:
        return False
    return True


def _parse_compat(verb: bytes, rest: bytes, has_rest: bool) -> Request:
    """``verb [SP id] [SP payload]`` with a verb SSMP 1.1 does not define."""
    if _VERB.fullmatch(verb) is None:
        raise SSMPProtocolError("not an SSMP request")
    if has_rest and not _is_payload(rest):
        ident, sp, payload = rest.partition(b" ")
        if not (sp and is_id(ident) and _is_payload(payload)):
            raise SSMPProtocolError("malformed arguments")
    return Request(verb, known=False)


_REQUEST_PARSERS = {
    b"LOGIN": _parse_login,
    b"CLOSE": _no_args,
    b"PING": _no_args,
    b"PONG": _no_args,
    b"SUBSCRIBE": _parse_subscribe,
    b"UNSUBSCRIBE": _parse_unsubscribe,
    b"UCAST": _parse_cast,
    b"MCAST": _parse_cast,
    b"BCAST": _parse_bcast,
}

# Where a payload may start, counted in space-separated fields from the start of the line.
_REQUEST_PAYLOAD_FIELDS = {
    b"LOGIN": (3,),
    b"UCAST": (2,),
    b"MCAST": (2,),
    b"BCAST": (1,),
    b"CLOSE": (),
    b"PING": (),
    b"PONG": (),
    b"SUBSCRIBE": (),
    b"UNSUBSCRIBE": (),
}
_COMPAT_PAYLOAD_FIELDS = (1, 2)


def parse_request(line: bytes) -> Request:
    """Parse one request line (LF removed).  Raises SSMPProtocolError."""
    verb, sp, rest = line.partition(b" ")
    parser = _REQUEST_PARSERS.get(verb, _parse_compat)
    return parser(verb, rest, bool(sp))


def _request_payload_fields(fields: list[bytes]) -> tuple[int, ...]:
    return _REQUEST_PAYLOAD_FIELDS.get(fields[0], _COMPAT_PAYLOAD_FIELDS)


# ---------------------------------------------------------------------------- server lines

_EVENT_PAYLOAD_FIELDS = {b"UCAST": (4,), b"MCAST": (4,), b"BCAST": (3,)}


def _server_payload_fields(fields: list[bytes]) -> tuple[int, ...]:
    if fields[0] != b"000":
        return (1,)
    if len(fields) < 3:
        return (3, 4)
    return _EVENT_PAYLOAD_FIELDS.get(fields[2], ())


def parse_server_line(line: bytes) -> Response | Event:
    """Parse one line a server sent (LF removed).  Raises SSMPProtocolError."""
    code, sp, rest = line.partition(b" ")
    if _CODE.fullmatch(code) is None:
        raise SSMPProtocolError("not an SSMP response or event")
    if code != b"000":
        if sp:
            check_payload(rest)
            return Response(code, rest)
        return Response(code)
    sender, sp, rest = rest.partition(b" ")
    if not (sp and (sender == ANONYMOUS or is_id(sender))):
        raise SSMPProtocolError("event without a sender")
    verb, sp, rest = rest.partition(b" ")
    if verb in (b"PING", b"PONG", b"CLOSE"):
        if sp:
            raise SSMPProtocolError(f"{verb.decode()} event takes no arguments")
        return Event(sender, verb)
    request = _REQUEST_PARSERS.get(verb, _parse_compat)(verb, rest, bool(sp))
    if not request.known or verb == b"LOGIN":
        raise SSMPProtocolError(f"unknown event verb {verb!r}")
    return Event(sender, verb, request.target, request.payload, request.option)


# ---------------------------------------------------------------------------- framing

class _LineFramer:
    """Splits a byte stream into SSMP lines, honouring binary payloads that contain LF."""

    def __init__(self, payload_fields, max_line: int) -> None:
        self._payload_fields = payload_fields
        self._max_line = max_line
        self._buffer = b""
        self.failed: SSMPProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet framed into a line."""
        return len(self._buffer)

    def frame(self, data: bytes) -> tuple[list[bytes], SSMPProtocolError | None]:
        """Add ``data``; return the complete lines (without LF) and an error if the stream
        broke the grammar after them.  After an error the framer only reports that error."""
        if self.failed is not None:
            return [], self.failed
        buffer = self._buffer + data if self._buffer else data
        # Four memchr scans are ~8x faster than one regex search for "any of 0x00-0x03"; int
        # needles, because a bytes needle makes CPython try it as an int first and build and
        # clear a TypeError each time (674 ns for the four per read, 62 ns with ints).
        if not (0 in buffer or 1 in buffer or 2 in buffer or 3 in buffer):
            lines = buffer.split(b"\n")
            rest = lines.pop()
            if len(rest) > self._max_line:
                return lines, self._fail("line too long")
            self._buffer = rest
            return lines, None
        return self._frame_carefully(buffer)

    def _fail(self, why: str) -> SSMPProtocolError:
        self._buffer = b""
        self.failed = SSMPProtocolError(why)
        return self.failed

    def _frame_carefully(self, buffer: bytes) -> tuple[list[bytes], SSMPProtocolError | None]:
        lines: list[bytes] = []
        pos = 0
        size = len(buffer)
        while pos < size:
            end = self._line_end(buffer, pos, size)
            if end < 0:
                break
            lines.append(buffer[pos:end])
            pos = end + 1
        rest = buffer[pos:]
        if end == -2:
            return lines, self._fail("binary payload not followed by LF")
        if len(rest) > self._max_line:
            return lines, self._fail("line too long")
        self._buffer = rest
        return lines, None

    def _line_end(self, buffer: bytes, pos: int, size: int) -> int:
        """Index of the LF ending the line at ``pos``; -1 if incomplete; -2 if malformed."""
        fields: list[bytes] = []
        start = pos
        while True:
            space = buffer.find(b" ", start)
            newline = buffer.find(b"\n", start)
            if newline != -1 and (space == -1 or newline < space):
                return newline
            if space == -1:
                return -1
            fields.append(buffer[start:space])
            start = space + 1
            if start >= size:
                return -1
            allowed = self._payload_fields(fields)
            if not allowed or len(fields) > allowed[-1]:
                newline = buffer.find(b"\n", start)
                return newline
            if len(fields) in allowed:
                if buffer[start] > 3:
                    return buffer.find(b"\n", start)
                if start + 2 > size:
                    return -1
                end = start + 2 + (buffer[start] << 8 | buffer[start + 1]) + 1
                if end >= size:
                    return -1
                return end if buffer[end] == 10 else -2


class SSMPParser:
    """Server side: bytes from a client in, :class:`Request` tuples out."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._framer = _LineFramer(_request_payload_fields, max_line)

    @property
    def buffered(self) -> int:
        return self._framer.buffered

    def lines(self, data: bytes) -> tuple[list[bytes], SSMPProtocolError | None]:
        """Framing only: the request lines (LF removed) completed by ``data`` and, if the
        stream then broke the framing, the error.  For a caller that parses each line itself
        (the server's request loop, which handles the common MCAST/UCAST line without making
        a Request): it parses the others with :func:`parse_request`, or :func:`parse_cast`
        for an MCAST/UCAST line that is not the common case, and reports a line that does not
        parse with :meth:`fail`."""
        return self._framer.frame(data)

    def fail(self, error: SSMPProtocolError) -> SSMPProtocolError:
        """A line :meth:`lines` returned broke the grammar: from now on only ``error``."""
        self._framer.failed = error
        return error

    def feed(self, data: bytes) -> tuple[list[Request], SSMPProtocolError | None]:
        """Return the requests completed by ``data`` and, if the stream then broke the
        grammar, the error (the server answers the requests, then 400 and close)."""
        lines, error = self._framer.frame(data)
        requests: list[Request] = []
        append = requests.append
        parsers = _REQUEST_PARSERS
        known = _KNOWN_IDS
        for line in lines:
            # parse_request(), inlined: this loop runs once per request the broker serves.
            verb, sp, rest = line.partition(b" ")
            if verb == _MCAST or verb == _UCAST:
                # _parse_cast's common case, inlined: a known id and a text payload.  Anything
                # else (and every error) goes through _parse_cast below.
                target, separated, payload = rest.partition(b" ")
                if separated and target in known and payload and payload[0] > 3 and len(payload) <= MAX_PAYLOAD:
                    append(_new(Request, (verb, target, payload, None, True)))
                    continue
            try:
                append(parsers.get(verb, _parse_compat)(verb, rest, bool(sp)))
            except SSMPProtocolError as exc:
                self._framer.failed = exc
                return requests, exc
        return requests, error


class SSMPClientParser:
    """Client side: bytes from a server in, :class:`Response` / :class:`Event` tuples out."""

    def __init__(self, max_line: int = MAX_EVENT_LINE) -> None:
        self._framer = _LineFramer(_server_payload_fields, max_line)

    def feed(self, data: bytes) -> tuple[list[Response | Event], SSMPProtocolError | None]:
        lines, error = self._framer.frame(data)
        messages: list[Response | Event] = []
        for line in lines:
            try:
                messages.append(parse_server_line(line))
            except SSMPProtocolError as exc:
                self._framer.failed = exc
                return messages, exc
        return messages, error


# ---------------------------------------------------------------------------- encoding

def encode_response(code: bytes, payload: bytes | None = None) -> bytes:
    if payload is None:
        return code + b"\n"
    return b"".join((code, b" ", payload, b"\n"))


def encode_event(sender: bytes, verb: bytes, *args: bytes) -> bytes:
    """``000 <sender> <verb> [args...]`` with args already in wire form (payload last)."""
    return b" ".join((b"000", sender, verb) + args) + b"\n"


def wire_payload(content: bytes, binary: bool = False) -> bytes:
    """The wire form of ``content`` (text when possible and not ``binary``), or ValueError for
    content no SSMP payload can carry (empty, or over 1024 bytes)."""
    if not isinstance(content, bytes):
        raise TypeError(f"SSMP payloads are bytes, not {type(content).__name__}")
    payload = encode_payload(content, binary)
    if payload is None:
        raise ValueError(f"an SSMP payload carries 1 to 1024 bytes, not {len(content)}")
    return payload


def encode_request(verb: bytes, *args: bytes) -> bytes:
    """A request line; args in wire form, payload last (see :func:`encode_payload`)."""
    return b" ".join((verb,) + args) + b"\n"

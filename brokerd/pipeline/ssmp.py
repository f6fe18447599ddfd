"""A small blocking SSMP 1.1 client for Spark's Python workers.

The streaming source and sink run inside Spark's Python processes, not in a Twisted reactor,
so they talk SSMP over a plain socket: requests are written in order and SSMP answers them in
order, so a run of MCASTs is pipelined (written in one go, then the 200s are counted).
Events that arrive while a response is awaited are queued for :meth:`SSMPConnection.receive`.
The server's PING is answered with PONG wherever it shows up.

Standard library only (this module is imported on executors that may have nothing else).
"""
from __future__ import annotations

import socket
import time
from collections import deque
from typing import NamedTuple

MAX_ID = 64
MAX_PAYLOAD = 1024
MAX_MESSAGE = 4 + MAX_ID + 1 + 16 + 1 + MAX_ID + 1 + 2 + MAX_PAYLOAD + 1
"""The longest server message a client must accept (an event with a full binary payload)."""
_ID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.:@/_-+=~")
OK = b"200"


class SSMPClientError(Exception):
    """The connection broke, timed out, or the server said something outside the grammar."""


class SSMPRefused(SSMPClientError):
    """The server answered a request with a code other than 200."""

    def __init__(self, request: str, code: bytes, payload: bytes | None) -> None:
        detail = f" ({payload.decode('utf-8', 'replace')})" if payload else ""
        super().__init__(f"SSMP {request} refused: {code.decode('ascii', 'replace')}{detail}")
        self.code = code
        self.payload = payload


class Event(NamedTuple):
    """A server event: ``verb`` MCAST/UCAST/BCAST/SUBSCRIBE/UNSUBSCRIBE; ``target`` the topic
    or address (None for BCAST); ``content`` without SSMP's binary length bytes."""

    sender: bytes
    verb: bytes
    target: bytes | None
    content: bytes | None
    binary: bool
    received: float
    """time.time() when it was read."""


def is_id(value: bytes) -> bool:
    return 0 < len(value) <= MAX_ID and all(byte in _ID_CHARS for byte in value)


def wire_payload(content: bytes) -> bytes:
    """The SSMP payload for ``content``: text when it can be, else binary.  ValueError when
    SSMP cannot carry it (empty or more than 1024 bytes)."""
    size = len(content)
    if size == 0 or size > MAX_PAYLOAD:
        raise ValueError(f"SSMP payloads are 1 to {MAX_PAYLOAD} bytes, not {size}")
    if content[0] > 3 and b"\n" not in content:
        return content
    return bytes(((size - 1) >> 8, (size - 1) & 0xFF)) + content


class SSMPConnection:
    """One logged-in SSMP connection over TCP.  Not thread-safe: one thread uses it."""

    def __init__(
        self,
        host: str,
        port: int,
        identity: bytes,
        scheme: bytes = b"open",
        credential: bytes | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.identity = identity
        self.scheme = scheme
        self.credential = credential
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._events: deque[Event] = deque()
        self._responses: deque[tuple[bytes, bytes | None]] = deque()

    def connect(self) -> SSMPConnection:
        """Connect and LOGIN; raises SSMPRefused (e.g. 401) or SSMPClientError."""
        try:
            self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise SSMPClientError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        login = b"LOGIN " + self.identity + b" " + self.scheme
        if self.credential is not None:
            login += b" " + wire_payload(self.credential)
        self._send(login + b"\n")
        self._expect_ok("LOGIN")
        return self

    def close(self) -> None:
        """Send CLOSE (best effort) and close the socket."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.sendall(b"CLOSE\n")
        except OSError:
            pass
        sock.close()

    def __enter__(self) -> SSMPConnection:
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def subscribe(self, topic: bytes) -> None:
        if not is_id(topic):
            raise ValueError(f"{topic!r} is not an SSMP topic")
        self._send(b"SUBSCRIBE " + topic + b"\n")
        self._expect_ok(f"SUBSCRIBE {topic.decode()}")

    def mcast_many(self, messages: list[tuple[bytes, bytes]]) -> list[tuple[int, bytes]]:
        """Publish ``(topic, content)`` pairs in order, pipelined; return the ``(index, code)``
        of those the server refused (an empty list when every one got its 200)."""
        if not messages:
            return []
        lines = []
        for topic, content in messages:
            if not is_id(topic):
                raise ValueError(f"{topic!r} is not an SSMP topic")
            lines.append(b"MCAST " + topic + b" " + wire_payload(content) + b"\n")
        self._send(b"".join(lines))
        refused = []
        for index in range(len(lines)):
            code, _payload = self._response()
            if code != OK:
                refused.append((index, code))
        return refused

    def receive(self, timeout: float) -> Event | None:
        """The next event, waiting at most ``timeout`` seconds; None when none came."""
        deadline = time.monotonic() + timeout
        while not self._events:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                break
        return self._events.popleft() if self._events else None

    def _send(self, data: bytes) -> None:
        if self._sock is None:
            raise SSMPClientError("not connected")
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise SSMPClientError(f"connection to {self.host}:{self.port} lost: {exc}") from None

    def _expect_ok(self, request: str) -> None:
        code, payload = self._response()
        if code != OK:
            raise SSMPRefused(request, code, payload)

    def _response(self) -> tuple[bytes, bytes | None]:
        deadline = time.monotonic() + self.timeout
        while not self._responses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SSMPClientError(f"no response from {self.host}:{self.port} in {self.timeout} s")
            self._read(remaining)
        return self._responses.popleft()

    def _read(self, timeout: float) -> bool:
        """Read once (at most ``timeout`` seconds) and parse what came; False on timeout."""
        if self._sock is None:
            raise SSMPClientError("not connected")
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(65536)
        except TimeoutError:
            return False
        except OSError as exc:
            raise SSMPClientError(f"connection to {self.host}:{self.port} lost: {exc}") from None
        if not data:
            raise SSMPClientError(f"{self.host}:{self.port} closed the connection")
        self._buffer += data
        self._parse()
        return True

    def _parse(self) -> None:
        buffer = self._buffer
        start = 0
        now = time.time()
        while True:
            parsed = _parse_message(buffer, start)
            if parsed is None:
                break
            start, message = parsed
            if message[0] == b"000":
                self._on_event(message, now)
            else:
                self._responses.append((message[0], message[1]))
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_MESSAGE:
            raise SSMPClientError("the server sent a line longer than SSMP allows")

    def _on_event(self, message: tuple, received: float) -> None:
        _code, sender, verb, target, content, binary = message
        if verb == b"PING":
            self._send(b"PONG\n")
            return
        if verb == b"PONG":
            return
        self._events.append(Event(sender, verb, target, content, binary, received))


class _Incomplete(Exception):
    """The buffer ends inside the message: it is parsed again once more bytes came."""


def _take_payload(buffer: bytes, start: int) -> tuple[int, bytes, bool]:
    """(end after LF, content, binary) of a payload at ``start`` followed by LF."""
    if start >= len(buffer):
        raise _Incomplete
    if buffer[start] > 3:
        end = buffer.find(b"\n", start)
        if end < 0:
            raise _Incomplete
        return end + 1, buffer[start:end], False
    if start + 2 > len(buffer):
        raise _Incomplete
    size = (buffer[start] << 8 | buffer[start + 1]) + 1
    end = start + 2 + size
    if end >= len(buffer):
        raise _Incomplete
    if buffer[end] != 0x0A:
        raise SSMPClientError("binary payload not followed by LF")
    return end + 1, buffer[start + 2:end], True


def _field(buffer: bytes, start: int) -> tuple[int, bytes, bytes]:
    """The token at ``start`` up to SP or LF: (index after it, token, separator)."""
    for index in range(start, min(len(buffer), start + MAX_ID + 17)):
        byte = buffer[index]
        if byte == 0x20 or byte == 0x0A:
            return index + 1, buffer[start:index], bytes((byte,))
    if len(buffer) - start > MAX_ID + 17:
        raise SSMPClientError("SSMP field too long")
    raise _Incomplete


def _parse_message(buffer: bytes, start: int) -> tuple[int, tuple] | None:
    """One response ``(code, payload)`` or event ``(b"000", sender, verb, target, content,
    binary)`` from ``buffer[start:]``; None when it is not complete yet."""
    try:
        return _message(buffer, start)
    except _Incomplete:
        return None


def _message(buffer: bytes, start: int) -> tuple[int, tuple]:
    position, code, separator = _field(buffer, start)
    if len(code) != 3 or not code.isdigit():
        raise SSMPClientError(f"not an SSMP response or event: {buffer[start:start + 40]!r}")
    if code != b"000":
        if separator == b"\n":
            return position, (code, None)
        end, payload, _binary = _take_payload(buffer, position)
        return end, (code, payload)
    if separator != b" ":
        raise SSMPClientError("an SSMP event needs a sender")
    position, sender, separator = _field(buffer, position)
    if separator != b" ":
        raise SSMPClientError("an SSMP event needs a verb")
    position, verb, separator = _field(buffer, position)
    if separator == b"\n":
        return position, (code, sender, verb, None, None, False)
    if verb == b"BCAST":
        end, content, binary = _take_payload(buffer, position)
        return end, (code, sender, verb, None, content, binary)
    position, target, separator = _field(buffer, position)
    if separator == b"\n":
        return position, (code, sender, verb, target, None, False)
    if verb in (b"SUBSCRIBE", b"UNSUBSCRIBE"):
        end = buffer.find(b"\n", position)
        if end < 0:
            raise _Incomplete
        return end + 1, (code, sender, verb, target, buffer[position:end], False)
    end, content, binary = _take_payload(buffer, position)
    return end, (code, sender, verb, target, content, binary)

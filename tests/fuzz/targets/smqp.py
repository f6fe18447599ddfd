"""SMQP: the server's parser (commands, message bodies, contact lines; it never raises, a bad
command is a Rejected event) and the client's parser (greeting, replies, notifications; it
raises SMQPProtocolError), with small limits, fed whole, cut in two and byte by byte.  What
a parser holds is its input buffer and the body data it keeps."""
from __future__ import annotations

from typing import Any

from brokerd.protocols.smqp.codec import (
    SMQPClientParser,
    SMQPParser,
    SMQPProtocolError,
    encode_command,
    encode_contact,
    encode_greeting,
    encode_notify,
    encode_publish,
    encode_reply,
)
from brokerd.protocols.smqp.events import Body, Section
from tests.fuzz.harness import Stream

LINE, MESSAGE, CONTACT = 128, 512, 256


def held(parser: Any) -> int:
    """Bytes of input buffered plus the data of the body being read (a body's attribute
    lines are bounded by their count, not checked here)."""
    reader = parser._reader
    kept = 0
    if reader is not None and hasattr(reader, "sections"):
        kept = sum(len(section.data) for section in reader.sections) + sum(len(chunk) for chunk in reader.data)
    elif reader is not None:
        kept = sum(len(line) + 2 for line in reader.lines)
    return parser._input.available + kept


SERVER = Stream(lambda: SMQPParser(LINE, MESSAGE, CONTACT), lambda parser, data: (parser.feed(data), None),
                held, LINE + 2 + max(MESSAGE, CONTACT))
CLIENT = Stream(lambda: SMQPClientParser(True, LINE, MESSAGE), lambda parser, data: (parser.feed(data), None),
                held, LINE + 2 + MESSAGE, errors=(SMQPProtocolError,), keeps_before_error=False)


def check(data: bytes) -> tuple:
    return SERVER.check(data), CLIENT.check(data)


def seeds() -> dict[str, bytes]:
    body = Body((("Created", "D20010815T08341245Z"), ("Name", "quote")),
                (Section((("Content-Type", "text/plain"),), b"IBM 120\r\n.\r\n"),
                 Section((("Content-Type", "application/octet-stream"),), b"\x00\xff")))
    commands = b"".join((
        encode_command("LOGIN", "alice:ch1", "CLEAR/1.0"), encode_command("SET", "LOGIN", "PASSWORD", "CLEAR/1.0"),
        encode_command("SUBSCRIBE", "TOPIC", "/news"), encode_publish("/news", "K1", body),
        encode_contact("text/plain", b"Alice\r\nroom 7"), encode_command("NOOP"), b"\r\n",
        encode_command("QUIT"),
    ))
    server = b"".join((
        encode_greeting("smqp.example.org"), encode_reply(200, "OK"), encode_reply(250, "first", "second"),
        encode_notify("MESSAGE", "NEW", "/news", body=body), encode_notify("TOPIC", "/news", "CREATED"),
        encode_notify("SERVER", "SHUTDOWN"),
    ))
    return {"commands": b"\x80" + commands, "server": b"\x20" + server}

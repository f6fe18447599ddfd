"""SMQP encoders: greeting, replies, attributes, message bodies, notifications, commands,
publishes and contact data; and :func:`decode_body` for stored messages."""
from __future__ import annotations

from brokerd.protocols.smqp.codec.reader import _ATTRIBUTE, _BodyError, _BodyReader, _Input
from brokerd.protocols.smqp.codec.values import CRLF, MAX_SERVER_LINE, VERSION
from brokerd.protocols.smqp.events import Body


def _line_text(text: str) -> bytes:
    if "\r" in text or "\n" in text:
        raise ValueError(f"an SMQP line cannot hold a line end: {text[:80]!r}")
    return text.encode("utf-8")


def encode_greeting(ident: str, ready: bool = True) -> bytes:
    """``SMQP/1.0 Ready. <ident>`` (or ``Not Available.``)."""
    status = "Ready" if ready else "Not Available"
    text = f"SMQP/{VERSION} {status}." + (f" {ident}" if ident else "")
    return _line_text(text) + CRLF


def encode_reply(code: int, *lines: str) -> bytes:
    """A reply: ``NNN text`` for one line, ``NNN-line`` ... ``NNN last`` for several."""
    if not 100 <= code <= 999:
        raise ValueError(f"bad reply code {code}")
    if not lines:
        lines = ("",)
    prefix = str(code)
    out = [prefix.encode("ascii") + b"-" + _line_text(line) + CRLF for line in lines[:-1]]
    last = lines[-1]
    out.append(prefix.encode("ascii") + (b" " + _line_text(last) if last else b"") + CRLF)
    return b"".join(out)


_NAMES_CHECKED: set[str] = set()
"""Attribute names already found valid (a NOTIFY renders the same few names again and
again); at most :data:`_NAMES_CHECKED_MAX`, as clients choose names."""
_NAMES_CHECKED_MAX = 256


def encode_attribute(name: str, value: str) -> bytes:
    if name not in _NAMES_CHECKED:
        if _ATTRIBUTE.fullmatch(name.encode("ascii", "replace") + b": x") is None:
            raise ValueError(f"bad attribute name {name!r}")
        if len(_NAMES_CHECKED) < _NAMES_CHECKED_MAX:
            _NAMES_CHECKED.add(name)
    if not value.isprintable() or value != value.strip(" \t"):
        raise ValueError(f"an attribute value is printable, without surrounding space: {value!r}")
    # a valid name and a printable value hold no line end (what _line_text checks)
    return f"{name}: {value}\r\n".encode("utf-8")


def encode_body(body: Body) -> bytes:
    """A message body: header attributes, a blank line, each data section (its attributes
    with Content-Length set to the real size, a blank line, the data, CRLF), a blank line
    between sections, and the final ``.`` line."""
    out = [encode_attribute(name, value) for name, value in body.attributes]
    out.append(CRLF)
    for index, section in enumerate(body.sections):
        if index:
            out.append(CRLF)
        wrote_length = False
        for name, value in section.attributes:
            if name.lower() == "content-length":
                if wrote_length:
                    continue
                value, wrote_length = str(len(section.data)), True
            out.append(encode_attribute(name, value))
        if not wrote_length:
            out.append(encode_attribute("Content-Length", str(len(section.data))))
        out.append(CRLF)
        out.append(section.data)
        out.append(CRLF)
    out.append(b"." + CRLF)
    return b"".join(out)


def encode_notify(kind: str, *args: str, body: Body | None = None) -> bytes:
    """``NOTIFY <kind> args...`` and, for MESSAGE and RECEIPT, the body."""
    line = _line_text(" ".join(("NOTIFY", kind) + args)) + CRLF
    return line + encode_body(body) if body is not None else line


def encode_command(*words: str) -> bytes:
    """A command line from its words (a keyword list is one word: see
    :func:`format_keywords`)."""
    for word in words:
        if not word:
            raise ValueError("empty word in an SMQP command")
    return _line_text(" ".join(words)) + CRLF


def encode_publish(target: str, cmuid: str, body: Body, mode: str = "NEW") -> bytes:
    """``PUBLISH MESSAGE [mode] target cmuid`` and the body."""
    words = ("PUBLISH", "MESSAGE") + ((mode,) if mode != "NEW" else ()) + (target, cmuid)
    return encode_command(*words) + encode_body(body)


def encode_contact(mime: str, data: bytes) -> bytes:
    """``SET LOGIN CONTACT mime``, the lines of ``data``, and the final ``.``."""
    lines = data.splitlines()
    if any(line == b"." for line in lines):
        raise ValueError("contact data cannot hold a line that is only '.'")
    out = encode_command("SET", "LOGIN", "CONTACT", mime)
    return out + b"".join(line + CRLF for line in lines) + b"." + CRLF


def decode_body(data: bytes) -> Body:
    """The :class:`Body` of bytes written by :func:`encode_body` (a stored message).
    Raises ValueError."""
    source = _Input(MAX_SERVER_LINE)
    source.add(data)
    reader = _BodyReader(source, True, max(len(data), 1))
    try:
        result = reader.step()
    except _BodyError as exc:
        raise ValueError(exc.text) from None
    if not isinstance(result, Body):
        raise ValueError("truncated message body")
    return result

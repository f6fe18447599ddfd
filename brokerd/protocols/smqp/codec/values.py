"""SMQP values: limits and reply codes, topic and word names, date-times, timeouts and
keyword lists (parsed and formatted), and the codec's errors."""
from __future__ import annotations

import calendar
import re
from collections.abc import Iterable

from brokerd.errors import ProtocolError
from brokerd.stamps import format_datetime as format_datetime  # the wire's datetime, one definition
from brokerd.protocols.smqp.events import TopicRef

VERSION = "1.0"
CRLF = b"\r\n"

MAX_LINE = 4096
"""Bytes in one command line, body attribute line or contact line (line end excluded)."""
MAX_SERVER_LINE = 65536
"""Bytes in one line a client accepts from a server."""
MAX_MESSAGE = 1 << 20
"""Bytes of data in all sections of one message together (413 beyond)."""
MAX_SECTIONS = 16
"""Data sections in one message."""
MAX_HEADER_ATTRIBUTES = 64
"""Header attributes of one message."""
MAX_SECTION_ATTRIBUTES = 16
"""Attributes of one data section."""
MAX_CONTACT = 16384
"""Bytes of SET LOGIN CONTACT data (413 beyond)."""
MAX_LEAF = 32
"""Characters in one topic name (the draft: an individual topic SHALL NOT exceed 32)."""
MAX_DEPTH = 16
"""Levels in a topic path."""
MAX_KEYWORDS = 32
"""Keywords of one topic."""
MAX_KEYWORD = 64
"""Characters in one keyword."""
MAX_WORD = 256
"""Characters in a word other than a topic: cmuid, smuid, method, mime type, address."""
MAX_FIND_DEPTH = 9999
"""The largest depth FIND TOPIC accepts (the tree is at most MAX_DEPTH deep anyway)."""

# Reply codes the codec itself gives.
BAD_REQUEST = 400
TOO_LARGE = 413
UNKNOWN_COMMAND = 500


class SMQPProtocolError(ProtocolError):
    """A server broke the SMQP grammar (raised by the client-side parser only: a server
    answers bad client input with a reply code and reads on)."""


class _Bad(Exception):
    """A command line that breaks the grammar; ``code`` is the reply it deserves."""

    def __init__(self, text: str, code: int = BAD_REQUEST) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


# ---------------------------------------------------------------------------- names

def is_leaf(name: str) -> bool:
    """True if ``name`` may name a topic: 1 to 32 characters, a letter first, then letters,
    digits or ``_`` (the draft: no spaces, no leading digit, alphanumeric; its own examples
    use ``big_blue``, so the underscore is allowed).  Letters and digits are Unicode's."""
    if not 0 < len(name) <= MAX_LEAF or not name[0].isalpha():
        return False
    return all(c.isalnum() or c == "_" for c in name)


def _is_pattern(name: str) -> bool:
    """A last path component with ``*`` wildcards: ``*``, ``ib*``, ``*news``..."""
    if not 0 < len(name) <= MAX_LEAF or "*" not in name:
        return False
    return all(c.isalnum() or c in "_*" for c in name)


def parse_topic(text: str, wildcard: bool = False) -> TopicRef:
    """Parse a topic path (``/``, ``/a/b``, ``/a/b/``); with ``wildcard`` also ``*`` (every
    topic) and a last component holding ``*``.  Raises ValueError."""
    if wildcard and text == "*":
        return TopicRef((), "*")
    if not text.startswith("/"):
        raise ValueError(f"a topic starts with '/': {text!r}")
    if text == "/":
        return TopicRef(())
    inner = text[1:-1] if text.endswith("/") else text[1:]
    parts = inner.split("/")
    if len(parts) > MAX_DEPTH:
        raise ValueError(f"a topic path has at most {MAX_DEPTH} levels")
    pattern = None
    if wildcard and _is_pattern(parts[-1]):
        pattern = parts.pop()
    for part in parts:
        if not is_leaf(part):
            raise ValueError(
                f"bad topic name {part!r}: 1 to {MAX_LEAF} letters, digits or '_', a letter first"
            )
    return TopicRef(tuple(parts), pattern)


def is_valid_word(word: str) -> bool:
    """A printable word of at most MAX_WORD characters with no space."""
    return 0 < len(word) <= MAX_WORD and word.isprintable() and " " not in word


# ---------------------------------------------------------------------------- values

_DATETIME = re.compile(r"D(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})(\d{0,6})(Z?)", re.I)


def parse_datetime(text: str) -> float:
    """``DYYYYMMDDTHHMMSS[fraction][Z]`` (GMT, as in the draft's examples) to POSIX seconds.
    The fraction's digits are decimal fractions of a second.  Raises ValueError."""
    m = _DATETIME.fullmatch(text)
    if m is None:
        raise ValueError(f"not an SMQP date-time: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        raise ValueError(f"not an SMQP date-time: {text!r}")
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (OverflowError, ValueError):
        raise ValueError(f"not an SMQP date-time: {text!r}") from None
    fraction = m.group(7)
    return seconds + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


INFINITE = None
"""What :func:`parse_timeout` returns for ``INFINITE``/``INF``."""


def parse_timeout(text: str) -> float | None:
    """``HH:MM:SS``, ``DD:HH:MM:SS`` or ``INFINITE``/``INF`` (None) to seconds.  Raises
    ValueError."""
    if text.upper() in ("INFINITE", "INF"):
        return INFINITE
    parts = text.split(":")
    if len(parts) not in (3, 4) or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
        raise ValueError(f"not an SMQP timeout: {text!r}")
    numbers = [int(p) for p in parts]
    if len(numbers) == 3:
        numbers.insert(0, 0)
    days, hours, minutes, seconds = numbers
    if minutes > 59 or seconds > 59:
        raise ValueError(f"not an SMQP timeout: {text!r}")
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


MAX_TOPIC_TIMEOUT_DIGITS = 10
"""Digits of SET TOPIC TIMEOUT's plain-seconds form (at most 9,999,999,999 s)."""
TOPIC_TIMEOUT_MODES = {"INFINITE": "INFINITE", "INF": "INFINITE", "DEFAULT": "DEFAULT"}


def parse_topic_timeout(text: str) -> tuple[str, float | None]:
    """SET TOPIC TIMEOUT's value (our extension): whole seconds (``3600``) or a draft
    timeout (``01:00:00``, ``00:01:00:00``) -> ``("SECONDS", seconds)``; ``INFINITE``/``INF``
    -> ``("INFINITE", None)``; ``DEFAULT`` (drop the topic's own value) -> ``("DEFAULT",
    None)``.  Raises ValueError."""
    mode = TOPIC_TIMEOUT_MODES.get(text.upper())
    if mode is not None:
        return mode, None
    if text.isascii() and text.isdigit():
        if len(text) > MAX_TOPIC_TIMEOUT_DIGITS:
            raise ValueError(f"at most {MAX_TOPIC_TIMEOUT_DIGITS} digits of seconds")
        return "SECONDS", float(int(text))
    return "SECONDS", parse_timeout(text)


def format_timeout(seconds: float | None) -> str:
    """Seconds as ``DD:HH:MM:SS`` (the form of the draft's login example); None as
    ``INFINITE``."""
    if seconds is None:
        return "INFINITE"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


def parse_keywords(group: str) -> tuple[str, ...]:
    """The keywords of a ``(a,b c,...)`` group: split on commas, ``\\`` quotes the next
    character, surrounding spaces dropped, empty elements ignored (the draft's ``#rule``),
    duplicates (case-insensitive) dropped.  Raises ValueError."""
    if not (group.startswith("(") and group.endswith(")")):
        raise ValueError("keywords are written (keyword,keyword,...)")
    found: list[str] = []
    seen: set[str] = set()
    current: list[str] = []
    quoted = False
    for c in group[1:-1] + ",":
        if quoted:
            current.append(c)
            quoted = False
        elif c == "\\":
            quoted = True
        elif c == ",":
            keyword = "".join(current).strip()
            current = []
            if not keyword:
                continue
            if len(keyword) > MAX_KEYWORD or not keyword.isprintable():
                raise ValueError(f"a keyword has 1 to {MAX_KEYWORD} printable characters")
            if keyword.lower() not in seen:
                seen.add(keyword.lower())
                found.append(keyword)
        elif c in "()":
            raise ValueError("'(' and ')' inside a keyword must be quoted with '\\'")
        else:
            current.append(c)
    if len(found) > MAX_KEYWORDS:
        raise ValueError(f"at most {MAX_KEYWORDS} keywords")
    return tuple(found)


def format_keywords(keywords: Iterable[str]) -> str:
    """``(a,b c)``, quoting ``\\ , ( )`` inside keywords."""
    def quote(keyword: str) -> str:
        return "".join("\\" + c if c in "\\,()" else c for c in keyword)

    return "(" + ",".join(quote(k) for k in keywords) + ")"

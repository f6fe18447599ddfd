"""SMQP (draft-tegen-smqp-09) wire codec, sans-IO: bytes in, events out; and back.

The wire is text lines (CRLF; a bare LF is accepted) with two kinds of multi-line content:

- a **message body** after ``PUBLISH MESSAGE`` (client) and ``NOTIFY MESSAGE``/``NOTIFY
  RECEIPT`` (server): header attributes (``Name: value``), a blank line, then data sections,
  each its own attributes (Content-Type and Content-Length required), a blank line and exactly
  Content-Length bytes (which may hold anything, line ends included); blank lines between
  sections; a final ``.`` line.  Content-Length, never the ``.``, delimits the data.
- the **contact lines** after ``SET LOGIN CONTACT mime``: text lines up to a ``.`` line.

Malformed input never ends the session: every command line, and every body, yields exactly
one event; a bad one is a :class:`~brokerd.protocols.smqp.events.Rejected` carrying its reply
code.  A bad body is skipped up to its ``.`` line (or, when only its size is wrong, by its
Content-Length counts, without buffering the excess).  Memory per connection is bounded by
:data:`MAX_LINE` plus :data:`MAX_MESSAGE` (or :data:`MAX_CONTACT`).

Blank lines between commands are ignored: the draft's examples show an empty ``C:`` line
after most commands.

Nothing here touches a socket, a reactor or a clock.  The grammar's keywords are
case-insensitive and every abbreviation the draft lists is accepted (PASS, MESS, SUB, UNSUB,
REM, SUS, RES, KEY, PUB; REN, DEL, SERV in notifications).

One extension: ``SET TOPIC TIMEOUT topic seconds|INFINITE|DEFAULT`` and ``GET TOPIC TIMEOUT
topic`` (per-topic default message timeouts, which the draft describes but names no command
for; docs/smqp.md).
"""
from __future__ import annotations

import calendar
import dataclasses
import re
import time
from collections.abc import Callable, Iterable

from brokerd.errors import ProtocolError
from brokerd.protocols.smqp.events import (
    Body,
    ClientReply,
    Command,
    Greeting,
    Notify,
    Rejected,
    Reply,
    Section,
    TopicRef,
)

VERSION = "1.0"
CRLF = b"\r\n"

# ---------------------------------------------------------------------------- limits

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


def format_datetime(seconds: float) -> str:
    """POSIX seconds as ``DYYYYMMDDTHHMMSSccZ`` (GMT, hundredths of a second)."""
    whole = int(seconds // 1)
    hundredths = min(99, int(round((seconds - whole) * 100)))
    return time.strftime("D%Y%m%dT%H%M%S", time.gmtime(whole)) + f"{hundredths:02d}Z"


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


# ---------------------------------------------------------------------------- command lines

def _tokens(text: str) -> list[str]:
    """Words separated by spaces or tabs; a word starting with ``(`` runs to the matching
    unquoted ``)`` and may hold spaces (a keyword list)."""
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        j = i
        if c == "(":
            j += 1
            while j < n and text[j] != ")":
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise _Bad("unbalanced '(' in the keyword list")
            j += 1
        else:
            while j < n and text[j] not in " \t":
                j += 1
        tokens.append(text[i:j])
        i = j
    return tokens


class _Words:
    """A cursor over the tokens of one command line."""

    def __init__(self, name: str, tokens: list[str]) -> None:
        self.name = name
        self.tokens = tokens
        self.i = 0

    def more(self) -> bool:
        return self.i < len(self.tokens)

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def word(self, what: str) -> str:
        if self.i >= len(self.tokens):
            raise _Bad(f"{self.name}: missing {what}")
        token = self.tokens[self.i]
        self.i += 1
        if not is_valid_word(token):
            raise _Bad(f"{self.name}: bad {what}")
        return token

    def topic(self, wildcard: bool = False) -> TopicRef:
        text = self.word("topic")
        try:
            return parse_topic(text, wildcard)
        except ValueError as exc:
            raise _Bad(f"{self.name}: {exc}") from None

    def choice(self, table: dict[str, str], what: str) -> str:
        token = self.word(what).upper()
        if token not in table:
            raise _Bad(f"{self.name}: expected {what}, not {token!r}")
        return table[token]

    def keywords(self) -> tuple[str, ...] | None:
        token = self.peek()
        if token is None or not token.startswith("("):
            return None
        self.i += 1
        try:
            return parse_keywords(token)
        except ValueError as exc:
            raise _Bad(f"{self.name}: {exc}") from None

    def end(self) -> None:
        if self.i < len(self.tokens):
            raise _Bad(f"{self.name}: unexpected {self.tokens[self.i]!r}")


_MESSAGE = {"MESSAGE": "MESSAGE", "MESS": "MESSAGE"}
_TOPIC = {"TOPIC": "TOPIC"}
_MESSAGE_CHANGES = {"ADD", "MOVE", "DELETE", "REPLACE"}
_TOPIC_CHANGES = {"ADD": "ADD", "RENAME": "RENAME", "REN": "RENAME", "DELETE": "DELETE",
                  "DEL": "DELETE", "KEYWORDS": "KEYWORDS", "KEY": "KEYWORDS"}
_DELIVERY = {"NONE": "NONE", "ALL": "ALL", "ONE": "ONE"}
_PUBLISH_MODES = {"NEW", "REPLY", "REPLACE", "RECALL"}
_SERVER_ITEMS = {"TIMEOUT": "TIMEOUT", "BYE": "BYE"}


def _method(w: _Words) -> tuple[str, str]:
    token = w.word("authentication-method/version")
    method, _slash, version = token.partition("/")
    if not method.isalnum():
        raise _Bad(f"{w.name}: bad authentication method {token!r}")
    return method.upper(), version


def _account_channel(w: _Words) -> tuple[str, str]:
    token = w.word("account:channel")
    account, colon, channel = token.partition(":")
    if not colon or not is_leaf(account) or not is_leaf(channel):
        raise _Bad(
            f"{w.name}: expected account:channel, each 1 to {MAX_LEAF} letters, digits or '_'"
        )
    return account, channel


def _p_login(w: _Words) -> Command:
    account, channel = _account_channel(w)
    method, version = _method(w)
    w.end()
    return Command("LOGIN", args=(account, channel, method, version))


def _p_connectto(w: _Words) -> Command:
    account, channel = _account_channel(w)
    where = w.word("[address:]port")
    address, _colon, port = where.rpartition(":")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise _Bad("CONNECTTO: bad port")
    w.end()
    return Command("CONNECTTO", args=(account, channel, address, port))


def _p_count(w: _Words) -> Command:
    resource = w.choice(
        {"TOPIC": "TOPIC", "MESSAGE": "MESSAGE", "MESS": "MESSAGE", "SUBSCRIBERS": "SUBSCRIBERS",
         "SUB": "SUBSCRIBERS"}, "TOPIC, MESSAGE or SUBSCRIBERS")
    topic = w.topic(wildcard=True)
    w.end()
    return Command(f"COUNT {resource}", topic=topic)


def _p_list(w: _Words) -> Command:
    resource = w.choice(
        {"TOPIC": "TOPIC", "TOPICS": "TOPIC", "MESSAGE": "MESSAGE", "MESS": "MESSAGE",
         "MESSAGES": "MESSAGE", "SUBSCRIPTIONS": "SUBSCRIPTIONS", "SUB": "SUBSCRIPTIONS"},
        "TOPIC, MESSAGE or SUBSCRIPTIONS")
    if resource == "SUBSCRIPTIONS":
        w.end()
        return Command("LIST SUBSCRIPTIONS")
    topic = w.topic()
    w.end()
    return Command(f"LIST {resource}", topic=topic)


def _p_create(w: _Words) -> Command:
    w.choice(_TOPIC, "TOPIC")
    topic = w.topic()
    keywords = w.keywords()
    other = None
    args: tuple[str, ...] = ()
    if w.more():
        if w.word("'>'") != ">":
            raise _Bad("CREATE TOPIC: expected '> target' after the topic")
        target = w.word("link target")
        if target.startswith("/"):
            try:
                other = parse_topic(target)
            except ValueError as exc:
                raise _Bad(f"CREATE TOPIC: {exc}") from None
        else:
            args = (target,)
    w.end()
    return Command("CREATE TOPIC", topic=topic, other=other, args=args, keywords=keywords)


def _p_remove(w: _Words) -> Command:
    resource = w.choice({"TOPIC": "TOPIC", **_MESSAGE}, "TOPIC or MESSAGE")
    topic = w.topic()
    if resource == "TOPIC":
        w.end()
        return Command("REMOVE TOPIC", topic=topic)
    smuid = w.word("smuid")
    w.end()
    return Command("REMOVE MESSAGE", topic=topic, args=(smuid,))


def _p_move(w: _Words) -> Command:
    w.choice(_MESSAGE, "MESSAGE")
    source = w.topic()
    smuid = w.word("smuid")
    destination = w.topic()
    w.end()
    return Command("MOVE MESSAGE", topic=source, other=destination, args=(smuid,))


def _p_set(w: _Words) -> Command:
    what = w.choice({"TOPIC": "TOPIC", "LOGIN": "LOGIN", "NOTIFY": "NOTIFY"},
                    "TOPIC, LOGIN or NOTIFY")
    if what == "TOPIC":
        item = w.choice({"NAME": "NAME", "KEYWORDS": "KEYWORDS", "KEY": "KEYWORDS",
                         "DELIVERY": "DELIVERY", "TIMEOUT": "TIMEOUT"},
                        "NAME, KEYWORDS, DELIVERY or TIMEOUT")
        topic = w.topic()
        if item == "NAME":
            other = w.topic()
            w.end()
            return Command("SET TOPIC NAME", topic=topic, other=other)
        if item == "KEYWORDS":
            keywords = w.keywords()
            if keywords is None:
                raise _Bad("SET TOPIC KEYWORDS: expected (keyword,...)")
            w.end()
            return Command("SET TOPIC KEYWORDS", topic=topic, keywords=keywords)
        if item == "TIMEOUT":
            value = w.word("seconds, INFINITE or DEFAULT")
            w.end()
            try:
                mode, seconds = parse_topic_timeout(value)
            except ValueError as exc:
                raise _Bad(f"SET TOPIC TIMEOUT: {exc}") from None
            return Command("SET TOPIC TIMEOUT", topic=topic, mode=mode, timeout=seconds)
        mode = w.choice(_DELIVERY, "NONE, ALL or ONE")
        w.end()
        return Command("SET TOPIC DELIVERY", topic=topic, mode=mode)
    if what == "LOGIN":
        item = w.choice({"PASSWORD": "PASSWORD", "PASS": "PASSWORD", "CONTACT": "CONTACT"},
                        "PASSWORD or CONTACT")
        if item == "PASSWORD":
            method, version = _method(w)
            w.end()
            return Command("SET LOGIN PASSWORD", args=(method, version))
        mime = _mime(w)
        w.end()
        return Command("SET LOGIN CONTACT", args=(mime,))
    item = w.choice({"SUSPEND": "SUSPEND", "SUS": "SUSPEND", "RESUME": "RESUME",
                     "RES": "RESUME"}, "SUSPEND or RESUME")
    topic = w.topic(wildcard=True) if w.more() else TopicRef((), "*")
    w.end()
    return Command(f"SET NOTIFY {item}", topic=topic)


def _mime(w: _Words) -> str:
    mime = w.word("mime type")
    kind, slash, sub = mime.partition("/")
    if not (slash and kind and sub):
        raise _Bad(f"{w.name}: expected a mime type such as text/x-vcard")
    return mime


def _p_find(w: _Words) -> Command:
    w.choice({"TOPIC": "TOPIC", "TOPICS": "TOPIC"}, "TOPIC")
    topic = w.topic(wildcard=True)
    keywords = w.keywords()
    depth = None
    if w.more():
        token = w.word("depth")
        if not (token.isascii() and token.isdigit() and int(token) <= MAX_FIND_DEPTH):
            raise _Bad(f"FIND TOPIC: the depth is a number from 0 to {MAX_FIND_DEPTH}")
        depth = int(token)
    w.end()
    return Command("FIND TOPIC", topic=topic, keywords=keywords, depth=depth)


def _p_publish(w: _Words) -> Command:
    w.choice(_MESSAGE, "MESSAGE")
    mode = "NEW"
    if w.peek() is not None and w.peek().upper() in _PUBLISH_MODES and len(w.tokens) - w.i >= 3:  # type: ignore[union-attr]
        mode = w.word("mode").upper()
    target = w.word("topic or recipient")
    topic = None
    if target.startswith("/"):
        try:
            topic = parse_topic(target)
        except ValueError as exc:
            raise _Bad(f"PUBLISH MESSAGE: {exc}") from None
    elif "@" not in target:
        raise _Bad("PUBLISH MESSAGE: the target is a topic (/...) or account[:channel]@domain")
    cmuid = w.word("cmuid")
    w.end()
    return Command("PUBLISH MESSAGE", topic=topic, args=(target, cmuid), mode=mode)


def _changes(w: _Words, allowed: dict[str, str]) -> frozenset[str] | None:
    """An optional ALL or comma list of change types before the topic."""
    token = w.peek()
    if token is None or token.startswith("/") or token == "*" or w.i + 1 >= len(w.tokens):
        return None
    w.i += 1
    if token.upper() == "ALL":
        return frozenset(allowed.values())
    found = set()
    for item in token.upper().split(","):
        if not item:
            continue
        if item not in allowed:
            raise _Bad(f"{w.name}: unknown change type {item!r}")
        found.add(allowed[item])
    if not found:
        raise _Bad(f"{w.name}: no change type named")
    return frozenset(found)


def _p_subscribe(w: _Words) -> Command:
    token = w.peek()
    if token is not None and token.startswith("/"):
        resource = "MESSAGE"  # "SUB /topic", as the draft's own UNSUBSCRIBE example writes it
    else:
        resource = w.choice({**_MESSAGE, "TOPIC": "TOPIC", "SUBSCRIBER": "SUBSCRIBERS",
                             "SUBSCRIBERS": "SUBSCRIBERS", "SUB": "SUBSCRIBERS",
                             "SERVER": "SERVER", "SERV": "SERVER"},
                            "MESSAGE, TOPIC, SUBSCRIBER or SERVER")
    if resource == "SERVER":
        item = w.choice(_SERVER_ITEMS, "TIMEOUT or BYE")
        w.end()
        return Command("SUBSCRIBE SERVER", mode=item)
    if resource == "SUBSCRIBERS":
        topic = w.topic(wildcard=True)
        w.end()
        return Command("SUBSCRIBE SUBSCRIBERS", topic=topic)
    if resource == "TOPIC":
        changes = _changes(w, _TOPIC_CHANGES) or frozenset(_TOPIC_CHANGES.values())
        topic = w.topic(wildcard=True)
        w.end()
        return Command("SUBSCRIBE TOPIC", topic=topic, changes=changes)
    all_changes = {c: c for c in _MESSAGE_CHANGES}
    changes = _changes(w, all_changes) or frozenset(_MESSAGE_CHANGES)
    topic = w.topic(wildcard=True)
    since = until = None
    while w.more():
        bound = w.choice({"SINCE": "SINCE", "UNTIL": "UNTIL"}, "SINCE or UNTIL")
        text = w.word("date-time")
        try:
            value = parse_datetime(text)
        except ValueError as exc:
            raise _Bad(f"SUBSCRIBE MESSAGE: {exc}") from None
        if bound == "SINCE":
            since = value
        else:
            until = value
    return Command("SUBSCRIBE MESSAGE", topic=topic, changes=changes, since=since, until=until)


def _p_unsubscribe(w: _Words) -> Command:
    if w.peek() == "*":
        w.i += 1
        w.end()
        return Command("UNSUBSCRIBE ALL")
    resource = w.choice({**_MESSAGE, "TOPIC": "TOPIC", "SUBSCRIBER": "SUBSCRIBERS",
                         "SUBSCRIBERS": "SUBSCRIBERS", "SUB": "SUBSCRIBERS",
                         "SERVER": "SERVER", "SERV": "SERVER"},
                        "MESSAGE, TOPIC, SUBSCRIBER, SERVER or *")
    if resource == "SERVER":
        item = w.choice(_SERVER_ITEMS, "TIMEOUT or BYE")
        w.end()
        return Command("UNSUBSCRIBE SERVER", mode=item)
    topic = w.topic(wildcard=True)
    w.end()
    return Command(f"UNSUBSCRIBE {resource}", topic=topic)


def _p_get(w: _Words) -> Command:
    what = w.choice({**_MESSAGE, "TOPIC": "TOPIC", "LOGIN": "LOGIN"}, "MESSAGE, TOPIC or LOGIN")
    if what == "MESSAGE":
        topic = w.topic()
        which = w.word("smuid, range list or *")
        w.end()
        return Command("GET MESSAGE", topic=topic, args=(which,))
    if what == "TOPIC":
        item = w.choice({"KEYWORDS": "KEYWORDS", "KEY": "KEYWORDS", "DELIVERY": "DELIVERY",
                         "TIMEOUT": "TIMEOUT"}, "KEYWORDS, DELIVERY or TIMEOUT")
        topic = w.topic()
        w.end()
        return Command(f"GET TOPIC {item}", topic=topic)
    item = w.choice({"CHANNEL": "CHANNEL", "CONTACT": "CONTACT"}, "CHANNEL or CONTACT")
    if item == "CHANNEL":
        w.end()
        return Command("GET LOGIN CHANNEL")
    mime = _mime(w)
    args: tuple[str, ...] = (mime,)
    if w.more():
        account = w.word("account")
        if not is_leaf(account):
            raise _Bad("GET LOGIN CONTACT: bad account name")
        args = (mime, account)
    w.end()
    return Command("GET LOGIN CONTACT", args=args)


def _p_bare(name: str) -> Callable[[_Words], Command]:
    def parse(w: _Words) -> Command:
        w.end()
        return Command(name)

    return parse


_VERBS: dict[str, tuple[str, Callable[[_Words], Command]]] = {
    "LOGIN": ("LOGIN", _p_login),
    "CONNECTTO": ("CONNECTTO", _p_connectto),
    "COUNT": ("COUNT", _p_count),
    "LIST": ("LIST", _p_list),
    "CREATE": ("CREATE", _p_create),
    "REMOVE": ("REMOVE", _p_remove),
    "REM": ("REMOVE", _p_remove),
    "MOVE": ("MOVE", _p_move),
    "SET": ("SET", _p_set),
    "FIND": ("FIND", _p_find),
    "PUBLISH": ("PUBLISH", _p_publish),
    "PUB": ("PUBLISH", _p_publish),
    "SUBSCRIBE": ("SUBSCRIBE", _p_subscribe),
    "SUB": ("SUBSCRIBE", _p_subscribe),
    "UNSUBSCRIBE": ("UNSUBSCRIBE", _p_unsubscribe),
    "UNSUB": ("UNSUBSCRIBE", _p_unsubscribe),
    "GET": ("GET", _p_get),
    "NOOP": ("NOOP", _p_bare("NOOP")),
    "QUIT": ("QUIT", _p_bare("QUIT")),
}
_PASSWORD_VERBS = ("PASSWORD", "PASS")
_CLIENT_REPLY = re.compile(r"([0-9]{3})(?:[ \t]+(.*))?")

BODY_NONE, BODY_MESSAGE, BODY_CONTACT = 0, 1, 2
_BODY_COMMANDS = {"PUBLISH MESSAGE": BODY_MESSAGE, "SET LOGIN CONTACT": BODY_CONTACT}


def body_follows(line: bytes) -> int:
    """Whether the command line announces a message body (PUBLISH MESSAGE), contact lines
    (SET LOGIN CONTACT) or nothing, judged from its first words alone so that it holds even
    for a line that is otherwise malformed (its body must still be skipped).  Words are
    separated by any run of blanks, leading blanks ignored, as :func:`parse_command` reads
    them: a body is never taken for commands."""
    words = line.split(None, 3)
    if len(words) >= 2:
        first, second = words[0].upper(), words[1].upper()
        if first in (b"PUBLISH", b"PUB") and second in (b"MESSAGE", b"MESS"):
            return BODY_MESSAGE
        if len(words) >= 3 and first == b"SET" and second == b"LOGIN" and words[2].upper() == b"CONTACT":
            return BODY_CONTACT
    return BODY_NONE


def parse_command(text: str) -> Command | ClientReply | Rejected:
    """Parse one client line (line end removed, not blank)."""
    stripped = text.strip(" \t")
    m = _CLIENT_REPLY.fullmatch(stripped)
    if m is not None:
        return ClientReply(int(m.group(1)), (m.group(2) or "").strip())
    verb, _sp, rest = stripped.partition(" ")
    verb = verb.split("\t")[0]
    upper = verb.upper()
    if upper in _PASSWORD_VERBS:
        return _parse_password(text.lstrip(" \t")[len(verb):])
    entry = _VERBS.get(upper)
    if entry is None:
        if not verb.isascii() or not verb.isalpha():
            return Rejected(UNKNOWN_COMMAND, "Unknown command")
        return Rejected(UNKNOWN_COMMAND, f"Unknown command {upper[:32]}")
    name, parser = entry
    try:
        tokens = _tokens(stripped[len(verb):])
        return parser(_Words(name, tokens))
    except _Bad as exc:
        return Rejected(exc.code, exc.text, name)


def _parse_password(rest: str) -> Command | Rejected:
    """``PASSWORD SP account [SP password]``: the password is everything after the single
    space that follows the account, spaces included (absent or empty: a blank password)."""
    if not rest.startswith((" ", "\t")):
        return Rejected(BAD_REQUEST, "PASSWORD: expected PASSWORD account password", "PASSWORD")
    rest = rest.lstrip(" \t")
    account, sep, password = rest.partition(" ")
    if "\t" in account:
        account, _tab, tail = account.partition("\t")
        password = tail + sep + password
    if not is_leaf(account):
        return Rejected(BAD_REQUEST, "PASSWORD: bad account name", "PASSWORD")
    return Command("PASSWORD", args=(account, password))


# ---------------------------------------------------------------------------- input framing

_LONG = object()
"""What :meth:`_Input.line` returns for a line longer than the limit (already discarded)."""
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

    def line(self) -> bytes | object | None:
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

    def _next_line(self) -> bytes | object | None:
        line = self.input.line()
        if line is not None and line is not _LONG:
            self._grow(len(line) + 2)  # type: ignore[arg-type]
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
        attr = _attribute(line)  # type: ignore[arg-type]
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
            return self._start_data()
        attr = _attribute(line)  # type: ignore[arg-type]
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
        attr = _attribute(line)  # type: ignore[arg-type]
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
            if _CONTROL.search(line):  # type: ignore[arg-type]
                # a bare CR, NUL...: no reply line could carry it back (GET LOGIN CONTACT)
                self.error = self.error or _BodyError(BAD_REQUEST, "control characters in contact data")
                continue
            self.size += len(line) + 2  # type: ignore[arg-type]
            if self.size > self.max_size:
                self.error = self.error or _BodyError(TOO_LARGE, f"contact data over {self.max_size} bytes")
            if self.keep and self.error is None:
                self.lines.append(line)  # type: ignore[arg-type]


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
            if not line.strip(b" \t"):  # type: ignore[union-attr]
                continue
            kind = body_follows(line)  # type: ignore[arg-type]
            try:
                text = line.decode("utf-8")  # type: ignore[union-attr]
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
                self._start(kind, event)  # type: ignore[arg-type]
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
        return _replace(pending, data=result)  # type: ignore[arg-type]


def _replace(command: Command, **changes: object) -> Command:
    return dataclasses.replace(command, **changes)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- server output

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
                kind, args = self._notify  # type: ignore[misc]
                events.append(Notify(kind, args, result))  # type: ignore[arg-type]
                self._reader = self._notify = None
                continue
            line = source.line()
            if line is None:
                break
            if line is _LONG:
                raise SMQPProtocolError(f"server line longer than {source.max_line} bytes")
            try:
                text = line.decode("utf-8")  # type: ignore[union-attr]
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


# ---------------------------------------------------------------------------- encoding

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


def encode_attribute(name: str, value: str) -> bytes:
    if _ATTRIBUTE.fullmatch(name.encode("ascii", "replace") + b": x") is None:
        raise ValueError(f"bad attribute name {name!r}")
    if not value.isprintable() or value != value.strip(" \t"):
        raise ValueError(f"an attribute value is printable, without surrounding space: {value!r}")
    return _line_text(f"{name}: {value}") + CRLF


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

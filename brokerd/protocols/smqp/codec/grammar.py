"""SMQP command lines: the client's grammar, one parser per verb, and whether a line announces
a body (PUBLISH MESSAGE) or contact lines (SET LOGIN CONTACT)."""
from __future__ import annotations

import re
from collections.abc import Callable

from brokerd.protocols.smqp.codec.values import (
    BAD_REQUEST,
    MAX_FIND_DEPTH,
    MAX_LEAF,
    UNKNOWN_COMMAND,
    _Bad,
    is_leaf,
    is_valid_word,
    parse_datetime,
    parse_keywords,
    parse_topic,
    parse_topic_timeout,
)
from brokerd.protocols.smqp.events import ClientReply, Command, Rejected, TopicRef

MAX_WINDOW_DIGITS = 6
"""Digits of a SET NOTIFY WINDOW size (the server's own maximum is far lower)."""


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
                     "RES": "RESUME", "WINDOW": "WINDOW"}, "SUSPEND, RESUME or WINDOW")
    if item == "WINDOW":  # brokerd's extension: notifications outstanding at once
        size = w.word("window size")
        w.end()
        if not size.isdigit() or len(size) > MAX_WINDOW_DIGITS or int(size) < 1:
            raise _Bad(f"SET NOTIFY WINDOW: expected a number of notifications from 1, not {size!r}")
        return Command("SET NOTIFY WINDOW", depth=int(size))
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
    following = w.peek()
    if following is not None and following.upper() in _PUBLISH_MODES and len(w.tokens) - w.i >= 3:
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

"""SMQP User Access Lists: who may do what on which topic.

The draft (section 6) puts every topic under a UAL that only the server's administrator
controls, never SMQP commands, and (section 2.2) lets a topic without an entry for a user
inherit its parent's, up to the root.  brokerd reads the UAL from a text file::

    # topic          who          permissions
    /                @accounts    psacr
    /                guest        s
    /news            *            s
    /news            editor       psacr
    /private         *            -

Permissions are letters (any order, any case); ``-`` is none:

=====  =====================================================================================
``p``  publish messages to the topic
``s``  subscribe to it (and see it: LIST, FIND, COUNT, GET TOPIC)
``a``  administer the queue: SET TOPIC KEYWORDS/DELIVERY, remove or move its messages
``c``  create, rename and remove topics at or below it
``r``  reply to messages received from it
=====  =====================================================================================

Who: an account name, ``@accounts`` (every account but ``guest``) or ``*`` (every login).

Topic names follow SMQP's rule (a letter, then letters, digits or ``_``), except that a name
may start with ``~``: the other protocols' ``~`` trees, ``/~sys`` (the broker's statistics)
above all, which only the broker publishes to whatever the list says; an entry there
decides who may subscribe.

Resolution, for a login and a topic: walk from the topic up to the root; at each level the
most specific entry that names the login wins (its name, then ``@accounts``, then ``*``); the
first level with such an entry decides.  When no level has one, the defaults apply: every
account may do everything (``psacr``), the guest may only subscribe (``s``; configurable).
A login sees a topic when it has any permission on it.

Login topics are built in: ``/accounts`` is closed to everyone (``*  -``) and each account
holds ``psar`` on its own ``/accounts/<name>`` (without ``c``: the server manages those
topics).  File entries at the same level and for the same principal replace them.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from brokerd.auth.accounts import GUEST, is_account_name
from brokerd.core.access import ALL, Perm
from brokerd.errors import ConfigurationError


_LETTERS = {"p": Perm.PUBLISH, "s": Perm.SUBSCRIBE, "a": Perm.ADMINISTER, "c": Perm.CREATE,
            "r": Perm.REPLY}
EVERYONE = "*"
ACCOUNTS = "@accounts"
ACCOUNTS_TOPIC = "accounts"
"""The first-level topic holding the login topics."""
OWN_LOGIN_TOPIC = Perm.PUBLISH | Perm.SUBSCRIBE | Perm.ADMINISTER | Perm.REPLY
DEFAULT_ACCOUNT_PERMISSIONS = ALL
DEFAULT_GUEST_PERMISSIONS = Perm.SUBSCRIBE

Path_ = tuple[str, ...]
"""A topic as lower-case leaf names; the root is ``()``."""


def parse_permissions(text: str) -> Perm:
    """``psacr`` letters (any order or case), or ``-`` for none.  ValueError otherwise."""
    if text == "-":
        return Perm.NONE
    perms = Perm.NONE
    for letter in text.lower():
        if letter not in _LETTERS:
            raise ValueError(f"unknown permission {letter!r} (use p s a c r, or - for none)")
        perms |= _LETTERS[letter]
    if not text:
        raise ValueError("no permissions given (use - for none)")
    return perms


def format_permissions(perms: Perm) -> str:
    letters = "".join(letter for letter, flag in _LETTERS.items() if flag in perms)
    return letters or "-"


def _parse_path(text: str) -> Path_:
    if text == "/":
        return ()
    if not text.startswith("/"):
        raise ValueError(f"a topic starts with '/': {text!r}")
    parts = text.strip("/").split("/")
    for part in parts:
        # the SMQP topic-name rule, or a ``~`` tree of the other protocols (``/~sys``, where
        # the broker's statistics are)
        if not is_account_name(part.removeprefix("~")) or part.count("~") > 1:
            raise ValueError(f"bad topic name {part!r} in {text!r}")
    return tuple(part.lower() for part in parts)


@dataclass(frozen=True)
class Entry:
    topic: Path_
    principal: str
    """An account name (lower case), ``@accounts`` or ``*``."""
    permissions: Perm


class AccessList:
    """The entries of a UAL file plus the built-in rules; answers :meth:`permissions`."""

    def __init__(
        self,
        entries: Iterable[Entry] = (),
        *,
        account_default: Perm = DEFAULT_ACCOUNT_PERMISSIONS,
        guest_default: Perm = DEFAULT_GUEST_PERMISSIONS,
    ) -> None:
        self.account_default = account_default
        self.guest_default = guest_default
        self.entries = tuple(entries)
        self._levels: dict[Path_, dict[str, Perm]] = {}
        for entry in self.entries:
            level = self._levels.setdefault(entry.topic, {})
            if entry.principal in level:
                raise ValueError(f"two entries for {entry.principal} on /{'/'.join(entry.topic)}")
            level[entry.principal] = entry.permissions

    def permissions(self, account: str | None, topic: Path_) -> Perm:
        """What ``account`` (lower case) may do on ``topic`` (lower-case leaves).  None is a
        login that proved no account name: only ``*`` entries apply to it, and the guest's
        defaults."""
        guest = account is None or account == GUEST
        if account is None:
            principals: tuple[str, ...] = (EVERYONE,)
        else:
            principals = (account, EVERYONE) if guest else (account, ACCOUNTS, EVERYONE)
        levels = self._levels
        for depth in range(len(topic), -1, -1):
            level = topic[:depth]
            entries = levels.get(level)
            builtin = _builtin(account, level)
            for principal in principals:
                if entries is not None and principal in entries:
                    return entries[principal]
                if builtin is not None and principal in builtin:
                    return builtin[principal]
        return self.guest_default if guest else self.account_default

    def allows(self, account: str, topic: Path_, wanted: Perm) -> bool:
        return wanted in self.permissions(account, topic)

    def visible(self, account: str, topic: Path_) -> bool:
        """A login sees a topic on which it has any permission at all."""
        return bool(self.permissions(account, topic))


def _builtin(account: str | None, level: Path_) -> dict[str, Perm] | None:
    """The built-in entries of one level: the login topics."""
    if not level or level[0] != ACCOUNTS_TOPIC:
        return None
    if len(level) == 1:
        return {EVERYONE: Perm.NONE}
    if len(level) == 2 and level[1] == account:
        return {account: OWN_LOGIN_TOPIC}
    return None


def parse_access_list(
    text: str,
    source: str = "UAL file",
    *,
    account_default: Perm = DEFAULT_ACCOUNT_PERMISSIONS,
    guest_default: Perm = DEFAULT_GUEST_PERMISSIONS,
) -> AccessList:
    """An AccessList from the file's text; ConfigurationError naming the bad line."""
    entries: list[Entry] = []
    seen: set[tuple[Path_, str]] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        try:
            if len(words) != 3:
                raise ValueError("expected: topic who permissions")
            topic = _parse_path(words[0])
            who = words[1]
            if who not in (EVERYONE, ACCOUNTS):
                if not is_account_name(who):
                    raise ValueError(f"bad account name {who!r} (or use * or @accounts)")
                who = who.lower()
            if (topic, who) in seen:
                raise ValueError(f"a second entry for {who} on {words[0]}")
            seen.add((topic, who))
            entries.append(Entry(topic, who, parse_permissions(words[2])))
        except ValueError as exc:
            raise ConfigurationError(f"{source}, line {number}: {exc}") from None
    return AccessList(entries, account_default=account_default, guest_default=guest_default)


def read_access_list(path: Path, **defaults: Perm) -> AccessList:
    """Read a UAL file (blocking: at start-up or in a thread)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"UAL file {path}: cannot read: {exc}") from None
    return parse_access_list(text, f"UAL file {path}", **defaults)


def entry_of(topic: str, who: str, permissions: str = "-") -> Entry:
    """The entry a UAL line ``topic who permissions`` stands for, checked as the file's
    lines are (ConfigurationError with the reason).  Each field is one word without ``#``: the
    line made of them would otherwise hold a comment, a second line or no entry at all."""
    if any(len(value.split()) != 1 or "#" in value for value in (topic, who, permissions)):
        raise ConfigurationError("the entry, line 1: expected: topic who permissions")
    return parse_access_list(f"{topic} {who} {permissions}", "the entry").entries[0]


def format_entry(entry: Entry) -> str:
    return f"/{'/'.join(entry.topic)} {entry.principal} {format_permissions(entry.permissions)}"


def edit_access_list(text: str, entry: Entry, remove: bool = False, **defaults: Perm) -> tuple[str, bool]:
    """The UAL file's ``text`` with ``entry``'s line (same topic and who) replaced by it, added
    at the end, or (``remove``) taken out; comments and other lines are kept as they are.
    Returns the new text and whether a line for that topic and who was there.  The result
    is parsed as the broker reads the file (ConfigurationError when it would not load)."""
    parse_access_list(text, "UAL file", **defaults)  # as it is: a bad line is named by its number
    lines = text.splitlines()
    kept: list[str] = []
    found = False
    for line in lines:
        if line.split("#", 1)[0].strip():
            listed = parse_access_list(line, "UAL file", **defaults).entries[0]
            if (listed.topic, listed.principal) == (entry.topic, entry.principal):
                found = True
                if not remove:
                    kept.append(format_entry(entry))
                continue
        kept.append(line)
    if not found and not remove:
        kept.append(format_entry(entry))
    result = "\n".join(kept) + "\n" if kept else ""
    parse_access_list(result, "UAL file", **defaults)
    return result, found

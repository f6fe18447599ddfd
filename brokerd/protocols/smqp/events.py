"""What the SMQP codec produces and consumes.

Client to server: :class:`Command` (a command line, with its message body or contact data when
the command carries one), :class:`ClientReply` (a client's ``310 ACK``, ``312 wait`` or
``416`` during a two-phase delivery) and :class:`Rejected` (a line or body the codec could
not accept, with the reply code it deserves: the session goes on).

Server to client: :class:`Greeting`, :class:`Reply` (one or more ``NNN-`` lines closed by an
``NNN `` line) and :class:`Notify`.

A :class:`Body` is the draft's message format: header attributes, then data sections, each
with its own attributes (Content-Type, Content-Length, ...) and exactly Content-Length bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

Attributes = tuple[tuple[str, str], ...]
"""``(name, value)`` pairs in wire order; names compare case-insensitively."""


def attribute(attributes: Attributes, name: str) -> str | None:
    """The first value of attribute ``name`` (case-insensitive), or None."""
    wanted = name.lower()
    for key, value in attributes:
        if key.lower() == wanted:
            return value
    return None


def attribute_values(attributes: Attributes, name: str) -> list[str]:
    """Every value of attribute ``name`` (case-insensitive), in order (Smuid and Cmuid repeat
    in a reply history)."""
    wanted = name.lower()
    return [value for key, value in attributes if key.lower() == wanted]


class TopicRef(NamedTuple):
    """A topic path as written: ``/stocks/IBM`` is ``TopicRef(("stocks", "IBM"))``.

    ``wildcard`` is a last component holding ``*`` (``*`` itself, or a pattern such as
    ``ib*``); the leaves before it are literal.  ``TopicRef(())`` is the root ``/``.
    """

    leaves: tuple[str, ...]
    wildcard: str | None = None

    @property
    def key(self) -> str:
        """The case-folded path without the leading slash (``stocks/ibm``; root: ``""``)."""
        return "/".join(leaf.lower() for leaf in self.leaves)

    def __str__(self) -> str:
        parts = self.leaves + ((self.wildcard,) if self.wildcard is not None else ())
        return "/" + "/".join(parts)


@dataclass(frozen=True, slots=True)
class Section:
    """One data section: its attributes (Content-Type, Content-Length, ...) and its bytes."""

    attributes: Attributes
    data: bytes

    @property
    def content_type(self) -> str:
        return attribute(self.attributes, "Content-Type") or ""


@dataclass(frozen=True, slots=True)
class Body:
    """A message: header attributes and zero or more data sections."""

    attributes: Attributes = ()
    sections: tuple[Section, ...] = ()

    def get(self, name: str) -> str | None:
        return attribute(self.attributes, name)

    def get_all(self, name: str) -> list[str]:
        return attribute_values(self.attributes, name)

    @property
    def size(self) -> int:
        """Bytes of data in all sections."""
        return sum(len(section.data) for section in self.sections)


@dataclass(frozen=True, slots=True)
class Command:
    """A client command, its keywords expanded to their full form.

    ``name`` is the canonical command (``"SET TOPIC NAME"``, ``"PUBLISH MESSAGE"``), whatever
    abbreviation and letter case the client used.  The other fields hold the parameters the
    grammar gives that command; the codec has already checked their syntax.

    - ``topic``: the topic the command is about; ``other``: a second topic (the new name of
      SET TOPIC NAME, the destination of MOVE MESSAGE, the target of a virtual topic).
    - ``args``: the remaining words: LOGIN ``(account, channel, method, version)``, PASSWORD
      ``(account, password)``, PUBLISH MESSAGE ``(target, cmuid)``, SET LOGIN PASSWORD
      ``(method, version)``, SET LOGIN CONTACT ``(mime,)``, GET LOGIN CONTACT ``(mime[,
      account])``, REMOVE/GET MESSAGE ``(smuid,)``, MOVE MESSAGE ``(smuid,)``, CONNECTTO
      ``(account, channel, address, port)``, CREATE TOPIC ``(remote-url,)`` for a link to
      another server.
    - ``keywords``: a ``(...)`` keyword list; ``depth``: FIND TOPIC's depth, SET NOTIFY
      WINDOW's size.
    - ``mode``: PUBLISH's NEW/REPLY/REPLACE/RECALL, SET TOPIC DELIVERY's NONE/ALL/ONE,
      SUBSCRIBE/UNSUBSCRIBE SERVER's TIMEOUT/BYE, SET TOPIC TIMEOUT's SECONDS/INFINITE/DEFAULT.
    - ``timeout``: SET TOPIC TIMEOUT's seconds (mode SECONDS).
    - ``changes``: the notification types of SUBSCRIBE MESSAGE/TOPIC (ALL expanded).
    - ``since``/``until``: SUBSCRIBE MESSAGE's bounds, as POSIX seconds (GMT).
    - ``body``: the message of PUBLISH MESSAGE; ``data``: the lines of SET LOGIN CONTACT.
    """

    name: str
    topic: TopicRef | None = None
    other: TopicRef | None = None
    args: tuple[str, ...] = ()
    keywords: tuple[str, ...] | None = None
    depth: int | None = None
    mode: str | None = None
    changes: frozenset[str] | None = None
    since: float | None = None
    until: float | None = None
    body: Body | None = None
    data: bytes | None = None
    timeout: float | None = None

    @property
    def ref(self) -> TopicRef:
        """``topic``, for a command whose grammar requires one (the codec makes none without it)."""
        if self.topic is None:
            raise ValueError(f"{self.name} has no topic")
        return self.topic

    @property
    def other_ref(self) -> TopicRef:
        """``other``, for a command whose grammar requires a second topic."""
        if self.other is None:
            raise ValueError(f"{self.name} has no second topic")
        return self.other


@dataclass(frozen=True, slots=True)
class ClientReply:
    """A reply code a client sends: ``310 ACK`` (first phase of a delivery), ``312`` (wait:
    suspend this topic) or ``416`` (not available)."""

    code: int
    text: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """Input the codec refused: the server answers ``code text`` and reads on.

    ``name`` is the command the line claimed to be, when that much was recognisable.
    """

    code: int
    text: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Greeting:
    """``SMQP/1.0 Ready. <server ident>``."""

    version: str
    status: str
    ident: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A server reply: its code and the text of each of its lines (``200-OK``,
    ``200-Topic: /accounts/a/c``, ``200 Suid: x`` is ``(200, ("OK", "Topic: ...", "Suid:
    x"))``)."""

    code: int
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def values(self) -> tuple[str, ...]:
        """The lines after a leading ``OK`` (the payload of a multi-line answer)."""
        if len(self.lines) > 1 and self.lines[0].upper() == "OK":
            return self.lines[1:]
        if len(self.lines) == 1 and self.lines[0].upper() == "OK":
            return ()
        return self.lines

    def attributes(self) -> dict[str, str]:
        """``Name: value`` lines as a dict keyed by the lower-cased name (first one wins)."""
        found: dict[str, str] = {}
        for line in self.lines:
            name, colon, value = line.partition(":")
            if colon and name and " " not in name.strip():
                found.setdefault(name.strip().lower(), value.strip())
        return found


@dataclass(frozen=True, slots=True)
class Notify:
    """A server notification.  ``kind`` is canonical (MESSAGE, RECEIPT, TOPIC, SUBSCRIBERS,
    SERVER); ``args`` the words after it (topic, change, value...); ``body`` the message of
    NOTIFY MESSAGE and NOTIFY RECEIPT."""

    kind: str
    args: tuple[str, ...]
    body: Body | None = None

"""SMQP messages, pure: what a PUBLISH MESSAGE header says, and the message the server keeps.

:func:`read_publication` checks every header attribute the draft defines (section 4.1.9)
and returns a :class:`Publication`; a bad value is a ValueError (400).  :func:`stored_body`
builds the message subscribers get: the client's attributes with the server's ``Smuid`` and
``Cmuid`` added (after the history a REPLY carries), data sections byte for byte.

Identifiers: a stored message's SMUID is ``<suid>/<seq>(<date-time>)`` where ``seq`` is the
store's number of the message (the number GET/LIST/REMOVE MESSAGE use); a CMUID is
``account:channel@domain/<client id>(<date-time>)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from brokerd.protocols.smqp.codec import parse_datetime, parse_timeout
from brokerd.protocols.smqp.events import Attributes, Body
from brokerd.protocols.smqp.mapping import main_section

MAX_NAME = 128
"""Characters in the Name attribute (the draft: one line of no more than 128)."""
MAX_PRIORITY = 2**31 - 1
DEFAULT_PRIORITY = 1
"""The priority of a message without a Priority attribute (the lowest the draft allows)."""

_BOOLEAN = {"YES": True, "NO": False}
_RECEIPTS = {"NONE": "NONE", "ONE": "ONE", "ALL": "ALL", "YES": "ONE", "NO": "NONE"}
_SERVER_ATTRIBUTES = {"smuid", "cmuid"}
_MIME_VERSION = re.compile(r"\d{1,4}\.\d{1,4}")
_SMUID_NUMBER = re.compile(r"(?:.*/)?(\d{1,18})(?:\(.*\))?")


class Missing:
    """The type of :data:`ABSENT`."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Missing()
"""A Timeout attribute that was not given (the topic's or the server's default applies)."""


@dataclass(frozen=True)
class Publication:
    """The server-relevant meaning of a PUBLISH MESSAGE header."""

    created: float
    priority: int = DEFAULT_PRIORITY
    timeout: float | None | Missing = ABSENT
    """Seconds, None for INFINITE, ABSENT when not given."""
    receipt: str = "NONE"
    guarantee: bool = True
    delivery: str = "ALL"
    reply: bool = False
    smuids: tuple[str, ...] = ()
    """Smuid attributes the client sent (a REPLY's history; REPLACE/RECALL: the target)."""
    cmuids: tuple[str, ...] = ()
    depth: int = 0
    """How many more servers the message may be forwarded to (-1: no limit; 0: local only)."""
    hops: tuple[str, ...] = ()
    """Domains the message has passed through (lower case), the Hops attribute."""


def _number(name: str, value: str, low: int, high: int = MAX_PRIORITY) -> int:
    text = value.strip()
    if not re.fullmatch(r"-?\d{1,10}", text) or not low <= int(text) <= high:
        raise ValueError(f"{name}: expected a number from {low} to {high}, not {value!r}")
    return int(text)


def _choice(name: str, value: str, table: dict) -> object:
    found = table.get(value.strip().upper())
    if found is None:
        raise ValueError(f"{name}: expected one of {', '.join(sorted(table))}, not {value!r}")
    return found


def read_publication(body: Body) -> Publication:
    """Check the header of a published message.  ValueError names the bad attribute."""
    values: dict[str, object] = {}
    smuids: list[str] = []
    cmuids: list[str] = []
    created: float | None = None
    for name, value in body.attributes:
        key = name.lower()
        if key == "created":
            try:
                created = parse_datetime(value)
            except ValueError as exc:
                raise ValueError(f"Created: {exc}") from None
        elif key == "name":
            if len(value) > MAX_NAME:
                raise ValueError(f"Name: at most {MAX_NAME} characters")
        elif key in ("priority", "pri"):
            values["priority"] = _number("Priority", value, 1)
        elif key == "receipt":
            values["receipt"] = _choice("Receipt", value, _RECEIPTS)
        elif key == "reply":
            values["reply"] = _choice("Reply", value, _BOOLEAN)
        elif key == "timeout":
            try:
                values["timeout"] = parse_timeout(value)
            except ValueError as exc:
                raise ValueError(f"Timeout: {exc}") from None
        elif key == "depth":
            values["depth"] = _number("Depth", value, -1)
        elif key == "hops":
            values["hops"] = tuple(h.strip().lower() for h in value.split(",") if h.strip())
        elif key in ("sequence", "seq"):
            _number("Sequence", value, 1)
        elif key in ("guarantee", "guar"):
            values["guarantee"] = _choice("Guarantee", value, _BOOLEAN)
        elif key == "delivery":
            values["delivery"] = _choice("Delivery", value, {"ALL": "ALL", "ONE": "ONE"})
        elif key == "mime-version":
            if not _MIME_VERSION.fullmatch(value.strip()):
                raise ValueError(f"MIME-Version: expected major.minor, not {value!r}")
        elif key == "smuid":
            smuids.append(value)
        elif key == "cmuid":
            cmuids.append(value)
    for section in body.sections:
        kind = section.content_type
        if "/" not in kind:
            raise ValueError(f"Content-Type: expected type/subtype, not {kind!r}")
        for name, value in section.attributes:
            if name.lower() == "content-encryption" and "/" not in value:
                raise ValueError(f"Content-Encryption: expected method/version, not {value!r}")
    if created is None:
        raise ValueError("the REQUIRED Created attribute is missing")
    return Publication(created=created, smuids=tuple(smuids), cmuids=tuple(cmuids),
                       **values)  # type: ignore[arg-type]  # each value parsed for the field of its name


def smuid_number(smuid: str) -> int | None:
    """The message number in an SMUID as a client writes it (``host/1835``,
    ``host/x/1835(D2002...)`` or just ``1835``); None when it names no stored message."""
    m = _SMUID_NUMBER.fullmatch(smuid.strip())
    return int(m.group(1)) if m else None


def stored_body(body: Body, smuid: str, cmuid: str, history: bool) -> Body:
    """The message as subscribers get it: ``Created`` first, then the Smuid and Cmuid
    history (a REPLY's, when ``history``) with the server's own appended, then the client's
    other attributes in their order; the sections unchanged."""
    first: list[tuple[str, str]] = []
    rest: list[tuple[str, str]] = []
    smuids: list[tuple[str, str]] = []
    cmuids: list[tuple[str, str]] = []
    for name, value in body.attributes:
        key = name.lower()
        if key == "created" and not first:
            first.append((name, value))
        elif key == "smuid":
            if history:
                smuids.append(("Smuid", value))
        elif key == "cmuid":
            if history:
                cmuids.append(("Cmuid", value))
        elif key != "created":
            rest.append((name, value))
    attributes: Attributes = tuple(first + smuids + [("Smuid", smuid)] + cmuids + [("Cmuid", cmuid)] + rest)
    return Body(attributes, body.sections)


def receipt_body(original: Body, acked: int, total: int, topic: str, created: str) -> Body:
    """NOTIFY RECEIPT's message: the original header (no data, as the draft says), with
    ``Receipt: X/Y`` (subscribers that acknowledged / subscribers it was for) and the topic."""
    attributes = [("Created", created)]
    for name, value in original.attributes:
        key = name.lower()
        if key in _SERVER_ATTRIBUTES or key == "name" or key == "sequence" or key == "seq":
            attributes.append((name, value))
    attributes.append(("Topic", topic))
    attributes.append(("Receipt", f"{acked}/{total}"))
    return Body(tuple(attributes), ())


def first_text(body: Body) -> tuple[bytes, bool] | None:
    """What SSMP and MCCHAT subscribers get of an SMQP message: the data of the first
    ``text/*`` section (binary False); else the first section's data when it is at most
    :data:`MAX_FOREIGN_BINARY` bytes (binary True); else None (not forwarded)."""
    index = main_section(body)
    if index is None:
        return None
    section = body.sections[index]
    if section.content_type.strip().lower().startswith("text/"):
        return section.data, False
    if len(section.data) <= MAX_FOREIGN_BINARY:
        return section.data, True
    return None


MAX_FOREIGN_BINARY = 1024
"""The largest non-text section forwarded to the other protocols (SSMP's binary limit)."""

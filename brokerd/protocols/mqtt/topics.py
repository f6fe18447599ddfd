"""MQTT topic names, topic filters, matching, and shared subscriptions.

MQTT 5.0 section 4.7 (3.1.1 section 4.7): a topic is levels separated by ``/``; a filter may use
``+`` (exactly one level, and the whole of it) and ``#`` (any number of levels, including the
parent's: only as the last level, alone); a topic name has no wildcard; both are at least one
character; a name starting with ``$`` is not matched by a filter whose first level is a wildcard
(4.7.2, [MQTT-4.7.2-1]).  MQTT 5.0 section 4.8.2: a shared subscription's filter is
``$share/{ShareName}/{filter}``, where ShareName is at least one character without ``/``, ``+``
or ``#``, and ``{filter}`` is a valid topic filter.

The decoder leaves filters unchecked: a bad filter in a SUBSCRIBE gets its own reason code
(0x8F Topic Filter invalid; 3.1.1: 0x80 Failure) in the SUBACK instead of a closed connection,
so the server checks each one here.  ``max_length`` (bytes of UTF-8) and ``max_levels`` are the
server's own limits, beyond the 65,535 bytes the wire allows.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_TOPIC_LENGTH = 65_535
"""The longest topic a UTF-8 Encoded String holds, in bytes."""
SHARE_PREFIX = "$share/"
SERVER_MARK = "$"
"""The first character of the topics that are the server's (4.7.2: ``$SYS/...``)."""


def server_topic(name: str) -> bool:
    """Whether topic name ``name`` is the server's (starts with ``$``, 4.7.2): MQTT tools take
    what arrives there for the broker's own word, so no client publishes, retains or leaves
    a will there."""
    return name[:1] == SERVER_MARK


def topic_name_problem(
    name: str, max_length: int = MAX_TOPIC_LENGTH, max_levels: int | None = None
) -> str | None:
    """Why ``name`` cannot be a topic name a PUBLISH carries, or None when it can."""
    if not name:
        return "topic name is empty"
    if "+" in name or "#" in name:
        return "topic name contains a wildcard"
    return _common_problem("topic name", name, max_length, max_levels)


def topic_filter_problem(
    topic_filter: str, max_length: int = MAX_TOPIC_LENGTH, max_levels: int | None = None
) -> str | None:
    """Why ``topic_filter`` cannot be a topic filter (a shared one included: see
    :func:`shared_subscription`), or None when it can.  ``max_levels`` counts the levels of
    the filter proper, without ``$share/{ShareName}/``."""
    if not topic_filter:
        return "topic filter is empty"
    problem = _common_problem("topic filter", topic_filter, max_length, None)
    if problem is not None:
        return problem
    if topic_filter.startswith("$share/") or topic_filter == "$share":
        share = _split_shared(topic_filter)
        if isinstance(share, str):
            return share
        topic_filter = share[1]
    levels = topic_filter.split("/")
    if max_levels is not None and len(levels) > max_levels:
        return f"topic filter has {len(levels)} levels (at most {max_levels})"
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if len(level) > 1 and ("+" in level or "#" in level):
            return "a wildcard must be a whole level"
        if level == "#" and index != last:
            return "'#' must be the last level"
    return None


def _common_problem(what: str, value: str, max_length: int, max_levels: int | None) -> str | None:
    if "\x00" in value:
        return f"{what} contains U+0000"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{what} holds a lone surrogate"
    if size > max_length:
        return f"{what} is {size} bytes (at most {max_length})"
    if max_levels is not None:
        levels = value.count("/") + 1
        if levels > max_levels:
            return f"{what} has {levels} levels (at most {max_levels})"
    return None


def is_topic_name(name: str, max_length: int = MAX_TOPIC_LENGTH, max_levels: int | None = None) -> bool:
    return topic_name_problem(name, max_length, max_levels) is None


def is_topic_filter(
    topic_filter: str, max_length: int = MAX_TOPIC_LENGTH, max_levels: int | None = None
) -> bool:
    return topic_filter_problem(topic_filter, max_length, max_levels) is None


def has_wildcard(topic_filter: str) -> bool:
    """True when the filter (shared or not) can match more than one topic name."""
    share = shared_subscription(topic_filter)
    inner = share.topic_filter if share is not None else topic_filter
    return "+" in inner or "#" in inner


# ---------------------------------------------------------------------------- shared subscriptions

@dataclass(frozen=True, slots=True)
class SharedSubscription:
    """The parts of ``$share/{ShareName}/{filter}``."""

    share_name: str
    topic_filter: str


def is_shared(topic_filter: str) -> bool:
    """True when the filter asks for a shared subscription (whether or not it is a valid one):
    a filter that starts with ``$share/``."""
    return topic_filter.startswith(SHARE_PREFIX)


def shared_subscription(topic_filter: str) -> SharedSubscription | None:
    """The share name and filter of a shared subscription, or None for a filter that is not
    one.  ValueError for a ``$share`` filter that breaks 4.8.2's rules."""
    if not (topic_filter.startswith(SHARE_PREFIX) or topic_filter == "$share"):
        return None
    share = _split_shared(topic_filter)
    if isinstance(share, str):
        raise ValueError(share)
    problem = topic_filter_problem(share[1])
    if problem is not None:
        raise ValueError(problem)
    return SharedSubscription(*share)


def _split_shared(topic_filter: str) -> tuple[str, str] | str:
    """(ShareName, filter), or why the ``$share`` filter is malformed."""
    _, _, rest = topic_filter.partition("/")
    share_name, slash, inner = rest.partition("/")
    if not share_name:
        return "shared subscription without a ShareName"
    if "+" in share_name or "#" in share_name:
        return "ShareName contains a wildcard"
    if not slash or not inner:
        return "shared subscription without a topic filter"
    return share_name, inner

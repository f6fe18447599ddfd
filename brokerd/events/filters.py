"""Which topics a topic filter names: MQTT's rules (MQTT 5.0 and 3.1.1, section 4.7), which the
core routes by (brokerd.core.filters builds its index on them) and the pipeline counts by (a
``subscribed`` record of an MQTT filter names the filter, not the topics it reaches).

A topic name is levels separated by ``/``.  In a filter, the level ``+`` matches exactly one
level and ``#`` (the last level only) any number of levels, none included: ``sport/#`` matches
``sport``, ``sport/tennis`` and ``sport/tennis/player1``.  A topic whose name starts with ``$``
is not matched by a filter whose first level is a wildcard, so ``#`` does not reach ``$SYS/...``.
"""
from __future__ import annotations

SEPARATOR = b"/"
ONE_LEVEL = b"+"
ANY_LEVELS = b"#"
SYSTEM = b"$"


def matches(topic_filter: bytes, topic: bytes) -> bool:
    """Whether ``topic_filter`` (a valid filter) matches the topic name ``topic``."""
    if topic[:1] == SYSTEM and topic_filter[:1] in (ONE_LEVEL, ANY_LEVELS):
        return False
    names = topic.split(SEPARATOR)
    levels = topic_filter.split(SEPARATOR)
    for index, level in enumerate(levels):
        if level == ANY_LEVELS:
            return True
        if index >= len(names) or (level != ONE_LEVEL and level != names[index]):
            return False
    return len(levels) == len(names)


def has_wildcard(topic_filter: bytes) -> bool:
    """Whether ``topic_filter`` can match another name than its own (else it is a topic)."""
    return ONE_LEVEL in topic_filter or ANY_LEVELS in topic_filter

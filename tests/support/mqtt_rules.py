"""MQTT's topic matching rules (MQTT 5.0 4.7, 3.1.1 4.7) read level by level: the oracle the
core's matching (brokerd.core.filters, the one implementation brokerd runs) is tested against."""
from __future__ import annotations


def level_by_level(topic_filter: str, topic_name: str) -> bool:
    """Whether the valid, unshared ``topic_filter`` matches the valid ``topic_name``."""
    return _match(topic_filter.split("/"), topic_name.split("/"), topic_name.startswith("$"))


def _match(levels: list[str], names: list[str], dollar: bool) -> bool:
    if dollar and levels[0] in ("+", "#"):
        return False  # a leading wildcard never reaches a $ topic
    if not levels:
        return not names
    if levels[0] == "#":
        return True
    if not names:
        return False
    return (levels[0] in ("+", names[0])) and _match(levels[1:], names[1:], False)

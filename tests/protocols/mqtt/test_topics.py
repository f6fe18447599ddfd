"""Topic names, topic filters, matching and shared subscriptions (MQTT 5.0 4.7 and 4.8.2; 3.1.1
4.7), with the examples the specs give; matching is the core's (brokerd.core.filters), the
only one brokerd has."""
from __future__ import annotations

import pytest
from hypothesis import assume, given

from brokerd.core.filters import matches as core_matches
from brokerd.protocols.mqtt.topics import (
    SharedSubscription,
    has_wildcard,
    is_shared,
    is_topic_filter,
    is_topic_name,
    shared_subscription,
    topic_filter_problem,
    topic_name_problem,
)
from tests.protocols.mqtt.strategies import topic_filter, topic_name
from tests.support.mqtt_rules import level_by_level


def matches(topic_filter: str, name: str) -> bool:
    """The matching brokerd runs (the core's, on bytes), on the codec's str names."""
    return core_matches(topic_filter.encode(), name.encode())


@pytest.mark.parametrize("name", ["a", "/", "a/b", "/finance", "sport/tennis/player1", "$SYS/x", " ", "a//b", "caf\u00e9"])
def test_valid_topic_names(name) -> None:
    assert topic_name_problem(name) is None
    assert is_topic_name(name)


@pytest.mark.parametrize("name", ["", "a/+", "#", "a/b#", "+", "a\x00b", "a\ud800"])
def test_invalid_topic_names(name) -> None:
    assert topic_name_problem(name) is not None
    assert not is_topic_name(name)


@pytest.mark.parametrize(
    "topic_filter",
    ["#", "+", "sport/#", "sport/tennis/#", "+/tennis/#", "sport/+/player1", "/+", "+/+", "$SYS/#", "a//b", "$share/g/a/#"],
)
def test_valid_topic_filters(topic_filter) -> None:
    assert topic_filter_problem(topic_filter) is None
    assert is_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    ["", "sport/tennis#", "sport/tennis/#/ranking", "sport+", "sp+rt/x", "#/a", "a/#b",
     "$share", "$share/", "$share/g", "$share/g/", "$share//a", "$share/g+/a", "$share/#/a", "$share/g/a/#/b"],
)
def test_invalid_topic_filters(topic_filter) -> None:
    assert topic_filter_problem(topic_filter) is not None
    assert not is_topic_filter(topic_filter)


def test_limits_of_length_and_levels() -> None:
    assert topic_name_problem("a/b/c", max_levels=3) is None
    assert "levels" in topic_name_problem("a/b/c/d", max_levels=3)
    assert topic_name_problem("\u00e9\u00e9", max_length=4) is None
    assert "bytes" in topic_name_problem("\u00e9\u00e9\u00e9", max_length=5)
    assert topic_filter_problem("$share/g/a/b", max_levels=2) is None
    assert "levels" in topic_filter_problem("$share/g/a/b/c", max_levels=2)
    assert "bytes" in topic_filter_problem("a/+/c", max_length=4)


@pytest.mark.parametrize(
    "topic_filter, name, expected",
    [
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("#", "sport/tennis", True),
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("#", "$SYS/x", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("A/b", "a/b", False),
        ("a/+/c", "a/b/d", False),
        ("a/+/#", "a/b", True),
    ],
)
def test_matching_examples_of_the_spec(topic_filter, name, expected) -> None:
    assert matches(topic_filter, name) is expected


@given(topic_name)
def test_a_name_is_a_filter_that_matches_itself_only(name) -> None:
    assume(name != "$share" and not is_shared(name))  # those are (malformed) shared subscriptions as filters
    assert is_topic_filter(name)
    assert matches(name, name)
    assert not matches(name, name + "x")


@given(topic_filter, topic_name)
def test_matching_agrees_with_a_level_by_level_reading(chosen, name) -> None:
    assert matches(chosen, name) is level_by_level(chosen, name)


def test_shared_subscriptions() -> None:
    assert shared_subscription("$share/consumers/sport/#") == SharedSubscription("consumers", "sport/#")
    assert shared_subscription("$share/g//a") == SharedSubscription("g", "/a")
    assert shared_subscription("sport/#") is None
    assert shared_subscription("$sharex/a") is None
    assert is_shared("$share/g/a") and not is_shared("$sharex/g/a") and not is_shared("share/g/a")
    for bad in ("$share/g", "$share//a", "$share/g+/a", "$share/g/a/#/b"):
        with pytest.raises(ValueError):
            shared_subscription(bad)
    assert has_wildcard("$share/g/a/+") and not has_wildcard("$share/g/a") and has_wildcard("#")

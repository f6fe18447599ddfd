"""The core's topic filters (brokerd.core.filters): MQTT's matching rules, checked against
a level-by-level reading of MQTT's statement of them (tests/support/mqtt_rules.py), and the FilterIndex's answers against testing every
filter, for any filters and topics hypothesis makes."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.core.filters import FilterIndex, has_wildcard, matches
from brokerd.protocols.mqtt import topics as mqtt_topics
from tests.support.mqtt_rules import level_by_level
from tests.support.examples import examples

LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "c1"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "+", "c1"])
FILTERS = st.builds(lambda levels, tail: "/".join(levels + tail),
                    st.lists(FILTER_LEVELS, min_size=0, max_size=3), st.sampled_from([[], ["#"], ["+"]])).filter(bool)


def test_the_rules_on_examples():
    assert matches(b"sport/#", b"sport") and matches(b"sport/#", b"sport/tennis/player1")
    assert matches(b"sport/+", b"sport/") and not matches(b"sport/+", b"sport")
    assert matches(b"+/+", b"/finance") and matches(b"/+", b"/finance") and not matches(b"+", b"/finance")
    assert not matches(b"#", b"$SYS/uptime") and not matches(b"+/uptime", b"$SYS/uptime")
    assert matches(b"$SYS/#", b"$SYS/uptime") and matches(b"#", b"a$b")
    assert has_wildcard(b"a/+") and has_wildcard(b"#") and not has_wildcard(b"a/b")


@settings(max_examples=examples(400), deadline=None)
@given(FILTERS, TOPICS)
def test_the_core_matches_as_a_level_by_level_reading_of_the_rules(topic_filter: str, topic: str):
    assert mqtt_topics.is_topic_filter(topic_filter) and mqtt_topics.is_topic_name(topic)
    assert matches(topic_filter.encode(), topic.encode()) == level_by_level(topic_filter, topic)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(FILTERS, st.integers(0, 3)), max_size=12), st.lists(TOPICS, min_size=1, max_size=6),
       st.data())
def test_the_index_finds_what_testing_every_filter_finds(subscriptions, topics, data):
    index = FilterIndex(max_cached=3)
    held: dict[tuple[str, int], None] = {}
    for topic_filter, member in subscriptions:
        assert index.add(topic_filter.encode(), member) == ((topic_filter, member) not in held)
        held[(topic_filter, member)] = None
    gone = data.draw(st.lists(st.sampled_from(list(held)), unique=True)) if held else []
    for topic_filter, member in gone:
        assert index.discard(topic_filter.encode(), member)
        assert not index.discard(topic_filter.encode(), member)
        del held[(topic_filter, member)]
    assert len(index) == len({topic_filter for topic_filter, _member in held})
    assert sorted(index.filters()) == sorted({topic_filter.encode() for topic_filter, _member in held})
    for topic in topics * 2:  # the second time from the memory of answers
        expected = {member for (topic_filter, member) in held if level_by_level(topic_filter, topic)}
        found = index.match(topic.encode())
        assert len(found) == len(set(found)) and set(found) == expected, (topic, held)


def test_answers_follow_every_change_and_the_memory_is_bounded():
    index = FilterIndex(max_cached=2)
    assert index.match(b"a/b") == ()
    index.add(b"a/+", "s1")
    assert index.match(b"a/b") == ("s1",)  # not the remembered empty answer
    index.add(b"a/b", "s2")
    index.add(b"#", "s3")
    assert index.match(b"a/b") == ("s2", "s1", "s3")  # exact, then +, then #
    for name in (b"x", b"y", b"z"):
        index.match(name)
    assert len(index._cache) <= 2
    index.discard(b"a/+", "s1")
    assert index.match(b"a/b") == ("s2", "s3")
    index.discard(b"a/b", "s2")
    index.discard(b"#", "s3")
    assert index._root.children == {} and len(index) == 0 and index.match(b"a/b") == ()

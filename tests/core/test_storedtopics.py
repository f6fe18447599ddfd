"""The stored topics as durable delivery reads them (brokerd.core.storedtopics): the delivery
mode and default timeout a stored message takes from its topic, and which topics keep the
core's publishes, on any node, from the store's records alone."""
from __future__ import annotations

import math

from twisted.logger import capturedLogs, formatEvent

from brokerd.core.storedtopics import StoredTopics
from brokerd.store.records import TopicRecord


def topics(*records: TopicRecord, default: float | None = 86400.0) -> StoredTopics:
    model = StoredTopics(default)
    model.replace(records)
    return model


def test_timeouts_are_inherited_from_the_nearest_topic_that_sets_one():
    model = topics(TopicRecord("chat", "chat"), TopicRecord("chat/web", "web"), TopicRecord("chat/web/eu", "eu"),
                   TopicRecord("news", "news"), TopicRecord("accounts", "accounts", system=True),
                   TopicRecord("accounts/alice", "alice", system=True))
    assert model.timeout_source("chat/web/eu") is None and model.timeout_for("chat/web/eu") == 86400.0
    model.put([TopicRecord("chat", "chat", timeout=60.0)])
    assert model.timeout_source("chat/web/eu") == "chat" and model.timeout_for("chat/web/eu") == 60.0
    model.put([TopicRecord("chat/web", "web", timeout=math.inf)])
    assert model.timeout_source("chat/web/eu") == "chat/web" and model.timeout_for("chat/web/eu") is None
    assert model.timeout_source("chat") == "chat" and model.timeout_source("news") is None
    model.put([TopicRecord("accounts/alice", "alice", system=True, timeout=5.0)])
    assert model.timeout_for("accounts/alice/c1") == 5.0  # an implicit channel login topic
    assert model.timeout_source("accounts/bob/c1") is None
    assert topics(default=None).timeout_for("anything") is None  # the server default: INFINITE


def test_the_mode_and_the_topics_that_keep_other_protocols_messages():
    model = topics(TopicRecord("jobs", "jobs", delivery="ONE"), TopicRecord("news", "news"),
                   TopicRecord("alias", "alias", link="news"), TopicRecord("accounts", "accounts", system=True),
                   TopicRecord("accounts/bob", "bob", system=True))
    assert (model.mode_for("jobs"), model.mode_for("news"), model.mode_for("absent")) == ("ONE", "ALL", "ALL")
    assert model.reachable("news") and model.reachable("jobs")
    assert not model.reachable("alias")  # a virtual topic
    assert not model.reachable("accounts/bob") and not model.reachable("accounts")  # login topics
    assert not model.reachable("absent")


def test_held_topics_and_what_a_change_releases():
    model = topics(TopicRecord("a", "a", delivery="NONE"), TopicRecord("b", "b"))
    assert model.held == {"a"}
    assert model.put([TopicRecord("b", "b", delivery="NONE")]) == set()
    assert model.held == {"a", "b"}
    assert model.put([TopicRecord("a", "a")]) == {"a"}  # released: its subscribers read again
    assert model.delete(["b"]) == {"b"}
    assert model.held == set()


def test_a_rename_moves_the_subtree_and_orphans_are_left_out():
    with capturedLogs() as events:
        model = topics(TopicRecord("a", "a"), TopicRecord("a/b", "b", timeout=7.0), TopicRecord("x/y", "y"))
    assert model.get("x/y") is None and len(model) == 2  # its parent is not stored
    assert [formatEvent(event) for event in events] == ["Topic 'x/y' has no parent in the store; ignored"]
    model.rename([("a", TopicRecord("z", "z")), ("a/b", TopicRecord("z/b", "b", timeout=7.0))])
    assert model.get("a") is None and model.get("a/b") is None
    assert model.timeout_for("z/b/c") == 7.0

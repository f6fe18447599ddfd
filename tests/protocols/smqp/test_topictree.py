"""The in-memory topic tree: lookup (case, Trash, virtual topics, implicit channel login
topics), create/remove/rename with their refusals, searching, and loading from records."""
from __future__ import annotations

import pytest

from brokerd.protocols.smqp.codec import parse_topic
from brokerd.protocols.smqp.topictree import TopicError, TopicTree
from brokerd.store.records import TopicRecord


def ref(path: str):
    return parse_topic(path, wildcard=True)


def build(*paths: str) -> TopicTree:
    tree = TopicTree()
    for path in paths:
        target = None
        if " > " in path:
            path, link = path.split(" > ")
            target = tree.lookup(ref(link), follow=False).node
        parent = tree.lookup(ref(path.rsplit("/", 1)[0] or "/")).node
        tree.create(parent, path.rsplit("/", 1)[1], link=target)
    return tree


def code(call) -> int:
    with pytest.raises(TopicError) as info:
        call()
    return info.value.code


def test_lookup_is_case_insensitive_and_keeps_names():
    tree = build("/Stocks", "/Stocks/IBM")
    node = tree.lookup(ref("/stocks/ibm")).node
    assert node.display == "/Stocks/IBM" and node.key == "stocks/ibm" and node.path == ("stocks", "ibm")
    assert code(lambda: tree.lookup(ref("/stocks/sony"))) == 404


def test_trash_resolves_to_its_parent():
    tree = build("/a")
    found = tree.lookup(ref("/a/TRASH"))
    assert found.trash and found.node.key == "a" and found.key == "a/trash"
    assert tree.lookup(ref("/Trash")).key == "trash"
    assert code(lambda: tree.lookup(ref("/a/trash/x"))) == 404


def test_virtual_topics_behave_as_their_target():
    tree = build("/info", "/info/cnn", "/info/cnn/live", "/news > /info/cnn")
    assert tree.lookup(ref("/news")).node.key == "info/cnn"
    assert tree.lookup(ref("/news"), follow=False).node.key == "news"
    assert tree.lookup(ref("/news/live")).node.key == "info/cnn/live"
    assert code(lambda: build("/a", "/v > /a", "/w > /v")) == 405
    tree2 = build("/a")
    assert code(lambda: tree2.create(tree2.root, "a2", link=tree2.root)) == 405


def test_create_refusals():
    tree = build("/a")
    root = tree.root
    assert code(lambda: tree.create(root, "A")) == 409
    assert code(lambda: tree.create(root, "trash")) == 409
    assert code(lambda: tree.create(root, "accounts")) == 409
    tree.ensure_account("alice", 0.0)
    account = tree.lookup(ref("/accounts/alice")).node
    assert code(lambda: tree.create(account, "x")) == 403
    small = TopicTree(max_children=2)
    small.create(small.root, "a")
    small.create(small.root, "b")
    assert code(lambda: small.create(small.root, "c")) == 414
    capped = TopicTree(max_topics=2)
    capped.create(capped.root, "a")
    capped.create(capped.root, "b")
    assert code(lambda: capped.create(capped.root, "c")) == 414


def test_login_topics():
    tree = TopicTree()
    records = tree.ensure_account("alice", 5.0)
    assert [r.key for r in records] == ["accounts", "accounts/alice"] and all(r.system for r in records)
    assert tree.ensure_account("alice", 6.0) == []
    channel = tree.lookup(ref("/accounts/alice/orange")).node
    assert channel.transient and channel.key == "accounts/alice/orange"
    assert code(lambda: tree.lookup(ref("/accounts/bob/orange"))) == 404
    assert code(lambda: tree.remove(channel)) == 403
    assert tree.login_topic("alice", "orange") == "/accounts/alice/orange"


def test_remove_takes_the_subtree_and_links_into_it():
    tree = build("/a", "/a/b", "/a/b/c", "/z", "/v > /a/b", "/w > /z")
    removed = tree.remove(tree.lookup(ref("/a")).node)
    assert sorted(n.key for n in removed) == ["a", "a/b", "a/b/c", "v"]
    assert [n.key for n in tree.children(tree.root)] == ["w", "z"]
    tree.restore(removed)
    assert tree.lookup(ref("/v/c")).node.key == "a/b/c"
    assert code(lambda: tree.remove(tree.root)) == 403


def test_rename_moves_subtrees_and_rewrites_links():
    tree = build("/stocks", "/stocks/quotes", "/stocks/quotes/ibm", "/stocks/ibm", "/v > /stocks/quotes/ibm")
    node = tree.lookup(ref("/stocks/quotes")).node
    changed = tree.rename(node, tree.lookup(ref("/stocks/ibm")).node, "Quote")
    assert sorted(old for old, _ in changed) == ["stocks/quotes", "stocks/quotes/ibm", "v"]
    assert tree.lookup(ref("/stocks/ibm/quote/ibm")).node.display == "/stocks/ibm/Quote/ibm"
    assert list(tree.lookup(ref("/stocks/ibm/quote")).node.children) == ["stocks/ibm/quote/ibm"]
    assert list(tree.lookup(ref("/stocks/ibm")).node.children) == ["stocks/ibm/quote"]
    assert tree.lookup(ref("/v")).node.key == "stocks/ibm/quote/ibm"
    assert code(lambda: tree.lookup(ref("/stocks/quotes"))) == 404
    stocks = tree.lookup(ref("/stocks")).node
    assert code(lambda: tree.rename(stocks, tree.lookup(ref("/stocks/ibm")).node, "x")) == 409
    assert code(lambda: tree.rename(stocks, tree.root, "STOCKS")) == 409
    assert code(lambda: tree.rename(stocks, tree.root, "v")) == 409
    assert len(tree) == 5


def test_searching():
    tree = build("/s", "/s/ibm", "/s/ibm/x", "/s/ibm/x/y", "/s/sony", "/s/v > /s/ibm")
    base = tree.lookup(ref("/s")).node
    assert [n.key for n in tree.descendants(base, 1)] == ["s/ibm", "s/sony", "s/v"]
    assert [n.key for n in tree.descendants(base, 2)] == ["s/ibm", "s/ibm/x", "s/sony", "s/v"]
    assert [n.key for n in tree.descendants(base)] == ["s/ibm", "s/ibm/x", "s/ibm/x/y", "s/sony", "s/v"]
    assert [n.key for n in tree.matching(base, "S*", None)] == ["s/sony"]


def test_from_records_orders_parents_first_and_skips_orphans():
    records = [TopicRecord("a/b", "B", ("K",)), TopicRecord("a", "A"), TopicRecord("x/y", "y")]
    tree, skipped = TopicTree.from_records(records)
    assert tree.lookup(ref("/a/b")).node.keywords == ("K",)
    assert [r.key for r in skipped] == ["x/y"]
    assert tree.lookup(ref("/a")).node.record() == TopicRecord("a", "A")


def test_timeouts_are_kept_in_the_records_and_follow_a_rename():
    """Which timeout applies is the core's answer (tests/core/test_storedtopics.py); the tree
    keeps each topic's own in its record."""
    tree = build("/chat", "/chat/web", "/chat/web/eu", "/news")
    tree.get("chat").timeout = 60.0
    tree.get("chat/web").timeout = float("inf")
    records = {r.key: r for r in (node.record() for node in tree.descendants_all(tree.root))}
    assert records["chat"].timeout == 60.0 and records["chat/web/eu"].timeout is None
    loaded, skipped = TopicTree.from_records(records.values())
    assert not skipped and loaded.get("chat/web").timeout == float("inf")
    renamed = loaded.rename(loaded.get("chat/web"), loaded.get("news"), "Web")
    assert {old: node.timeout for old, node in renamed} == {"chat/web": float("inf"), "chat/web/eu": None}

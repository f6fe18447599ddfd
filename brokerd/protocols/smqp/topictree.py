"""The SMQP topic tree, in memory: names, keywords, delivery modes, default message
timeouts, virtual topics.

The tree answers every topic question synchronously (LIST, FIND, COUNT and each permission
check walk it); the store keeps a copy of every node (:meth:`Node.record`) so the tree
survives restarts.  Mutations return the records to write, and the front end answers 200
once the store has them.

Names are case-insensitive: a node is found by its key (the lower-case path) and keeps the
name it was created with for display.  Every topic has a reserved ``Trash`` child that is not
a node: a path ending in ``/Trash`` resolves to its parent with ``trash`` set.  Virtual topics
hold the key of their target and behave as it: a path that continues below a virtual topic
continues below its target.

The login topics live under ``/accounts``: that node and each ``/accounts/<name>`` are system
nodes created by the server; the channel topics below them (``/accounts/<name>/<channel>``)
exist implicitly for every channel, so clients choosing new channels never grow the tree.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from brokerd.config import Settings
from brokerd.protocols.smqp.events import TopicRef
from brokerd.store.records import TopicRecord, trash_key

TRASH = "trash"
ACCOUNTS = "accounts"
MAX_CHILDREN = 1024
"""Child topics of one parent, system topics (``/accounts``) not counted (414 beyond)."""
MAX_TOPICS = 100_000
"""Topics in the whole tree (414 beyond)."""


class TopicError(Exception):
    """A topic operation the tree refuses; ``code`` is the SMQP reply code."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class Node:
    """One topic.  ``transient`` nodes are implicit channel login topics (never stored).
    ``timeout`` is the topic's own default message timeout (None: it sets none and inherits,
    see brokerd.core.storedtopics.StoredTopics.timeout_for; ``math.inf``: INFINITE)."""

    __slots__ = ("key", "name", "parent", "children", "keywords", "delivery", "link", "owner",
                 "created", "system", "transient", "timeout")

    def __init__(self, key: str, name: str, parent: Node | None, *, keywords: tuple[str, ...] = (),
                 delivery: str = "ALL", link: str | None = None, owner: str = "",
                 created: float = 0.0, system: bool = False, transient: bool = False,
                 timeout: float | None = None) -> None:
        self.key = key
        self.name = name
        self.parent = parent
        self.children: dict[str, Node] = {}
        self.keywords = keywords
        self.delivery = delivery
        self.link = link
        self.owner = owner
        self.created = created
        self.system = system
        self.transient = transient
        self.timeout = timeout

    @property
    def path(self) -> tuple[str, ...]:
        """The lower-case leaves (what the UAL resolves on)."""
        return tuple(self.key.split("/")) if self.key else ()

    @property
    def display(self) -> str:
        """``/Stocks/IBM``: the names as created."""
        names: list[str] = []
        node: Node | None = self
        while node is not None and node.key:
            names.append(node.name)
            node = node.parent
        return "/" + "/".join(reversed(names))

    @property
    def depth(self) -> int:
        return self.key.count("/") + 1 if self.key else 0

    def record(self) -> TopicRecord:
        return TopicRecord(self.key, self.name, self.keywords, self.delivery, self.link,
                           self.owner, self.created, self.system, self.timeout)

    def __repr__(self) -> str:
        return f"<Node {self.display}{' > ' + self.link if self.link else ''}>"


@dataclass(frozen=True)
class Found:
    """What a path resolved to: the node (the target, for a followed virtual topic) and
    whether the path named its Trash."""

    node: Node
    trash: bool = False

    @property
    def key(self) -> str:
        """The queue key: the node's, or ``<key>/trash``."""
        return trash_key(self.node.key) if self.trash else self.node.key


def _key(parent_key: str, leaf: str) -> str:
    return f"{parent_key}/{leaf.lower()}" if parent_key else leaf.lower()


class TopicTree:
    def __init__(self, max_children: int = MAX_CHILDREN, max_topics: int = MAX_TOPICS,
                 max_owned: int = Settings.smqp_max_topics_per_account) -> None:
        """``max_owned``: topics one account may have created and not removed (414 beyond),
        so that one account cannot use up ``max_topics`` for everyone."""
        self.max_children = max_children
        self.max_topics = max_topics
        self.max_owned = max_owned
        self.root = Node("", "", None, system=True)
        self._nodes: dict[str, Node] = {"": self.root}
        self._owned: dict[str, int] = {}
        """Topics (not system ones) by the account that created them."""

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_records(cls, records: Iterable[TopicRecord], **limits: int) -> tuple[TopicTree, list[TopicRecord]]:
        """A tree from stored records (in any order); also the records that could not be
        placed (a missing parent: only a damaged store has those)."""
        tree = cls(**limits)
        skipped = []
        for record in sorted(records, key=lambda r: r.key.count("/")):
            parent_key, _slash, _leaf = record.key.rpartition("/")
            parent = tree._nodes.get(parent_key)
            if parent is None or not record.key or record.key in tree._nodes:
                skipped.append(record)
                continue
            tree._attach(parent, record)
        return tree, skipped

    def _attach(self, parent: Node, record: TopicRecord) -> Node:
        node = Node(record.key, record.name, parent, keywords=record.keywords,
                    delivery=record.delivery, link=record.link, owner=record.owner,
                    created=record.created, system=record.system, timeout=record.timeout)
        parent.children[record.key] = node
        self._nodes[record.key] = node
        self._count(node, 1)
        return node

    def _count(self, node: Node, change: int) -> None:
        if node.owner and not node.system:
            self._owned[node.owner] = self._owned.get(node.owner, 0) + change

    def owned(self, account: str) -> int:
        """Topics ``account`` created that are still there (its quota's use)."""
        return self._owned.get(account, 0)

    def __len__(self) -> int:
        """Stored topics (the root excluded)."""
        return len(self._nodes) - 1

    def get(self, key: str) -> Node | None:
        return self._nodes.get(key)

    # ------------------------------------------------------------------ lookup

    def lookup(self, ref: TopicRef, follow: bool = True) -> Found:
        """Resolve a path (without wildcard).  Virtual topics on the way are always
        followed; the last one only with ``follow``.  TopicError 404 if missing."""
        node = self.root
        leaves = ref.leaves
        for index, leaf in enumerate(leaves):
            last = index == len(leaves) - 1
            if node.link is not None:
                node = self._target(node)
            lower = leaf.lower()
            if lower == TRASH:
                if last:
                    return Found(node, trash=True)
                raise TopicError(404, f"Not found: {ref} (Trash has no child topics)")
            child = node.children.get(_key(node.key, leaf))
            if child is None:
                child = self._implicit_channel(node, leaf)
            if child is None:
                raise TopicError(404, f"Not found: {ref}")
            node = child
        if follow and node.link is not None:
            node = self._target(node)
        return Found(node)

    def _target(self, node: Node) -> Node:
        target = self._nodes.get(node.link) if node.link is not None else None
        if target is None:
            raise TopicError(404, f"Not found: the target of {node.display}")
        return target

    def _implicit_channel(self, node: Node, leaf: str) -> Node | None:
        """``/accounts/<name>/<channel>`` exists for every channel of a known account."""
        if node.system and node.depth == 2 and node.key.startswith(ACCOUNTS + "/"):
            return Node(_key(node.key, leaf), leaf, node, system=True, transient=True)
        return None

    def login_topic(self, account: str, channel: str) -> str:
        """The display path of a login topic."""
        return f"/{ACCOUNTS}/{account}/{channel}"

    def ensure_account(self, account: str, now: float) -> list[TopicRecord]:
        """Create ``/accounts`` and ``/accounts/<account>`` if missing; the new records."""
        created = []
        parent = self._nodes.get(ACCOUNTS)
        if parent is None:
            parent = self._attach(self.root, TopicRecord(ACCOUNTS, ACCOUNTS, created=now, system=True))
            created.append(parent.record())
        key = _key(ACCOUNTS, account)
        if key not in self._nodes:
            created.append(self._attach(parent, TopicRecord(key, account, owner=account, created=now,
                                                            system=True)).record())
        return created

    # ------------------------------------------------------------------ reading

    def children(self, node: Node) -> list[Node]:
        """Child topics by name (case-insensitive)."""
        return sorted(node.children.values(), key=lambda n: n.key)

    def descendants(self, node: Node, layers: int | None = None) -> Iterator[Node]:
        """Every topic below ``node`` (depth first, by name), at most ``layers`` levels down;
        virtual topics are listed but not entered."""
        stack = [(child, 1) for child in reversed(self.children(node))]
        while stack:
            current, level = stack.pop()
            yield current
            if current.link is None and (layers is None or level < layers):
                stack.extend((child, level + 1) for child in reversed(self.children(current)))

    def matching(self, node: Node, pattern: str | None, layers: int | None) -> Iterator[Node]:
        """The descendants a wildcard selects: ``*`` every one, another pattern those whose
        name matches it (case-insensitive)."""
        for child in self.descendants(node, layers):
            if pattern is None or pattern == "*" or fnmatch.fnmatchcase(child.name.lower(), pattern.lower()):
                yield child

    # ------------------------------------------------------------------ changing

    def create(self, parent: Node, name: str, *, keywords: tuple[str, ...] = (),
               link: Node | None = None, owner: str = "", now: float = 0.0) -> Node:
        """Create ``name`` below ``parent``.  TopicError: 409 exists or reserved, 403 system,
        414 too many, 405 a link to a virtual topic, 409 a link to itself."""
        key = _key(parent.key, name)
        self._check_new_child(parent, name, key)
        if owner and self.owned(owner) >= self.max_owned:
            raise TopicError(414, f"Resource too large: {owner} has created {self.max_owned} topics")
        if link is not None:
            if link.link is not None:
                raise TopicError(405, "Not allowed: a virtual topic cannot link to another virtual topic")
            if link.transient or link is self.root:
                raise TopicError(405, f"Not allowed: cannot link to {link.display}")
            if link.key == key:
                raise TopicError(409, "Conflict: a topic cannot link to itself")
        record = TopicRecord(key, name, keywords, "ALL", link.key if link is not None else None,
                             owner, now, False)
        return self._attach(parent, record)

    def _check_new_child(self, parent: Node, name: str, key: str) -> None:
        if parent.transient or (parent.system and parent is not self.root):
            raise TopicError(403, f"Forbidden: {parent.display} is managed by the server")
        if name.lower() == TRASH:
            raise TopicError(409, "Conflict: Trash is a reserved topic")
        if parent is self.root and name.lower() == ACCOUNTS:
            raise TopicError(409, "Conflict: /accounts is reserved for login topics")
        if key in self._nodes:
            raise TopicError(409, f"Conflict: {self._nodes[key].display} exists")
        if sum(not child.system for child in parent.children.values()) >= self.max_children:
            raise TopicError(414, f"Resource too large: {self.max_children} topics below {parent.display or '/'}")
        if len(self) >= self.max_topics:
            raise TopicError(414, f"Resource too large: {self.max_topics} topics in all")

    def remove(self, node: Node) -> list[Node]:
        """Remove ``node``, every topic below it and every virtual topic linking into that
        subtree; the removed nodes (parents before children)."""
        if node is self.root or node.system or node.transient:
            raise TopicError(403, f"Forbidden: {node.display or '/'} is managed by the server")
        doomed = [node, *self.descendants_all(node)]
        keys = {n.key for n in doomed}
        prefix = node.key + "/"
        for other in list(self._nodes.values()):
            if other.link is not None and other.key not in keys and (
                    other.link == node.key or other.link.startswith(prefix)):
                keys.add(other.key)
                doomed.append(other)
                doomed.extend(n for n in self.descendants_all(other) if n.key not in keys)
        for gone in doomed:
            if self._nodes.pop(gone.key, None) is not None:
                self._count(gone, -1)
            if gone.parent is not None:
                gone.parent.children.pop(gone.key, None)
        return doomed

    def descendants_all(self, node: Node) -> list[Node]:
        """Every node below ``node``, virtual or not, parents first."""
        found: list[Node] = []
        stack = list(node.children.values())
        while stack:
            current = stack.pop()
            found.append(current)
            stack.extend(current.children.values())
        return found

    def restore(self, nodes: Iterable[Node]) -> None:
        """Put removed nodes back (undo :meth:`remove` when the store failed)."""
        for node in sorted(nodes, key=lambda n: n.depth):
            if node.key not in self._nodes:
                self._count(node, 1)
            self._nodes[node.key] = node
            if node.parent is not None:
                node.parent.children[node.key] = node

    def rename(self, node: Node, new_parent: Node, new_name: str) -> list[tuple[str, Node]]:
        """Move ``node`` (and its subtree) to ``new_parent``/``new_name``; virtual topics
        that link into the subtree follow.  Returns ``(old_key, node)`` for every node whose
        record changed.  TopicError: 403 system, 409 same/exists/into itself, 414."""
        if node is self.root or node.system or node.transient:
            raise TopicError(403, f"Forbidden: {node.display or '/'} is managed by the server")
        new_key = _key(new_parent.key, new_name)
        if new_key == node.key:
            raise TopicError(409, "Conflict: the new name is the topic itself")
        walk: Node | None = new_parent
        while walk is not None:
            if walk is node:
                raise TopicError(409, "Conflict: a topic cannot move below itself")
            walk = walk.parent
        self._check_new_child(new_parent, new_name, new_key)
        old_prefix = node.key
        moved = [node, *self.descendants_all(node)]
        changed: list[tuple[str, Node]] = []
        for current in moved:
            self._nodes.pop(current.key, None)
        old_parent = node.parent
        assert old_parent is not None  # only the root has none, and it is refused above
        old_parent.children.pop(node.key, None)
        for current in moved:
            old = current.key
            current.key = new_key + old[len(old_prefix):]
            changed.append((old, current))
        node.name = new_name
        node.parent = new_parent
        new_parent.children[node.key] = node
        for current in moved:  # re-key every moved node's children once (they all moved)
            self._nodes[current.key] = current
            current.children = {c.key: c for c in current.children.values()}
        moved_keys = {n.key for n in moved}
        for other in self._nodes.values():
            link = other.link
            if link is not None and (link == old_prefix or link.startswith(old_prefix + "/")):
                other.link = new_key + link[len(old_prefix):]
                if other.key not in moved_keys:
                    changed.append((other.key, other))
        return changed

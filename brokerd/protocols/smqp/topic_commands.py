"""The SMQP topic commands of a session (mixed into SMQPServerProtocol): CREATE/REMOVE TOPIC,
SET/GET TOPIC NAME, KEYWORDS, DELIVERY and TIMEOUT, LIST/FIND/COUNT TOPIC, COUNT MESSAGE and
COUNT SUBSCRIBERS, and the permission checks every topic command makes (the UAL).

A change is answered once the store has it (:meth:`TopicCommands._persist`), and undone in
memory when the store fails.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.auth.ual import Perm, format_permissions
from brokerd.core.subscriptions import Subscription
from brokerd.protocols.smqp.codec import format_keywords, format_timeout, parse_topic
from brokerd.protocols.smqp.events import Command, TopicRef
from brokerd.protocols.smqp.refusal import Refused
from brokerd.protocols.smqp.session import SessionBase
from brokerd.protocols.smqp.topictree import ACCOUNTS, Found, Node, TopicError

MAX_FIND_RESULTS = 1000
"""Topics one FIND TOPIC may return (510 beyond)."""
OK = 200

_PERM_NAMES = {Perm.PUBLISH: "publish", Perm.SUBSCRIBE: "subscribe", Perm.ADMINISTER: "administer",
               Perm.CREATE: "create/rename/remove", Perm.REPLY: "reply"}


class TopicCommands(SessionBase):
    """Mixin of SMQPServerProtocol: the topic commands, and resolving a topic reference with
    the login's permissions (the session it needs: brokerd.protocols.smqp.session)."""

    _log = Logger()

    def _permissions(self, node: Node) -> Perm:
        return self.factory.permissions(self.principal, node.key)

    def _resolve(self, ref: TopicRef, *, follow: bool = True, need: Perm = Perm.NONE,
                 trash: bool = False) -> Found:
        """The topic ``ref`` names, if this login may see it (404 otherwise: a topic the
        login has no permission on is not revealed) and has ``need`` on it (403)."""
        found = self.factory.tree.lookup(ref, follow)
        if found.trash and not trash:
            raise Refused(403, "Forbidden: Trash is a system topic")
        perms = self._permissions(found.node)
        if not perms:
            raise TopicError(404, f"Not found: {ref}")
        if need and need not in perms:
            raise Refused(403, f"Forbidden: no {_PERM_NAMES.get(need, format_permissions(need))} "
                               f"permission on {found.node.display}")
        return found

    def _visible(self, nodes: Iterable[Node]) -> list[Node]:
        return [node for node in nodes if self._permissions(node)]

    def _listing(self, node: Node, keywords: bool = False) -> str:
        line = node.display
        if keywords and node.keywords:
            line += " " + format_keywords(node.keywords)
        if node.link is not None:
            target = self.factory.tree.get(node.link)
            line += " > " + (target.display if target is not None else "/" + node.link)
        return line

    def _persist(self, d: Deferred, undo: Callable[[], object],
                 then: Callable[[], None] | None = None) -> Deferred:
        """Answer 200 once the store has the change (and run ``then``: notices); undo it in
        memory if the store fails."""
        def stored(_result: object) -> None:
            self._reply(OK, "OK")
            if then is not None:
                then()

        def failed(failure: Failure) -> None:
            undo()
            self._log.failure("Storing a topic change", failure)
            self._reply(451, "Local error: the change could not be stored")

        return d.addCallbacks(stored, failed)

    # ------------------------------------------------------------------ topic commands

    def _remote_destination(self, target: str) -> TopicRef:
        """``domain:/path`` of a linked domain: the local mirror ``/<domain>/path`` that the
        link fills (it must exist: 404 otherwise, like any destination)."""
        domain, colon, path = target.partition(":")
        link = self.factory.links.get(domain) if colon else None
        if link is None:
            raise Refused(405, f"Not allowed: {target} is not domain:/topic of a linked domain")
        try:
            ref = parse_topic(path)
        except ValueError as exc:
            raise Refused(400, f"Bad request: {exc}") from None
        if ref.wildcard is not None or not ref.leaves:
            raise Refused(400, "Bad request: a remote destination is one topic")
        return TopicRef((link.prefix, *ref.leaves))

    def do_CREATE_TOPIC(self, command: Command) -> Deferred:
        ref = command.ref
        if not ref.leaves:
            raise Refused(409, "Conflict: / exists")
        parent = self._resolve(TopicRef(ref.leaves[:-1]), need=Perm.CREATE).node
        destination = command.other
        if command.args:
            destination = self._remote_destination(command.args[0])
        link = None
        if destination is not None:
            try:
                link = self._resolve(destination, follow=False).node
            except TopicError as exc:
                raise TopicError(404, f"Not found: destination topic {destination}") from exc
        tree = self.factory.tree
        node = tree.create(parent, ref.leaves[-1], keywords=command.keywords or (), link=link,
                           owner=self.account or "", now=self.factory.clock.seconds())
        service = self.factory.service

        def created() -> None:
            service.topic_notice(parent.key, "ADD", node.display)

        return self._persist(self.factory.durable.put_topics([node.record()]),
                             lambda: tree.remove(node), created)

    def do_REMOVE_TOPIC(self, command: Command) -> Deferred:
        """Remove the topic, its subtree and the virtual topics linking into it, with every
        subscription to them (any subscriber, any kind, wildcards based on them) in the same
        transaction.  Their messages are still delivered and expire as usual."""
        found = self._resolve(command.ref, follow=False, need=Perm.CREATE)
        tree = self.factory.tree
        service = self.factory.service
        removed = tree.remove(found.node)
        keys = [node.key for node in removed]
        paths = [(node.key, node.display) for node in removed]
        dropped: list[Subscription] = service.index.based_on(keys)
        entries = [(sub.record.subscriber, sub.record.kind, sub.record.topic) for sub in dropped]
        d = self.factory.durable.delete_topics(keys, entries)

        def done(pending: int) -> None:
            self._reply(OK, "OK", f"{pending} messages pending")
            service.topics_removed(paths, dropped)

        def failed(failure: Failure) -> None:
            tree.restore(removed)
            self._log.failure("Removing topics", failure)
            self._reply(451, "Local error: the change could not be stored")

        return d.addCallbacks(done, failed)

    def do_SET_TOPIC_NAME(self, command: Command) -> Deferred:
        source = self._resolve(command.ref, follow=False, need=Perm.CREATE).node
        new = command.other_ref
        if not new.leaves:
            raise Refused(409, "Conflict: / exists")
        parent = self._resolve(TopicRef(new.leaves[:-1]), need=Perm.CREATE).node
        tree = self.factory.tree
        old_parent, old_name = source.parent, source.name
        old_key = source.key
        changed = tree.rename(source, parent, new.leaves[-1])
        assert old_parent is not None  # the root has none, and rename refused it
        renames = [(old, node.record()) for old, node in changed]
        service = self.factory.service
        return self._persist(self.factory.durable.rename_topics(renames),
                             lambda: tree.rename(source, old_parent, old_name),
                             lambda: service.topic_notice(old_key, "RENAME", source.display))

    def do_SET_TOPIC_KEYWORDS(self, command: Command) -> Deferred:
        node = self._resolve(command.ref, follow=False, need=Perm.ADMINISTER).node
        self._changeable(node)
        old, node.keywords = node.keywords, command.keywords or ()

        def undo() -> None:
            node.keywords = old

        return self._persist(self.factory.durable.put_topics([node.record()]), undo,
                             lambda: self.factory.service.topic_notice(node.key, "KEYWORDS",
                                                                      format_keywords(node.keywords)))

    def do_SET_TOPIC_DELIVERY(self, command: Command) -> Deferred:
        node = self._resolve(command.ref, need=Perm.ADMINISTER).node
        self._changeable(node)
        old, node.delivery = node.delivery, command.mode or "ALL"

        def undo() -> None:
            node.delivery = old

        return self._persist(self.factory.durable.put_topics([node.record()]), undo)

    def do_SET_TOPIC_TIMEOUT(self, command: Command) -> Deferred:
        """Our extension: the default timeout of messages published to the topic (and,
        unless they set their own, to the topics below it) without a Timeout attribute.
        Like DELIVERY it acts on the target of a virtual topic and needs administer."""
        node = self._resolve(command.ref, need=Perm.ADMINISTER).node
        self._changeable(node)
        old = node.timeout
        if command.mode == "INFINITE":
            node.timeout = math.inf
        elif command.mode == "DEFAULT":
            node.timeout = None
        else:
            node.timeout = command.timeout

        def undo() -> None:
            node.timeout = old

        return self._persist(self.factory.durable.put_topics([node.record()]), undo)

    def do_GET_TOPIC_TIMEOUT(self, command: Command) -> None:
        """``200-OK``, the timeout a message without Timeout gets in the topic, and where
        it comes from: ``From: /path`` (the topic or the ancestor that sets it) or ``From:
        SERVER`` (the server default)."""
        node = self._resolve(command.ref).node
        factory = self.factory
        source = factory.durable.topics.timeout_source(node.key)
        origin = "SERVER" if source is None else factory.display(source)
        self._reply(OK, "OK", format_timeout(factory.message_timeout_for(node.key)), f"From: {origin}")

    def _changeable(self, node: Node) -> None:
        if node.key == "" or node.transient or (node.system and node.key == ACCOUNTS):
            raise Refused(403, f"Forbidden: {node.display or '/'} is managed by the server")

    def do_GET_TOPIC_KEYWORDS(self, command: Command) -> None:
        node = self._resolve(command.ref, follow=False).node
        self._reply(OK, "OK", format_keywords(node.keywords))

    def do_GET_TOPIC_DELIVERY(self, command: Command) -> None:
        node = self._resolve(command.ref).node
        self._reply(OK, "OK", node.delivery)

    def do_LIST_TOPIC(self, command: Command) -> None:
        node = self._resolve(command.ref).node
        lines = [self._listing(child) for child in self._visible(self.factory.tree.children(node))]
        self._reply(OK, "OK", *lines)

    def do_FIND_TOPIC(self, command: Command) -> None:
        ref = command.ref
        tree = self.factory.tree
        wanted = [k.lower() for k in command.keywords or ()]
        if ref.wildcard is None and not wanted:
            node = self._resolve(ref, follow=False).node
            self._reply(OK, "OK", self._listing(node, keywords=True))
            return
        base = self._resolve(TopicRef(ref.leaves)).node
        layers = max(1, command.depth or 0)
        found = []
        for node in tree.matching(base, ref.wildcard, layers):
            if wanted and not all(any(w in k.lower() for k in node.keywords) for w in wanted):
                continue
            if not self._permissions(node):
                continue
            found.append(node)
            if len(found) > MAX_FIND_RESULTS:
                raise Refused(510, f"Maximum quantities exceeded: more than {MAX_FIND_RESULTS} topics")
        self._reply(OK, "OK", *(self._listing(node, keywords=True) for node in found))

    def _selected(self, ref: TopicRef) -> tuple[Found, list[Node]]:
        """A COUNT target: the topic (wildcard: its parent) and, for a wildcard, every
        visible topic it selects below."""
        if ref.wildcard is None:
            return self._resolve(ref, trash=True), []
        base = self._resolve(TopicRef(ref.leaves))
        return base, self._visible(self.factory.tree.matching(base.node, ref.wildcard, None))

    def do_COUNT_TOPIC(self, command: Command) -> None:
        found, selected = self._selected(command.ref)
        if command.ref.wildcard is None:
            if found.trash:
                raise Refused(403, "Forbidden: Trash has no child topics")
            selected = self._visible(self.factory.tree.children(found.node))
        self._reply(OK, "OK", str(len(selected)))

    def do_COUNT_MESSAGE(self, command: Command) -> Deferred:
        found, selected = self._selected(command.ref)
        keys = [node.key for node in selected] if command.ref.wildcard else [found.key]
        return self.factory.durable.count(keys).addCallback(
            lambda count: self._reply(OK, "OK", str(count)))

    def do_COUNT_SUBSCRIBERS(self, command: Command) -> None:
        """Answered from the subscription index, which mirrors the store's subscriptions."""
        found, selected = self._selected(command.ref)
        keys = [node.key for node in selected] if command.ref.wildcard else [found.key]
        self._reply(OK, "OK", str(len(self.factory.service.index.exact_subscribers(keys))))


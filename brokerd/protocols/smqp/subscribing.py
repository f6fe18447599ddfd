"""The SMQP subscription commands of a session (mixed into SMQPServerProtocol): SUBSCRIBE and
UNSUBSCRIBE (MESSAGE, TOPIC, SUBSCRIBERS, SERVER), LIST SUBSCRIPTIONS, SET NOTIFY.

SMQP's subscriptions are the core's durable subscriptions (:mod:`brokerd.core.durable`): a
MESSAGE subscription is stored, then indexed, so that any protocol's message to its topics is
kept for the subscriber from then on, and the messages already retained are backfilled.
"""
from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed

from brokerd.auth.ual import Perm
from brokerd.core.subscriptions import (
    MESSAGE,
    SUBSCRIBERS,
    TOPIC,
    Subscription,
    stored_topic,
    wildcard_covers,
)
from brokerd.protocols.smqp.events import Command, TopicRef
from brokerd.protocols.smqp.refusal import Refused
from brokerd.protocols.smqp.session import SessionBase
from brokerd.protocols.smqp.topictree import TopicError
from brokerd.store.records import SubscriptionRecord

_KIND_WORDS = {MESSAGE: "MESSAGE", TOPIC: "TOPIC", SUBSCRIBERS: "SUB"}


class SubscriptionCommands(SessionBase):
    """Mixin of SMQPServerProtocol: SUBSCRIBE, UNSUBSCRIBE and the notification settings
    (the session it needs: brokerd.protocols.smqp.session)."""

    def _subscription_target(self, ref: TopicRef, kind: str) -> tuple[str, str | None, list[Any]]:
        """(base key, pattern, topics it selects now) for a SUBSCRIBE."""
        if ref.wildcard is not None and not ref.leaves and kind == MESSAGE:
            raise Refused(510, "Maximum quantities exceeded: no subscription to every message at /")
        if ref.wildcard is None:
            found = self._resolve(ref, need=Perm.SUBSCRIBE)
            return found.node.key, None, [found.node]
        base = self._resolve(TopicRef(ref.leaves), need=Perm.SUBSCRIBE)
        selected = [node for node in self.factory.tree.matching(base.node, ref.wildcard, None)
                    if Perm.SUBSCRIBE in self._permissions(node)]
        return base.node.key, ref.wildcard.lower(), selected

    def _subscribe(self, kind: str, ref: TopicRef, changes: frozenset[str], since: float | None = None,
                   until: float | None = None) -> Deferred:
        base, pattern, selected = self._subscription_target(ref, kind)
        topic = stored_topic(base, pattern)
        service = self.service
        name = self.subscriber
        if service.index.get(name, kind, topic) is None and \
                service.index.count_of(name) >= self.factory.settings.max_subscriptions:
            raise Refused(413, f"Resource too large: {self.factory.settings.max_subscriptions} subscriptions")
        record = SubscriptionRecord(name, kind, topic, tuple(sorted(changes)), since, until)
        keys = sorted({node.link or node.key for node in selected})

        def done(_: object) -> None:
            if kind == MESSAGE:
                self.notifications.refresh()
                if pattern is None:
                    service.subscribers_changed(base)
                self.factory.subscriptions_changed()
            self._reply(200, "OK", *(node.display for node in selected))

        return self.factory.durable.subscribe(record, keys).addCallback(done)

    def do_SUBSCRIBE_MESSAGE(self, command: Command) -> Deferred:
        if command.since is not None and command.until is not None and command.until <= command.since:
            raise Refused(409, "Conflict: UNTIL precedes or is the same as SINCE")
        return self._subscribe(MESSAGE, command.ref, command.changes or frozenset(),
                               command.since, command.until)

    def do_SUBSCRIBE_TOPIC(self, command: Command) -> Deferred:
        return self._subscribe(TOPIC, command.ref, command.changes or frozenset())

    def do_SUBSCRIBE_SUBSCRIBERS(self, command: Command) -> Deferred:
        return self._subscribe(SUBSCRIBERS, command.ref, frozenset())

    def do_SUBSCRIBE_SERVER(self, command: Command) -> None:
        """Transitory: for this connection only (the draft)."""
        if command.mode == "BYE":
            self.server_bye = True
        else:
            self.server_timeout = True
        self._reply(200, "OK")

    def do_UNSUBSCRIBE_SERVER(self, command: Command) -> None:
        if command.mode == "BYE":
            self.server_bye = False
        else:
            self.server_timeout = False
        self._reply(200, "OK")

    # ------------------------------------------------------------------ UNSUBSCRIBE

    def _unsubscribe_keys(self, ref: TopicRef) -> tuple[str, str | None]:
        if ref.wildcard is not None and not ref.leaves:
            return "", ref.wildcard.lower()
        try:
            found = self.factory.tree.lookup(TopicRef(ref.leaves))
            base = found.node.key
        except TopicError:
            base = ref.key
        return base, ref.wildcard.lower() if ref.wildcard is not None else None

    def _unsubscribe(self, kinds: tuple[str, ...], ref: TopicRef | None, labelled: bool) -> Deferred:
        service = self.service
        name = self.subscriber
        selected: list[Subscription] = []
        base, pattern = self._unsubscribe_keys(ref) if ref is not None else ("", "*")
        wanted = stored_topic(base, pattern)
        for sub in service.index.of(name):
            if sub.record.kind not in kinds:
                continue
            if sub.record.topic == wanted or (pattern is not None and wildcard_covers(base, pattern, sub.base)):
                selected.append(sub)
        if not selected:
            if pattern is None:
                raise Refused(404, f"Not found: not subscribed to {ref}")
            self._reply(200, "OK")
            return succeed(None)

        def done(dropped: list[str]) -> None:
            if dropped:
                self.notifications.refresh()
            for sub in selected:
                if sub.record.kind == MESSAGE and sub.pattern is None:
                    service.subscribers_changed(sub.base)
            if any(sub.record.kind == MESSAGE for sub in selected):
                self.factory.subscriptions_changed()
            lines = [self._subscription_line(sub, labelled) for sub in selected]
            if pattern is None and not labelled:
                self._reply(200, "OK")
            else:
                self._reply(200, "OK", *lines)

        return self.factory.durable.unsubscribe(name, selected, self._keys_of).addCallback(done)

    def _keys_of(self, sub: Subscription) -> list[str]:
        if sub.pattern is None:
            return [sub.base]
        node = self.factory.tree.get(sub.base)
        if node is None:
            return []
        return [n.link or n.key for n in self.factory.tree.matching(node, sub.pattern, None)]

    def _subscription_line(self, sub: Subscription, labelled: bool) -> str:
        path = self.service.display(sub.base) if sub.pattern is None else \
            (self.service.display(sub.base).rstrip("/") + "/" + sub.pattern)
        return f"{_KIND_WORDS[sub.record.kind]} {path}" if labelled else path

    def do_UNSUBSCRIBE_MESSAGE(self, command: Command) -> Deferred:
        ref = command.ref
        return self._unsubscribe((MESSAGE,), None if ref == TopicRef((), "*") else ref, False)

    def do_UNSUBSCRIBE_TOPIC(self, command: Command) -> Deferred:
        ref = command.ref
        return self._unsubscribe((TOPIC,), None if ref == TopicRef((), "*") else ref, False)

    def do_UNSUBSCRIBE_SUBSCRIBERS(self, command: Command) -> Deferred:
        ref = command.ref
        return self._unsubscribe((SUBSCRIBERS,), None if ref == TopicRef((), "*") else ref, False)

    def do_UNSUBSCRIBE_ALL(self, command: Command) -> Deferred:
        """``UNSUB *``: every subscription, each line labelled with its resource."""
        self.server_timeout = False
        return self._unsubscribe((MESSAGE, TOPIC, SUBSCRIBERS), None, True)

    def do_LIST_SUBSCRIPTIONS(self, command: Command) -> None:
        lines = []
        for sub in self.service.index.of(self.subscriber):
            lines.append(self._subscription_line(sub, sub.record.kind != MESSAGE))
        self._reply(200, "OK", *lines)

    # ------------------------------------------------------------------ SET NOTIFY

    def _notify_scope(self, ref: TopicRef) -> str | None:
        if ref == TopicRef((), "*"):
            return None
        base, pattern = self._unsubscribe_keys(ref)
        return stored_topic(base, pattern)

    def do_SET_NOTIFY_SUSPEND(self, command: Command) -> None:
        self.notifications.suspend(self._notify_scope(command.ref))
        self._reply(200, "OK")

    def do_SET_NOTIFY_RESUME(self, command: Command) -> None:
        self.notifications.resume(self._notify_scope(command.ref))
        self._reply(200, "OK")

    def do_SET_NOTIFY_WINDOW(self, command: Command) -> None:
        """brokerd's extension (docs/smqp.md): up to ``n`` notifications outstanding, their
        acknowledgements sharing commits.  A server without it answers 400 (SET NOTIFY
        takes SUSPEND or RESUME), over this server's maximum 510: the client keeps the
        draft's one at a time either way."""
        size = int(command.depth or 0)
        most = self.factory.max_notify_window
        if size > most:
            raise Refused(510, f"Maximum quantities exceeded: a notification window of at most {most}")
        self.notifications.set_window(size)
        self._reply(200, "OK")


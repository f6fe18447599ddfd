"""The SMQP message commands of a session (mixed into SMQPServerProtocol): PUBLISH,
SUBSCRIBE, UNSUBSCRIBE, the client's 310/312/416, SET NOTIFY, LIST SUBSCRIPTIONS, and
GET/LIST/REMOVE/MOVE MESSAGE.

A guaranteed PUBLISH answers once its message is committed; publishes do not wait for each
other (:class:`Overlap`): several pipelined ones share a group commit and their replies still
come back in order.  See docs/smqp.md for the reply codes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, succeed

from brokerd.auth.ual import Perm
from brokerd.core.stored import encode as encode_message
from brokerd.protocols.smqp.codec import encode_reply, format_datetime
from brokerd.protocols.smqp.events import Body, ClientReply, Command, TopicRef
from brokerd.protocols.smqp.mapping import to_message
from brokerd.protocols.smqp.messages import (
    ABSENT,
    Publication,
    read_publication,
    smuid_number,
    stored_body,
)
from brokerd.protocols.smqp.outbox import NoNotification
from brokerd.core.subscriptions import (
    MESSAGE,
    SUBSCRIBERS,
    TOPIC,
    Subscription,
    stored_topic,
    wildcard_covers,
)
from brokerd.protocols.smqp.topictree import ACCOUNTS, TopicError
from brokerd.store.records import MessageRecord, SubscriptionRecord, trash_owner

if TYPE_CHECKING:
    from brokerd.protocols.smqp.delivery import MessageService

MAX_GET_MESSAGES = 1000
"""Messages one GET MESSAGE returns (510 beyond)."""
MAX_ID_RANGE = 100_000
"""Message numbers one GET MESSAGE range may span (400 beyond)."""
_KIND_WORDS = {MESSAGE: "MESSAGE", TOPIC: "TOPIC", SUBSCRIBERS: "SUB"}


@dataclass
class Overlap:
    """A command whose reply comes later without holding the commands behind it: ``d``
    fires with the reply bytes (or fails like any command)."""

    d: Deferred


class Refused(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class MessagingCommands:
    """Mixin: needs ``factory`` (with ``service``, ``tree``, ``store``, ``clock``,
    ``domain``, ``settings``), ``account``, ``channel``, ``outbox``, ``_reply``,
    ``_resolve``, ``_permissions`` and ``_visible`` from SMQPServerProtocol."""

    factory: Any
    account: str | None
    channel: str | None
    outbox: Any
    server_bye: bool
    server_timeout: bool

    @property
    def subscriber(self) -> str:
        return f"{self.account}:{self.channel}"

    @property
    def service(self) -> MessageService:
        return self.factory.service  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ client replies

    def client_reply(self, event: ClientReply) -> Deferred | None:
        """310 ACK, 312 wait, 416 not available: the first phase of a delivery."""
        outbox = self.outbox
        if event.code not in (310, 312, 416):
            raise Refused(400, f"Bad request: {event.code} is not an acknowledgement (310, 312 or 416)")
        try:
            if event.code == 416:
                d = outbox.refuse()
                return d.addCallback(lambda _: self._reply(200, "OK"))
            d = outbox.acknowledge(wait=event.code == 312)
        except (NoNotification, AttributeError):
            raise Refused(503, "Bad sequence: no notification to acknowledge") from None
        return d.addCallback(lambda _: self._server_ack())

    def _server_ack(self) -> None:
        self._reply(310, "ACK")
        self._after_reply(self.outbox.pump)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ PUBLISH

    def do_PUBLISH_MESSAGE(self, command: Command) -> Overlap | Deferred | None:
        body = command.body or Body()
        try:
            publication = read_publication(body)
        except ValueError as exc:
            raise Refused(400, f"Bad request: {exc}") from None
        mode = command.mode or "NEW"
        if mode == "RECALL":
            return self._recall(command, publication)
        if mode == "REPLY" and not publication.smuids:
            raise Refused(400, "Bad request: a REPLY carries the Smuid of the message it answers")
        if mode == "REPLACE" and not publication.smuids:
            raise Refused(400, "Bad request: a REPLACE carries the Smuid of the message it replaces")
        need = Perm.REPLY if mode == "REPLY" else Perm.PUBLISH
        if command.topic is not None:
            key, node_mode = self._publish_topic(command.topic, need)
            return self._publish_to(key, [], body, publication, command, node_mode, mode)
        if mode == "REPLACE":
            raise Refused(400, "Bad request: REPLACE names the topic of the message")
        key, explicit, account = self._address(command.args[0], Perm.NONE if mode == "REPLY" else need)

        def known(exists: bool) -> bytes | Deferred:
            if not exists:
                raise Refused(404, f"Not found: no account {account}")
            result = self._publish_to(key, explicit, body, publication, command, "ALL", mode)
            return result.d if isinstance(result, Overlap) else b""

        d = self._may_reply(publication) if mode == "REPLY" else succeed(None)
        d.addCallback(lambda _: self.factory.checker.exists(account))
        return Overlap(d.addCallback(known))

    def _may_reply(self, publication: Publication) -> Deferred:
        """A REPLY to an address needs reply permission (UAL ``r``) on the topic of the
        message it answers: the last Smuid of its header (a reply carries the history first,
        the answered message last).  That message must still be on the server (in its topic
        or its Trash): 404 otherwise, and also when the login may not see its topic."""
        given = publication.smuids[-1].strip()
        seq = smuid_number(given)
        if seq is None:
            raise Refused(400, f"Bad request: Smuid {given!r} names no message")

        def found(record: MessageRecord | None) -> None:
            if record is None or not _same_message(given, record.smuid):
                raise Refused(404, "Not found: the message answered is not on the server")
            key = record.topic
            if record.trashed is not None:
                key = trash_owner(key) or ""
            perms = self.factory.ual.permissions(self.account, tuple(key.split("/")) if key else ())
            if not perms:
                raise Refused(404, "Not found: the message answered is not on the server")
            if Perm.REPLY not in perms:
                raise Refused(403, f"Forbidden: no reply permission on {self.service.display(key)}")

        return self.factory.store.find_message(seq).addCallback(found)

    def _publish_to(self, key: str, explicit: list[str], body: Body, publication: Publication,
                    command: Command, node_mode: str, mode: str) -> Overlap | None:
        if not publication.guarantee:
            self._publish_volatile(key, body, publication, command, explicit, mode)
            return None
        if mode == "REPLACE":
            return Overlap(self._replace(key, body, publication, command, node_mode))
        return Overlap(self._publish(key, body, publication, command, explicit, node_mode, "ADD",
                                     history=mode == "REPLY"))

    def _publish_topic(self, ref: TopicRef, need: Perm) -> tuple[str, str]:
        if not ref.leaves:
            raise Refused(403, "Forbidden: messages are published to a topic below /")
        found = self._resolve(ref, need=need)  # type: ignore[attr-defined]
        node = found.node
        if node.key == ACCOUNTS:
            raise Refused(403, "Forbidden: /accounts is managed by the server")
        return found.key, node.delivery

    def _address(self, target: str, need: Perm) -> tuple[str, list[str], str]:
        """``user[:channel]@domain``: the login topic key, the subscribers it reaches and
        the account (whose existence the caller checks).  ``need`` is checked on ``/`` (a
        new message to an account needs publish there; a REPLY is checked against the
        message it answers instead, Perm.NONE here)."""
        who, _at, domain = target.partition("@")
        account, colon, channel = who.partition(":")
        account = account.lower()
        if domain.lower() not in self.factory.domains:
            raise Refused(405, f"Not allowed: {domain} is not this server's domain (no server links)")
        if need and need not in self._permissions(self.factory.tree.root):  # type: ignore[attr-defined]
            raise Refused(403, "Forbidden: no permission to send to accounts")
        if colon:
            if not channel:
                raise Refused(400, "Bad request: empty channel")
            return f"{ACCOUNTS}/{account}/{channel.lower()}", [f"{account}:{channel}"], account
        names = self.service.index.account_channels(account)
        names.update(name for name in self.service.outboxes if name.startswith(account + ":"))
        return f"{ACCOUNTS}/{account}", sorted(names), account

    def _identifiers(self, client_cmuid: str) -> tuple[int, str, str, str, float]:
        factory = self.factory
        now = factory.clock.seconds()
        stamp = format_datetime(now)
        seq = self.service.next_seq()
        smuid = self.service.smuid(seq, stamp)
        cmuid = f"{self.subscriber}@{factory.domain}/{client_cmuid}({stamp})"
        return seq, smuid, cmuid, stamp, now

    def _expiry(self, publication: Publication, key: str, now: float) -> float | None:
        """When a message kept in ``key`` expires: its Timeout, else the topic's default
        (inherited from the nearest ancestor that sets one), else the server's."""
        timeout = publication.timeout
        if timeout is ABSENT:
            timeout = self.factory.message_timeout_for(key)
        return None if timeout is None else now + timeout  # type: ignore[operator]

    def _publish(self, key: str, body: Body, publication: Publication, command: Command,
                 explicit: list[str], node_mode: str, change: str, history: bool) -> Deferred:
        seq, smuid, cmuid, stamp, now = self._identifiers(command.args[1])
        stored = stored_body(body, smuid, cmuid, history)
        subscribers = dict.fromkeys(explicit)
        subscribers.update(dict.fromkeys(self.service.recipients(key, change, now)))
        mode = "ONE" if "ONE" in (node_mode, publication.delivery) else "ALL"
        expires = self._expiry(publication, key, now)
        message = to_message(stored, key, self.subscriber, message_id=smuid, created=publication.created,
                             priority=publication.priority, expires=expires)
        record = MessageRecord(smuid, key, self.subscriber, cmuid, now, expires, publication.priority,
                               encode_message(message), seq, mode, publication.receipt)
        forward = message if not key.startswith(ACCOUNTS) else None
        d = self.service.publish(record, [(name, change) for name in subscribers], forward,
                                 stored.size)
        return d.addCallback(lambda _: encode_reply(200, "OK", cmuid, smuid))

    def _publish_volatile(self, key: str, body: Body, publication: Publication, command: Command,
                          explicit: list[str], mode: str) -> None:
        factory = self.factory
        now = factory.clock.seconds()
        stamp = format_datetime(now)
        number = next(factory.volatile_numbers)
        smuid = f"{self.service.suid}/x{number}({stamp})"
        stored = stored_body(body, smuid, f"{self.subscriber}@{factory.domain}/{command.args[1]}({stamp})",
                             mode == "REPLY")
        subscribers = dict.fromkeys(explicit)
        subscribers.update(dict.fromkeys(self.service.recipients(key, "ADD", now)))
        message = to_message(stored, key, self.subscriber, message_id=smuid, created=publication.created,
                             priority=publication.priority, expires=None)
        self.service.publish_volatile(key, self.subscriber, stored, message, subscribers)

    def _owned(self, record: MessageRecord, key: str) -> bool:
        """May this login remove/replace/recall/move the message: its publisher's account,
        or administer permission on the topic."""
        if record.publisher.partition(":")[0] == self.account:
            return True
        node = self.factory.tree.get(key)
        return node is not None and Perm.ADMINISTER in self._permissions(node)  # type: ignore[attr-defined]

    def _replace(self, key: str, body: Body, publication: Publication, command: Command,
                 node_mode: str) -> Deferred:
        seq = smuid_number(publication.smuids[0])
        d = self.factory.store.find_message(seq) if seq is not None else succeed(None)

        def found(record: MessageRecord | None) -> Deferred:
            if record is None or record.trashed is not None or record.topic != key:
                return self._publish(key, body, publication, command, [], node_mode, "ADD", False)
            if not self._owned(record, key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator replaces a message")
            trashed = self.factory.store.trash_message(record.seq, self.factory.clock.seconds())

            def gone(settled: Any) -> Deferred:
                if settled is not None:
                    self.service.durable.settle(settled, "replaced")
                return self._publish(key, body, publication, command, [], node_mode, "REPLACE", False)

            return trashed.addCallback(gone)

        return d.addCallback(found)

    def _recall(self, command: Command, publication: Publication) -> Deferred:
        if command.topic is None:
            raise Refused(400, "Bad request: RECALL names the topic of the message")
        key, _mode = self._publish_topic(command.topic, Perm.PUBLISH)
        seq = smuid_number(publication.smuids[0]) if publication.smuids else None
        if seq is None:
            raise Refused(400, "Bad request: a RECALL carries the Smuid of the message")
        d = self.factory.store.find_message(seq)
        factory = self.factory

        def found(record: MessageRecord | None) -> Deferred:
            if record is None or record.trashed is not None or record.topic != key:
                raise Refused(404, "Not found: the message is no longer in the topic")
            if not self._owned(record, key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator recalls a message")
            return factory.store.trash_message(seq, factory.clock.seconds()).addCallback(gone, record)

        def gone(settled: Any, record: MessageRecord) -> None:
            if settled is not None:
                self.service.durable.settle(settled, "recalled")
            self.service.message_notice(key, "DELETE", record)
            stamp = format_datetime(factory.clock.seconds())
            self._reply(200, "OK", f"{self.subscriber}@{factory.domain}/{command.args[1]}({stamp})", record.smuid)

        return d.addCallback(found)

    # ------------------------------------------------------------------ SUBSCRIBE

    def _subscription_target(self, ref: TopicRef, kind: str) -> tuple[str, str | None, list[Any]]:
        """(base key, pattern, topics it selects now) for a SUBSCRIBE."""
        if ref.wildcard is not None and not ref.leaves and kind == MESSAGE:
            raise Refused(510, "Maximum quantities exceeded: no subscription to every message at /")
        if ref.wildcard is None:
            found = self._resolve(ref, need=Perm.SUBSCRIBE)  # type: ignore[attr-defined]
            return found.node.key, None, [found.node]
        base = self._resolve(TopicRef(ref.leaves), need=Perm.SUBSCRIBE)  # type: ignore[attr-defined]
        selected = [node for node in self.factory.tree.matching(base.node, ref.wildcard, None)
                    if Perm.SUBSCRIBE in self._permissions(node)]  # type: ignore[attr-defined]
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
        store = self.factory.store
        d = store.put_subscription(record)

        def stored(_: Any) -> Any:
            service.index.add(record)
            if kind == MESSAGE:
                now = self.factory.clock.seconds()
                if "ADD" in changes and (until is None or until > now):
                    return store.backfill(name, keys, since, now)
            return None

        def done(_: Any) -> None:
            if kind == MESSAGE:
                self.outbox.refresh()
                if pattern is None:
                    service.subscribers_changed(base)
            self._reply(200, "OK", *(node.display for node in selected))

        return d.addCallback(stored).addCallback(done)

    def do_SUBSCRIBE_MESSAGE(self, command: Command) -> Deferred:
        if command.since is not None and command.until is not None and command.until <= command.since:
            raise Refused(409, "Conflict: UNTIL precedes or is the same as SINCE")
        return self._subscribe(MESSAGE, command.topic, command.changes or frozenset(),  # type: ignore[arg-type]
                               command.since, command.until)

    def do_SUBSCRIBE_TOPIC(self, command: Command) -> Deferred:
        return self._subscribe(TOPIC, command.topic, command.changes or frozenset())  # type: ignore[arg-type]

    def do_SUBSCRIBE_SUBSCRIBERS(self, command: Command) -> Deferred:
        return self._subscribe(SUBSCRIBERS, command.topic, frozenset())  # type: ignore[arg-type]

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
        store = self.factory.store
        for sub in selected:
            service.index.remove(name, sub.record.kind, sub.record.topic)
        removals = [store.remove_subscription(name, sub.record.kind, sub.record.topic) for sub in selected]
        dropped = sorted({key for sub in selected if sub.record.kind == MESSAGE
                          for key in self._keys_of(sub) if not service.index.covered(name, key)})
        d = store.drop_pending(name, dropped) if dropped else removals[-1]

        def done(_: Any) -> None:
            if dropped:
                self.outbox.refresh()
            for sub in selected:
                if sub.record.kind == MESSAGE and sub.pattern is None:
                    service.subscribers_changed(sub.base)
            lines = [self._subscription_line(sub, labelled) for sub in selected]
            if pattern is None and not labelled:
                self._reply(200, "OK")
            else:
                self._reply(200, "OK", *lines)

        return d.addCallback(done)

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
        ref = command.topic
        return self._unsubscribe((MESSAGE,), None if ref == TopicRef((), "*") else ref, False)

    def do_UNSUBSCRIBE_TOPIC(self, command: Command) -> Deferred:
        ref = command.topic
        return self._unsubscribe((TOPIC,), None if ref == TopicRef((), "*") else ref, False)

    def do_UNSUBSCRIBE_SUBSCRIBERS(self, command: Command) -> Deferred:
        ref = command.topic
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
        self.outbox.suspend(self._notify_scope(command.topic))  # type: ignore[arg-type]
        self._reply(200, "OK")

    def do_SET_NOTIFY_RESUME(self, command: Command) -> None:
        self.outbox.resume(self._notify_scope(command.topic))  # type: ignore[arg-type]
        self._reply(200, "OK")

    # ------------------------------------------------------------------ messages in a queue

    def _message_queue(self, ref: TopicRef, need: Perm) -> tuple[str, str]:
        """(queue key, display) of a topic or its Trash."""
        found = self._resolve(ref, need=need, trash=True)  # type: ignore[attr-defined]
        display = found.node.display + ("/Trash" if found.trash else "")
        return found.key, display

    def do_LIST_MESSAGE(self, command: Command) -> Deferred:
        key, _display = self._message_queue(command.topic, Perm.SUBSCRIBE)  # type: ignore[arg-type]
        d = self.factory.store.list_messages(key)
        return d.addCallback(lambda seqs: self._reply(200, "OK", format_ranges(seqs)))

    def do_GET_MESSAGE(self, command: Command) -> Deferred:
        key, display = self._message_queue(command.topic, Perm.SUBSCRIBE)  # type: ignore[arg-type]
        try:
            wanted = parse_ids(command.args[0])
        except ValueError as exc:
            raise Refused(400, f"Bad request: {exc}") from None
        # one more than may be sent, so that too many are refused without reading them all
        d = self.factory.store.get_messages(key, wanted, MAX_GET_MESSAGES + 1)

        def found(records: list[MessageRecord]) -> None:
            if not records and wanted is not None and len(wanted) == 1:
                raise Refused(404, "Not found: no such message in the topic")
            if len(records) > MAX_GET_MESSAGES:
                raise Refused(510, f"Maximum quantities exceeded: more than {MAX_GET_MESSAGES} messages")
            topic_line = f"Topic: {display}\r\n".encode("utf-8")
            parts = [encode_reply(200, "OK")]
            for record in records:
                parts += [topic_line, self.service.body_bytes(record.data)]
            parts.append(b".\r\n")
            self._reply_raw(b"".join(parts))  # type: ignore[attr-defined]

        return d.addCallback(found)

    def do_REMOVE_MESSAGE(self, command: Command) -> Deferred:
        key, _display = self._message_queue(command.topic, Perm.NONE)  # type: ignore[arg-type]
        seq = smuid_number(command.args[0])
        if seq is None:
            raise Refused(400, "Bad request: expected an SMUID or a message number")
        store = self.factory.store
        service = self.service

        def found(record: MessageRecord | None) -> Any:
            if record is None or record.topic != key:
                raise Refused(404, "Not found: no such message in the topic")
            owner = trash_owner(key) if record.trashed is not None else None
            owner_key = key if owner is None else owner
            if not self._owned(record, owner_key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator removes a message")
            if record.trashed is not None:
                return store.delete_message(seq).addCallback(lambda _: self._reply(200, "OK"))
            return store.trash_message(seq, self.factory.clock.seconds()).addCallback(removed, record)

        def removed(settled: Any, record: MessageRecord) -> None:
            if settled is not None:
                service.durable.settle(settled, "removed")
            service.message_notice(key, "DELETE", record)
            self._reply(200, "OK")

        return store.find_message(seq).addCallback(found)

    def do_MOVE_MESSAGE(self, command: Command) -> Deferred:
        key, _display = self._message_queue(command.topic, Perm.NONE)  # type: ignore[arg-type]
        destination, _mode = self._publish_topic(command.other, Perm.PUBLISH)  # type: ignore[arg-type]
        seq = smuid_number(command.args[0])
        if seq is None:
            raise Refused(400, "Bad request: expected an SMUID or a message number")
        if destination == key:
            raise Refused(409, "Conflict: the message is in that topic already")
        store = self.factory.store
        service = self.service
        now = self.factory.clock.seconds()

        def found(record: MessageRecord | None) -> Any:
            if record is None or record.topic != key or record.trashed is not None:
                raise Refused(404, "Not found: no such message in the topic")
            if not self._owned(record, key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator moves a message")
            deliveries = [(name, "ADD") for name in service.recipients(destination, "ADD", now)]
            d = store.move_message(seq, destination, deliveries)
            return d.addCallback(moved, record, deliveries)

        def moved(settled: Any, record: MessageRecord, deliveries: list[tuple[str, str]]) -> None:
            if settled is None:
                raise Refused(404, "Not found: no such message in the topic")
            service.durable.settle(settled)
            service.message_notice(key, "MOVE", record)
            service.durable.offer(replace(record, topic=destination), deliveries)
            self._reply(200, "OK")

        return store.find_message(seq).addCallback(found)


def _same_message(given: str, smuid: str) -> bool:
    """A client's Smuid names stored message ``smuid``: the same SMUID without its
    date-time, or only its number (the number was matched already)."""
    if "/" not in given:
        return True
    return given.partition("(")[0] == smuid.partition("(")[0]


def parse_ids(text: str) -> list[int] | None:
    """GET MESSAGE's ``*`` (None), ``1865``, ``1845-1890,1905`` or an SMUID.  ValueError."""
    if text == "*":
        return None
    single = smuid_number(text)
    if single is not None and "," not in text and "-" not in text.rsplit("/", 1)[-1]:
        return [single]
    found: set[int] = set()
    for part in text.split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not (low.isascii() and low.isdigit()) or (dash and not (high.isascii() and high.isdigit())):
            raise ValueError(f"expected message numbers such as 1845-1890,1905, not {part!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last - first >= MAX_ID_RANGE:
            raise ValueError(f"a range spans 1 to {MAX_ID_RANGE} numbers")
        found.update(range(first, last + 1))
        if len(found) > MAX_ID_RANGE:
            raise ValueError(f"at most {MAX_ID_RANGE} message numbers")
    if not found:
        raise ValueError("no message number")
    return sorted(found)


def format_ranges(numbers: list[int]) -> str:
    """``[1809, 1810, 1811, 1845]`` -> ``1809-1811,1845`` (LIST MESSAGE)."""
    parts: list[str] = []
    ordered = sorted(set(numbers))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


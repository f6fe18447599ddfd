"""The SMQP publishing commands of a session (mixed into SMQPServerProtocol): PUBLISH MESSAGE
(NEW, REPLY, REPLACE, RECALL; to a topic or to an address) and the client's 310/312/416, plus
the reply that comes later without holding the commands behind it (:class:`Overlap`).

A guaranteed PUBLISH is stored through the core's durable service as a neutral Message
(:mod:`~brokerd.protocols.smqp.mapping`) and answered once it is committed; publishes do not wait for each
other (:class:`Overlap`): several pipelined ones share a group commit and their replies still
come back in order.  See docs/smqp.md for the reply codes.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, succeed

from brokerd.auth.ual import Perm
from brokerd.core.message import Details, property_problem
from brokerd.core.stored import encode as encode_message
from brokerd.protocols.smqp.codec import encode_reply, format_datetime
from brokerd.protocols.smqp.events import Body, ClientReply, Command, TopicRef
from brokerd.protocols.smqp.federation import is_outgoing, out_subscriber, outgoing_key, recipients_for
from brokerd.protocols.smqp.mapping import published_over_smqp, to_message, user_properties_of
from brokerd.protocols.smqp.messages import Missing, Publication, read_publication, smuid_number, stored_body
from brokerd.protocols.smqp.outbox import NoNotification, Outbox
from brokerd.protocols.smqp.refusal import Refused
from brokerd.protocols.smqp.session import SessionBase
from brokerd.protocols.smqp.topictree import ACCOUNTS
from brokerd.store.records import MessageRecord, trash_owner

_ACK = encode_reply(310, "ACK")
"""The server's ``310 ACK``, written once per acknowledged delivery: encoded once."""
_OK = encode_reply(200, "OK")

if TYPE_CHECKING:
    from brokerd.protocols.smqp.delivery import MessageService


@dataclass
class Overlap:
    """A command whose reply comes later without holding the commands behind it: ``d``
    fires with the reply bytes (or fails like any command)."""

    d: Deferred
    after: Callable[[], None] | None = None
    """Called once the reply has been written (whether it succeeded or failed)."""


class MessagingCommands(SessionBase):
    """Mixin of SMQPServerProtocol: publishing, the client's answers to notifications, and
    the message commands (the session it needs: brokerd.protocols.smqp.session)."""

    @property
    def subscriber(self) -> str:
        return f"{self.account}:{self.channel}"

    @property
    def service(self) -> MessageService:
        return self.factory.service

    @property
    def notifications(self) -> Outbox:
        """The logged-in session's outbox (commands that use it are refused before LOGIN)."""
        if self.outbox is None:
            raise Refused(503, "Bad sequence: not logged in")
        return self.outbox

    # ------------------------------------------------------------------ client replies

    def client_reply(self, event: ClientReply) -> Overlap | Deferred | None:
        """310 ACK, 312 wait, 416 not available: the first phase of a delivery."""
        outbox = self.outbox
        if event.code not in (310, 312, 416):
            raise Refused(400, f"Bad request: {event.code} is not an acknowledgement (310, 312 or 416)")
        if outbox is None:
            raise Refused(503, "Bad sequence: no notification to acknowledge")
        windowed = outbox.window > 1 or len(outbox.sent) > 1
        try:
            if event.code == 416:
                d = outbox.refuse()
                if windowed:
                    return self._windowed_answer(outbox, d, _OK)
                return d.addCallback(lambda _: self._reply(200, "OK"))
            d = outbox.acknowledge(wait=event.code == 312)
        except NoNotification:
            raise Refused(503, "Bad sequence: no notification to acknowledge") from None
        if windowed:
            return self._windowed_answer(outbox, d, _ACK)
        return d.addCallback(lambda _: self._server_ack(outbox))

    def _windowed_answer(self, outbox: Outbox, d: Deferred, reply: bytes) -> Overlap:
        """With a notification window the answers do not wait for each other (their store
        writes share commits); each reply is still written after its own commit, in order,
        and only then does the window have room for one more NOTIFY."""
        outbox.unreplied += 1
        return Overlap(d.addCallback(lambda _: reply), after=outbox.replied)

    def _server_ack(self, outbox: Outbox) -> None:
        self._reply_raw(_ACK)
        self._after_reply(outbox.pump)

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
        if account is None:  # a recipient of a linked domain: its server checks the account
            if mode != "NEW":
                raise Refused(405, f"Not allowed: {mode} to a recipient of another domain")
            return self._publish_to(key, explicit, body, publication, command, "ALL", mode)

        def known(exists: bool) -> Deferred:
            if not exists:
                raise Refused(404, f"Not found: no account {account}")
            result = self._publish_to(key, explicit, body, publication, command, "ALL", mode)
            return result.d if isinstance(result, Overlap) else succeed(b"")

        allowed: Deferred[Any] = self._may_reply(publication) if mode == "REPLY" else succeed(None)
        exists: Deferred[Any] = allowed.addCallback(lambda _: self.factory.checker.exists(account))
        return Overlap(exists.addCallback(known))

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
            if record is None or not _same_message(given, record.message_id):
                raise Refused(404, "Not found: the message answered is not on the server")
            key = record.topic
            if record.trashed is not None:
                key = trash_owner(key) or ""
            perms = self.factory.permissions(self.principal, key)
            if not perms:
                raise Refused(404, "Not found: the message answered is not on the server")
            if Perm.REPLY not in perms:
                raise Refused(403, f"Forbidden: no reply permission on {self.service.display(key)}")

        return self.factory.durable.find(seq).addCallback(found)

    def _publish_to(self, key: str, explicit: list[str], body: Body, publication: Publication,
                    command: Command, node_mode: str, mode: str) -> Overlap | None:
        self._check_properties(body)
        if publication.timeout is None:
            self._may_keep_forever(key)
        if not publication.guarantee:
            self._publish_volatile(key, body, publication, command, explicit, mode)
            return None
        disk = self.factory.disk
        if disk is not None and disk.low:
            raise Refused(451, "Local error: the disk is nearly full; the message was not stored")
        if mode == "REPLACE":
            return Overlap(self._replace(key, body, publication, command, node_mode))
        return Overlap(self._publish(key, body, publication, command, explicit, node_mode, "ADD",
                                     history=mode == "REPLY"))

    def _check_properties(self, body: Body) -> None:
        """The ``X-`` attributes are the message's user properties for the other protocols,
        bounded for every protocol alike (``--max-user-properties``, ``--max-property-bytes``)."""
        user_properties = user_properties_of(body.attributes)
        if user_properties:
            settings = self.factory.settings
            problem = property_problem(Details(user_properties=user_properties), settings.max_user_properties,
                                       settings.max_property_bytes)
            if problem is not None:
                raise Refused(413, f"Resource too large: {problem}")

    def _may_keep_forever(self, key: str) -> None:
        """``Timeout: INFINITE`` (a state message, kept until removed) needs administer
        permission (UAL ``a``) on the queue that keeps it, like SET TOPIC TIMEOUT INFINITE:
        otherwise any publisher could fill the store with messages that never expire."""
        perms = self.factory.permissions(self.principal, key)
        if Perm.ADMINISTER not in perms:
            raise Refused(403, f"Forbidden: Timeout INFINITE needs administer permission on "
                               f"{self.service.display(key)}")

    def _publish_topic(self, ref: TopicRef, need: Perm) -> tuple[str, str]:
        if not ref.leaves:
            raise Refused(403, "Forbidden: messages are published to a topic below /")
        found = self._resolve(ref, need=need)
        node = found.node
        if node.key == ACCOUNTS:
            raise Refused(403, "Forbidden: /accounts is managed by the server")
        return found.key, node.delivery

    def _address(self, target: str, need: Perm) -> tuple[str, list[str], str | None]:
        """``user[:channel]@domain``: the login topic key, the subscribers it reaches and
        the account (whose existence the caller checks; None for a linked domain's
        recipient, whose message waits for the link in ``accounts/~<domain>/...``).  ``need``
        is checked on ``/`` (a new message to an account needs publish there; a REPLY is
        checked against the message it answers instead, Perm.NONE here)."""
        who, _at, domain = target.partition("@")
        account, colon, channel = who.partition(":")
        account = account.lower()
        local = domain.lower() in self.factory.domains
        if not local and self.factory.links.get(domain) is None:
            raise Refused(405, f"Not allowed: {domain} is not this server's domain and no link goes there")
        if need and need not in self._permissions(self.factory.tree.root):
            raise Refused(403, "Forbidden: no permission to send to accounts")
        if not local:
            if colon and not channel:
                raise Refused(400, "Bad request: empty channel")
            return outgoing_key(domain, account, channel.lower() if colon else None), [out_subscriber(domain)], None
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
        if isinstance(timeout, Missing):  # ABSENT
            timeout = self.factory.message_timeout_for(key)
        return None if timeout is None else now + timeout

    def _publish(self, key: str, body: Body, publication: Publication, command: Command,
                 explicit: list[str], node_mode: str, change: str, history: bool) -> Deferred:
        seq, smuid, cmuid, stamp, now = self._identifiers(command.args[1])
        stored = stored_body(body, smuid, cmuid, history)
        subscribers = dict.fromkeys(explicit)
        subscribers.update(dict.fromkeys(recipients_for(self.service.recipients(key, change, now), publication)))
        mode = "ONE" if "ONE" in (node_mode, publication.delivery) else "ALL"
        expires = self._expiry(publication, key, now)
        message = to_message(stored, key, self.subscriber, message_id=smuid, created=publication.created,
                             priority=publication.priority, expires=expires,
                             principal=self.principal)
        # a linked domain's topic (/<domain>/...) goes to its server too, over the link
        link = self.factory.links.for_key(key)
        if link is not None:
            subscribers[link.subscriber] = None
        # a receipt for what goes over a link comes from the other server (brokerd.protocols.smqp.links)
        receipt = "NONE" if is_outgoing(key) or link is not None else publication.receipt
        record = MessageRecord(smuid, key, self.subscriber, cmuid, now, expires, publication.priority,
                               encode_message(message), seq, mode, receipt)
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
        message = to_message(stored, key, self.subscriber, message_id=smuid, created=publication.created,
                             priority=publication.priority, expires=None,
                             principal=self.principal)
        self.service.publish_volatile(key, self.subscriber, stored.size, message, explicit)

    def _owned(self, record: MessageRecord, key: str) -> bool:
        """May this login remove/replace/recall/move the message: its publisher's account,
        or administer permission on the topic."""
        if record.publisher.partition(":")[0] == self.account and published_over_smqp(record.data):
            return True
        node = self.factory.tree.get(key)
        return node is not None and Perm.ADMINISTER in self._permissions(node)

    def _replace(self, key: str, body: Body, publication: Publication, command: Command,
                 node_mode: str) -> Deferred:
        seq = smuid_number(publication.smuids[0])
        d = self.factory.durable.find(seq) if seq is not None else succeed(None)

        def found(record: MessageRecord | None) -> Deferred:
            if record is None or record.trashed is not None or record.topic != key:
                return self._publish(key, body, publication, command, [], node_mode, "ADD", False)
            if not self._owned(record, key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator replaces a message")
            trashed = self.factory.durable.to_dead_letters(record.seq, "replaced")
            return trashed.addCallback(
                lambda _: self._publish(key, body, publication, command, [], node_mode, "REPLACE", False))

        return d.addCallback(found)

    def _recall(self, command: Command, publication: Publication) -> Deferred:
        if command.topic is None:
            raise Refused(400, "Bad request: RECALL names the topic of the message")
        key, _mode = self._publish_topic(command.topic, Perm.PUBLISH)
        seq = smuid_number(publication.smuids[0]) if publication.smuids else None
        if seq is None:
            raise Refused(400, "Bad request: a RECALL carries the Smuid of the message")
        d = self.factory.durable.find(seq)
        factory = self.factory

        def found(record: MessageRecord | None) -> Deferred:
            if record is None or record.trashed is not None or record.topic != key:
                raise Refused(404, "Not found: the message is no longer in the topic")
            if not self._owned(record, key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator recalls a message")
            return factory.durable.to_dead_letters(seq, "recalled").addCallback(gone, record)

        def gone(_settled: object, record: MessageRecord) -> None:
            self.service.message_notice(key, "DELETE", record)
            stamp = format_datetime(factory.clock.seconds())
            self._reply(200, "OK", f"{self.subscriber}@{factory.domain}/{command.args[1]}({stamp})", record.message_id)

        return d.addCallback(found)


def _same_message(given: str, smuid: str) -> bool:
    """A client's Smuid names stored message ``smuid``: the same SMUID without its
    date-time, or only its number (the number was matched already)."""
    if "/" not in given:
        return True
    return given.partition("(")[0] == smuid.partition("(")[0]


"""The SMQP commands on the messages kept in a topic (mixed into SMQPServerProtocol): LIST,
GET, REMOVE and MOVE MESSAGE, and the message-number syntax they share (``1845-1890,1905``).
"""
from __future__ import annotations

from twisted.internet.defer import Deferred, succeed

from brokerd.auth.ual import Perm
from brokerd.protocols.smqp.codec import encode_reply
from brokerd.protocols.smqp.events import Command, TopicRef
from brokerd.protocols.smqp.messages import smuid_number
from brokerd.protocols.smqp.refusal import Refused
from brokerd.protocols.smqp.session import SessionBase
from brokerd.store.records import MessageRecord, trash_owner


MAX_GET_MESSAGES = 1000
"""Messages one GET MESSAGE returns (510 beyond)."""
MAX_ID_RANGE = 100_000
"""Message numbers one GET MESSAGE range may span (400 beyond)."""
MAX_ID_DIGITS = 18
"""Digits of a message number (longer ones could not be stored: 400)."""


class QueueCommands(SessionBase):
    """Mixin of SMQPServerProtocol: the message-queue commands (LIST, GET, REMOVE and MOVE
    MESSAGE; the session it needs: brokerd.protocols.smqp.session)."""

    def _message_queue(self, ref: TopicRef, need: Perm) -> tuple[str, str]:
        """(queue key, display) of a topic or its Trash."""
        found = self._resolve(ref, need=need, trash=True)
        display = found.node.display + ("/Trash" if found.trash else "")
        return found.key, display

    def do_LIST_MESSAGE(self, command: Command) -> Deferred:
        key, _display = self._message_queue(command.ref, Perm.SUBSCRIBE)
        d = self.factory.durable.numbers(key)
        return d.addCallback(lambda seqs: self._reply(200, "OK", format_ranges(seqs)))

    def do_GET_MESSAGE(self, command: Command) -> Deferred:
        key, display = self._message_queue(command.ref, Perm.SUBSCRIBE)
        try:
            wanted = parse_ids(command.args[0])
        except ValueError as exc:
            raise Refused(400, f"Bad request: {exc}") from None
        durable = self.factory.durable
        body_bytes = self.service.body_bytes

        def listed(numbers: list[int]) -> Deferred:
            if wanted is None:
                chosen = numbers
            else:
                present = set(numbers)
                chosen = [seq for seq in wanted if seq in present]
            if not chosen and wanted is not None and len(wanted) == 1:
                raise Refused(404, "Not found: no such message in the topic")
            if len(chosen) > MAX_GET_MESSAGES:
                raise Refused(510, f"Maximum quantities exceeded: more than {MAX_GET_MESSAGES} messages")
            topic_line = f"Topic: {display}\r\n".encode("utf-8")
            left = iter(chosen)

            def next_message() -> Deferred:
                """One message at a time (one gone meanwhile is skipped)."""
                seq = next(left, None)
                if seq is None:
                    return succeed(None)
                d = durable.messages(key, [seq])
                return d.addCallback(lambda records: b"".join(topic_line + body_bytes(r.data) for r in records))

            return self.stream_reply(encode_reply(200, "OK"), next_message, b".\r\n")

        # the numbers first: too many are refused, and only one message is read at a time
        return durable.numbers(key).addCallback(listed)

    def do_REMOVE_MESSAGE(self, command: Command) -> Deferred:
        key, _display = self._message_queue(command.ref, Perm.NONE)
        seq = smuid_number(command.args[0])
        if seq is None:
            raise Refused(400, "Bad request: expected an SMUID or a message number")
        durable = self.factory.durable
        service = self.service

        def found(record: MessageRecord | None) -> Deferred:
            if record is None or record.topic != key:
                raise Refused(404, "Not found: no such message in the topic")
            owner = trash_owner(key) if record.trashed is not None else None
            owner_key = key if owner is None else owner
            if not self._owned(record, owner_key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator removes a message")
            if record.trashed is not None:
                return durable.delete(seq).addCallback(lambda _: self._reply(200, "OK"))
            return durable.to_dead_letters(seq, "removed").addCallback(removed, record)

        def removed(_settled: object, record: MessageRecord) -> None:
            service.message_notice(key, "DELETE", record)
            self._reply(200, "OK")

        return durable.find(seq).addCallback(found)

    def do_MOVE_MESSAGE(self, command: Command) -> Deferred:
        key, _display = self._message_queue(command.ref, Perm.NONE)
        destination, _mode = self._publish_topic(command.other_ref, Perm.PUBLISH)
        seq = smuid_number(command.args[0])
        if seq is None:
            raise Refused(400, "Bad request: expected an SMUID or a message number")
        if destination == key:
            raise Refused(409, "Conflict: the message is in that topic already")
        durable = self.factory.durable
        service = self.service

        def found(record: MessageRecord | None) -> Deferred:
            if record is None or record.topic != key or record.trashed is not None:
                raise Refused(404, "Not found: no such message in the topic")
            if not self._owned(record, key):
                raise Refused(403, "Forbidden: only the publisher or a topic administrator moves a message")
            return durable.move(record, destination, lambda: service.message_notice(key, "MOVE", record)) \
                .addCallback(moved)

        def moved(live: bool) -> None:
            if not live:
                raise Refused(404, "Not found: no such message in the topic")
            self._reply(200, "OK")

        return durable.find(seq).addCallback(found)


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
        if not _is_number(low) or (dash and not _is_number(high)):
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


def _is_number(text: str) -> bool:
    """A message number: 1 to 18 ASCII digits (the store's numbers are 64-bit)."""
    return text.isascii() and text.isdigit() and len(text) <= MAX_ID_DIGITS


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


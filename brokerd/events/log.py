"""The broker's event log: an IBrokerObserver plus a recorder front ends call.

Cost on the hot path is one small tuple appended to a list per event; a run of messages one
publisher sent to one topic (one ``publish_batch``) is one entry holding its count and total
size, not the messages, so routed messages and their payloads are freed as soon as they are
delivered and the buffer's memory does not grow with message sizes.  ENCODE_INTERVAL after
the buffer receives its first entry the reactor turns the entries into JSON lines, and every
``flush_interval`` seconds (or at ``batch_limit`` entries) hands the bytes to the writer
thread, which only chooses the hourly file and writes.  At most ``max_pending`` batches wait
for the thread; past that a batch is dropped and counted, so memory stays bounded by
``(max_pending + 1) * batch_limit`` entries whatever the disk does.

Durability: a process crash loses what was buffered, at most ``flush_interval`` seconds of
events (plus whatever the writer had not yet written if it was behind); every batch is flushed
to the OS when written, and ``fsync=True`` also syncs it to disk (files are always synced when
they are rotated or closed).  A line cut short by a crash is the last line of its file: the
writer never appends to a file of an earlier run, nor to one whose write failed.
"""
from __future__ import annotations

import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from json.encoder import encode_basestring  # the escaping of schema.encode (ensure_ascii=False)
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, TypedDict, Unpack, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, ITransport
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import Interface, implementer

from brokerd.config import Settings
from brokerd.events import schema
from brokerd.events.outcome_lines import outcome_line, record_head
from brokerd.events.retention import Retention
from brokerd.events.writer import HourlyFiles, WriterThread
from brokerd.interfaces import IBrokerObserver, IBrokerReactor, ISubscriber

DEFAULT_BATCH_LIMIT = 16_384
"""Entries buffered on the reactor thread before they are handed off early."""
DEFAULT_MAX_PENDING = 8
"""Batches waiting for the writer thread before new ones are dropped and counted."""
ENCODE_INTERVAL = 0.05
"""Seconds from the first entry in an empty buffer to its encoding on the reactor thread."""
STOP_TIMEOUT = 5.0
"""Seconds shutdown waits for the writer to finish behind a stuck disk before giving up (the
reactor keeps running meanwhile)."""

_ROUTED, _RECORD, _RUN, _SUMMARY = range(4)
"""Entry tags.  _SUMMARY: ``(tag, ts_ns, shared_key, count, total_bytes)`` for one message or a
run that carries nothing of its own; _ROUTED and _RUN keep the message(s) (a message id, a
per-message time, or logged payloads); _RECORD: ``(tag, ts_ns, kind, protocol, fields)`` for
every other event, logins and logouts included."""

_MESSAGE_ID = attrgetter("message_id")
_PAYLOAD = attrgetter("payload")

_RECORD_FIELDS = frozenset(schema.FIELD_NAMES) - {"v", "ts", "broker", "protocol", "kind"}
_OUTCOME_KINDS = frozenset({schema.DELIVERED, schema.ACKED, schema.REDELIVERED, schema.DROPPED, schema.EXPIRED,
                            schema.TRASHED})
"""Durable outcome events: written from their format when they have its shape."""
_TEXT_FIELDS = frozenset({"session", "sender", "topic", "recipient", "message_id", "source", "scheme"})
_BROKER_ID_FILE = "broker-id"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class IEventRecorder(Interface):
    """What a front end calls to log the events only it can see.  Every method returns at
    once (one append) and never raises for anything but a programming error (an unknown kind
    or field name)."""

    def record(kind, protocol, **fields):
        """Log one event of ``kind`` (a brokerd.events.schema kind) seen by ``protocol``;
        ``fields`` are schema field names (bytes values are fine for names and topics)."""

    def auth_failure(protocol, identity, source=None, scheme=None, reason=None):
        """A login was refused."""

    def delivery(kind, session, *, topic=None, sender=None, message_id=None, size=None,
                 reason=None, latency_us=None):
        """A per-recipient outcome (delivered, dropped, acked, redelivered, expired,
        trashed) for ``session`` (an ISubscriber)."""


class DeliveryFields(TypedDict, total=False):
    """The fields of a per-recipient outcome (:meth:`IEventRecorder.delivery`), for what
    hands them on."""

    topic: bytes | str | None
    sender: bytes | str | None
    message_id: bytes | str | None
    size: int | None
    reason: str | None
    latency_us: int | None


def peer_text(address: object) -> str | None:
    """An event's ``source``: ``host:port`` of a peer address, or a UNIX socket's path; None
    when there is nothing to tell."""
    if address is None:
        return None
    host = getattr(address, "host", None)
    if host is not None:
        return f"{host}:{getattr(address, 'port', '')}"
    name = getattr(address, "name", None)
    if isinstance(name, bytes):
        return name.decode("utf-8", "backslashreplace")
    return None if name is None else str(name)


class RoutedMessage(Protocol):
    """What the event log reads of a routed message: brokerd.core.message.Message, which it
    cannot import (the core sits above the event log and calls it)."""

    @property
    def kind(self) -> str: ...

    @property
    def target(self) -> bytes | None: ...

    @property
    def payload(self) -> bytes: ...

    @property
    def protocol(self) -> str: ...

    @property
    def sender_name(self) -> bytes: ...

    @property
    def message_id(self) -> str | None: ...


def transport_source(transport: ITransport | None) -> str | None:
    """:func:`peer_text` of a transport's peer (None without a transport or a peer)."""
    if transport is None:
        return None
    try:
        return peer_text(transport.getPeer())
    except Exception:
        return None


def _peer(session: ISubscriber) -> str | None:
    """The ``source`` of a session's connection."""
    return transport_source(getattr(session, "transport", None))


def resolve_broker_id(data_dir: Path) -> str:
    """The broker id kept in ``DATA_DIR/broker-id`` (made on first use; outside ``events/``,
    whose every file is a log file); the host name if it cannot be written."""
    path = data_dir / _BROKER_ID_FILE
    try:
        existing = path.read_text("utf-8").strip()
        if existing:
            return existing
    except OSError:
        pass
    made = f"{_SAFE.sub('_', socket.gethostname())[:40]}-{uuid.uuid4().hex[:8]}"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(made + "\n", "utf-8")
    except OSError:
        return _SAFE.sub("_", socket.gethostname())[:40] or "broker"
    return made


class Encoder:
    """Turns buffered entries into JSON lines, on the reactor thread (see EventLog.encode).

    Consecutive summaries with the same shared fields (sender, target, fan-out...) become one
    chunk from one comprehension, with those fields rendered once and cached.  Returns
    ``(stamps, chunks)``: each chunk is one or more lines of one UTC hour, and its stamp a time
    (µs) in that hour.
    """

    CACHE_LIMIT = 4096
    """Cached renderings of shared fields (one per sender x target x fan-out); emptied when full."""

    def __init__(self, broker_id: str, include_payloads: bool) -> None:
        self.broker_id = broker_id
        self.include_payloads = include_payloads
        self._shared: dict[tuple, tuple[str, str]] = {}
        self._timed_types: dict[type, bool] = {}
        self._heads: dict[tuple[str, str], str] = {}
        """The rendered broker, protocol and kind of outcome events, by (kind, protocol)."""

    def summarizes(self, message: RoutedMessage) -> bool:
        """Whether messages like ``message`` can be logged as a summary: nothing of their own
        (payload, per-message time) is logged, headers aside (the caller checks those)."""
        if self.include_payloads:
            return False
        timed = self._timed_types.get(type(message))
        if timed is None:
            timed = self._timed(message)
        return not timed

    def __call__(self, batch: list[tuple]) -> tuple[list[int], list[bytes]]:
        stamps: list[int] = []
        chunks: list[bytes] = []
        group: list[tuple] = []
        group_key: tuple = ()
        for entry in batch:
            tag = entry[0]
            if tag == _SUMMARY:
                if entry[2] != group_key:
                    if group:
                        self._group(group_key, group, stamps, chunks)
                        group = []
                    group_key = entry[2]
                group.append(entry)
                continue
            if group:
                self._group(group_key, group, stamps, chunks)
                group, group_key = [], ()
            ts = entry[1] // 1000
            if tag == _RUN:
                stamps.append(ts)
                chunks.append(
                    "".join([schema.encode(self._routed(ts, m, entry[3], entry[4])) for m in entry[2]]).encode("utf-8")
                )
                continue
            if tag == _ROUTED:
                line = self._routed_line(ts, entry[2], entry[3], entry[4])
                if line is not None:
                    stamps.append(ts)
                    chunks.append(line.encode("utf-8"))
                    continue
                record = self._routed(ts, entry[2], entry[3], entry[4])
            else:
                line = self._outcome_line(ts, entry[2], entry[3], entry[4])
                if line is not None:
                    stamps.append(ts)
                    chunks.append(line.encode("utf-8"))
                    continue
                record = self._record(ts, entry[2], entry[3], entry[4])
            stamps.append(ts)
            chunks.append(schema.encode(record).encode("utf-8"))
        if group:
            self._group(group_key, group, stamps, chunks)
        return stamps, chunks

    def _routed_line(self, ts: int, message: RoutedMessage, delivered: int, dropped: int) -> str | None:
        """The ``accepted`` record of a message that carries nothing of its own but its id
        (an SMQP publish: the id its publisher is answered with) from the cached text of its
        shared fields (:meth:`_render_shared`), as a summary's; None for one with a payload
        or a time of its own to log (:meth:`_routed` writes it)."""
        if self.include_payloads or self._timed(message):
            return None
        key = (message.protocol, message.sender_name, message.target, message.kind, delivered, dropped)
        head, tail = self._shared.get(key) or self._render_shared(key)
        message_id = message.message_id
        own = "" if message_id is None else f',"message_id":{encode_basestring(schema.text(message_id))}'
        return f'{head}{ts},"bytes":{len(message.payload)}{tail[:-2]}{own}}}\n'

    def _outcome_line(self, ts: int, kind: str, protocol: str, fields: dict[str, Any]) -> str | None:
        """A durable delivery's outcome event written from its format (brokerd.events.
        outcome_lines), or None for any other record."""
        if kind not in _OUTCOME_KINDS:
            return None
        head = self._heads.get((kind, protocol))
        if head is None:
            if len(self._heads) >= self.CACHE_LIMIT:
                self._heads.clear()
            head = self._heads[(kind, protocol)] = record_head(self.broker_id, protocol, kind)
        return outcome_line(ts, head, fields)

    def _timed(self, message: RoutedMessage) -> bool:
        """Whether ``message``'s class has an ``accepted_us`` slot (checked once per class)."""
        kind = type(message)
        timed = self._timed_types.get(kind)
        if timed is None:
            timed = self._timed_types[kind] = hasattr(kind, "accepted_us")
        return timed

    def _group(self, key: tuple, entries: list[tuple], stamps: list[int], chunks: list[bytes]) -> None:
        """Consecutive summaries with the same shared fields: one ``accepted`` record each,
        its size the run's total and ``count`` how many messages it stands for (when > 1)."""
        head, tail = self._shared.get(key) or self._render_shared(key)
        times = [entry[1] // 1000 for entry in entries]
        lines = [
            f'{head}{ts},"bytes":{entry[4]}{tail}' if entry[3] == 1 else f'{head}{ts},"bytes":{entry[4]},"count":{entry[3]}{tail}'
            for ts, entry in zip(times, entries)
        ]
        if min(times) // schema.HOUR_US == max(times) // schema.HOUR_US:
            stamps.append(times[0])
            chunks.append("".join(lines).encode("utf-8"))
            return
        for ts, line in zip(times, lines):  # across an hour: line by line
            stamps.append(ts)
            chunks.append(line.encode("utf-8"))

    def _render_shared(self, key: tuple) -> tuple[str, str]:
        """The text before the time and after the size of an accepted record for ``key``."""
        protocol, sender, target, kind, delivered, dropped = key
        record = self._routed_fields(protocol, sender, target, kind, delivered, dropped)
        parts = ('{"v":%d,"ts":' % schema.SCHEMA_VERSION, "," + schema.encode(record)[1:])
        if len(self._shared) >= self.CACHE_LIMIT:
            self._shared.clear()
        self._shared[key] = parts
        return parts

    def _routed_fields(
        self, protocol: str, sender: bytes, target: bytes | None, kind: str, delivered: int, dropped: int
    ) -> dict[str, Any]:
        if delivered:
            outcome = "partial" if dropped else "routed"
        else:
            outcome = "undeliverable" if dropped else "unrouted"
        name = schema.text(target)
        return {
            "broker": self.broker_id,
            "protocol": protocol,
            "kind": schema.ACCEPTED,
            "session": schema.text(sender),
            "topic": name if kind == "multicast" else None,
            "recipient": name if kind == "unicast" else None,
            "message": kind,
            "fanout": delivered,
            "dropped": dropped or None,
            "outcome": outcome,
        }

    def _routed(self, ts: int, message: RoutedMessage, delivered: int, dropped: int) -> dict[str, Any]:
        accepted_us = getattr(message, "accepted_us", None) if self._timed(message) else None
        message_id = message.message_id
        record: dict[str, Any] = {"v": schema.SCHEMA_VERSION, "ts": ts, "bytes": len(message.payload)}
        record.update(
            self._routed_fields(message.protocol, message.sender_name, message.target, message.kind, delivered, dropped)
        )
        if message_id is not None:
            record["message_id"] = schema.text(message_id)
        if accepted_us is not None:
            record["latency_us"] = max(0, ts - accepted_us)
        if self.include_payloads:
            record["payload"] = schema.encode_payload(message.payload)
        return record

    def _record(self, ts: int, kind: str, protocol: str, fields: dict[str, Any]) -> dict[str, Any]:
        record: dict[str, Any] = {
            "v": schema.SCHEMA_VERSION,
            "ts": ts,
            "broker": self.broker_id,
            "protocol": protocol,
            "kind": kind,
        }
        for key, value in fields.items():
            if value is None:
                continue
            if key in _TEXT_FIELDS:
                value = schema.text(value)
            elif key == "payload":
                if not self.include_payloads:
                    continue
                value = schema.encode_payload(value)
            record[key] = value
        return record


@implementer(IBrokerObserver, IEventRecorder)
class EventLog(Service):
    """Appends broker and front-end events to ``DATA_DIR/events/``; a child service of the
    broker's MultiService (start it before the listeners, stop it after them)."""

    _log = Logger()

    def __init__(
        self,
        data_dir: Path | str,
        *,
        reactor: IBrokerReactor | None = None,
        broker_id: str | None = None,
        include_payloads: bool = False,
        flush_interval: float = Settings.event_log_flush,
        batch_limit: int = DEFAULT_BATCH_LIMIT,
        max_pending: int = DEFAULT_MAX_PENDING,
        fsync: bool = False,
        clock_ns: Callable[[], int] = time.time_ns,
        max_bytes: int | None = None,
        max_age: float | None = None,
        paused: Callable[[], bool] | None = None,
    ) -> None:
        """``max_bytes`` and ``max_age`` (seconds) bound the files kept (brokerd.events.retention;
        None: unbounded); while ``paused()`` is true (a disk below its floor) nothing is written."""
        self.setName("event-log")  # Twisted's Service declares ``name = None`` untyped
        if flush_interval <= 0 or batch_limit <= 0 or max_pending <= 0:
            raise ValueError("flush_interval, batch_limit and max_pending must be positive")
        self.directory = Path(data_dir) / schema.EVENTS_DIR
        self.broker_id = broker_id or resolve_broker_id(Path(data_dir))
        self.flush_interval = flush_interval
        self.batch_limit = batch_limit
        self._reactor = reactor
        self._now = clock_ns
        self._buffer: list[tuple] = []
        self._run_weight = 0
        self._stamps: list[int] = []
        self._lines: list[bytes] = []
        """Encoded, not yet handed to the writer (bounded: flush() hands them over at
        batch_limit buffered messages or every flush_interval)."""
        self._encode_call: IDelayedCall | None = None
        """The pending encode() (an IDelayedCall), scheduled when the buffer stops being empty,
        so an idle broker does not wake up for the log more than once a flush interval."""
        run = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.retention = None
        if max_bytes is not None or max_age is not None:
            self.retention = Retention(
                self.directory,
                max_bytes if max_bytes is not None else 1 << 62,
                max_age if max_age is not None else float("inf"),
            )
        file_bytes = self.retention.file_bytes if self.retention is not None else 0
        self.files = HourlyFiles(self.directory, run, fsync=fsync, max_file_bytes=file_bytes)
        self.encoder = Encoder(self.broker_id, include_payloads)
        self.writer = WriterThread(self.files, self._report, max_pending, self.retention, paused)
        self._unencodable = 0
        """Events lost because encoding them raised (a bug; reported, never fatal)."""
        self._timer: LoopingCall | None = None
        self.reports: list[str] = []
        """Problems the writer reported (most recent last, at most 20 kept)."""

    # ------------------------------------------------------------------ service

    def startService(self) -> None:
        super().startService()
        self.writer.start()
        if self._reactor is None:
            from twisted.internet import reactor

            self._reactor = cast(IBrokerReactor, reactor)  # the global reactor has every facet
        self._timer = LoopingCall(self.flush)
        self._timer.clock = self._reactor
        self._timer.start(self.flush_interval, now=False)
        if self._buffer:
            self._encode_soon()

    def stopService(self) -> Deferred | None:
        super().stopService()
        if self._timer is not None and self._timer.running:
            self._timer.stop()
        self._timer = None
        if self._encode_call is not None and self._encode_call.active():
            self._encode_call.cancel()
        self._encode_call = None
        self.flush()
        call_from_thread = getattr(self._reactor, "callFromThread", None)
        if call_from_thread is None or not getattr(self._reactor, "running", False):
            self.close()
            return None
        done: Deferred = Deferred()

        def finished() -> None:
            if timer.active():
                timer.cancel()
            if not done.called:
                done.callback(None)

        def gave_up() -> None:
            self._report(f"event log: {self.directory} did not keep up; queued events are lost at shutdown")
            done.callback(None)

        timer = self._started_reactor().callLater(STOP_TIMEOUT, gave_up)
        self.writer.stop(lambda: call_from_thread(finished))
        return done

    def close(self) -> None:
        """Write everything buffered and stop the writer thread, blocking until it is done
        (for scripts and tests that run without a reactor; the service uses stopService)."""
        self.flush()
        if self.writer.alive:
            self.writer.stop()
            self.writer.join(STOP_TIMEOUT)

    def flush(self) -> None:
        """Hand the buffered entries to the writer thread (the timer calls this)."""
        self.encode()
        if not self._lines:
            return
        stamps, lines = self._stamps, self._lines
        self._stamps, self._lines = [], []
        self.writer.submit(stamps, lines)

    def _started_reactor(self) -> IBrokerReactor:
        """The reactor: the one given, else the global one from startService on."""
        if self._reactor is None:
            raise RuntimeError("the event log is not started")
        return self._reactor

    def _encode_soon(self) -> None:
        """Called as the first entry goes into an empty buffer: encode it ENCODE_INTERVAL later."""
        if self._encode_call is None and self.running:
            self._encode_call = self._started_reactor().callLater(min(ENCODE_INTERVAL, self.flush_interval), self._encode_due)

    def _encode_due(self) -> None:
        self._encode_call = None
        self.encode()

    def encode(self) -> None:
        """Turn the buffered entries into JSON lines, on the reactor thread.

        A writer thread encoding in Python would take the GIL at every syscall the reactor
        makes (measured: a third of the throughput), so the thread only writes bytes.  Encoding
        runs ENCODE_INTERVAL after the buffer receives its first entry, so each run is a small
        slice that never stalls the reactor for long, and an idle broker never runs it.
        """
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        self._run_weight = 0
        try:
            stamps, lines = self.encoder(batch)
        except Exception as exc:  # a bug in the encoder must not stop message delivery
            self._unencodable += len(batch)
            self._report(f"event log: could not encode {len(batch)} events ({exc!r}); they are lost")
            return
        self._stamps.extend(stamps)
        self._lines.extend(lines)
        if len(self._lines) >= self.batch_limit:  # memory stays bounded between two flushes
            self.flush()

    def _report(self, text: str) -> None:
        """Called on the writer thread: keep the message and log it on the reactor thread."""
        self.reports = (self.reports + [text])[-20:]
        call_from_thread = getattr(self._reactor, "callFromThread", None)
        if call_from_thread is not None and getattr(self._reactor, "running", False):
            call_from_thread(self._log.error, "{text}", text=text)
        else:
            self._log.error("{text}", text=text)

    def stats(self) -> dict[str, int | bool]:
        """Counters for operators and tests."""
        writer = self.writer
        return {
            "buffered": len(self._buffer),
            "encoded": len(self._lines),
            "queued_batches": writer.pending,
            "written": writer.written,
            "overflowed": writer.overflowed,
            "lost": writer.lost + self._unencodable,
            "failing": writer.failing,
            "files_opened": self.files.files_opened,
            "bytes_written": self.files.bytes_written,
        }

    # ------------------------------------------------------------------ IBrokerObserver

    def message_routed(self, message: RoutedMessage, recipients: int, dropped: int) -> None:
        if message.message_id is None and self.encoder.summarizes(message):
            key = (message.protocol, message.sender_name, message.target, message.kind, recipients, dropped)
            self._append((_SUMMARY, self._now(), key, 1, len(message.payload)))
        else:
            self._append((_ROUTED, self._now(), message, recipients, dropped))

    def messages_routed(self, messages: list[RoutedMessage], recipients_each: int, dropped_each: int) -> None:
        """A run of messages (one ``publish_batch``) was routed, each to ``recipients_each``
        sessions: one entry for the whole run, stamped with the run's time.  A run from one
        sender whose messages carry nothing of their own is summarized here (count and total
        size, one record); otherwise the entry keeps the messages for one record each."""
        first = messages[0]
        if (
            self.encoder.summarizes(first)
            and messages[-1].sender_name is first.sender_name
            and not any(map(_MESSAGE_ID, messages))
        ):
            key = (first.protocol, first.sender_name, first.target, first.kind, recipients_each, dropped_each)
            self._append((_SUMMARY, self._now(), key, len(messages), sum(map(len, map(_PAYLOAD, messages)))))
        else:
            # A kept run counts for as many entries as it has messages, so batch_limit bounds
            # the messages (and payloads) the buffer keeps alive, not runs.
            self._run_weight += len(messages) - 1
            self._append((_RUN, self._now(), messages, recipients_each, dropped_each))

    @property
    def summarizes_runs(self) -> bool:
        """Whether a run of plain messages (no message ids, not timed) is logged as a summary
        alone: then :meth:`run_summary_routed` takes a run another node sent without its
        messages (Router.route(RemoteRun)); with payloads logged it needs them."""
        return not self.encoder.include_payloads

    def run_summary_routed(self, protocol: str, sender_name: bytes, target: bytes, kind: str, count: int,
                           size: int, recipients_each: int, dropped_each: int) -> None:
        """What :meth:`messages_routed` logs for a run of ``count`` plain messages of ``size``
        payload bytes together, from the run's head only (only when :attr:`summarizes_runs`)."""
        key = (protocol, sender_name, target, kind, recipients_each, dropped_each)
        self._append((_SUMMARY, self._now(), key, count, size))

    def session_attached(self, session: ISubscriber) -> None:
        fields = {"session": session.name, "outcome": "ok", "source": _peer(session)}
        self._append((_RECORD, self._now(), schema.LOGIN, session.protocol, fields))

    def session_detached(self, session: ISubscriber) -> None:
        fields = {"session": session.name, "source": _peer(session)}
        self._append((_RECORD, self._now(), schema.LOGOUT, session.protocol, fields))

    def subscribed(self, session: ISubscriber, topic: bytes) -> None:
        """``session`` joined ``topic`` (proposed IBrokerObserver addition)."""
        self.record(schema.SUBSCRIBED, session.protocol, session=session.name, topic=topic)

    def unsubscribed(self, session: ISubscriber, topic: bytes) -> None:
        """``session`` left ``topic`` (proposed IBrokerObserver addition)."""
        self.record(schema.UNSUBSCRIBED, session.protocol, session=session.name, topic=topic)

    # ------------------------------------------------------------------ IEventRecorder

    def record(self, kind: str, protocol: str, **fields: object) -> None:
        if kind not in schema.KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        if not _RECORD_FIELDS.issuperset(fields):
            unknown = sorted(set(fields) - _RECORD_FIELDS)
            raise TypeError(f"unknown event fields {unknown}")
        self._append((_RECORD, self._now(), kind, protocol, fields))

    def auth_failure(
        self,
        protocol: str,
        identity: bytes | str | None,
        source: str | None = None,
        scheme: bytes | str | None = None,
        reason: str | None = None,
    ) -> None:
        self._append(
            (
                _RECORD,
                self._now(),
                schema.AUTH_FAILURE,
                protocol,
                {"session": identity, "source": source, "scheme": scheme, "outcome": "refused", "reason": reason},
            )
        )

    def delivery(
        self,
        kind: str,
        session: ISubscriber,
        *,
        topic: bytes | str | None = None,
        sender: bytes | str | None = None,
        message_id: bytes | str | None = None,
        size: int | None = None,
        reason: str | None = None,
        latency_us: int | None = None,
    ) -> None:
        self.record(
            kind,
            session.protocol,
            session=session.name,
            topic=topic,
            sender=sender,
            message_id=message_id,
            bytes=size,
            reason=reason,
            latency_us=latency_us,
            outcome=kind,
        )

    def _append(self, entry: tuple) -> None:
        """Every event goes through here: schedule its encoding, and hand the buffer over
        once it holds ``batch_limit`` messages (a kept run counting for its messages)."""
        buffer = self._buffer
        if not buffer:
            self._encode_soon()
        buffer.append(entry)
        if len(buffer) + self._run_weight >= self.batch_limit:
            self.flush()


@implementer(IBrokerObserver, IEventRecorder)
class NullEventLog:
    """The recorder front ends use when the event log is off: every call does nothing."""

    records_messages = False
    """The router asks it (through the operator log in front) when it installs its stages:
    with nothing to record, its path has no observer stage (brokerd.core.router)."""

    def message_routed(self, message: RoutedMessage, recipients: int, dropped: int) -> None:
        pass

    def messages_routed(self, messages: list[RoutedMessage], recipients_each: int, dropped_each: int) -> None:
        pass

    summarizes_runs = True

    def run_summary_routed(self, protocol: str, sender_name: bytes, target: bytes, kind: str, count: int,
                           size: int, recipients_each: int, dropped_each: int) -> None:
        pass

    def session_attached(self, session: ISubscriber) -> None:
        pass

    def session_detached(self, session: ISubscriber) -> None:
        pass

    def subscribed(self, session: ISubscriber, topic: bytes) -> None:
        pass

    def unsubscribed(self, session: ISubscriber, topic: bytes) -> None:
        pass

    def record(self, kind: str, protocol: str, **fields: object) -> None:
        pass

    def auth_failure(self, protocol: str, identity: bytes | str | None, source: str | None = None,
                     scheme: bytes | str | None = None, reason: str | None = None) -> None:
        pass

    def delivery(self, kind: str, session: ISubscriber, **fields: Unpack[DeliveryFields]) -> None:
        pass


NULL_EVENT_LOG = NullEventLog()

"""The event log's record format, version 1: one JSON object per line.

This module is the contract between the broker (which writes the log) and the data pipeline
(which reads it, possibly years later, on a cluster that has never seen the broker's code).
So it is pure: the standard library only, no Twisted, no broker objects.  Both sides import
it; nothing else is shared between them.

A record is a JSON object with these keys (``null`` fields are left out of the line):

=============  ========  ================================================================
key            type      meaning
=============  ========  ================================================================
v              int       schema version (``SCHEMA_VERSION``); readers check it
ts             int       when it happened: microseconds since the Unix epoch, UTC
broker         str       the broker's id (stable per data dir)
protocol       str       the front end that saw it: ssmp, mcchat, smqp, socketmq, mqtt
kind           str       one of ``KINDS``
session        str       the session the event is about: the publisher of an accepted
                         message, the recipient of a delivery outcome, the user of a
                         login/logout, the identity tried in an auth failure
sender         str       the message's sender, on delivery outcomes (on ``accepted`` it is
                         the session itself)
topic          str       the topic (multicast), as the core names it (``a/b``)
recipient      str       the target address of a unicast message
message        str       the message kind: multicast, unicast, broadcast
message_id     str       the protocol's message id where it has one (SMQP)
bytes          int       payload size in bytes (of all the messages a record stands for)
count          int       ``accepted``: how many messages the record stands for: a run one
                         sender published to one topic in one read is one record (absent = 1);
                         ``fanout`` and ``dropped`` are then per message
fanout         int       ``accepted``: sessions the core handed the message to
dropped        int       ``accepted``: recipients whose protocol could not carry it;
                         ``dropped`` records: how many drops the record stands for
                         (one record per congestion episode; absent = 1)
outcome        str       short result: routed/unrouted/partial, ok, refused, ...
reason         str       why (drops, auth failures, trash): see ``DROP_REASONS``
latency_us     int       microseconds from acceptance to this outcome, where known
source         str       the peer address (logins, auth failures)
scheme         str       the login scheme (open, secret, cert, password, ...)
payload        str       the content, base64; only when the broker runs with payloads on
queued_us      int       SMQP outcomes: the part of ``latency_us`` the message waited for its
                         subscriber to come online (0 when it was online at the publish)
pending        int       ``gauge``: deliveries stored and never sent yet
unacknowledged int       ``gauge``: deliveries sent at least once, not acknowledged yet
trash          int       ``gauge``: messages in the Trash queues
=============  ========  ================================================================

Names, topics and ids are bytes in the broker; they are written as UTF-8 text, bytes that
are not UTF-8 as ``\\xNN`` escapes (``backslashreplace``), so every line is valid JSON.
"""
from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from typing import Any, overload

SCHEMA_VERSION = 1
"""The version this module writes."""
SUPPORTED_VERSIONS = frozenset({1})
"""Versions a reader of this module understands."""

# ------------------------------------------------------------------------------ kinds

ACCEPTED = "accepted"
"""The broker took a message from a publisher and routed it (once per message)."""
DELIVERED = "delivered"
"""One recipient got a message outside the core's fan-out (e.g. an SMQP pending message on
reconnect).  Fan-out deliveries are counted in ``accepted.fanout``, not one event each."""
DROPPED = "dropped"
"""A message (or one recipient's copy) was not delivered; ``reason`` says why."""
ACKED = "acked"
"""A recipient acknowledged a message (SMQP 310 ACK); ``latency_us`` from acceptance."""
REDELIVERED = "redelivered"
"""A message was sent again to a recipient that had not acknowledged it."""
EXPIRED = "expired"
"""A pending message outlived its expiry before every recipient acknowledged it."""
TRASHED = "trashed"
"""A message went to its topic's Trash (expired or undeliverable)."""
LOGIN = "login"
"""A session logged in."""
LOGOUT = "logout"
"""A session ended (closed, replaced or lost)."""
AUTH_FAILURE = "auth_failure"
"""A login was refused."""
SUBSCRIBED = "subscribed"
"""A session joined a topic."""
UNSUBSCRIBED = "unsubscribed"
"""A session left a topic (explicitly; a logout ends every subscription of the session)."""
LATENCY = "latency"
"""A sampled delivery: ``latency_us`` from the core's acceptance of a message to the write of
its copies to the recipients of one protocol (``protocol`` is the receiving front end,
``sender`` ``<publishing protocol>:<name>``, ``fanout`` those recipients).  Taken at most a few
times a second, never per message; not a delivery (those are counted in ``accepted.fanout``)."""
GAUGE = "gauge"
"""A periodic reading of a queue (SMQP's store): ``pending``, ``unacknowledged``, ``trash``,
written only when a figure changed."""

KINDS = frozenset(
    {
        ACCEPTED,
        DELIVERED,
        DROPPED,
        ACKED,
        REDELIVERED,
        EXPIRED,
        TRASHED,
        LOGIN,
        LOGOUT,
        AUTH_FAILURE,
        SUBSCRIBED,
        UNSUBSCRIBED,
        LATENCY,
        GAUGE,
    }
)
DEAD_LETTER_KINDS = frozenset({EXPIRED, TRASHED})
"""Kinds the pipeline's dead-letter table collects."""

# ------------------------------------------------------------------------------ drop reasons

UNRENDERABLE = "unrenderable"
"""The recipient's protocol cannot carry the message (size, topic name, content).  The core
reports these in ``accepted.dropped`` rather than as separate events."""
NO_RECIPIENT = "no_recipient"
"""A unicast to an address nobody holds."""
SLOW_CONSUMER = "slow_consumer"
"""The recipient's output buffer was full (SSMP/MCCHAT flow control)."""
QUEUE_FULL = "queue_full"
"""A bounded per-recipient queue was full."""
REJECTED = "rejected"
"""The front end refused the message (not allowed, too large, bad target)."""
CONNECTION_LOST = "connection_lost"
"""The recipient's connection ended before the message was written."""
UNACKNOWLEDGED = "unacknowledged"
"""SMQP: the subscriber never acknowledged the notification within the allowed attempts."""

DROP_REASONS = frozenset(
    {UNRENDERABLE, NO_RECIPIENT, SLOW_CONSUMER, QUEUE_FULL, REJECTED, CONNECTION_LOST, UNACKNOWLEDGED}
)
"""Reasons the broker writes.  A reader must accept others (a newer front end may add some)."""
AFTER_HANDOFF_REASONS = frozenset({SLOW_CONSUMER, QUEUE_FULL, CONNECTION_LOST})
"""Drops that happen after the core handed the message to the recipient's session, so they
are already counted in ``accepted.fanout``; the pipeline subtracts them from deliveries."""

# ------------------------------------------------------------------------------ fields

FIELDS: tuple[tuple[str, str], ...] = (
    ("v", "int"),
    ("ts", "long"),
    ("broker", "string"),
    ("protocol", "string"),
    ("kind", "string"),
    ("session", "string"),
    ("sender", "string"),
    ("topic", "string"),
    ("recipient", "string"),
    ("message", "string"),
    ("message_id", "string"),
    ("bytes", "long"),
    ("count", "long"),
    ("fanout", "long"),
    ("dropped", "long"),
    ("outcome", "string"),
    ("reason", "string"),
    ("latency_us", "long"),
    ("source", "string"),
    ("scheme", "string"),
    ("payload", "string"),
    ("queued_us", "long"),
    ("pending", "long"),
    ("unacknowledged", "long"),
    ("trash", "long"),
)
"""Every key of a version-1 record and its type, in Spark SQL type names (int, long, string),
in the order the writer puts them."""
FIELD_NAMES = tuple(name for name, _type in FIELDS)
REQUIRED = ("v", "ts", "protocol", "kind")
"""Keys a valid record must have (non-null)."""
_INTEGER_FIELDS = frozenset(name for name, kind in FIELDS if kind in ("int", "long"))
_KNOWN = frozenset(FIELD_NAMES)

PARTITION_FORMAT = "date={date}/hour={hour}"
"""Directory of a record under ``DATA_DIR/events/``: its UTC date (YYYY-MM-DD) and hour (HH)."""
EVENTS_DIR = "events"
"""The event log's directory under the broker's data dir."""
FILE_SUFFIX = ".jsonl"


class SchemaError(ValueError):
    """A line that is not a valid record of a supported version."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status


MALFORMED = "malformed"
"""Not a JSON object (including a line cut short by a crash)."""
UNSUPPORTED_VERSION = "unsupported_version"
"""A JSON object whose ``v`` this reader does not know."""
INVALID = "invalid"
"""A record of a known version with a missing required field, a wrong type or an unknown kind."""


@overload
def text(value: bytes | str) -> str: ...


@overload
def text(value: None) -> None: ...


@overload
def text(value: bytes | str | None) -> str | None: ...


def text(value: bytes | str | None) -> str | None:
    """A broker name/topic/id as record text (UTF-8, other bytes escaped)."""
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "backslashreplace")


def encode_payload(content: bytes) -> str:
    """Message content as the ``payload`` field (base64)."""
    return base64.b64encode(content).decode("ascii")


def decode_payload(field: str) -> bytes:
    """The content a ``payload`` field holds."""
    return base64.b64decode(field, validate=True)


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def encode(record: Mapping[str, Any]) -> str:
    """One record as a line (with its LF).  ``record`` holds ``FIELD_NAMES`` keys; None values
    are left out."""
    return _dumps({key: value for key, value in record.items() if value is not None}) + "\n"


def validate(record: object) -> dict[str, Any]:
    """Return ``record`` (a parsed JSON value) if it is a valid record; raise SchemaError."""
    if not isinstance(record, dict):
        raise SchemaError(MALFORMED, "not a JSON object")
    version = record.get("v")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise SchemaError(UNSUPPORTED_VERSION, f"schema version {version!r}")
    for key in REQUIRED:
        if record.get(key) is None:
            raise SchemaError(INVALID, f"missing {key}")
    for key, value in record.items():
        if key not in _KNOWN or value is None:
            continue
        if key in _INTEGER_FIELDS:
            if not isinstance(value, int) or isinstance(value, bool):
                raise SchemaError(INVALID, f"{key} must be an integer")
        elif not isinstance(value, str):
            raise SchemaError(INVALID, f"{key} must be a string")
    if record["kind"] not in KINDS:
        raise SchemaError(INVALID, f"unknown kind {record['kind']!r}")
    return record


def decode(line: str | bytes) -> dict[str, Any]:
    """Parse and validate one line; raise SchemaError (status MALFORMED, UNSUPPORTED_VERSION or
    INVALID) for anything else."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(MALFORMED, str(exc)) from None
    return validate(record)


HOUR_US = 3_600_000_000
"""Microseconds in an hour: the log's files are partitioned by UTC hour."""


def partition_of(ts_us: int) -> tuple[str, str]:
    """(date, hour) strings of the partition a record with timestamp ``ts_us`` belongs to."""
    parts = time.gmtime(ts_us // 1_000_000)
    return f"{parts.tm_year:04d}-{parts.tm_mon:02d}-{parts.tm_mday:02d}", f"{parts.tm_hour:02d}"


def partition_path(ts_us: int) -> str:
    """``date=YYYY-MM-DD/hour=HH`` for a record with timestamp ``ts_us``."""
    date, hour = partition_of(ts_us)
    return PARTITION_FORMAT.format(date=date, hour=hour)

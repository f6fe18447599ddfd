"""An in-memory IEventRecorder for front-end tests: records as the event log would write them."""
from __future__ import annotations

from typing import Any

from zope.interface import implementer

from brokerd.events import schema
from brokerd.events.log import IEventRecorder

_FIELDS = frozenset(schema.FIELD_NAMES) - {"v", "ts", "broker", "protocol", "kind"}
_TEXT = frozenset({"session", "sender", "topic", "recipient", "message_id", "source", "scheme"})


@implementer(IEventRecorder)
class RecordingEvents:
    """Keeps every event as a dict of schema fields (names as text, None left out).  Like
    EventLog, an unknown kind or field name raises, so a front end's mistake fails its test."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, kind: str, protocol: str, **fields: Any) -> None:
        if kind not in schema.KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        unknown = set(fields) - _FIELDS
        if unknown:
            raise TypeError(f"unknown event fields {sorted(unknown)}")
        entry = {"protocol": protocol, "kind": kind}
        for key, value in fields.items():
            if value is not None:
                entry[key] = schema.text(value) if key in _TEXT else value
        schema.validate({"v": schema.SCHEMA_VERSION, "ts": 0, **entry})
        self.records.append(entry)

    def auth_failure(self, protocol: str, identity: Any, source: Any = None, scheme: Any = None,
                     reason: Any = None) -> None:
        self.record(schema.AUTH_FAILURE, protocol, session=identity, source=source, scheme=scheme,
                    outcome="refused", reason=reason)

    def delivery(self, kind: str, session: Any, *, topic: Any = None, sender: Any = None,
                 message_id: Any = None, size: Any = None, reason: Any = None, latency_us: Any = None) -> None:
        self.record(kind, session.protocol, session=session.name, topic=topic, sender=sender,
                    message_id=message_id, bytes=size, reason=reason, latency_us=latency_us, outcome=kind)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [entry for entry in self.records if entry["kind"] == kind]

"""The JSON line of a durable delivery's outcome event, written from one format.

The durable service records two outcome events per message it delivers (``delivered`` and
``acked``, docs/events.md), always with the same fields in the same order
(:meth:`brokerd.core.outcomes.DurableOutcomes._write`).  Encoding such a record as a dict
through the json module costs two to three times what one format with the values in place
does (callgrind: about 37,000 instructions a record against 14,500), and it was the largest
part of an acknowledged delivery with a notification window (docs/performance-history.md).  The fixed
shape allows the format; :func:`outcome_line` gives the very bytes the generic path
(``Encoder._record`` and :func:`brokerd.events.schema.encode`) gives, which
tests/events/test_outcome_lines.py checks for each shape.  Any other record, or one whose
values are not of the usual types, gets None and takes the generic path.
"""
from __future__ import annotations

from json.encoder import encode_basestring  # the escaping of schema.encode (ensure_ascii=False)
from typing import Any

from brokerd.events import schema

_PUBLISHED = ("session", "topic", "reason", "outcome", "sender", "message_id", "bytes", "latency_us")
_SHAPES = frozenset({_PUBLISHED, _PUBLISHED + ("queued_us",)})
"""The key orders of an outcome event that names its message (without and with ``queued_us``)."""
_HEAD = '{"v":%d,"ts":' % schema.SCHEMA_VERSION


def record_head(broker_id: str, protocol: str, kind: str) -> str:
    """The text between a record's time and its own fields: broker, protocol and kind."""
    e = encode_basestring
    return f',"broker":{e(broker_id)},"protocol":{e(protocol)},"kind":{e(kind)}'


def outcome_line(ts: int, head: str, fields: dict[str, Any]) -> str | None:
    """The line (with its LF) of an outcome event at ``ts`` with ``fields``, ``head`` from
    :func:`record_head`; None when ``fields`` is not an outcome that names its message with
    text and whole numbers (the generic encoder writes it then)."""
    if tuple(fields) not in _SHAPES:
        return None
    session = fields["session"]
    if session.__class__ is bytes:  # a connection's name (ISubscriber.name): text as _record makes it
        session = schema.text(session)
    topic = fields["topic"]
    reason = fields["reason"]
    outcome = fields["outcome"]
    sender = fields["sender"]
    message_id = fields["message_id"]
    size = fields["bytes"]
    latency = fields["latency_us"]
    queued = fields.get("queued_us")
    str_ = str
    int_ = int
    if (session.__class__ is not str_ or topic.__class__ is not str_ or outcome.__class__ is not str_
            or sender.__class__ is not str_ or message_id.__class__ is not str_
            or size.__class__ is not int_ or latency.__class__ is not int_
            or (reason is not None and reason.__class__ is not str_)
            or (queued is not None and queued.__class__ is not int_)):
        return None
    e = encode_basestring
    because = "" if reason is None else f',"reason":{e(reason)}'
    waited = "" if queued is None else f',"queued_us":{queued}'
    return (f'{_HEAD}{ts}{head},"session":{e(session)},"topic":{e(topic)}{because},"outcome":{e(outcome)},'
            f'"sender":{e(sender)},"message_id":{e(message_id)},"bytes":{size},"latency_us":{latency}{waited}}}\n')

"""Outcome events written from their format are the very lines the generic encoder writes."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.events import schema
from brokerd.events.log import _RECORD, _ROUTED, Encoder
from brokerd.events.outcome_lines import outcome_line, record_head


def _generic(encoder: Encoder, ts: int, kind: str, protocol: str, fields: dict) -> str:
    return schema.encode(encoder._record(ts, kind, protocol, fields))


def _fields(session="bob:1", topic="news", reason=None, outcome="delivered", queued: int | None = 7) -> dict:
    fields = {"session": session, "topic": topic, "reason": reason, "outcome": outcome, "sender": "smqp:alice:1",
              "message_id": "srv/ab/12(D20261127T09004046Z)", "bytes": 120, "latency_us": 3456}
    if queued is not None:
        fields["queued_us"] = queued
    return fields


_text = st.text(max_size=30)


@given(_text, _text, st.none() | _text, st.none() | st.integers(0, 2**40), st.integers(0, 2**40))
def test_an_outcome_line_is_the_generic_line(session, topic, reason, queued, ts):
    encoder = Encoder("node-1", include_payloads=False)
    fields = _fields(session, topic, reason, queued=queued)
    line = outcome_line(ts, record_head("node-1", "smqp", schema.ACKED), fields)
    assert line == _generic(encoder, ts, schema.ACKED, "smqp", fields)
    assert schema.validate(json.loads(line))["session"] == session


@given(st.binary(max_size=30))
def test_a_session_named_in_bytes_is_written_as_the_generic_path_writes_it(name):
    encoder = Encoder("node-1", include_payloads=False)
    fields = _fields(session=name)
    line = outcome_line(9, record_head("node-1", "smqp", schema.DELIVERED), fields)
    assert line is not None and line == _generic(encoder, 9, schema.DELIVERED, "smqp", fields)


@pytest.mark.parametrize("change", [
    {"topic": b"news"},              # only a session comes as bytes (a connection's name)
    {"bytes": True},                 # a bool is no count
    {"latency_us": 1.5},
    {"reason": 3},
])
def test_other_values_take_the_generic_path(change):
    fields = {**_fields(), **change}
    assert outcome_line(1, record_head("node-1", "smqp", schema.ACKED), fields) is None


def test_a_queue_time_of_none_is_left_out_as_the_generic_path_does():
    encoder = Encoder("node-1", include_payloads=False)
    fields = {**_fields(), "queued_us": None}
    line = outcome_line(1, record_head("node-1", "smqp", schema.ACKED), fields)
    assert line == _generic(encoder, 1, schema.ACKED, "smqp", fields) and "queued_us" not in line


def test_an_outcome_without_its_message_takes_the_generic_path():
    fields = {"session": None, "topic": "news", "reason": "expired", "outcome": schema.TRASHED}
    assert outcome_line(1, record_head("n", "durable", schema.TRASHED), fields) is None


def test_the_encoder_writes_outcomes_from_the_format_and_the_rest_as_before():
    """A batch of outcome events and other records: every line as the generic path writes it."""
    encoder = Encoder("node-1", include_payloads=False)
    entries = [
        (_RECORD, 5_000_000, schema.DELIVERED, "smqp", _fields(outcome="delivered")),
        (_RECORD, 6_000_000, schema.ACKED, "smqp", _fields(outcome="acked", queued=None)),
        (_RECORD, 7_000_000, schema.DROPPED, "smqp", _fields(reason="unacknowledged", outcome="dropped")),
        (_RECORD, 8_000_000, schema.TRASHED, "durable",
         {"session": None, "topic": "news", "reason": "expired", "outcome": "trashed"}),
        (_RECORD, 9_000_000, schema.LOGIN, "smqp", {"session": "bob:1", "outcome": "ok"}),
    ]
    stamps, chunks = encoder(entries)
    assert stamps == [5000, 6000, 7000, 8000, 9000]
    assert [chunk.decode("utf-8") for chunk in chunks] == [
        _generic(encoder, ts // 1000, kind, protocol, fields) for _tag, ts, kind, protocol, fields in entries]
    assert [json.loads(chunk)["kind"] for chunk in chunks] == ["delivered", "acked", "dropped", "trashed", "login"]


@given(st.binary(max_size=20), st.binary(min_size=1, max_size=20), st.none() | _text,
       st.sampled_from(["multicast", "unicast"]), st.integers(0, 5), st.integers(0, 3), st.binary(max_size=50))
def test_an_accepted_record_from_cached_fields_is_the_generic_line(sender, target, message_id, kind, delivered,
                                                                    dropped, payload):
    from brokerd.core.message import Details, Message

    encoder = Encoder("node-1", include_payloads=False)
    message = Message(kind, target, payload, "smqp", sender, False, details=Details(message_id=message_id))
    line = encoder._routed_line(123456, message, delivered, dropped)
    assert line == schema.encode(encoder._routed(123456, message, delivered, dropped))
    assert encoder._routed_line(123457, message, delivered, dropped) == schema.encode(
        encoder._routed(123457, message, delivered, dropped))  # from the cache this time


def test_with_payloads_logged_an_accepted_record_takes_the_generic_path():
    from brokerd.core.message import Details, Message

    encoder = Encoder("node-1", include_payloads=True)
    message = Message("multicast", b"news", b"hi", "smqp", b"alice:1", False, details=Details(message_id="s/1"))
    assert encoder._routed_line(1, message, 1, 0) is None
    stamps, chunks = encoder([(_ROUTED, 5_000_000, message, 1, 0)])
    assert json.loads(chunks[0])["payload"] == schema.encode_payload(b"hi")

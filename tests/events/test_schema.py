"""The record format: what the writer produces is what the reader accepts, and every way a
line can be wrong is classified, never raised as anything but SchemaError."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.events import schema

TS = 1_714_564_800_123_456  # 2024-05-01T12:00:00.123456Z


def test_encode_leaves_out_nulls_and_round_trips() -> None:
    line = schema.encode(
        {"v": 1, "ts": TS, "broker": "b1", "protocol": "ssmp", "kind": "accepted",
         "session": "alice", "topic": "a/b", "bytes": 5, "fanout": 3, "dropped": None}
    )
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == {"v": 1, "ts": TS, "broker": "b1", "protocol": "ssmp",
                                "kind": "accepted", "session": "alice", "topic": "a/b",
                                "bytes": 5, "fanout": 3}
    assert schema.decode(line)["fanout"] == 3


def test_non_utf8_names_become_escapes_and_payloads_base64() -> None:
    assert schema.text(b"caf\xc3\xa9") == "café"
    assert schema.text(b"\xff/x") == "\\xff/x"
    assert schema.decode_payload(schema.encode_payload(b"\x00\n\xff")) == b"\x00\n\xff"


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ("", schema.MALFORMED),
        ('{"v":1,"ts":1,"protocol":"ssmp","kind":"acc', schema.MALFORMED),  # cut by a crash
        ("[1,2]", schema.MALFORMED),
        ('{"v":2,"ts":1,"protocol":"ssmp","kind":"accepted"}', schema.UNSUPPORTED_VERSION),
        ('{"ts":1,"protocol":"ssmp","kind":"accepted"}', schema.UNSUPPORTED_VERSION),
        ('{"v":true,"ts":1,"protocol":"ssmp","kind":"accepted"}', schema.UNSUPPORTED_VERSION),
        ('{"v":1,"protocol":"ssmp","kind":"accepted"}', schema.INVALID),
        ('{"v":1,"ts":"now","protocol":"ssmp","kind":"accepted"}', schema.INVALID),
        ('{"v":1,"ts":1,"protocol":"ssmp","kind":"exploded"}', schema.INVALID),
        ('{"v":1,"ts":1,"protocol":"ssmp","kind":"accepted","topic":7}', schema.INVALID),
    ],
)
def test_bad_lines_are_classified(line: str, status: str) -> None:
    with pytest.raises(schema.SchemaError) as caught:
        schema.decode(line)
    assert caught.value.status == status


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_schema_error(data: bytes) -> None:
    try:
        schema.decode(data)
    except schema.SchemaError:
        pass


def test_partitions_are_utc_date_and_hour() -> None:
    assert schema.partition_path(TS) == "date=2024-05-01/hour=12"
    assert schema.partition_of(0) == ("1970-01-01", "00")


def test_field_list_has_the_required_fields_first() -> None:
    assert schema.FIELD_NAMES[:5] == ("v", "ts", "broker", "protocol", "kind")
    assert {"session", "topic", "recipient", "bytes", "fanout", "outcome", "latency_us"} <= set(
        schema.FIELD_NAMES
    )

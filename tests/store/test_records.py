"""The store's records: MessageRecord and Delivery write their own ``__init__`` (for speed,
brokerd.store.records), which must take and set exactly the dataclass's fields, in order,
with the same defaults, and leave them frozen."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from brokerd.store.records import Delivery, MessageRecord


@pytest.mark.parametrize("cls", [MessageRecord, Delivery])
def test_the_written_init_takes_and_sets_every_field(cls):
    fields = dataclasses.fields(cls)
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields):
        expected = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert parameter.default == expected, field.name
    values = [object() for _ in fields]
    record = cls(*values)
    assert [getattr(record, f.name) for f in fields] == values
    assert record == cls(*values) and hash(record) == hash(cls(*values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, fields[0].name, 1)
    changed = dataclasses.replace(record, **{fields[1].name: "other"})
    assert getattr(changed, fields[1].name) == "other" and getattr(changed, fields[0].name) is values[0]


def test_defaults_of_a_message_record():
    record = MessageRecord("id", "news", "ssmp:sam", "", 1.0, None, 1, b"hi")
    assert (record.seq, record.mode, record.receipt, record.trashed) == (0, "ALL", "NONE", None)

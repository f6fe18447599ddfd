"""The DURABLE control message: what a node announces after committing durable state, and
the refusal of one whose fields are not subscriber names."""
from __future__ import annotations

import pytest

from brokerd.cluster import directory as control


def test_a_durable_change_reads_back_as_sent() -> None:
    data = control.encode("ab12", "node1", control.DURABLE,
                          **control.durable_fields(True, {"alice:b", "alice:a"}, {"bob:x"}))
    message = control.decode(data)
    assert message["k"] == control.DURABLE
    assert control.read_durable(message) == (True, ["alice:a", "alice:b"], ["bob:x"])


def test_a_durable_change_without_names_is_refused() -> None:
    for fields in ({"s": "alice:a"}, {"p": [1]}, {"s": [None]}):
        message = control.decode(control.encode("ab12", "node1", control.DURABLE, **fields))
        with pytest.raises(control.ControlError):
            control.read_durable(message)
    assert control.read_durable(control.decode(control.encode("ab12", "n", control.DURABLE))) == (False, [], [])

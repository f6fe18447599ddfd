"""The type of a JSON value as brokerd writes one (the admin API, the event log, the CLI's
answers): what :func:`json.dumps` accepts, read-only, so that a ``dict[str, int]`` of figures
is one without a copy."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias, Union

JSONValue: TypeAlias = Union[Mapping[str, "JSONValue"], Sequence["JSONValue"], str, int, float, bool, None]
"""A value :func:`json.dumps` writes: objects and arrays of these, strings, numbers, booleans, null."""

JSONObject: TypeAlias = Mapping[str, JSONValue]
"""A JSON object (a mapping of names to JSON values)."""

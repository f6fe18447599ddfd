"""JSON as the admin listener serves it: strict (RFC 8259), so a browser's ``JSON.parse``
and every other strict parser read it.

Python's json writes the non-finite floats as the bare words ``Infinity``, ``-Infinity`` and
``NaN``, which are not JSON; one such figure (the store's commit-latency histogram ends with
a ``+Inf`` bucket bound) used to make the whole answer unreadable.  Here a non-finite float
becomes the string Prometheus writes for it (``"+Inf"``, ``"-Inf"``, ``"NaN"``), and
anything left over fails loudly (``allow_nan=False``) instead of reaching a client.
"""
from __future__ import annotations

import json
import math

from brokerd.jsontypes import JSONValue


def _finite(value: JSONValue) -> JSONValue:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def dumps(body: JSONValue) -> bytes:
    """``body`` as strict JSON bytes, keys sorted."""
    return json.dumps(_finite(body), sort_keys=True, allow_nan=False).encode()

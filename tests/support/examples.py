"""How many examples a property test with its own count runs: that count in the whole suite,
a quarter of it in the quick loop.

The quick loop (README.md) loads the Hypothesis profile ``quick``, which runs a quarter of the
default's examples; a test that names its own count (``@settings(max_examples=examples(300))``)
is scaled the same way, so the quick loop stays quick while the whole suite, which CI runs,
tries every example it always did.
"""
from __future__ import annotations

from hypothesis import settings


def examples(count: int) -> int:
    """``count`` examples in the whole suite; under the ``quick`` profile the same share of
    the suite profile's default (at least 10)."""
    full = settings.get_profile("brokerd").max_examples  # tests/conftest.py registers it
    return max(10, count * settings.default.max_examples // full)

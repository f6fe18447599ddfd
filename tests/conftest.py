"""Suite-wide fixtures: no test leaves a child process running."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import processes


@pytest.fixture(autouse=True)
def _stop_child_processes() -> Iterator[None]:
    """Stop whatever a test spawned and did not stop (a failed assertion skipped its cleanup)."""
    start = processes.mark()
    yield
    processes.stop_started_since(start)

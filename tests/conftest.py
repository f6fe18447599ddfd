"""Suite-wide settings and fixtures: Hypothesis without timing checks, and no test leaves a
child process running."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support import processes

# Fixtures of servers the tests start themselves, for any test module: postgres_server,
# postgres_url, own_postgres (tests/support/postgres.py); tor_network, the private Tor network
# (tests/support/tor.py).  Registered here once: a session fixture imported into several
# modules would be a fixture of each, built once per module.  mypy_report, the session's one
# mypy run over brokerd (tests/support/typecheck.py).
pytest_plugins = ["tests.support.postgres", "tests.support.tor", "tests.support.typecheck"]

# Hypothesis' deadline and too_slow health check time each example: a busy CI machine fails
# them for no fault of the code.  What a property test asserts is the property.
settings.register_profile("brokerd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The quick loop's (README.md: ``--hypothesis-profile=quick``): a quarter of the examples, of
# the default and of each test's own count (tests/support/examples.py); the whole suite runs all.
settings.register_profile("quick", settings.get_profile("brokerd"),
                          max_examples=settings.get_profile("brokerd").max_examples // 4)
settings.load_profile("brokerd")


@pytest.fixture(autouse=True)
def _stop_child_processes() -> Iterator[None]:
    """Stop whatever a test spawned and did not stop (a failed assertion skipped its cleanup)."""
    start = processes.mark()
    yield
    processes.stop_started_since(start)

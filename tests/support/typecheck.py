"""One mypy run per test session, shared by every test that asks about types.

mypy is slow to start (it reads Twisted's and the standard library's stubs before it checks a
line of brokerd), so the tests do not each run it: ``mypy_report`` runs it once over all of
brokerd with setup.cfg's ``[mypy]`` and over the probes the test modules registered with
:func:`probe` while they were collected (small modules written to check that a check can fail,
or that a Protocol and the class that is it agree), and each test reads the errors of the
files it is about.

The run uses mypy's incremental cache in the checkout (``.mypy_cache``, the one
``python -m mypy brokerd`` uses by hand): mypy re-checks every module whose source, or the
interface of a module it depends on, changed since the cache was written, and reports the
errors of every module it was given each time, so a cached run finds what a fresh one does;
the first run after a checkout takes the full time (about 16 s of CPU), later ones about 1 s.
"""
from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

_probes: dict[str, str] = {}
_ERROR = re.compile(r"^(brokerd/[^:]+\.py):\d+: error: ", re.MULTILINE)


def probe(name: str, source: str) -> str:
    """Have the session's mypy run check ``source`` as the module ``name`` (call it at a test
    module's top level, so it is registered before the run); returns ``name``, the key of its
    errors in :class:`MypyReport`."""
    if _probes.setdefault(name, source) != source:
        raise ValueError(f"two different probes are called {name!r}")
    return name


def run_mypy(*arguments: str) -> subprocess.CompletedProcess[str]:
    """mypy run from the repository's root, so it reads setup.cfg's configuration."""
    return subprocess.run([sys.executable, "-m", "mypy", *arguments], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@dataclass(frozen=True)
class MypyReport:
    """mypy's errors, by a brokerd module's path (``brokerd/core/broker.py``) or a probe's name."""

    output: str
    errors: dict[str, list[str]] = field(default_factory=dict)

    def errors_in(self, key: str) -> list[str]:
        return self.errors.get(key, [])


def read_report(output: str, probes: Collection[str]) -> MypyReport:
    """The errors of mypy's ``output`` by brokerd module and by probe.  A probe is known by its
    file's name, not its directory: each session writes the probes into a new temp directory,
    and mypy replays the errors of a module its cache holds unchanged (same name, same source)
    under the path it was checked at."""
    probe_error = re.compile(rf"^(?:.*/)?({'|'.join(map(re.escape, probes))})\.py:\d+: error: ")
    errors: dict[str, list[str]] = defaultdict(list)
    for line in output.splitlines():
        match = _ERROR.match(line) or (probe_error.match(line) if probes else None)
        if match:
            errors[match.group(1)].append(line)
    return MypyReport(output, dict(errors))


@pytest.fixture(scope="session")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> MypyReport:
    """mypy over all of brokerd and every registered probe, once for the session."""
    directory = tmp_path_factory.mktemp("mypy-probes")
    probe_paths = {name: directory / f"{name}.py" for name in sorted(_probes)}
    for name, path in probe_paths.items():
        path.write_text(_probes[name])
    result = run_mypy("brokerd", *map(str, probe_paths.values()))
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed
    return read_report(result.stdout, probe_paths)

"""Which heavy packages a command imports: a command that publishes one message should start
as fast as the publish needs (docs/performance.md, "The clients' start-up")."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HEAVY = ("OpenSSL", "autobahn", "cryptography", "prometheus_client", "twisted", "zope")
"""Packages a one-shot publish does without."""

_PROBE = """
import sys
from {module} import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    print(done.code, " ".join(sorted({{name.split(".")[0] for name in sys.modules}} & {heavy})))
"""


def run_and_list_heavy(module: str, arguments: Sequence[str], cwd: Path, env: dict[str, str],
                       timeout: float) -> subprocess.CompletedProcess:
    """Run ``module``'s ``main`` with ``arguments`` in a fresh interpreter: its stdout is then
    the exit status and the heavy packages it imported, on one line (stderr as it was)."""
    probe = _PROBE.format(module=module, heavy=set(HEAVY))
    return subprocess.run([sys.executable, "-c", probe, *arguments], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout)

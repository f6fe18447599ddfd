"""The layering of STYLE.md, checked by import-linter's contracts in setup.cfg."""
from __future__ import annotations

import subprocess
import sys

from tests.support.broker import REPO

LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_import_contracts_are_kept():
    # A subprocess: import-linter's own state must not mix with the test run's imports.
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--config", "setup.cfg"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout

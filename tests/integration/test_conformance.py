"""The black-box conformance kit (../shared/conformance) against the real twistd plugin.

It is how third-party clients see brokerd; it runs here so that the README's test command
covers it.  Skipped when the kit is not beside the checkout.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import REPO

KIT = REPO.parent / "shared" / "conformance" / "run.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not KIT.exists(), reason="the conformance kit is not beside the checkout"),
]


def run_kit(group: str, *only: str) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(
        [sys.executable, str(KIT), "--only", group, "--timeout", "5", *(arg for k in only for arg in ("-k", k))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )


@pytest.mark.parametrize("group, only", [("ssmp", ()), ("mcchat", ()), ("smqp", ())])
def test_conformance_group_passes(group, only):
    result = run_kit(group, *only)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and last.endswith(" 0 failed"), result.stdout + result.stderr

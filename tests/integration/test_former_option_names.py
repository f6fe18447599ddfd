"""An option's former name, as an operator's unit file written before the rename gives it:
``twistd brokerd`` starts, serves, and logs one warning line naming the former and the new
name; ``--check-config`` prints the same line."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import LineClient, start_broker
from tests.support.processes import repo_env

pytestmark = pytest.mark.slow

WARNING = re.compile(r"\[brokerd\.tap#warn\] (.*)$")
LINE = "--smqp-retry-timeout is now --durable-retry-timeout: the former name still works but is going away"


def test_twistd_brokerd_with_a_former_option_name_starts_and_logs_one_warning(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, "--smqp-retry-timeout", "5", "--open-login")
    try:
        client = LineClient.connect(broker.ports["ssmp"])
        assert client.request("LOGIN alice open") == b"200"  # it started with the option, and serves
        client.close()
    finally:
        broker.stop()
    log = broker.log()
    assert [match.group(1) for line in log.splitlines() if (match := WARNING.search(line))] == [LINE], log
    assert "Traceback" not in log
    checked = subprocess.run([sys.executable, "-m", "brokerd.cli.server", "--check-config", "--smqp-retry-timeout",
                              "5", "--data-dir", str(tmp_path / "checked")],
                             env=repo_env(), capture_output=True, text=True, timeout=60)
    assert (checked.returncode, checked.stdout, checked.stderr) == (
        0, "brokerd: configuration OK\n", f"brokerd: warning: {LINE}\n"), checked

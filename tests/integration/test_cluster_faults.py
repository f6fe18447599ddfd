"""The fault-injection run (``python -m tests.faults``, docs/cluster.md "Fault-injection run")
for 3 minutes, on one redis-server and on a 3-master Redis Cluster: three ``twistd brokerd``
nodes with PostgreSQL under traffic in all four protocols, through a forger on Redis, a
PostgreSQL restart, a Redis restart, a node frozen past the node timeout and a node killed and
restarted.  The run's own checks decide (it exits 1 when one fails); its report, with each
check's evidence, is the failure message.  No timing is asserted here beyond the run's
presence check, whose tolerance tests/faults/run.py justifies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.postgres import require_binaries
from tests.support.redis import redis_binary, redis_version

pytestmark = pytest.mark.slow

MINUTES = 3
SLACK = 600
"""Seconds past the run's length before it counts as hung: starting the servers, draining the
durable subscriber (bounded by the run at 120 s) and stopping everything on a loaded machine."""


@pytest.mark.parametrize("mode", [[], ["--redis-cluster"]], ids=["one-redis", "redis-cluster"])
def test_a_cluster_under_faults_keeps_its_promises(tmp_path: Path, mode: list[str]) -> None:
    if mode and redis_version(redis_binary()) < (7, 0, 0):
        pytest.skip("redis-server is older than 7.0: no sharded pub/sub")
    redis_binary()
    require_binaries()
    log_path = tmp_path / "run.log"
    process = processes.spawn(
        [sys.executable, "-m", "tests.faults", "--minutes", str(MINUTES), "--directory", str(tmp_path / "run"), *mode],
        log_path, start_new_session=True)
    try:
        process.wait(MINUTES * 60 + SLACK)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        pytest.fail(f"the run did not end within {MINUTES} min + {SLACK} s:\n{log_path.read_text(errors='replace')[-8000:]}")
    report = log_path.read_text(errors="replace")
    assert process.returncode == 0, report[-12000:]
    assert "PASS  acknowledged SMQP messages lost: 0 of" in report  # the checks ran and were printed

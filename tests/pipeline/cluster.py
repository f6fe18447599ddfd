"""A Spark standalone cluster for tests: one master and two workers, each a process of its own
started with the ``spark-class`` launcher that ships with pyspark, on loopback, with work dirs
in a temp dir; stopped whatever happens."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import processes
from tests.support.broker import free_port

START_TIMEOUT = 90.0
"""Seconds a master or worker may take to start on a loaded 2-core machine."""
WORKERS = 2


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> list[str]:
    return [str(spark_home() / "bin" / "spark-class")]


def cluster_env(scratch: Path) -> dict[str, str]:
    return processes.repo_env(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(scratch / "local"),
        SPARK_LOG_DIR=str(scratch / "logs"),
        SPARK_NO_DAEMONIZE="1",
    )


@contextmanager
def standalone_cluster(scratch: Path, cores: int = 1, memory: str = "1g") -> Iterator[str]:
    """Yield the master URL (``spark://127.0.0.1:PORT``) once both workers have registered."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = cluster_env(scratch)
    port = free_port()
    started = []
    try:
        master_log = scratch / "master.log"
        master = processes.spawn(
            [*spark_class(), "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())],
            master_log, env=env, cwd=scratch,
        )
        started.append(master)
        url = f"spark://127.0.0.1:{port}"
        processes.wait_for_output("I have been elected leader", master, master_log, START_TIMEOUT)
        for index in range(WORKERS):
            work_dir = scratch / f"worker{index}"
            work_dir.mkdir()
            log = scratch / f"worker{index}.log"
            worker = processes.spawn(
                [*spark_class(), "org.apache.spark.deploy.worker.Worker",
                 "--host", "127.0.0.1", "--webui-port", str(free_port()), "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(work_dir), url],
                log, env=env, cwd=scratch,
            )
            started.append(worker)
            processes.wait_for_output("Successfully registered with master", worker, log, START_TIMEOUT)
        yield url
    finally:
        for process in reversed(started):
            processes.stop(process)


def executor_dirs(scratch: Path) -> dict[str, list[str]]:
    """Per worker, the applications whose executors ran there (``work-dir/app-*``)."""
    return {
        worker.name: sorted(os.listdir(worker))
        for worker in sorted(scratch.glob("worker*"))
        if worker.is_dir()
    }

"""The pipeline on a real Spark standalone cluster (a master and two workers, separate
processes on loopback): the report job distributed there gives the same tables as on
``local[2]`` and as the report run in this process (pyarrow, no Spark), and the
event-log source feeding the brokerd sink delivers the same messages to an SSMP subscriber."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the report needs pyarrow (the 'pipeline' extra)")

from brokerd.events import schema
from brokerd.pipeline.report import TABLES, run_report
from tests.pipeline.brokers import twistd_broker
from tests.pipeline.cluster import executor_dirs, standalone_cluster
from tests.pipeline.test_compact import rows
from tests.pipeline.test_report import H0, S, write_log

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 300
CLUSTER_CONF = ["--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
                "--conf", "spark.sql.shuffle.partitions=4", "--driver-memory", "1g"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("pyspark", reason="the data pipeline needs PySpark (the 'pipeline' extra)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if os.environ.get("CI"):
            pytest.fail("Java is missing (CI must install a Java 17 runtime)")
        pytest.skip("no Java runtime: Spark cannot start")
    scratch = tmp_path_factory.mktemp("cluster")
    with standalone_cluster(scratch) as url:
        yield url, scratch


def test_the_report_job_on_the_cluster_gives_the_local_tables(spark: Any, cluster: Any, tmp_path: Path) -> None:
    url, scratch = cluster
    write_log(tmp_path / "on-cluster")
    shutil.copytree(tmp_path / "on-cluster", tmp_path / "on-local")
    result = subprocess.run(
        [sys.executable, "-m", "brokerd.pipeline", "report", "--master", url, "--data-dir", str(tmp_path / "on-cluster"),
         "--out", str(tmp_path / "out-cluster"), "--quiet", *CLUSTER_CONF],
        cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # --quiet: no progress, no JVM warnings
    local = run_report(spark, str(tmp_path / "on-local"), str(tmp_path / "out-local"))
    assert local["events"] == 29
    # the same log, now compacted (its malformed lines need Spark's reader), in this process
    in_process = run_report(None, str(tmp_path / "on-local"), str(tmp_path / "out-in-process"))
    assert in_process["events"] == 29 and in_process["compaction"]["compacted_now"] == 0
    for table in TABLES:
        expected = rows(spark, tmp_path / "out-in-process" / table)
        assert rows(spark, tmp_path / "out-cluster" / table) == rows(spark, tmp_path / "out-local" / table) == expected, table
    assert rows(spark, tmp_path / "on-cluster" / "events-compacted") == rows(spark, tmp_path / "on-local" / "events-compacted")
    # the log is on a filesystem the driver sees: pyarrow compacted the hour it parses, Spark the others
    by_pyarrow = (tmp_path / "on-cluster" / "events-compacted").glob("date=*/hour=*/*-arrow.parquet")
    assert [path.parent.name for path in by_pyarrow] == ["hour=11"]
    # both workers ran executors of the job
    assert all(apps for apps in executor_dirs(scratch).values()) and len(executor_dirs(scratch)) == 2


def _write_payload_log(data_dir: Path, payloads: list[bytes]) -> None:
    directory = data_dir / "events" / "date=2024-05-01" / "hour=10"
    directory.mkdir(parents=True)
    lines = [
        schema.encode({"v": 1, "ts": H0 + i * S, "protocol": "ssmp", "kind": "accepted", "session": "p",
                       "topic": "logged" if i % 3 else "other", "message": "multicast", "bytes": len(content),
                       "fanout": 0, "payload": schema.encode_payload(content)})
        for i, content in enumerate(payloads)
    ]
    (directory / "events-b1-run1-1.jsonl").write_text("".join(lines), "utf-8")


def _stream(master: str, data_dir: Path, port: int, checkpoint: Path, topic: str, expected: int) -> list[bytes]:
    from brokerd.pipeline.ssmp import SSMPConnection

    with SSMPConnection("127.0.0.1", port, f"watch-{topic.replace('/', '-')}".encode()) as subscriber:
        subscriber.subscribe(topic.encode())
        result = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("stream_job.py")), "--master", master,
             "--data-dir", str(data_dir), "--address", f"127.0.0.1:{port}", "--checkpoint", str(checkpoint),
             "--topic", topic],
            cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"done on {master}" in result.stdout
        received = [subscriber.receive(30.0) for _ in range(expected)]
    assert all(event is not None for event in received)
    assert {event.target for event in received} == {topic.encode()}
    return sorted(event.content for event in received)


def test_streaming_source_and_sink_on_the_cluster_deliver_what_local_does(cluster: Any, tmp_path: Path) -> None:
    url, _scratch = cluster
    payloads = [b"message %d" % i for i in range(30)]
    _write_payload_log(tmp_path / "data", payloads)
    logged = sorted(content for i, content in enumerate(payloads) if i % 3)
    with twistd_broker(tmp_path / "broker") as port:
        on_cluster = _stream(url, tmp_path / "data", port, tmp_path / "ckpt-cluster", "cluster/out", len(logged))
        on_local = _stream("local[2]", tmp_path / "data", port, tmp_path / "ckpt-local", "local/out", len(logged))
    assert on_cluster == on_local == logged

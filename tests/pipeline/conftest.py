"""One local SparkSession for the whole pipeline test group (JVM start-up is the slow part)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="the data pipeline needs PySpark (the 'pipeline' extra)")
    from brokerd.pipeline.session import build_session
    from brokerd.pipeline.streaming import register

    session = build_session(
        "local[2]",
        app_name="brokerd-tests",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            # One session serves every pipeline test of a whole-suite run: 1g ran out of heap
            # late in such runs (java.lang.OutOfMemoryError in a Parquet write), and the status
            # store keeps every finished job and query unless told to keep fewer.
            "spark.driver.memory": "2g",
            "spark.sql.ui.retainedExecutions": "50",
            "spark.ui.retainedJobs": "100",
            "spark.ui.retainedStages": "100",
            "spark.sql.streaming.schemaInference": "false",
        },
    )
    register(session)
    yield session
    session.stop()

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
            "spark.driver.memory": "1g",
            "spark.sql.streaming.schemaInference": "false",
        },
    )
    register(session)
    yield session
    session.stop()

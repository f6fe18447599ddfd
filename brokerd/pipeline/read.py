"""Reading the event log into a DataFrame of valid records, counting the bad lines.

The log is read with Spark's JSON reader against the schema in ``brokerd.events.schema``
(no inference: a field of the wrong type makes the line malformed instead of changing the
table).  ``date=``/``hour=`` directories are partition columns, so ``--since``/``--until``
prune whole hours before any file is opened; the exact bounds then apply to ``ts``.

Every line ends up in exactly one status: ``ok``; ``malformed`` (not JSON, cut short by a
crash, or a field of the wrong type); ``unsupported_version``; ``invalid`` (a required field
missing or an unknown kind).  Only ``ok`` records within the bounds reach the tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from operator import or_
from typing import Any

from brokerd.events import schema

CORRUPT = "_corrupt"
OK = "ok"
STATUSES = (OK, schema.MALFORMED, schema.UNSUPPORTED_VERSION, schema.INVALID)
_SPARK_TYPES = {"int": "IntegerType", "long": "LongType", "string": "StringType"}


def event_struct() -> Any:
    """The Spark schema of one record (every version-1 field) plus the corrupt-line column."""
    from pyspark.sql import types

    fields = [
        types.StructField(name, getattr(types, _SPARK_TYPES[kind])(), True) for name, kind in schema.FIELDS
    ]
    fields.append(types.StructField(CORRUPT, types.StringType(), True))
    return types.StructType(fields)


@dataclass
class EventLog:
    """What was read: ``records`` (valid, in bounds, with a ``time`` timestamp column) and
    the count of lines of each status in the partitions read."""

    records: Any
    quality: dict[str, int] = field(default_factory=dict)
    path: str = ""
    found: bool = True

    @property
    def bad_lines(self) -> int:
        return sum(count for status, count in self.quality.items() if status != OK)


def events_path(data_dir: str) -> str:
    return data_dir.rstrip("/") + "/" + schema.EVENTS_DIR


def _exists(spark: Any, path: str) -> bool:
    """Whether ``path`` exists, through Hadoop's FileSystem (local paths and cluster URIs)."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hadoop_path))


def _partition_filter(since_us: int | None, until_us: int | None) -> Any:
    """A condition on the date/hour partition columns that keeps every hour overlapping
    [since, until)."""
    from pyspark.sql import functions as F

    condition = F.lit(True)
    if since_us is not None:
        date, hour = schema.partition_of(since_us)
        condition = condition & ((F.col("date") > date) | ((F.col("date") == date) & (F.col("hour") >= hour)))
    if until_us is not None:
        date, hour = schema.partition_of(until_us - 1)
        condition = condition & ((F.col("date") < date) | ((F.col("date") == date) & (F.col("hour") <= hour)))
    return condition


def empty_records(spark: Any) -> Any:
    from pyspark.sql import functions as F

    struct = event_struct()
    frame = spark.createDataFrame([], struct).drop(CORRUPT, "payload")
    return frame.withColumn("time", F.timestamp_micros(F.col("ts")))


def read_events(spark: Any, data_dir: str, since_us: int | None = None, until_us: int | None = None) -> EventLog:
    """Read ``data_dir``'s event log; never raises for bad or missing data (an absent or
    empty log is an empty EventLog)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    path = events_path(data_dir)
    if not _exists(spark, path):
        return EventLog(empty_records(spark), {status: 0 for status in STATUSES}, path, found=False)
    raw = (
        spark.read.schema(event_struct())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("pathGlobFilter", "*" + schema.FILE_SUFFIX)
        .option("basePath", path)
        .json(path)
    )
    if "date" not in raw.columns or "hour" not in raw.columns:
        # no date=/hour= directories yet: nothing the broker wrote
        return EventLog(empty_records(spark), {status: 0 for status in STATUSES}, path)
    raw = raw.filter(_partition_filter(since_us, until_us))
    kinds = sorted(schema.KINDS)
    status = (
        F.when(F.col(CORRUPT).isNotNull(), F.lit(schema.MALFORMED))
        .when(F.col("v").isNull() | ~F.col("v").isin(sorted(schema.SUPPORTED_VERSIONS)), F.lit(schema.UNSUPPORTED_VERSION))
        .when(
            reduce(or_, [F.col(name).isNull() for name in schema.REQUIRED if name != "v"]) | ~F.col("kind").isin(kinds),
            F.lit(schema.INVALID),
        )
        .otherwise(F.lit(OK))
    )
    columns = [name for name in schema.FIELD_NAMES if name != "payload"]
    marked = raw.select(*columns, status.alias("status")).persist(StorageLevel.MEMORY_AND_DISK)
    counts = {row["status"]: row["count"] for row in marked.groupBy("status").count().collect()}
    quality = {status_name: int(counts.get(status_name, 0)) for status_name in STATUSES}
    records = marked.filter(F.col("status") == OK).drop("status")
    if since_us is not None:
        records = records.filter(F.col("ts") >= since_us)
    if until_us is not None:
        records = records.filter(F.col("ts") < until_us)
    records = records.withColumn("time", F.timestamp_micros(F.col("ts")))
    return EventLog(records, quality, path)

"""Spark's part of the pipeline: storage, JSON parsing and distribution, never the figures.

A report on a cluster (a ``spark://`` master, yarn, a data dir on cluster storage) and one with
``--engine spark`` read through Spark: Hadoop's FileSystem for any URI (:class:`HadoopFS`),
Spark's JSON reader (which marks exactly the lines it cannot parse ``malformed``, where
pyarrow rejects a whole file) and Spark's Parquet reader and writer.  The functions that compute
locally run on the executors (``mapInArrow``, ``arrow_udf``): the line statuses and the
per-hour summaries, which travel back as Arrow IPC blobs (small by design), collected with
``toArrow()`` and merged in the driver, where brokerd.pipeline.tables derives every table.  No
figure is a Spark DataFrame expression.  PySpark is imported inside the functions: it is an
optional dependency, and a local report (brokerd.pipeline.read) never needs it.
"""
from __future__ import annotations

from functools import partial, reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.pipeline.arrowjson import line_status
from brokerd.pipeline.localfs import local_path
from brokerd.pipeline.read import OK, Hour, Log, WritableFileSystem, plan_hours, read_stored
from brokerd.pipeline.summaries import (
    ENDPOINT_KINDS, HOUR_US, NAMES, RECORD_COLUMNS, SUMMARY_DIR, merge, record_schema, schemas, summarize_table,
)

CORRUPT = "_corrupt"
BLOBS = "hour_index long, name string, data binary"
"""What the summarising ``mapInArrow`` returns: one row per non-empty summary of a part of an
hour, the summary as an Arrow IPC stream."""
BLOB_SCHEMA = pa.schema([("hour_index", pa.int64()), ("name", pa.string()), ("data", pa.binary())])


class HadoopFS:
    """The few FileSystem calls compaction and reading need, on ``spark``'s Hadoop config."""

    def __init__(self, spark: Any, root: str) -> None:
        self._jvm = spark.sparkContext._jvm
        self.fs = self.path(root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(name)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def glob(self, base: str, pattern: str, directories: bool = False) -> list[str]:
        """Paths under ``base`` matching ``pattern`` (only directories, if asked)."""
        found = self.fs.globStatus(self.path(f"{base}/{pattern}")) or []
        return [status.getPath().toString() for status in found if not directories or status.isDirectory()]

    def files(self, directory: str, suffix: str) -> list[tuple[str, int]]:
        found = self.fs.globStatus(self.path(f"{directory}/*{suffix}")) or []
        return sorted((status.getPath().getName(), int(status.getLen())) for status in found if status.isFile())

    def read_text(self, name: str) -> str:
        stream = self.fs.open(self.path(name))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, name: str, text: str) -> None:
        stream = self.fs.create(self.path(name), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def mkdirs(self, name: str) -> None:
        self.fs.mkdirs(self.path(name))

    def rename(self, source: str, target: str) -> bool:
        return bool(self.fs.rename(self.path(source), self.path(target)))

    def delete(self, name: str, recursive: bool = True) -> None:
        self.fs.delete(self.path(name), recursive)


def spark_struct(fields: Any, *extra: str) -> Any:
    """The Spark form of the Arrow ``fields`` and the string columns ``extra``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema([*fields, *[pa.field(name, pa.string()) for name in extra]]))


COMPACTED = ("status", "date", "hour")
"""The columns compacted hours have besides the log's fields (``date``, ``hour``: the
partition values)."""


def read_json(spark: Any, base_path: str, paths: list[str]) -> Any:
    """The log files under ``paths`` as Spark reads them: the schema given (no inference), a
    line it cannot parse kept whole in the corrupt column, only ``*.jsonl`` files; with each
    line's ``status`` (:func:`with_status`), ``date`` and ``hour``."""
    reader = (spark.read.schema(spark_struct(record_schema(payload=True), CORRUPT))
              .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
              .option("pathGlobFilter", "*" + schema.FILE_SUFFIX)
              .option("basePath", base_path))
    return with_status(reader.json(paths))


STATUS_FIELDS = tuple(dict.fromkeys(("v", "kind", *schema.REQUIRED)))  # what arrowjson.line_status reads


def _status_of(fields: pa.Array) -> pa.Array:
    """On an executor: the line statuses of a batch (``fields``: a struct of STATUS_FIELDS)."""
    return line_status(pa.RecordBatch.from_arrays([fields.field(name) for name in STATUS_FIELDS], names=list(STATUS_FIELDS)))


def with_status(raw: Any) -> Any:
    """Every schema field, ``status``, ``date`` and ``hour`` of each line Spark's reader
    gave: ``malformed`` where it could not parse the line, else the status
    :func:`arrowjson.line_status` gives (the one definition, pyarrow's path uses it too), run
    on the executors as an Arrow UDF over the few fields it reads.  Sending whole lines
    through Python instead (``mapInArrow``: the payloads too) made parsing 60 % slower."""
    from pyspark.sql import functions as F

    status_of = F.arrow_udf(_status_of, "string")  # type: ignore[call-overload]  # pyspark's stubs want functionType, which it warns against when the hints tell
    status = F.when(F.col(CORRUPT).isNotNull(), F.lit(schema.MALFORMED)).otherwise(status_of(F.struct(*STATUS_FIELDS)))
    return raw.select(*schema.FIELD_NAMES, status.alias("status"), *COMPACTED[1:])


def _encode(table: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _decode(data: bytes) -> Any:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


PART_ROWS = 1_000_000
"""Records summarised at once by an executor (a larger partition: in parts)."""


def _summarize_parts(endpoints, batches):  # noqa: ANN001, ANN202 - no hints: Spark infers the UDF's form from them
    """On an executor: a partition's records in BLOBS, per hour, PART_ROWS at most at a time."""
    ends, part, rows = _decode(endpoints.value), [], 0
    for batch in batches:
        part.append(batch)
        rows += batch.num_rows
        if rows >= PART_ROWS:
            yield _summarize_part(pa.Table.from_batches(part), ends)
            part, rows = [], 0
    if part:
        yield _summarize_part(pa.Table.from_batches(part), ends)


def _summarize_part(table: Any, ends: Any) -> Any:
    records = table.select(list(RECORD_COLUMNS)).cast(record_schema())
    hours = pc.divide(records.column("ts"), HOUR_US)  # ts > 0: integer division
    end_hours = pc.divide(ends.column("ts"), HOUR_US)
    rows = []
    for hour in pc.unique(hours).to_pylist():
        summaries = summarize_table(records.filter(pc.equal(hours, hour)), ends.filter(pc.equal(end_hours, hour)))
        rows += [{"hour_index": hour, "name": name, "data": _encode(one)} for name, one in summaries.items() if len(one)]
    return pa.RecordBatch.from_pylist(rows, schema=BLOB_SCHEMA)


def summarize(records: Any) -> Any:
    """``records`` (valid records, no payload) summarised per hour of ``ts`` where they are,
    each partition's part of an hour on its executor with the hour's endpoint records (few,
    broadcast): no record is shuffled (docs/pipeline.md).  A DataFrame of :data:`BLOBS`."""
    from pyspark.sql import functions as F

    selected = records.select(*RECORD_COLUMNS)
    ends = selected.filter(F.col("kind").isin(list(ENDPOINT_KINDS))).toArrow().cast(record_schema())
    endpoints = records.sparkSession.sparkContext.broadcast(_encode(ends))
    return selected.mapInArrow(partial(_summarize_parts, endpoints), BLOBS)


def collect(blobs: Any) -> dict[str, list[Any]]:
    """The summaries of a :func:`summarize` DataFrame, in the driver (name -> one table per part of an hour)."""
    found: dict[str, list[Any]] = {}
    table = blobs.toArrow()
    for name, data in zip(table.column("name").to_pylist(), table.column("data").to_pylist()):
        found.setdefault(name, []).append(_decode(data))
    return found


def _unpack(batches):  # noqa: ANN001, ANN202 - no hints: Spark infers the UDF's form from them
    """On an executor: the rows of a summary from its blobs, with the hour's ``date`` and
    ``hour`` (partition values) appended."""
    for batch in batches:
        for hour_index, data in zip(batch.column("hour_index").to_pylist(), batch.column("data").to_pylist()):
            table = _decode(data)
            date, hour = schema.partition_of(hour_index * HOUR_US)
            table = table.append_column("date", pa.array([date] * len(table), pa.string()))
            table = table.append_column("hour", pa.array([hour] * len(table), pa.string()))
            yield from table.to_batches()


def store_summaries(spark: Any, fs: WritableFileSystem, data: str, scratch: str, hours: list[Hour]) -> dict[Hour, set[str]]:
    """Summarise the staged ``hours`` under ``data`` (``data/date=/hour=``) on the executors and
    store each hour's as ``.../_summary/<name>``, one Parquet write per summary (partitioned by
    hour, moved into place); returns the summaries that have rows in each hour."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    rows = spark.read.schema(spark_struct(record_schema(payload=True), *COMPACTED)).option("basePath", data).parquet(
        *[f"{data}/date={hour[0]}/hour={hour[1]}" for hour in sorted(hours)]
    )
    blobs = summarize(rows.filter(F.col("status") == OK)).persist(StorageLevel.MEMORY_AND_DISK)
    stored: dict[Hour, set[str]] = {hour: set() for hour in hours}
    try:
        for name in NAMES:
            written = f"{scratch}/{name}"
            frame = blobs.filter(F.col("name") == name).mapInArrow(_unpack, spark_struct(schemas()[name], "date", "hour"))
            frame.write.partitionBy("date", "hour").parquet(written)
            for hour in sorted(hours):
                part = f"{written}/date={hour[0]}/hour={hour[1]}"
                if fs.exists(part):
                    directory = f"{data}/date={hour[0]}/hour={hour[1]}/{SUMMARY_DIR}"
                    fs.mkdirs(directory)
                    if not fs.rename(part, f"{directory}/{name}"):
                        raise OSError(f"could not move {part}")
                    stored[hour].add(name)
    finally:
        blobs.unpersist()
    return stored


def convert_hours(spark: Any, events: str, tmp: str, paths: dict[Hour, str]) -> dict[Hour, tuple[dict[str, int], Any]]:
    """Parse the JSON of the hours in ``paths`` in one read (every executor works, even on small
    hours), keep the rows in memory and write each hour's Parquet into ``tmp/data/date=/hour=``
    (one write per hour: no sort by partition, as partitionBy would do).  Returns each hour's
    line count per status and the lowest and highest ``ts`` of its valid records (or None)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    parsed = read_json(spark, events, list(paths.values())).persist(StorageLevel.MEMORY_AND_DISK)
    found: dict[Hour, tuple[dict[str, int], Any]] = {hour: ({}, None) for hour in paths}
    try:
        counted = parsed.groupBy("date", "hour", "status").agg(
            F.count(F.lit(1)).alias("count"), F.min("ts").alias("lo"), F.max("ts").alias("hi")
        )
        for row in counted.collect():
            key = (row["date"], row["hour"])
            found[key][0][row["status"]] = int(row["count"])
            if row["status"] == OK:
                found[key] = (found[key][0], (row["lo"], row["hi"]))
        for date, hour in paths:
            staged = f"{tmp}/data/date={date}/hour={hour}"
            parsed.filter((F.col("date") == date) & (F.col("hour") == hour)).drop("date", "hour").write.parquet(staged)
    finally:
        parsed.unpersist()
    return found


def read_log(spark: Any, data_dir: str, since_us: int | None = None, until_us: int | None = None) -> Log:
    """The merged summaries of ``data_dir``'s log in [since, until) through Spark: the stored
    summaries of compacted hours wholly inside the window, and the others' records (Parquet or
    JSON) summarised on the executors.  An absent or empty log is an empty Log."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    fs = HadoopFS(spark, data_dir)
    plan = plan_hours(fs, data_dir, since_us, until_us)
    if local_path(data_dir) is not None:  # the driver sees the log: reading here beats a Spark job per summary
        parts = read_stored(plan)
    else:
        parts = {name: [] for name in NAMES}
        for name in NAMES:
            paths = [f"{location}/{SUMMARY_DIR}/{name}" for location, names in sorted(plan.summarized.items()) if name in names]
            if paths:
                parts[name].append(spark.read.schema(spark_struct(schemas()[name])).parquet(*paths).toArrow())
    frames = []
    if plan.record_hours():
        compacted = spark.read.schema(spark_struct(record_schema(payload=True), *COMPACTED))
        frames.append(compacted.option("basePath", plan.compacted).parquet(*plan.record_hours()))
    json_paths = [p for _h, p in sorted(plan.json_hours.items()) if fs.files(p, schema.FILE_SUFFIX)]
    parsed = None
    if json_paths:  # open hours: their statuses counted here (a few hours at most)
        parsed = read_json(spark, plan.path, json_paths).persist(StorageLevel.MEMORY_AND_DISK)
        for row in parsed.groupBy("status").count().collect():
            plan.counts[row["status"]] = plan.counts.get(row["status"], 0) + int(row["count"])
        frames.append(parsed)
    try:
        if frames:
            records = reduce(lambda a, b: a.unionByName(b), [f.select(*RECORD_COLUMNS, "status") for f in frames])
            records = records.filter(F.col("status") == OK)
            if since_us is not None:
                records = records.filter(F.col("ts") >= since_us)
            if until_us is not None:
                records = records.filter(F.col("ts") < until_us)
            for name, tables in collect(summarize(records)).items():
                parts[name] += tables
    finally:
        if parsed is not None:
            parsed.unpersist()
    return Log(merge(parts), plan.quality(), plan.path, found=plan.found, summarized=plan.summarized)


def write_table(spark: Any, table: Any, directory: str) -> None:
    """An Arrow table computed in the driver written by Spark (to any Hadoop URI) as one file."""
    spark.createDataFrame(table).coalesce(1).write.mode("overwrite").parquet(directory)

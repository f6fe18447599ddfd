"""Time one compaction of a generated log by a checkout's pipeline, on a ``local[2]`` Spark
session in this process (a script, not a test).

    python benchmarks/compaction_phases.py TREE DATA_DIR MODE

TREE is the brokerd checkout timed (another commit's worktree, for side-by-side runs); DATA_DIR
a log made by ``pipeline_bench.py report --events N --data-dir DATA_DIR``; MODE ``spark``
(``compact(spark, DIR)``: Spark parses and summarises), ``in-process`` (``compact(None, DIR)``
then ``compact(spark, DIR)`` for what pyarrow left: what ``--engine auto`` does with a local log) or
``plain`` (``compact(spark, DIR)`` of a tree without those phases, e.g. 2d534db).  Prints one
JSON line: the seconds of the whole compaction and, where the tree has them, of
``sparkio.convert_hours`` (parsing, statuses, Parquet) and ``sparkio.store_summaries``; the
driver's CPU seconds; the load average when it started.
"""
import json
import os
import shutil
import sys
import time


def main() -> None:
    tree, data, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, tree)
    os.environ["PYTHONPATH"] = tree  # the executors import brokerd from the tree timed
    from brokerd.pipeline import compact
    from brokerd.pipeline.session import build_session

    spark = build_session("local[2]", quiet=True, conf={"spark.executorEnv.PYTHONPATH": tree})
    times: dict[str, float] = {}
    if mode != "plain":
        from brokerd.pipeline import sparkio

        def timed(name, function):  # noqa: ANN001, ANN202
            def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                started = time.monotonic()
                try:
                    return function(*args, **kwargs)
                finally:
                    times[name] = times.get(name, 0.0) + time.monotonic() - started
            return run

        sparkio.convert_hours = timed("convert", sparkio.convert_hours)
        sparkio.store_summaries = timed("summaries", sparkio.store_summaries)
    shutil.rmtree(os.path.join(data, "events-compacted"), ignore_errors=True)
    spark.range(10).count()  # the JVM and the first job's warm-up are not the compaction's
    load = os.getloadavg()[0]
    started, cpu = time.monotonic(), os.times()
    if mode == "in-process":
        here = compact.compact(None, data)
        done = compact.compact(spark, data)
        done.compacted += here.compacted
    else:
        done = compact.compact(spark, data)
    times["total"] = time.monotonic() - started
    after = os.times()
    print(json.dumps({"mode": mode, "tree": tree, **{k: round(v, 1) for k, v in times.items()},
                      "driver_cpu": round(after.user + after.system - cpu.user - cpu.system, 1),
                      "hours": len(done.compacted), "load": round(load, 2)}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()

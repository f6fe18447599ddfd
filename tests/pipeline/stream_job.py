"""A streaming job for the cluster test, run as its own driver: the event-log source reads the
accepted messages on topic ``logged`` from DATA_DIR's log and the sink publishes their payloads
to an SSMP broker on topic TOPIC.

    python tests/pipeline/stream_job.py --master URL --data-dir DIR --address HOST:PORT
        --checkpoint DIR --topic TOPIC
"""
from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    from pyspark.sql import functions as F

    from brokerd.pipeline.session import build_session
    from brokerd.pipeline.streaming import register

    spark = build_session(args.master, app_name="brokerd-stream-test", quiet=True, conf={
        "spark.executor.memory": "512m", "spark.cores.max": "2", "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
    })
    try:
        register(spark)
        rows = (
            spark.readStream.format("brokerd").option("dataDir", args.data_dir).option("topics", "logged")
            .option("startingOffsets", "earliest").load()
        )
        query = (
            rows.select(F.lit(args.topic).alias("topic"), "payload")
            .writeStream.format("brokerd").option("address", args.address).option("identity", "stream-job")
            .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            print(f"stream_job: {query.exception()}", file=sys.stderr)
            return 1
        print(f"stream_job: done on {spark.sparkContext.master}")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())

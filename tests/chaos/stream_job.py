"""A streaming query for the chaos trials (``python -m tests.chaos --stream``), run as its own process.

    python tests/chaos/stream_job.py --bootstrap-servers H:P --database-url URL --topic T --job J \
        --checkpoint DIR --mode counts|counted|table [--table NAME] [--trigger 0.5] \
        [--max-offsets-per-trigger N] [--source-failpoints SPEC] [--sink-failpoints SPEC]

``readStream.format("txstore")`` -> ``writeStream.format("txstore")`` with a processingTime trigger
until SIGTERM, which stops the query and exits 0 (``stream_job: stopped after N micro-batches``).
Modes: ``counts`` (a row per message, ``topic, partition, offset``: the sink counts them into
``txn_data``), ``counted`` (``txstore.countMessages``: a row per range), ``table`` (a row per
message merged into ``--table``: ``k`` the message's key, ``n`` 1 and ``osum`` its offset, summed).
Each micro-batch with progress prints ``stream_job: batch ID: ROWS rows``; a query that fails
prints ``stream_job: query failed: LINE`` and exits 1. The Spark configuration comes from
``PYSPARK_SUBMIT_ARGS`` (the runner's).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from typing import Any

try:
    import txstore
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
    import txstore

ERROR_LINE = re.compile(r"^((?:[a-z_]\w*\.)+[A-Z]\w*|[A-Z]\w*(?:Error|Exception)): ")  # pkg.mod.Class: ...
FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def say(line: str) -> None:
    print(f"stream_job: {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream_job.py")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--mode", choices=("counts", "counted", "table"), default="counts")
    parser.add_argument("--table", help="the results table (--mode table)")
    parser.add_argument("--trigger", type=float, default=0.5, help="processingTime, seconds")
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--source-failpoints", default="")
    parser.add_argument("--sink-failpoints", default="")
    args = parser.parse_args(argv)

    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName(f"chaos-stream-{args.job}")
        .config("spark.sql.streaming.checkpointFileManagerClass", FILE_MANAGER)
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    txstore.register(spark)
    reader = (
        spark.readStream.format("txstore")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.topic)
        .option("txstore.job", args.job)
        .option("txstore.databaseUrl", args.database_url)
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    if args.source_failpoints:
        reader = reader.option("txstore.failpoints", args.source_failpoints)
    if args.mode == "counted":
        df = reader.option("txstore.countMessages", "true").load()
    elif args.mode == "counts":
        df = reader.schema("topic string, partition int, offset long").load()
    else:
        df = (
            reader.schema("topic string, partition int, offset long, key binary")
            .load()
            .selectExpr(
                "topic",
                "partition",
                "offset",
                "CAST(key AS STRING) AS k",
                "CAST(1 AS BIGINT) AS n",
                "CAST(offset AS BIGINT) AS osum",
            )
        )
    writer = (
        df.writeStream.format("txstore")
        .option("txstore.job", args.job)
        .option("txstore.databaseUrl", args.database_url)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{int(args.trigger * 1000)} milliseconds")
    )
    if args.mode == "table":
        writer = (
            writer.option("txstore.table", args.table or "")
            .option("txstore.key", "k")
            .option("txstore.merge", "n=sum,osum=sum")
        )
    if args.sink_failpoints:
        writer = writer.option("txstore.failpoints", args.sink_failpoints)
    query = writer.start()
    say(f"query started, checkpoint {args.checkpoint}")
    return watch(query, lambda: stopping)


def watch(query: Any, stopping: Any) -> int:
    """Report each micro-batch until SIGTERM (stop the query, exit 0) or the query fails (exit 1)."""
    seen = -1
    batches = 0
    while True:
        if stopping():
            query.stop()
            say(f"stopped after {batches} micro-batches")
            return 0
        try:
            query.awaitTermination(0.2)
        except Exception as e:  # StreamingQueryException: the cause's line first
            say(f"query failed: {failure_line(e)}")
            return 1
        for progress in query.recentProgress:
            batch = int(progress["batchId"])
            if batch > seen:
                seen = batch
                batches += 1
                say(f"batch {batch}: {progress['numInputRows']} rows")
        if not query.isActive:
            exception = query.exception()
            if exception is not None:
                say(f"query failed: {failure_line(exception)}")
                return 1
            say("query ended without being stopped")
            return 1
        time.sleep(0.05)


def failure_line(e: BaseException) -> str:
    """The cause of a query's failure in one line: the last ``Name: message`` line of the Python
    traceback inside Spark's message (a txstore error, psycopg's, ...), else the first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    causes = [line for line in lines if ERROR_LINE.match(line)]
    line = causes[-1] if causes else (lines[0] if lines else repr(e))
    return line[:2000]


if __name__ == "__main__":
    sys.exit(main())

"""The Structured Streaming path beside the batch per-range count, on the same messages.

``python -m bench.stream [--messages 400000] [--partitions 4] [--rounds 3] [--output FILE]``

Produces the messages to the test broker (in its own process), then counts them per topic
into ``txn_data`` with a new job per run, in an order that rotates from round to round:

- ``per-range``: ``count_topic``'s default path, one batch (``run_batch()``), planned before
  the clock (as a running job's batch);
- ``stream-all-columns``: ``readStream.format("txstore")`` -> ``writeStream.format("txstore")``
  with ``Trigger.AvailableNow``, every Kafka-source column built;
- ``stream-topic-column``: the same with ``.schema("topic string")``;
- ``stream-counted-by-source``: the same with ``.option("txstore.countMessages",
  "true")``: the source's tasks count their messages and hand Spark one row per range
  (:mod:`txstore.spark.stream_source`), a micro-batch's ranges read in one Spark task per core
  (``txstore.tasks``' default, the parallelism ``register`` measured);
- ``stream-counted-task-per-range``: the same with ``txstore.tasks`` set to the number of
  partitions, a Spark task per range (how the source planned before ``txstore.tasks``).

Steady state: a round of every path first, not measured (Python workers, consumers, Spark's
code warm); a stream's job has its ``txn_offsets`` rows before the clock, as per-range's
``plan()`` creates its own before its clock and a running stream has after its first micro-batch. A stream's time is its data micro-batch's ``triggerExecution`` (planning the
micro-batch, reading, the sink's commit: Spark's own ``durationMs``); the query's start-up
(the first ``latestOffset``, the checkpoint's files) is reported beside it as ``wall``. Each
stored total is checked against the messages produced. Ratios are per round, their median
reported, and Spark's ``durationMs`` of each stream path's last run (where its time goes:
``latestOffset`` and ``queryPlanning`` on the driver, ``addBatch`` the tasks and the sink's
commit, ``commitOffsets`` the checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker import BrokerProcess
from bench.run import bench_database, machine, say, warm_up
from bench.workload import Workload, produce
from txstore.core.starting import StartDecision
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.postgres import store
from txstore.postgres.db import connect, redact
from txstore.spark.range_task import COMMITTED
from txstore.spark.source_format import register

PER_RANGE = "per-range"
STREAM_ALL = "stream-all-columns"
STREAM_TOPIC = "stream-topic-column"
STREAM_COUNTED = "stream-counted-by-source"
STREAM_COUNTED_PER_RANGE = "stream-counted-task-per-range"
PATHS = (PER_RANGE, STREAM_ALL, STREAM_TOPIC, STREAM_COUNTED, STREAM_COUNTED_PER_RANGE)


class StreamRuns:
    def __init__(
        self, spark: Any, bootstrap: str, database_url: str, workdir: Path, workload: Workload
    ) -> None:
        self.spark = spark
        self.bootstrap = bootstrap
        self.database_url = database_url
        self.workdir = workdir
        self.workload = workload
        self._jobs = 0

    def run(self, path: str) -> dict[str, Any]:
        self._jobs += 1
        name = f"bench-stream-{self._jobs}"
        result = self._per_range(name) if path == PER_RANGE else self._stream(name, path)
        with connect(self.database_url) as conn:
            stored = store.topic_totals(conn, name, [self.workload.topic]).get(self.workload.topic)
        if stored != self.workload.messages:
            raise RuntimeError(f"{path}: stored total {stored}, expected {self.workload.messages}")
        return {"path": path, "messages": self.workload.messages, **result}

    def _per_range(self, name: str) -> dict[str, Any]:
        settings = JobSettings(name, (self.workload.topic,), self.bootstrap, self.database_url)
        job = TransactionalJob(self.spark, settings, count_messages)
        try:
            job.plan()
            started = time.perf_counter()
            report = job.run_batch()
            ms = (time.perf_counter() - started) * 1000
        finally:
            job.close()
        if any(r.outcome != COMMITTED for r in report.ranges):
            raise RuntimeError(f"per-range: a range was not committed: {[r.outcome for r in report.ranges]}")
        return {"batch_ms": ms, "wall_ms": ms}

    def _stream(self, name: str, path: str) -> dict[str, Any]:
        with connect(self.database_url) as conn:  # the job's offset rows, at the topic's start
            starts = [
                StartDecision(self.workload.topic, p, 0, "bench") for p in range(self.workload.partitions)
            ]
            store.create_start_rows(conn, name, starts)
        reader = self.spark.readStream.format("txstore")
        if path == STREAM_TOPIC:
            reader = reader.schema("topic string")
        if path in (STREAM_COUNTED, STREAM_COUNTED_PER_RANGE):
            reader = reader.option("txstore.countMessages", "true")
        if path == STREAM_COUNTED_PER_RANGE:
            reader = reader.option("txstore.tasks", str(self.workload.partitions))
        frame = (
            reader.option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.workload.topic)
            .option("txstore.job", name)
            .option("txstore.databaseUrl", self.database_url)
            .load()
        )
        started = time.perf_counter()
        query = (
            frame.writeStream.format("txstore")
            .option("txstore.job", name)
            .option("txstore.databaseUrl", self.database_url)
            .option("checkpointLocation", str(self.workdir / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(600)
        wall_ms = (time.perf_counter() - started) * 1000
        if query.isActive or query.exception() is not None:
            raise RuntimeError(f"{path}: the query did not finish: {query.exception()}")
        data = [p for p in query.recentProgress if p["numInputRows"] > 0]
        if len(data) != 1:
            raise RuntimeError(f"{path}: expected one data micro-batch, got {len(data)}")
        durations = data[0]["durationMs"]
        return {"batch_ms": float(durations["triggerExecution"]), "wall_ms": wall_ms, "durations": durations}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of: " + ", ".join(PATHS))
    parser.add_argument("--database-url", help="an existing PostgreSQL database (default: a throwaway one)")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown path {unknown[0]!r}")
    root = Path(__file__).resolve().parent.parent
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    workload = Workload(f"bench-stream-{os.getpid()}", args.messages, args.partitions, args.value_bytes)
    from pyspark.sql import SparkSession

    with bench_database(args.database_url) as database_url, BrokerProcess() as broker:
        say(f"test broker {broker.bootstrap_servers}, PostgreSQL {redact(database_url)}")
        broker.create_topic(workload.topic, workload.partitions)
        produce(broker.bootstrap_servers, workload)
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        warm_up(spark)
        rounds: list[dict[str, dict[str, Any]]] = []
        with tempfile.TemporaryDirectory(prefix="txstore-bench-stream-") as workdir:
            runs = StreamRuns(spark, broker.bootstrap_servers, database_url, Path(workdir), workload)
            for path in paths:  # steady state: every path once, not measured
                runs.run(path)
            for r in range(args.rounds):
                shift = r % len(paths)
                measured = {}
                for path in paths[shift:] + paths[:shift]:
                    measured[path] = runs.run(path)
                    say(
                        f"round {r + 1} {path:32s} batch {measured[path]['batch_ms']:8.0f} ms   "
                        f"wall {measured[path]['wall_ms']:8.0f} ms"
                    )
                rounds.append(measured)
        spark.stop()
    summary: dict[str, Any] = {}
    say(
        f"\n{workload.messages:,} messages, {workload.partitions} partitions, local[2], medians of {args.rounds}"
    )
    for path in paths:
        batch = statistics.median(r[path]["batch_ms"] for r in rounds)
        wall = statistics.median(r[path]["wall_ms"] for r in rounds)
        line: dict[str, Any] = {
            "batch_ms": batch,
            "wall_ms": wall,
            "messages_per_second": workload.messages / (batch / 1000),
        }
        text = f"{path:32s} batch {batch:8.0f} ms   wall {wall:8.0f} ms   {line['messages_per_second']:>10,.0f} msg/s"
        if PER_RANGE in paths and path != PER_RANGE:
            # throughput relative to per-range: per-range's time / this path's, per round
            ratio = statistics.median(r[PER_RANGE]["batch_ms"] / r[path]["batch_ms"] for r in rounds)
            line["throughput_vs_per_range"] = ratio
            text += f"   {ratio:.2f}x per-range's throughput"
        summary[path] = line
        say(text)
    for path in paths:
        if path != PER_RANGE:
            say(f"{path}: Spark's durationMs of the last round: {json.dumps(rounds[-1][path]['durations'])}")
    if args.output:
        document = {"workload": vars(workload), "machine": machine(), "summary": summary, "rounds": rounds}
        args.output.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

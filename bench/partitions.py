"""A running job's batches by partition count, on Apache Kafka, in one run.

``python -m bench.partitions [--partitions 8,1024] [--messages-per-partition 20] [--rounds 5]
[--idle-batches 10] [--output FILE]``

For each partition count: a topic on one Apache Kafka node
(:class:`~txstore.testing.real_kafka.RealKafkaCluster`) and one txstore job counting it
(``count_topic``'s aggregate, per-range, in one SparkSession), whose first batch (it creates
the job's rows) is not timed. Then, measured by their wall clock:

- **idle batches**: no new message, so planning alone (no Spark job);
- **idle stream plans**: a ``readStream.format("txstore")`` source of the same topic (its own
  job, started at ``latest``), its ``latestOffset`` called as Spark calls it each trigger
  while there is nothing new (the stream's idle micro-batch: Spark runs none);
- **warm batches**: ``--messages-per-partition`` new messages in every partition, then one
  batch, reported per range (the batch's wall time over its ranges);
- ``txstore status`` for the job, as an operator runs it (its own process);
- **warm stream micro-batches**: a running query, ``readStream.format("txstore")`` with
  ``txstore.countMessages`` into ``writeStream.format("txstore")``, of a topic of its own with as
  many partitions (so its micro-batches never overlap the batches above). Each round the same
  new messages in every partition of that topic, then its micro-batch's ``triggerExecution``
  (Spark's own clock: planning, reading, the sink's commit, the checkpoint's files) per range,
  and ``txstore status`` for the query's job. It triggers every ``--trigger-seconds`` (a
  running query's idle plans meanwhile are the stream idle plans measured above).

The partition counts take turns within each round, so that the load on the machine falls on
all of them alike; every median comes with its lowest and highest round and the 1-minute load
when each ended. Issue 38's targets, checked at the largest count against the smallest, for
the job and for the stream: an idle batch at most 4x, a warm batch within 1 ms a range,
``txstore status`` under 1 s. Every batch's and micro-batch's count is checked exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.common import bench_database, local_session, machine, positive_count, positive_counts, say, warm_up
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.reader import close_idle_consumers
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.source_format import register
from txstore.spark.stream.stream_source import stream_reader

IDLE_RATIO_TARGET = 4.0
WARM_MS_PER_RANGE_TARGET = 1.0
STATUS_SECONDS_TARGET = 1.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--partitions", type=positive_counts, default=[8, 1024], help="partition counts (default 8,1024)"
    )
    p.add_argument(
        "--messages-per-partition", type=positive_count, default=20, help="a warm batch's new messages (20)"
    )
    p.add_argument("--rounds", type=positive_count, default=5, help="rounds (default 5)")
    p.add_argument(
        "--idle-batches", type=positive_count, default=10, help="idle batches a round (default 10)"
    )
    p.add_argument(
        "--trigger-seconds",
        type=positive_count,
        default=2,
        help="the running query's trigger interval (default 2)",
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--database-url", default=None, help="an existing database (default: a throwaway one)")
    p.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    return p


def spread(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    """The median with its lowest and highest value."""
    return {
        "median": round(statistics.median(values), digits),
        "lowest": round(min(values), digits),
        "highest": round(max(values), digits),
    }


def summarize(rounds: list[dict[str, dict[str, Any]]], counts: Sequence[int]) -> dict[str, Any]:
    """Per partition count: medians (lowest, highest) of the idle batch (ms), the warm batch (ms a
    range) and ``txstore status`` (s); the largest count's ratios to the smallest, per round then
    their median, and whether the targets hold."""
    per: dict[str, Any] = {}
    for n in counts:
        runs = [r[str(n)] for r in rounds]
        per[str(n)] = {
            "idle_batch_ms": spread([r["idle_ms"] for r in runs]),
            "stream_idle_plan_ms": spread([r["stream_idle_ms"] for r in runs]),
            "warm_ms_per_range": spread([r["warm_ms_per_range"] for r in runs]),
            "status_seconds": spread([r["status_seconds"] for r in runs]),
            "stream_warm_ms_per_range": spread([r["stream_warm_ms_per_range"] for r in runs]),
            "stream_status_seconds": spread([r["stream_status_seconds"] for r in runs]),
            "load_1min": spread([r["load_1min"] for r in runs], 1),
        }
    low, high = str(min(counts)), str(max(counts))
    idle_ratio = spread([r[high]["idle_ms"] / r[low]["idle_ms"] for r in rounds])
    stream_ratio = spread([r[high]["stream_idle_ms"] / r[low]["stream_idle_ms"] for r in rounds])
    warm = per[high]["warm_ms_per_range"]["median"]
    status = per[high]["status_seconds"]["median"]
    stream_warm = per[high]["stream_warm_ms_per_range"]["median"]
    stream_status = per[high]["stream_status_seconds"]["median"]
    return {
        "by_partitions": per,
        f"idle_{high}_over_{low}": idle_ratio,
        f"stream_idle_{high}_over_{low}": stream_ratio,
        "targets": {
            f"idle batch at {high} partitions <= {IDLE_RATIO_TARGET:g}x {low}": idle_ratio["median"]
            <= IDLE_RATIO_TARGET,
            f"idle stream plan at {high} partitions <= {IDLE_RATIO_TARGET:g}x {low}": stream_ratio["median"]
            <= IDLE_RATIO_TARGET,
            f"warm batch at {high} partitions <= {WARM_MS_PER_RANGE_TARGET:g} ms a range": warm
            <= WARM_MS_PER_RANGE_TARGET,
            f"txstore status at {high} partitions < {STATUS_SECONDS_TARGET:g} s": status
            < STATUS_SECONDS_TARGET,
            f"warm stream micro-batch at {high} partitions <= {WARM_MS_PER_RANGE_TARGET:g} ms a range": (
                stream_warm <= WARM_MS_PER_RANGE_TARGET
            ),
            f"txstore status of the stream's job at {high} partitions < {STATUS_SECONDS_TARGET:g} s": (
                stream_status < STATUS_SECONDS_TARGET
            ),
        },
    }


def fill(producer: Any, topic: str, partitions: int, per_partition: int) -> None:
    """``per_partition`` new messages in every partition of ``topic``, all acknowledged."""
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, b"v%d" % i, b"k%d" % i, partition=p)
    if producer.flush(60) != 0:
        raise RuntimeError(f"{topic}: messages not acknowledged within 60 s")


class RunningQuery:
    """A running query of txstore's stream on a topic of ``n`` partitions of its own: the source
    counting (``txstore.countMessages``) into txstore's sink."""

    WAIT_SECONDS = 300.0

    def __init__(
        self,
        spark: Any,
        kafka: Any,
        database_url: str,
        n: int,
        per_partition: int,
        workdir: Path,
        every: int,
        run: str,
    ) -> None:
        from confluent_kafka import Producer

        self.n = n
        self.per_partition = per_partition
        self.database_url = database_url
        self.bootstrap = kafka.bootstrap_servers
        # The run's own job, like its topic: in a kept --database-url, another run's rows under
        # the same job name would show in this job's ``txstore status``.
        self.topic = self.job_name = f"bench-partitions-query-{n}-{run}"
        kafka.create_topic(self.topic, n)
        self.producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        self.query: Any = None
        self.produced = 0
        self.seen = -1  # the last micro-batch id looked at
        try:
            self.produce()  # first, so that the new topic's partitions have their leaders
            job = {"txstore.job": self.job_name, "txstore.databaseUrl": database_url}
            self.query = (
                spark.readStream.format("txstore")
                .options(**job)
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", self.topic)
                .option("txstore.countMessages", "true")
                .load()
                .writeStream.format("txstore")
                .options(**job)
                .option("checkpointLocation", str(workdir / self.job_name))
                .trigger(processingTime=f"{every} seconds")
                .start()
            )
            self.counted()  # its first micro-batch: the query's warm-up, not timed
        except BaseException:
            self.close()
            raise

    def micro_batch(self) -> dict[str, Any]:
        """New messages in every partition, then the micro-batches that read them (one, unless a
        trigger fell while they were produced), once the job's count in ``txn_data`` is exactly
        what was produced: how many there were and their ``durationMs``, each step summed."""
        self.produce()
        return self.counted()

    def produce(self) -> None:
        fill(self.producer, self.topic, self.n, self.per_partition)
        self.produced += self.n * self.per_partition

    def counted(self) -> dict[str, Any]:
        """Wait, without loading the machine while the micro-batch runs (only the query's small
        last progress is polled), for a new micro-batch to end, then check ``txn_data``."""
        deadline = time.monotonic() + self.WAIT_SECONDS
        while time.monotonic() < deadline:
            if self.query.exception() is not None or not self.query.isActive:
                raise RuntimeError(f"{self.topic}: the query stopped: {self.query.exception()}")
            last = self.query.lastProgress
            if last is None or last["batchId"] <= self.seen or self.query.status["isTriggerActive"]:
                time.sleep(0.05)
                continue
            with connect(self.database_url) as conn:
                total = store.topic_totals(conn, self.job_name, [self.topic]).get(self.topic, 0)
            if total > self.produced:
                raise RuntimeError(f"{self.topic}: txn_data counts {total}, only {self.produced} produced")
            progress = [p for p in self.query.recentProgress if p["batchId"] > self.seen]
            data = [p for p in progress if p["numInputRows"] > 0]
            if total == self.produced and data:
                self.seen = max(p["batchId"] for p in progress)
                steps = {k for p in data for k in p["durationMs"]}
                return {
                    "micro_batches": len(data),
                    "ms": {k: sum(int(p["durationMs"].get(k, 0)) for p in data) for k in sorted(steps)},
                }
            time.sleep(0.05)
        raise RuntimeError(f"{self.topic}: the new messages were not counted in {self.WAIT_SECONDS:g} s")

    def close(self) -> None:
        """Stop the query, if it started, and close the producer (also when the query did not)."""
        try:
            if self.query is not None:
                self.query.stop()
        finally:
            self.producer.flush(10)
            self.producer.close()


class Partitions:
    """One topic of ``n`` partitions and its running job."""

    def __init__(
        self,
        spark: Any,
        kafka: Any,
        database_url: str,
        n: int,
        per_partition: int,
        query: RunningQuery,
        run: str,
    ) -> None:
        from confluent_kafka import Producer
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        self.n = n
        self.per_partition = per_partition
        self.bootstrap = kafka.bootstrap_servers
        self.database_url = database_url
        self.query = query
        self.topic = self.job_name = f"bench-partitions-{n}-{run}"
        self.stream_job = f"bench-partitions-stream-{n}-{run}"
        kafka.create_topic(self.topic, n)
        self.producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        self.job: Any = None
        self.stream: Any = None
        try:
            settings = JobSettings(self.job_name, (self.topic,), self.bootstrap, database_url)
            self.job = TransactionalJob(spark, settings, count_messages)
            self.fill()
            self.batch(n * per_partition)  # its rows, and every path warm: not timed
            self.stream = stream_reader(
                {
                    "kafka.bootstrap.servers": self.bootstrap,
                    "subscribe": self.topic,
                    "startingOffsets": "latest",
                    "txstore.job": self.stream_job,
                    "txstore.databaseUrl": database_url,
                },
                StructType([StructField("topic", StringType()), StructField("offset", LongType())]),
            )
            self.stream_start = self.stream.initialOffset()  # its rows: not timed
        except BaseException:
            self.close()
            raise

    def fill(self) -> None:
        fill(self.producer, self.topic, self.n, self.per_partition)

    def batch(self, expected: int) -> float:
        started = time.monotonic()
        report = self.job.run_batch()
        seconds = time.monotonic() - started
        if report.messages != expected:
            raise RuntimeError(
                f"{self.topic}: a batch counted {report.messages} messages, expected {expected}"
            )
        if any(r.outcome != COMMITTED for r in report.ranges):
            raise RuntimeError(
                f"{self.topic}: a range was not committed: {[r.outcome for r in report.ranges]}"
            )
        return seconds

    def status_seconds(self, job: str) -> float:
        command = [
            sys.executable,
            "-m",
            "txstore.ops.cli",
            "status",
            "--job",
            job,
            "--database-url",
            self.database_url,
            "--bootstrap-servers",
            self.bootstrap,
        ]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"txstore status exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return seconds

    def stream_idle(self) -> float:
        """One idle stream plan: ``latestOffset`` from the log ends, which must answer them."""
        started = time.monotonic()
        end = self.stream.latestOffset(self.stream_start, None)
        seconds = time.monotonic() - started
        if end != self.stream_start:
            raise RuntimeError(f"{self.topic}: an idle stream plan moved: {end} from {self.stream_start}")
        return seconds

    def stream_past_new_messages(self) -> None:
        """Take the idle-plan source past the messages just produced, as Spark would: plan the
        micro-batch (``latestOffset``, then ``partitions``, which saves its plan), then commit it
        (no txstore sink wrote it, so ``txn_offsets`` follows, and the next idle plans start at
        the job's stored offsets: a start past them would be refused)."""
        end = self.stream.latestOffset(self.stream_start, None)
        self.stream.partitions(self.stream_start, end)
        self.stream.commit(end)
        self.stream_start = end

    def round(self, idle_batches: int) -> dict[str, Any]:
        idle = [self.batch(0) for _ in range(idle_batches)]
        stream_idle = [self.stream_idle() for _ in range(idle_batches)]
        self.fill()
        self.stream_past_new_messages()
        warm = self.batch(self.n * self.per_partition)
        status = self.status_seconds(self.job_name)
        stream = self.query.micro_batch()
        stream_warm = float(stream["ms"]["triggerExecution"])
        return {
            "idle_ms": round(statistics.median(idle) * 1000, 2),
            "stream_idle_ms": round(statistics.median(stream_idle) * 1000, 2),
            "warm_ms_per_range": round(warm * 1000 / self.n, 3),
            "warm_batch_ms": round(warm * 1000, 1),
            "status_seconds": round(status, 3),
            "stream_warm_ms_per_range": round(stream_warm / self.n, 3),
            "stream_warm_ms": round(stream_warm, 1),
            "stream_micro_batches": stream["micro_batches"],
            "stream_steps_ms": stream["ms"],
            "stream_status_seconds": round(self.status_seconds(self.query.job_name), 3),
            "load_1min": round(os.getloadavg()[0], 2),
        }

    def close(self) -> None:
        """Stop the stream's planning and the job, and close the producer while Kafka still runs
        (left to the garbage collector, it kept reconnecting to the stopped cluster)."""
        try:
            if self.stream is not None:
                self.stream.stop()
        finally:
            try:
                if self.job is not None:
                    self.job.close()
            finally:
                self.producer.flush(10)
                self.producer.close()


def main(argv: list[str] | None = None, spark: Any = None, kafka: Any = None) -> int:
    """``python -m bench.partitions``. ``spark``: a running session to use (and leave running);
    ``kafka``: a running Apache Kafka (:class:`~txstore.testing.real_kafka.RealKafkaCluster`) to
    create the topics on (default: one started here)."""
    args = parser().parse_args(argv)
    counts = sorted(set(args.partitions))
    if len(counts) < 2:
        raise SystemExit(
            "python -m bench.partitions: give at least two partition counts (--partitions 8,1024)"
        )
    from txstore.testing.real_kafka import RealKafkaCluster, kafka_jars

    started_at = time.monotonic()
    rounds: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(bench_database(args.database_url))
        if kafka is None:
            kafka = stack.enter_context(RealKafkaCluster(kafka_jars()))
        if spark is None:
            spark = local_session(args.master, "txstore bench partitions")
            stack.callback(spark.stop)
        stack.callback(close_idle_consumers)
        warm_up(spark)
        register(spark)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-partitions-")))
        run = f"{os.getpid()}-{secrets.token_hex(3)}"  # this run's topics and jobs
        topics: dict[int, Partitions] = {}
        for n in counts:
            query = RunningQuery(
                spark,
                kafka,
                database_url,
                n,
                args.messages_per_partition,
                workdir,
                args.trigger_seconds,
                run,
            )
            stack.callback(query.close)
            topics[n] = Partitions(spark, kafka, database_url, n, args.messages_per_partition, query, run)
            stack.callback(topics[n].close)
        jobs = {
            str(n): {"job": p.job_name, "stream_plan": p.stream_job, "query": p.query.job_name}
            for n, p in topics.items()
        }
        for r in range(args.rounds):
            order = counts if r % 2 == 0 else counts[::-1]
            measured = {str(n): topics[n].round(args.idle_batches) for n in order}
            rounds.append(measured)
            say(
                f"round {r + 1}: "
                + "; ".join(
                    f"{n} partitions idle {m['idle_ms']:.1f} ms (stream {m['stream_idle_ms']:.1f} ms), warm "
                    f"{m['warm_ms_per_range']:.2f} ms a range (stream {m['stream_warm_ms_per_range']:.2f}), "
                    f"status {m['status_seconds']:.2f} s (stream's job {m['stream_status_seconds']:.2f} s)"
                    for n, m in measured.items()
                )
                + f" (load {os.getloadavg()[0]:.1f})"
            )
    summary = summarize(rounds, counts)
    for n, s in summary["by_partitions"].items():
        say(
            f"{n:>5} partitions: idle batch {s['idle_batch_ms']['median']} ms "
            f"({s['idle_batch_ms']['lowest']}-{s['idle_batch_ms']['highest']}), idle stream plan "
            f"{s['stream_idle_plan_ms']['median']} ms ({s['stream_idle_plan_ms']['lowest']}-"
            f"{s['stream_idle_plan_ms']['highest']}), warm "
            f"{s['warm_ms_per_range']['median']} ms a range ({s['warm_ms_per_range']['lowest']}-"
            f"{s['warm_ms_per_range']['highest']}), warm stream micro-batch "
            f"{s['stream_warm_ms_per_range']['median']} ms a range ({s['stream_warm_ms_per_range']['lowest']}-"
            f"{s['stream_warm_ms_per_range']['highest']}), status {s['status_seconds']['median']} s "
            f"(the stream's job {s['stream_status_seconds']['median']} s), load "
            f"{s['load_1min']['lowest']}-{s['load_1min']['highest']}"
        )
    for target, held in summary["targets"].items():
        say(f"  {'ok    ' if held else 'MISSED'} {target}")
    if args.output:
        document = {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m bench.partitions " + " ".join(argv if argv is not None else sys.argv[1:]),
            "settings": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k != "database_url"
            },
            "machine": machine(),
            "jobs": jobs,
            "seconds": round(time.monotonic() - started_at, 1),
            "summary": summary,
            "rounds": rounds,
        }
        args.output.write_text(json.dumps(document, indent=2) + "\n")
        say(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

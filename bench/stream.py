"""The Structured Streaming path beside the batch per-range count, on the same messages.

``python -m bench.stream [--kafka mock|real] [--messages 400000] [--partitions 4] [--rounds 3]
[--output FILE]``

Produces the messages, then counts them per topic into ``txn_data`` with a new job per run, in
an order that rotates from round to round. ``--kafka mock`` (the default): the test broker, in
its own process (:mod:`bench.broker`), which keeps at most about 5 MiB per partition (400,000
messages over 4 partitions is near its limit; a workload that cannot fit is refused before
anything starts). ``--kafka real``: Apache Kafka (:class:`~txstore.testing.real_kafka.RealKafkaCluster`,
one KRaft node), the messages produced by the race's producer (:func:`bench.race.produce`,
100 keys), with no such limit: millions of messages, so that a micro-batch is long beside
Structured Streaming's fixed steps. The paths:

- ``per-range``: ``count_topic``'s default path, one batch (``run_batch()``), planned before
  the clock (as a running job's batch);
- ``stream-all-columns``: ``readStream.format("txstore")`` -> ``writeStream.format("txstore")``
  with ``Trigger.AvailableNow``, every Kafka-source column built;
- ``stream-topic-column``: the same with ``.schema("topic string, partition int, offset bigint")``
  (the columns the sink needs to check each row against the micro-batch's plan);
- ``stream-counted-by-source``: the same with ``.option("txstore.countMessages",
  "true")``: the source's tasks count their messages and hand Spark one row per range
  (:mod:`txstore.spark.stream.stream_source`), a micro-batch's ranges read in one Spark task per core
  (``txstore.tasks``' default, the parallelism ``register`` measured);
- ``stream-counted-task-per-range``: the same with ``txstore.tasks`` set to the number of
  partitions, a Spark task per range (how the source planned before ``txstore.tasks``).

``--batch-messages N``, running mode: each path is one job or one query that takes the topic
in batches of ``N`` messages (the job's ``max_offsets_per_batch``, the query's
``maxOffsetsPerTrigger``), as a job or query that runs for days does; its first batch is its
warm-up (``first_batch``), its time the median of its later batches. Without it, a new job or
query counts the whole topic in one batch, so a stream's measured micro-batch is always its
query's first. ``--spark-conf KEY=VALUE`` sets Spark settings of the session started here
(e.g. the checkpoint file manager).

Steady state: a round of every path first, not measured (Python workers, consumers, Spark's
code warm); a stream's job has its ``txn_offsets`` rows before the clock, as per-range's
``plan()`` creates its own before its clock and a running stream has after its first micro-batch. A stream's time is its data micro-batch's ``triggerExecution`` (planning the
micro-batch, reading, the sink's commit: Spark's own ``durationMs``); the query's start-up
(the first ``latestOffset``, the checkpoint's files) is reported beside it as ``wall``. Each
stored total is checked against the messages produced. Ratios are per round, their median
reported, and the median of Spark's ``durationMs`` per phase for each stream path (where its
time goes: ``latestOffset`` and ``queryPlanning`` on the driver, ``addBatch`` the tasks and the
sink's commit, ``walCommit`` and ``commitOffsets`` the checkpoint's logs), per-range's
``plan_ms``/``run_ms`` beside them. Every measured run records the peak resident memory of the
driver, the JVM and the Python workers (:class:`bench.memory.PeakMemory`, reset before each
run; the broker's own process left out). The load average is recorded at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.broker import BrokerProcess
from bench.common import bench_database, local_session, machine, positive_count, say, warm_up
from bench.memory import PeakMemory
from bench.race import produce as produce_fast
from bench.workload import Workload, fit_value_bytes, produce
from txstore.core.starting import StartDecision
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.reader import close_idle_consumers
from txstore.postgres import store
from txstore.postgres.db import connect, redact
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.source_format import register

PER_RANGE = "per-range"
STREAM_ALL = "stream-all-columns"
STREAM_TOPIC = "stream-topic-column"
STREAM_COUNTED = "stream-counted-by-source"
STREAM_COUNTED_PER_RANGE = "stream-counted-task-per-range"
PATHS = (PER_RANGE, STREAM_ALL, STREAM_TOPIC, STREAM_COUNTED, STREAM_COUNTED_PER_RANGE)
MOCK = "mock"
REAL = "real"
REAL_KAFKA_KEYS = 100  # the race's default: keys key-000 .. key-099 (the count ignores them)


class StreamRuns:
    def __init__(
        self,
        spark: Any,
        bootstrap: str,
        database_url: str,
        workdir: Path,
        workload: Workload,
        memory: PeakMemory | None = None,
        batch_messages: int | None = None,
    ) -> None:
        self.spark = spark
        self.batch_messages = batch_messages
        self.bootstrap = bootstrap
        self.database_url = database_url
        self.workdir = workdir
        self.workload = workload
        self.memory = memory or PeakMemory()
        self._jobs = 0

    def run(self, path: str) -> dict[str, Any]:
        self._jobs += 1
        name = f"bench-stream-{self._jobs}"
        self.memory.reset()
        result = self._per_range(name) if path == PER_RANGE else self._stream(name, path)
        memory = self.memory.peaks()
        with connect(self.database_url) as conn:
            stored = store.topic_totals(conn, name, [self.workload.topic]).get(self.workload.topic)
        if stored != self.workload.messages:
            raise RuntimeError(f"{path}: stored total {stored}, expected {self.workload.messages}")
        return {"path": path, "messages": self.workload.messages, **result, "memory": memory}

    def _per_range(self, name: str) -> dict[str, Any]:
        settings = JobSettings(
            name,
            (self.workload.topic,),
            self.bootstrap,
            self.database_url,
            max_offsets_per_batch=self.batch_messages,
        )
        job = TransactionalJob(self.spark, settings, count_messages)
        batches: list[float] = []
        profiles: list[dict[str, float]] = []
        try:
            job.plan()
            # One batch, or (--batch-messages) batches until the topic is counted; a batch takes
            # about batch_messages, so more than that many batches and two is a runaway.
            most = 1 if self.batch_messages is None else -(-self.workload.messages // self.batch_messages) + 2
            for _ in range(most):
                started = time.perf_counter()
                report = job.run_batch()
                ms = (time.perf_counter() - started) * 1000
                if not report.ranges:
                    break
                if any(r.outcome != COMMITTED for r in report.ranges):
                    outcomes = [r.outcome for r in report.ranges]
                    raise RuntimeError(f"per-range: a range was not committed: {outcomes}")
                batches.append(ms)
                profiles.append(
                    {
                        "plan_ms": report.plan_ms,
                        "run_ms": report.run_ms,
                        "read_ms_sum": sum(r.read_ms for r in report.ranges),
                        "task_commit_ms_sum": sum(r.commit_ms for r in report.ranges),
                        "ranges": len(report.ranges),
                    }
                )
                if self.batch_messages is None:
                    break
            else:
                raise RuntimeError(f"per-range: the topic was not counted in {most} batches")
        finally:
            job.close()
        measured, first = _measured(batches)
        measured_profiles = _measured(profiles)[0]
        profile = {k: statistics.median(x[k] for x in measured_profiles) for k in profiles[0]}
        return {"batch_ms": statistics.median(measured), "wall_ms": sum(batches), "profile": profile, **first}

    def _stream(self, name: str, path: str) -> dict[str, Any]:
        with connect(self.database_url) as conn:  # the job's offset rows, at the topic's start
            starts = [
                StartDecision(self.workload.topic, p, 0, "bench") for p in range(self.workload.partitions)
            ]
            store.create_start_rows(conn, name, starts)
        reader = self.spark.readStream.format("txstore")
        if path == STREAM_TOPIC:
            reader = reader.schema("topic string, partition int, offset bigint")
        if path in (STREAM_COUNTED, STREAM_COUNTED_PER_RANGE):
            reader = reader.option("txstore.countMessages", "true")
        if path == STREAM_COUNTED_PER_RANGE:
            reader = reader.option("txstore.tasks", str(self.workload.partitions))
        if self.batch_messages is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(self.batch_messages))
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
        data = [p["durationMs"] for p in query.recentProgress if p["numInputRows"] > 0]
        if self.batch_messages is None and len(data) != 1:
            raise RuntimeError(f"{path}: expected one data micro-batch, got {len(data)}")
        measured, first = _measured(data)
        if "first_batch" in first:
            first["first_batch"] = float(first["first_batch"]["triggerExecution"])
        durations = {k: statistics.median(d.get(k, 0) for d in measured) for k in measured[0]}
        batch_ms = statistics.median(float(d["triggerExecution"]) for d in measured)
        return {"batch_ms": batch_ms, "wall_ms": wall_ms, "durations": durations, **first}


def _measured(batches: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """The batches measured, and what to report beside them: a running job's or query's first
    batch is its warm-up, left out (``first_batch``) when there are later ones; a single batch
    is measured as it is (the default, a job or query per batch)."""
    if len(batches) > 1:
        return batches[1:], {"first_batch": batches[0], "batches": len(batches)}
    return batches, {"batches": len(batches)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.stream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--kafka",
        choices=(MOCK, REAL),
        default=MOCK,
        help="mock: the test broker (at most about 5 MiB per partition); real: Apache Kafka, started "
        "here (RealKafkaCluster; its jars fetched by Maven once) (default mock)",
    )
    p.add_argument(
        "--messages", type=positive_count, default=400_000, help="messages produced (default 400000)"
    )
    p.add_argument("--partitions", type=positive_count, default=4, help="partitions of the topic (default 4)")
    p.add_argument("--value-bytes", type=positive_count, default=20, help="message value size (default 20)")
    p.add_argument(
        "--rounds", type=positive_count, default=3, help="measured rounds of every path (default 3)"
    )
    p.add_argument(
        "--batch-messages",
        type=positive_count,
        help="running mode: each path one job or query that counts the topic in batches of this many "
        "messages (the job's --max-offsets-per-batch, the query's maxOffsetsPerTrigger), its first "
        "batch its warm-up, the median of the others its time (default: the whole topic in one "
        "batch, a new job or query per batch)",
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of: " + ", ".join(PATHS))
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session started here, as spark-submit's --conf (repeatable; "
        "e.g. spark.sql.streaming.checkpointFileManagerClass)",
    )
    p.add_argument("--database-url", help="an existing PostgreSQL database (default: a throwaway one)")
    p.add_argument("--output", type=Path, help="write the results as JSON here")
    return p


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The arguments and the paths chosen; a workload the test broker cannot hold is refused here."""
    p = parser()
    args = p.parse_args(argv)
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    unknown = [x for x in paths if x not in PATHS]
    if unknown or not paths:
        p.error(f"unknown path {unknown[0]!r}" if unknown else "--paths: choose at least one")
    bad = [c for c in args.spark_conf if "=" not in c or not c.split("=", 1)[0].strip()]
    if bad:
        p.error(f"--spark-conf {bad[0]!r}: give KEY=VALUE")
    if args.batch_messages is not None and args.batch_messages * 2 > args.messages:
        p.error(
            f"--batch-messages {args.batch_messages}: at least two batches of --messages {args.messages} "
            "are needed (the first is the warm-up)"
        )
    if args.kafka == MOCK:
        fits = fit_value_bytes(args.messages, args.partitions, args.value_bytes, 1.0)
        if fits is None or fits < args.value_bytes:
            p.error(
                f"{args.messages} messages of {args.value_bytes} bytes over {args.partitions} partitions "
                "do not fit the test broker's 5 MiB per partition: use --kafka real (or more partitions)"
            )
    return args, paths


def produce_messages(kafka: str, bootstrap: str, workload: Workload) -> float:
    """Produce the workload (every message checked there afterwards); the seconds it took."""
    if kafka == REAL:
        return produce_fast(
            bootstrap,
            workload.topic,
            workload.messages,
            workload.partitions,
            REAL_KAFKA_KEYS,
            workload.value_bytes,
        )
    return produce(bootstrap, workload)


def main(argv: list[str] | None = None, spark: Any = None, kafka: Any = None) -> int:
    """``python -m bench.stream``. ``spark``: a running session to use (and leave running);
    ``kafka``: a running broker of the ``--kafka`` kind (``bootstrap_servers``, ``create_topic``)
    to use instead of starting one (the tests' session broker)."""
    args, paths = parse(argv)
    started_at = time.monotonic()
    load_before = os.getloadavg()
    own_session = spark is None
    if own_session:
        root = Path(__file__).resolve().parent.parent
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    workload = Workload(
        f"bench-stream-{os.getpid()}-{secrets.token_hex(3)}", args.messages, args.partitions, args.value_bytes
    )
    rounds: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(bench_database(args.database_url))
        if kafka is not None:
            broker = kafka
        elif args.kafka == REAL:
            from txstore.testing.real_kafka import RealKafkaCluster

            broker = stack.enter_context(RealKafkaCluster())
        else:
            broker = stack.enter_context(BrokerProcess())
        version = getattr(broker, "version", None)
        kafka_name = (
            f"Apache Kafka {version}" if args.kafka == REAL else "the test broker (librdkafka's mock)"
        )
        say(f"{kafka_name} {broker.bootstrap_servers}, PostgreSQL {redact(database_url)}")
        broker.create_topic(workload.topic, workload.partitions)
        produce_seconds = produce_messages(args.kafka, broker.bootstrap_servers, workload)
        say(
            f"produced {workload.messages:,} messages to {workload.partitions} partitions "
            f"in {produce_seconds:.1f} s"
        )
        if own_session:
            conf = {"spark.sql.shuffle.partitions": "2", **dict(c.split("=", 1) for c in args.spark_conf)}
            spark = local_session(args.master, "txstore bench stream", conf)
        stack.callback(close_idle_consumers)  # the driver's pooled readers, before their broker goes
        if own_session:
            stack.callback(spark.stop)
        register(spark)
        warm_up(spark)
        broker_pid = getattr(broker, "pid", None)  # real Kafka's JVM: not Spark's
        memory = PeakMemory(exclude={broker_pid} if broker_pid else set())
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="txstore-bench-stream-"))
        runs = StreamRuns(
            spark,
            broker.bootstrap_servers,
            database_url,
            Path(workdir),
            workload,
            memory,
            args.batch_messages,
        )
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
    summary = summarize(paths, rounds, workload, args.batch_messages)
    end = machine()
    say(
        f"\n{workload.messages:,} messages, {workload.partitions} partitions, {kafka_name}, "
        f"{args.master if own_session else spark.sparkContext.master}, medians of {args.rounds}; "
        f"load average {load_before[0]:.1f} at the start, {end['load_average_1_5_15'][0]:.1f} at the end"
    )
    print_summary(summary)
    if args.output:
        document = {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m bench.stream " + " ".join(argv if argv is not None else sys.argv[1:]),
            "settings": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k != "database_url"
            },
            "kafka": kafka_name,
            "master": spark.sparkContext.master if not own_session else args.master,
            "workload": {**vars(workload), "keys": REAL_KAFKA_KEYS if args.kafka == REAL else None},
            "produce_seconds": round(produce_seconds, 1),
            "machine": {**end, "load_average_at_start": [round(x, 2) for x in load_before]},
            "seconds": round(time.monotonic() - started_at, 1),
            "summary": summary,
            "rounds": rounds,
        }
        args.output.write_text(json.dumps(document, indent=2, default=str) + "\n")
        say(f"wrote {args.output}")
    return 0


def summarize(
    paths: list[str],
    rounds: list[dict[str, dict[str, Any]]],
    workload: Workload,
    batch_messages: int | None = None,
) -> dict[str, Any]:
    """Per path: medians over the rounds, the ratio to per-range (per round, then the median),
    Spark's ``durationMs`` per phase (medians), the largest memory peaks."""
    summary: dict[str, Any] = {}
    for path in paths:
        runs = [r[path] for r in rounds]
        batch = statistics.median(x["batch_ms"] for x in runs)
        line: dict[str, Any] = {
            "batch_ms": batch,
            "wall_ms": statistics.median(x["wall_ms"] for x in runs),
            "messages_per_second": (batch_messages or workload.messages) / (batch / 1000),
        }
        firsts = [x["first_batch"] for x in runs if "first_batch" in x]
        if firsts:
            line["first_batch_ms"] = statistics.median(firsts)
        if PER_RANGE in paths and path != PER_RANGE:
            # throughput relative to per-range: per-range's time / this path's, per round
            per_round = [r[PER_RANGE]["batch_ms"] / r[path]["batch_ms"] for r in rounds]
            line["throughput_vs_per_range"] = statistics.median(per_round)
            line["throughput_vs_per_range_rounds"] = per_round
        if path == PER_RANGE:
            line["profile_median"] = {
                k: statistics.median(x["profile"][k] for x in runs) for k in runs[0]["profile"]
            }
        else:
            phases = sorted({k for x in runs for k in x["durations"]})
            line["durations_ms_median"] = {
                k: statistics.median(x["durations"].get(k, 0) for x in runs) for k in phases
            }
        line["memory_peak_mib"] = {
            k: max(x["memory"][k] for x in runs)
            for k in ("python_driver_mib", "jvm_mib", "python_worker_max_mib", "python_worker_sum_mib")
        }
        summary[path] = line
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    for path, line in summary.items():
        text = (
            f"{path:32s} batch {line['batch_ms']:8.0f} ms   wall {line['wall_ms']:8.0f} ms   "
            f"{line['messages_per_second']:>10,.0f} msg/s"
        )
        if "first_batch_ms" in line:
            text += f"   first batch {line['first_batch_ms']:.0f} ms"
        if "throughput_vs_per_range" in line:
            spread = ", ".join(f"{x:.2f}" for x in line["throughput_vs_per_range_rounds"])
            text += f"   {line['throughput_vs_per_range']:.2f}x per-range's throughput ({spread})"
        say(text)
    for path, line in summary.items():
        where = line.get("durations_ms_median") or line.get("profile_median")
        say(f"{path}: medians, ms: {json.dumps(where)}")
        say(f"{path}: memory peaks, MiB: {json.dumps(line['memory_peak_mib'])}")


if __name__ == "__main__":
    sys.exit(main())

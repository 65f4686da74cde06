"""The race: Spark's own Kafka source beside txstore, on a real Kafka broker, over the same messages.

``python -m bench race [--messages 1000000] [--partitions 8] [--keys 100] [--rounds 3]``

Starts Apache Kafka (:class:`~txstore.testing.real_kafka.RealKafkaCluster`), produces
``--messages`` small messages once (keys ``key-NNN`` of ``--keys`` distinct keys, round-robin
over ``--partitions``), then in one SparkSession (``spark.jars``: Spark's Kafka connector,
:mod:`bench.spark_kafka_jars`) reads all of them with each side, for two results: the topic
total and the count per key. Sides, in an order that rotates from round to round:

- ``Spark batch``: ``spark.read.format("kafka")`` from earliest to latest, ``count()`` /
  ``groupBy("key").count()`` collected. Keeps no offsets: a rerun reads everything again.
- ``Spark stream``: ``spark.readStream.format("kafka")`` with ``Trigger.AvailableNow`` and
  ``foreachBatch`` upserting the batch's counts into a PostgreSQL table
  (``INSERT ... ON CONFLICT DO UPDATE SET n = n + EXCLUDED.n``), a fresh checkpoint per run:
  what a user writes without txstore. At-least-once into PostgreSQL: the offsets go to the
  checkpoint after the batch's rows are committed, so a batch replayed after a crash in between
  is added twice.
- ``txstore per-range``: :class:`~txstore.count_topic.CountMessages` (``count_topic``, and
  ``--by key``) in a new :class:`~txstore.job.TransactionalJob`: exactly-once, offsets and
  counts in one PostgreSQL transaction.
- ``txstore DataFrame``: the same counts as a DataFrame aggregate
  (``groupBy("topic").count()`` / ``groupBy("topic", "key").count()``), counts pushed down.
- ``txstore stream``: ``readStream.format("txstore")`` with ``txstore.countMessages`` (the
  source's tasks count their ranges) into ``writeStream.format("txstore")``,
  ``Trigger.AvailableNow``, a new query, job and checkpoint per run, from earliest: exactly-once,
  offsets and counts in one PostgreSQL transaction per micro-batch. The topic total only (a
  stream's per-key counts are the user's own aggregation into a results table, not raced here).

Each timed run starts from an existing SparkSession and ends with the result stored (stream,
txstore) or collected (batch); it includes the side's own setup (the stream's query start and
checkpoint, the job's construction, first planning and offset rows). Before the clock, every
side runs once, untimed, over a small topic of the same shape (the JVM loads and compiles the
connector's code on its first query, txstore's first job compiles its SQL). Every side's result is
checked against the messages produced (a wrong answer voids the race). Ratios (txstore /
Spark, messages per second, and txstore's stream / its per-range job) are taken within a round;
their median is reported with the lowest and highest round, and each timed run records the
1-minute load average when it ended: on 2 cores, other work takes the cores txstore's tasks
would use, so the ratios are read with the load they were taken at.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.common import RESULTS, bench_database, machine, positive_count, say, warm_up
from bench.race_sides import (
    GRAIN_SIDES,
    GRAINS,
    GUARANTEES,
    PER_KEY,
    SIDES,
    SPARK_BATCH,
    SPARK_SIDES,
    SPARK_STREAM,
    STREAM_TABLE,
    TOTAL,
    TX_DATAFRAME,
    TX_PER_RANGE,
    TX_STREAM,
    TXSTORE_SIDES,
    spark_batch,
    spark_stream,
    txstore_job,
    txstore_stream,
)
from bench.spark_kafka_jars import SparkKafkaJars, spark_kafka_jars
from bench.workload import check_all_there
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import close_idle_consumers
from txstore.postgres.db import connect, redact
from txstore.spark.source_format import register
from txstore.testing.real_kafka import RealKafkaCluster

log = logging.getLogger("bench.race")

WARM_UP_MESSAGES = 10_000
_run_numbers = itertools.count(1)  # job and stream-run names, unique in the process


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench race",
        description="Race Spark's own Kafka source (batch and AvailableNow stream) against txstore's "
        "per-range and DataFrame paths on a real Kafka broker, over the same messages.",
    )
    p.add_argument(
        "--messages", type=positive_count, default=1_000_000, help="messages produced (default 1e6)"
    )
    p.add_argument("--partitions", type=positive_count, default=8, help="topic partitions (default 8)")
    p.add_argument("--keys", type=positive_count, default=100, help="distinct message keys (default 100)")
    p.add_argument("--value-bytes", type=positive_count, default=20, help="message value size (default 20)")
    p.add_argument(
        "--rounds", type=positive_count, default=3, help="rounds of every side and result (default 3)"
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument(
        "--warm-up-messages",
        type=int,
        default=WARM_UP_MESSAGES,
        help="messages of the untimed warm-up topic every side reads first (default 10000; 0: none)",
    )
    p.add_argument(
        "--spark-kafka-version",
        help="Spark's Kafka connector version (default: the installed PySpark's, else the newest "
        "release below it on Maven Central)",
    )
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated sides to run (default all)")
    p.add_argument("--grains", default=",".join(GRAINS), help="comma-separated results (default all)")
    p.add_argument("--name", default="race", help="results name: <output-dir>/<name>.json")
    p.add_argument(
        "--output-dir", type=Path, default=RESULTS, help="where results go (default bench/results)"
    )
    p.add_argument("--database-url", help="an existing PostgreSQL database (default: a throwaway one)")
    return p


# -- the messages ------------------------------------------------------------------
def key_of(i: int) -> bytes:
    return b"key-%03d" % i


def produce(bootstrap: str, topic: str, messages: int, partitions: int, keys: int, value_bytes: int) -> float:
    """Message ``i``: key ``key_of(i % keys)``, partition ``i % partitions``."""
    producer = Producer(
        {
            **client_config(bootstrap),
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "none",
            "enable.idempotence": True,
        }
    )
    value = b"v" * value_bytes
    names = [key_of(k) for k in range(keys)]
    started = time.monotonic()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, value, names[i % keys], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(600):
        raise RuntimeError(f"messages to {topic!r} were not delivered")
    elapsed = time.monotonic() - started
    base, extra = divmod(messages, partitions)
    check_all_there(bootstrap, topic, [base + (1 if p < extra else 0) for p in range(partitions)])
    return elapsed


def expected_counts(messages: int, keys: int) -> dict[str, int]:
    base, extra = divmod(messages, keys)
    return {key_of(k).decode(): base + (1 if k < extra else 0) for k in range(keys)}


# -- the race ----------------------------------------------------------------------
def start_spark(master: str, jars: SparkKafkaJars) -> tuple[Any, float]:
    """A session like the benchmark's (bench/run.py), with Spark's Kafka connector on ``spark.jars``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    started = time.monotonic()
    spark = (
        SparkSession.builder.master(master)
        .appName("txstore bench race")
        .config("spark.jars", jars.spark_jars)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    warm_up(spark)
    return spark, time.monotonic() - started


class Race:
    def __init__(self, spark: Any, bootstrap: str, topic: str, database_url: str, workdir: Path) -> None:
        self.spark = spark
        self.bootstrap = bootstrap
        self.topic = topic
        self.database_url = database_url
        self.workdir = workdir

    def run(self, side: str, grain: str) -> tuple[dict[str, int], dict[str, float]]:
        name = f"race-{side}-{grain}-{next(_run_numbers)}".replace(" ", "-")
        if side == SPARK_BATCH:
            return spark_batch(self.spark, self.bootstrap, self.topic, grain), {}
        if side == SPARK_STREAM:
            checkpoint = self.workdir / name
            try:
                return spark_stream(
                    self.spark, self.bootstrap, self.topic, grain, self.database_url, name, checkpoint
                )
            finally:
                shutil.rmtree(checkpoint, ignore_errors=True)
        if side == TX_STREAM:
            checkpoint = self.workdir / name
            try:
                return txstore_stream(
                    self.spark, self.bootstrap, self.topic, self.database_url, name, checkpoint
                )
            finally:
                shutil.rmtree(checkpoint, ignore_errors=True)
        return txstore_job(
            self.spark,
            self.bootstrap,
            self.topic,
            grain,
            self.database_url,
            name,
            dataframe=side == TX_DATAFRAME,
        )

    def timed(self, side: str, grain: str, expected: dict[str, int], messages: int) -> dict[str, Any]:
        started = time.monotonic()
        found, profile = self.run(side, grain)
        wall = time.monotonic() - started
        if found != expected:
            wrong = {k: (found.get(k), expected.get(k)) for k in set(found) | set(expected)}
            wrong = {k: v for k, v in wrong.items() if v[0] != v[1]}
            raise RuntimeError(
                f"{side}, {grain}: wrong result (found, expected): {dict(list(wrong.items())[:5])}"
            )
        return {
            "wall_ms": wall * 1000,
            "messages_per_second": messages / wall,
            "load_1min": round(os.getloadavg()[0], 2),
            **profile,
        }


def race(
    spark: Any,
    bootstrap: str,
    topic: str,
    database_url: str,
    messages: int,
    keys: int,
    rounds: int,
    sides: tuple[str, ...],
    grains: tuple[str, ...],
    warm_up_topic: tuple[str, int] | None = None,
) -> dict[str, Any]:
    expected = {TOTAL: {topic: messages}, PER_KEY: expected_counts(messages, keys)}
    with connect(database_url) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {STREAM_TABLE} (run text, k text, n bigint NOT NULL, PRIMARY KEY (run, k))"
        )
        conn.commit()
    if TX_STREAM in sides:
        register(spark)
    pairs = [(s, g) for g in grains for s in sides if s in GRAIN_SIDES[g]]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        g: {s: [] for s in sides if s in GRAIN_SIDES[g]} for g in grains
    }
    with tempfile.TemporaryDirectory(prefix="txstore-race-") as workdir:
        if warm_up_topic is not None:  # untimed: each side's first run loads and compiles its code
            warm, warm_messages = warm_up_topic
            warm_race = Race(spark, bootstrap, warm, database_url, Path(workdir))
            warm_expected = {TOTAL: {warm: warm_messages}, PER_KEY: expected_counts(warm_messages, keys)}
            for side, grain in pairs:
                warm_race.timed(side, grain, warm_expected[grain], warm_messages)
            say(f"  warmed up every side on {warm_messages:,} messages (not timed)")
        the_race = Race(spark, bootstrap, topic, database_url, Path(workdir))
        for r in range(rounds):
            shift = r % len(pairs)
            for side, grain in pairs[shift:] + pairs[:shift]:
                record = the_race.timed(side, grain, expected[grain], messages)
                runs[grain][side].append(record)
                say(
                    f"  round {r + 1} {grain:8s} {side:18s} {record['wall_ms']:>9,.0f} ms "
                    f"{record['messages_per_second']:>12,.0f} msg/s"
                )
    loads = [x["load_1min"] for g in runs.values() for xs in g.values() for x in xs]
    result: dict[str, Any] = {
        "runs": runs,
        "messages_per_second_median": {},
        "messages_per_second_spread": {},
        "ratios": {},
        "load_1min": {"lowest": min(loads), "highest": max(loads)},
    }
    for grain in grains:
        rates = {s: [x["messages_per_second"] for x in xs] for s, xs in runs[grain].items()}
        result["messages_per_second_median"][grain] = {s: statistics.median(xs) for s, xs in rates.items()}
        result["messages_per_second_spread"][grain] = {s: [min(xs), max(xs)] for s, xs in rates.items()}
        result["ratios"][grain] = {
            f"{ours} / {theirs}": _ratio(rates[ours], rates[theirs])
            for ours, theirs in ratio_pairs(tuple(rates))
        }
    return result


def ratio_pairs(sides: tuple[str, ...]) -> list[tuple[str, str]]:
    """The ratios a race reports among ``sides``: each txstore side against each of Spark's, and
    txstore's stream against its per-range job."""
    pairs = [(ours, theirs) for ours in TXSTORE_SIDES for theirs in SPARK_SIDES]
    pairs.append((TX_STREAM, TX_PER_RANGE))
    return [(a, b) for a, b in pairs if a in sides and b in sides]


def _ratio(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    per_round = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {
        "median": statistics.median(per_round),
        "lowest": min(per_round),
        "highest": max(per_round),
        "rounds": per_round,
    }


def _split(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [c for c in chosen if c not in allowed]
    if unknown or not chosen:
        raise SystemExit(f"--{what}: choose from {', '.join(allowed)} (got {text!r})")
    return chosen


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """``python -m bench race``; ``spark``: a running session with the connector on its class path."""
    from bench.report import write_json

    args = parser().parse_args(argv)
    sides = _split(args.sides, SIDES, "sides")
    grains = _split(args.grains, GRAINS, "grains")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        filename=str(args.output_dir / f"{args.name}.log"),
        filemode="w",
    )
    for noisy in ("py4j", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.monotonic()
    load_before = os.getloadavg()
    jars = spark_kafka_jars(args.spark_kafka_version)
    say(
        f"Spark's Kafka source {jars.version} for PySpark {jars.pyspark_version}: "
        + ", ".join(j.name for j in jars.jars)
    )
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(bench_database(args.database_url))
        kafka = stack.enter_context(RealKafkaCluster())
        topic = f"race-{os.getpid()}"
        kafka.create_topic(topic, args.partitions)
        say(f"Kafka {kafka.version} {kafka.bootstrap_servers}, PostgreSQL {redact(database_url)}")
        produce_seconds = produce(
            kafka.bootstrap_servers, topic, args.messages, args.partitions, args.keys, args.value_bytes
        )
        say(f"produced {args.messages:,} messages to {args.partitions} partitions in {produce_seconds:.1f} s")
        warm: tuple[str, int] | None = None
        if args.warm_up_messages:
            warm = (f"{topic}-warm-up", min(args.messages, args.warm_up_messages))
            kafka.create_topic(warm[0], args.partitions)
            produce(kafka.bootstrap_servers, *warm, args.partitions, args.keys, args.value_bytes)
        own_session = spark is None
        session_seconds = 0.0
        if spark is None:
            spark, session_seconds = start_spark(args.master, jars)
            say(f"Spark {args.master}: session and first Python workers {session_seconds:.1f} s")
        stack.callback(close_idle_consumers)  # before the broker goes (callbacks run last-in first)
        if own_session:
            stack.callback(spark.stop)
        results = race(
            spark,
            kafka.bootstrap_servers,
            topic,
            database_url,
            args.messages,
            args.keys,
            args.rounds,
            sides,
            grains,
            warm,
        )
    document = {
        "name": args.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench race " + " ".join(argv if argv is not None else sys.argv[2:]),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "database_url"
        },
        "machine": {**machine(), "load_average_at_start": [round(x, 2) for x in load_before]},
        "kafka": RealKafkaCluster.__module__ + " (Apache Kafka, one KRaft node)",
        "spark_kafka_connector": {
            "version": jars.version,
            "pyspark": jars.pyspark_version,
            "jars": [j.name for j in jars.jars],
        },
        "session_seconds": round(session_seconds, 1),
        "produce_seconds": round(produce_seconds, 1),
        "guarantees": {s: GUARANTEES[s] for s in sides},
        "seconds": round(time.monotonic() - started, 1),
        **results,
    }
    path = write_json(document, args.output_dir / f"{args.name}.json")
    print_table(document)
    say(f"wrote {path}")
    return 0


def print_table(document: dict[str, Any]) -> None:
    load = document["load_1min"]
    say(
        f"race: {document['settings']['messages']:,} messages, {document['settings']['partitions']} "
        f"partitions, {document['settings']['rounds']} rounds, load average "
        f"{load['lowest']:.1f}-{load['highest']:.1f} (1 min, as the runs ended)"
    )
    for grain, rates in document["messages_per_second_median"].items():
        for side, rate in rates.items():
            low, high = document["messages_per_second_spread"][grain][side]
            say(f"  {grain:8s} {side:18s} {rate:>12,.0f} msg/s (median; {low:,.0f}-{high:,.0f})")
        for name, ratio in document["ratios"][grain].items():
            say(
                f"  {grain:8s} {name:38s} {ratio['median']:.2f} "
                f"(median; {ratio['lowest']:.2f}-{ratio['highest']:.2f})"
            )

"""The race's sides (:mod:`bench.race`): each reads every message of a topic and gives the topic
total or the count per key, Spark's own Kafka source and txstore's paths, and what each
guarantees (:data:`GUARANTEES`)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.spark.ranges.range_task import COMMITTED

TOTAL = "total"
PER_KEY = "per key"
GRAINS = (TOTAL, PER_KEY)
SPARK_BATCH = "Spark batch"
SPARK_STREAM = "Spark stream"
TX_PER_RANGE = "txstore per-range"
TX_DATAFRAME = "txstore DataFrame"
TX_STREAM = "txstore stream"
SIDES = (SPARK_BATCH, SPARK_STREAM, TX_PER_RANGE, TX_DATAFRAME, TX_STREAM)
SPARK_SIDES = (SPARK_BATCH, SPARK_STREAM)
TXSTORE_SIDES = (TX_PER_RANGE, TX_DATAFRAME, TX_STREAM)
GRAIN_SIDES = {TOTAL: SIDES, PER_KEY: tuple(s for s in SIDES if s != TX_STREAM)}
"""The sides that race each result (the stream counts topic totals only)."""
GUARANTEES = {
    SPARK_BATCH: "none kept: no offsets are stored; a rerun reads (and counts) everything again",
    SPARK_STREAM: "at-least-once into PostgreSQL: offsets go to the checkpoint after foreachBatch "
    "commits its rows, so a batch replayed after a crash in between is applied twice",
    TX_PER_RANGE: "exactly-once: offsets and counts in one PostgreSQL transaction",
    TX_DATAFRAME: "exactly-once: offsets and counts in one PostgreSQL transaction",
    TX_STREAM: "exactly-once: offsets and counts in one PostgreSQL transaction per micro-batch",
}
STREAM_TABLE = "bench_race_stream_counts"


def _kafka_reader(reader: Any, bootstrap: str, topic: str) -> Any:
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )


def spark_batch(spark: Any, bootstrap: str, topic: str, grain: str) -> dict[str, int]:
    frame = _kafka_reader(spark.read, bootstrap, topic).option("endingOffsets", "latest").load()
    if grain == TOTAL:
        return {topic: int(frame.count())}
    rows = frame.groupBy("key").count().collect()
    return {bytes(r["key"]).decode(): int(r["count"]) for r in rows}


def spark_stream(
    spark: Any, bootstrap: str, topic: str, grain: str, database_url: str, run: str, checkpoint: Path
) -> tuple[dict[str, int], dict[str, float]]:
    """``readStream`` + ``Trigger.AvailableNow`` + ``foreachBatch`` upserting counts into PostgreSQL;
    what it counted, and where its time went (:func:`query_phases`)."""
    column = "topic" if grain == TOTAL else "CAST(key AS STRING)"

    def write(batch: Any, batch_id: int) -> None:
        rows = batch.selectExpr(f"{column} AS k").groupBy("k").count().collect()
        with connect(database_url) as conn:
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {STREAM_TABLE} (run, k, n) VALUES (%s, %s, %s) "
                    f"ON CONFLICT (run, k) DO UPDATE SET n = {STREAM_TABLE}.n + EXCLUDED.n",
                    [(run, r["k"], int(r["count"])) for r in rows],
                )
            conn.commit()

    started = time.time()
    query = (
        _kafka_reader(spark.readStream, bootstrap, topic)
        .load()
        .writeStream.foreachBatch(write)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    returned = time.time()
    query.awaitTermination()
    ended = time.time()
    if query.exception() is not None:
        raise RuntimeError(f"Spark stream failed: {query.exception()}")
    with connect(database_url) as conn:
        found = conn.execute(f"SELECT k, n FROM {STREAM_TABLE} WHERE run = %s", (run,)).fetchall()
    return {k: int(n) for k, n in found}, query_phases(query.recentProgress, started, returned, ended)


def query_phases(
    progress: list[dict[str, Any]], started: float, returned: float, ended: float
) -> dict[str, float]:
    """Where a one-shot query's time went, in ms: ``start_ms`` (building it and ``start()``, from
    ``started`` to ``returned``), ``to_first_trigger_ms`` (from ``start()`` returning to its first
    micro-batch's start, Spark's ``timestamp``: the query's start before any data is asked; a
    few ms below 0 if Spark starts it before ``start()`` has returned to Python),
    ``after_last_trigger_ms`` (from its last micro-batch's end to ``awaitTermination`` returning,
    ``ended``), and Spark's ``durationMs`` phases summed over its micro-batches (``progress``).
    Times are the machine's clock (``time.time``), as Spark's timestamps are."""
    phases: dict[str, float] = {}
    for p in progress:
        for phase, ms in p["durationMs"].items():
            phases[f"{phase}_ms"] = phases.get(f"{phase}_ms", 0.0) + float(ms)
    phases["micro_batches"] = float(len(progress))
    phases["start_ms"] = (returned - started) * 1000
    if progress:
        first = _spark_time(progress[0]["timestamp"])
        last = progress[-1]
        last_end = _spark_time(last["timestamp"]) + last["durationMs"]["triggerExecution"] / 1000
        phases["to_first_trigger_ms"] = (first - returned) * 1000
        phases["after_last_trigger_ms"] = (ended - last_end) * 1000
    return phases


def _spark_time(timestamp: str) -> float:
    """A progress ``timestamp`` (UTC, ``...Z``; Python 3.10's ``fromisoformat`` takes no ``Z``)."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def topic_totals(frame: Any) -> Any:
    return frame.groupBy("topic").count().selectExpr("topic", "`count` AS metric")


def key_counts(frame: Any) -> Any:
    return frame.groupBy("topic", "key").count().selectExpr("topic", "key", "`count` AS metric")


def txstore_job(
    spark: Any, bootstrap: str, topic: str, grain: str, database_url: str, job: str, dataframe: bool
) -> tuple[dict[str, int], dict[str, float]]:
    settings = JobSettings(job, (topic,), bootstrap, database_url)
    if dataframe:
        aggregate = topic_totals if grain == TOTAL else key_counts
        tx = TransactionalJob(spark, settings, dataframe_aggregate=aggregate)
    else:
        tx = TransactionalJob(spark, settings, CountMessages(by_key=grain == PER_KEY))
    try:
        report = tx.run_batch()
    finally:
        tx.close()
    if any(r.outcome != COMMITTED for r in report.ranges):
        raise RuntimeError(f"{job}: a range was not committed: {[r.outcome for r in report.ranges]}")
    want = "topic" if grain == TOTAL else "key"
    with connect(database_url) as conn:
        found = conn.execute(
            "SELECT topic, key, metric FROM txn_data WHERE job = %s AND grain = %s", (job, want)
        ).fetchall()
    result = {(t if grain == TOTAL else k): int(m) for t, k, m in found}
    profile = {
        "plan_ms": report.plan_ms,
        "run_ms": report.run_ms,
        "commit_ms": report.commit_ms,
        "read_ms_sum": sum(r.read_ms for r in report.ranges),
        "task_commit_ms_sum": sum(r.commit_ms for r in report.ranges),
        "ranges": len(report.ranges),
    }
    return result, profile


def txstore_stream(
    spark: Any, bootstrap: str, topic: str, database_url: str, job: str, checkpoint: Path
) -> tuple[dict[str, int], dict[str, float]]:
    """A new txstore stream (source counting its ranges, txstore sink), ``Trigger.AvailableNow``
    from earliest; its topic total, and where its time went (:func:`query_phases`)."""
    started = time.time()
    frame = (
        spark.readStream.format("txstore")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("txstore.countMessages", "true")
        .option("txstore.job", job)
        .option("txstore.databaseUrl", database_url)
        .load()
    )
    query = (
        frame.writeStream.format("txstore")
        .option("txstore.job", job)
        .option("txstore.databaseUrl", database_url)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    returned = time.time()
    query.awaitTermination(600)
    ended = time.time()
    if query.isActive or query.exception() is not None:
        query.stop()
        raise RuntimeError(f"{job}: the txstore stream did not finish: {query.exception()}")
    with connect(database_url) as conn:
        found = {t: int(n) for t, n in store.topic_totals(conn, job, [topic]).items()}
    return found, query_phases(query.recentProgress, started, returned, ended)

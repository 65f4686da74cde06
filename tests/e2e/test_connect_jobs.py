"""One code path: the core of the count_topic suite on classic Spark and on Spark Connect.

Every test here takes ``any_spark``, so it runs twice: on the classic
``local[2,4]`` session and on a client of a local Spark Connect server
(``sc://``, no ``sparkContext``, no RDDs). The subset is one test per way a
batch runs (per-range, per-key+window, per-batch with more tasks than
partitions, the idempotent sink, outbox publishing, a DataFrame aggregate)
plus a Spark task failing (its Python error's one line must survive Connect's
error transport) and one job process started with ``SPARK_REMOTE``: enough to show each
Spark-facing path works on both, while the rest of the suite (failure
injection, gaps, retries, bad messages) runs on classic only, because the
Spark-facing code is the same and the Connect server costs ~25 s to start
and slows each batch on this machine. The thin client (``pyspark-client``,
no JVM) runs a job process against the server under ``./dev lowest``,
which builds that interpreter.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections import Counter
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from tests.chaos.procs import server_python_workers
from tests.conftest import send
from tests.e2e.test_aggregates import MINUTE, expected, keyed_messages, settings, stored
from tests.helpers.counting import BrokerDb
from tests.helpers.job_processes import (
    JOB,
    count_topic_args,
    job_env,
    kill_group,
    run_job,
    start_job,
    wait_for,
)
from tests.helpers.recreated import NEW_TS, OLD_TS, fill, mismatch_line
from tests.postgres.test_idempotent_and_outbox import read_topic, stored_messages
from tests.postgres.test_sink import snapshot
from txstore.core.errors import BatchFailed
from txstore.core.ranges import OffsetRange, split_ranges
from txstore.core.results import GRAIN_KEY, GRAIN_KEY_WINDOW, ResultKey
from txstore.count_topic import CountMessages, count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.postgres.outbox import pending_count
from txstore.spark.ranges.deltas import dataframe_deltas
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.ranges.tasks import default_parallelism, read_ranges, run_ranges, task_groups
from txstore.spark.runtime.sessions import is_connect

pytestmark = pytest.mark.spark


def test_each_task_group_runs_in_its_own_partition_exactly_once(any_spark: Any) -> None:
    def echo(ranges: Any) -> Any:  # each range with the Spark partition it ran in
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        return [(r, context.partitionId()) for r in ranges]

    assert default_parallelism(any_spark) == 2  # local[2,4]: two cores, on both
    assert is_connect(any_spark) == (type(any_spark).__module__ != "pyspark.sql.session")
    # 2 cores: 4 ranges are a group each, 9 ranges two groups of neighbours.
    for n, expected_groups in ((4, 4), (9, 2)):
        ranges = [OffsetRange("t", p, 0, 10 * (p + 1)) for p in range(n)]
        reports = run_ranges(any_spark, ranges, echo, "txstore test echo")
        # Outputs come back in range order, each range exactly once.
        assert [r for r, _ in reports] == ranges
        groups = task_groups(ranges, 2)
        assert len(groups) == expected_groups
        # Group i ran in partition i (spark.range(n, numPartitions=n) puts id i alone in
        # partition i), and nothing coalesced or split the partitions.
        group_of = {r: i for i, group in enumerate(groups) for r in group}
        assert [p for _, p in reports] == [group_of[r] for r in ranges]


def test_per_range_counts_are_exact_over_several_runs(any_spark: Any, broker_db: BrokerDb) -> None:
    topic = broker_db.new_topic(4)
    produced = 0
    for counts in ({0: 300, 1: 200, 2: 100, 3: 1}, {1: 50}):
        broker_db.produce(topic, counts)
        produced += sum(counts.values())
        s = JobSettings("count_topic", (topic,), broker_db.kafka.bootstrap_servers, broker_db.database_url)
        with TransactionalJob(any_spark, s, count_messages) as job:
            report = job.run_batch()
        assert report.messages == sum(counts.values())
        assert {r.outcome for r in report.ranges} == {COMMITTED}
        broker_db.assert_counted_exactly(topic, produced)


@pytest.mark.parametrize("commit", ["per-range", "per-batch"])
def test_per_key_and_window_counts_are_exact(any_spark: Any, broker_db: BrokerDb, commit: str) -> None:
    topic = broker_db.new_topic(2)
    messages = keyed_messages(random.Random(11), 1_000, 2)
    send(broker_db.kafka.bootstrap_servers, topic, messages)
    more = {"min_partitions": 5} if commit == "per-batch" else {}
    s = settings(broker_db.kafka, broker_db.database_url, "both", topic, commit=commit, **more)
    with TransactionalJob(any_spark, s, CountMessages(by_key=True, window_ms=MINUTE)) as job:
        report = job.run_batch()
    assert {r.outcome for r in report.ranges} == {COMMITTED}
    if commit == "per-batch":
        assert len(split_ranges([r.range for r in report.ranges], 5)) >= 5
    assert stored(broker_db.db, "both", topic) == expected(messages, True, MINUTE)
    assert broker_db.offsets(topic, "both") == broker_db.log_ends(topic)


def test_the_idempotent_sink_stores_every_message_once(any_spark: Any, broker_db: BrokerDb) -> None:
    topic, db = broker_db.new_topic(2), broker_db.db
    outgoing = [(0, b"a", b"1", None), (1, None, b"\x00\x81", None), (0, b"a", None, None)]
    send(broker_db.kafka.bootstrap_servers, topic, outgoing)
    s = JobSettings(
        "copy", (topic,), broker_db.kafka.bootstrap_servers, broker_db.database_url, sink="idempotent"
    )
    for _ in range(2):  # the second time after a forced replay: nothing changes
        with TransactionalJob(any_spark, s) as job:
            assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
        db.execute("UPDATE txn_offsets SET off = 0 WHERE job = 'copy'")
    rows = stored_messages(db, "copy")
    assert Counter((p, k, v) for _, p, _, k, v in rows) == Counter((p, k, v) for p, k, v, _ in outgoing)


def test_committed_results_are_published_through_the_outbox(any_spark: Any, broker_db: BrokerDb) -> None:
    kafka, db = broker_db.kafka, broker_db.db
    topic, results = broker_db.new_topic(3), broker_db.new_topic(1, prefix="results")
    send(kafka.bootstrap_servers, topic, [(p, b"k", b"v", None) for p in (0, 1, 2) for _ in range(20)])
    s = JobSettings("pub", (topic,), kafka.bootstrap_servers, broker_db.database_url, publish_topic=results)
    # Closing the job flushes and closes the outbox's producers (close_producers).
    with TransactionalJob(any_spark, s, CountMessages(by_key=True)) as job:
        job.run_batch()
    assert pending_count(db, "pub") == 0
    keys = {r[0] for r in db.execute("SELECT dedup_key FROM txn_outbox WHERE job = 'pub'").fetchall()}
    assert len(keys) == 3
    assert {(m.key() or b"").decode() for m in read_topic(kafka, results)} == keys


@pytest.mark.parametrize("read_columns", [None, ("timestamp", "key", "topic")])
def test_a_dataframe_aggregate_commits_exact_counts(
    any_spark: Any, broker_db: BrokerDb, read_columns: tuple[str, ...] | None
) -> None:
    topic = broker_db.new_topic(3)
    messages = keyed_messages(random.Random(8), 600, 3)
    send(broker_db.kafka.bootstrap_servers, topic, messages)

    def per_key_and_minute(frame: Any) -> Any:
        # SQL text, not pyspark.sql.functions: those choose classic or Connect by the environment
        # (SPARK_CONNECT_MODE_ENABLED), and this process runs both kinds of session.
        return (
            frame.selectExpr("topic", "key", "window(timestamp, '1 minute').start AS window_start")
            .groupBy("topic", "key", "window_start")
            .count()
            .withColumnRenamed("count", "metric")
        )

    s = settings(broker_db.kafka, broker_db.database_url, "frames", topic)
    with TransactionalJob(
        any_spark, s, dataframe_aggregate=per_key_and_minute, read_columns=read_columns
    ) as job:
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
        # None: the columns its optimized plan uses (txstore.spark.source.used_columns), in the source's order.
        assert job.read_columns == (read_columns or ("key", "topic", "timestamp"))
    want = expected(messages, True, MINUTE)
    del want[("topic", None, None)]  # this aggregate keeps no topic total
    assert stored(broker_db.db, "frames", topic) == want
    assert broker_db.offsets(topic, "frames") == broker_db.log_ends(topic)
    assert read_ranges(any_spark, [], {"bootstrap.servers": broker_db.kafka.bootstrap_servers}).count() == 0


def test_collected_deltas_keep_keys_windows_grains_and_exact_sums_from_every_partition(
    any_spark: Any,
) -> None:
    # Duplicate addresses in different partitions, sums past BIGINT and DECIMAL(38, 10), binary
    # and NULL keys, TIMESTAMP and TIMESTAMP_NTZ windows, an explicit grain column.
    windowed = any_spark.sql(
        """SELECT * FROM VALUES
          ('t', X'6B31', TIMESTAMP '2026-01-01 00:01:00Z', 4611686018427387904),
          ('t', X'6B31', TIMESTAMP '2026-01-01 00:01:00Z', 4611686018427387904),
          ('t', X'6B32', TIMESTAMP '2026-01-01 00:02:00Z', 1),
          ('u', CAST(NULL AS BINARY), TIMESTAMP '2026-01-01 00:01:00Z', 2)
        AS v(topic, key, window_start, metric)"""
    ).repartition(3)
    assert dataframe_deltas(windowed) == {
        ("t", ResultKey(GRAIN_KEY_WINDOW, "k1", datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc))): 2**63,
        ("t", ResultKey(GRAIN_KEY_WINDOW, "k2", datetime(2026, 1, 1, 0, 2, tzinfo=timezone.utc))): 1,
        ("u", ResultKey(GRAIN_KEY_WINDOW, None, datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc))): 2,
    }
    graded = any_spark.sql(
        """SELECT * FROM VALUES
          ('t', 'key', 'a', TIMESTAMP_NTZ '2026-01-01 00:03:00', CAST(0.1 AS DECIMAL(38, 10))),
          ('t', 'key', 'a', TIMESTAMP_NTZ '2026-01-01 00:03:00', CAST(0.2 AS DECIMAL(38, 10))),
          ('t', CAST(NULL AS STRING), CAST(NULL AS STRING), CAST(NULL AS TIMESTAMP_NTZ),
           CAST(99999999999999999999999999.9999999999 AS DECIMAL(38, 10))),
          ('t', CAST(NULL AS STRING), CAST(NULL AS STRING), CAST(NULL AS TIMESTAMP_NTZ),
           CAST(0.0000000001 AS DECIMAL(38, 10)))
        AS v(topic, grain, key, window_start, metric)"""
    ).repartition(2)
    assert dataframe_deltas(graded) == {
        ("t", ResultKey(GRAIN_KEY, "a", datetime(2026, 1, 1, 0, 3, tzinfo=timezone.utc))): Decimal("0.3"),
        ("t", ResultKey(GRAIN_KEY_WINDOW, None, None)): Decimal("100000000000000000000000000"),
    }
    assert dataframe_deltas(windowed.limit(0)) == {}


@pytest.mark.connect
def test_a_job_process_with_spark_remote_counts_exactly(
    spark_connect_server: Any, broker_db: BrokerDb
) -> None:
    topic = broker_db.new_topic(3)
    broker_db.produce(topic, {0: 100, 1: 70, 2: 5})
    result = run_job(
        *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--once"),
        env=job_env(SPARK_REMOTE=spark_connect_server.url),
    )
    assert result.returncode == 0, result.stderr
    broker_db.assert_counted_exactly(topic, 175)


@pytest.mark.connect
def test_a_running_job_on_spark_connect_counts_each_batch_in_one_session_without_more_python_workers(
    spark_connect_server: Any, broker_db: BrokerDb
) -> None:
    """A job with ``--interval`` and ``SPARK_REMOTE`` keeps one Connect session for all its
    batches. Spark's Connect server (PySpark 4.3) keeps the Python workers of every session it
    had until it stops (SPARK-54055): a job process per batch leaves some on the server each
    run (docs/how-to/connect.md); a running job's later batches reuse the workers its first two
    started (those forked by the server's ``pyspark.daemon`` processes)."""
    topic = broker_db.new_topic(3)
    job = start_job(
        *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--interval", "0.5"),
        env=job_env(SPARK_REMOTE=spark_connect_server.url),
    )
    try:
        produced, workers = 0, []
        for _ in range(6):
            broker_db.produce(topic, {0: 10, 1: 7, 2: 5})
            produced += 22
            counted = wait_for(
                lambda total=produced: broker_db.totals(topic) == {topic: total} or job.poll() is not None,
                120,
            )
            assert counted and job.poll() is None, (broker_db.totals(topic), produced, job.poll())
            workers.append(len(server_python_workers(spark_connect_server.process.pid)))
        assert workers[1] > 0 and max(workers[2:]) <= workers[1], workers
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        assert job.returncode == 0, err
    finally:
        kill_group(job)
    broker_db.assert_counted_exactly(topic, produced)


THIN_CLIENT_PYTHON = os.environ.get("TXSTORE_THIN_CLIENT_PYTHON")


@pytest.mark.connect
@pytest.mark.skipif(
    not THIN_CLIENT_PYTHON,
    reason="needs TXSTORE_THIN_CLIENT_PYTHON, a Python with pyspark-client instead of pyspark: "
    "./dev lowest builds one (.venv-thin) and runs this test",
)
def test_a_thin_pyspark_client_runs_a_job_against_a_connect_server(
    spark_connect_server: Any, broker_db: BrokerDb
) -> None:
    """``pip install pyspark-client`` (no JVM, no jars): the job's txstore reaches the server's
    Python workers as an artifact (``addArtifacts``), as the README says."""
    assert THIN_CLIENT_PYTHON is not None
    probe = (
        "import importlib.metadata as m, pathlib, pyspark; "
        "print(m.version('pyspark-client'), (pathlib.Path(pyspark.__file__).parent / 'jars').is_dir())"
    )
    thin = subprocess.run([THIN_CLIENT_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
    assert thin.returncode == 0 and thin.stdout.split()[1] == "False", thin.stdout + thin.stderr
    topic = broker_db.new_topic(3)
    broker_db.produce(topic, {0: 100, 1: 70, 2: 5})
    env = {k: v for k, v in job_env().items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    result = subprocess.run(
        [
            THIN_CLIENT_PYTHON,
            JOB,
            *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--once"),
        ],
        env={**env, "SPARK_REMOTE": spark_connect_server.url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    broker_db.assert_counted_exactly(topic, 175)


def test_a_failing_spark_task_stops_the_batch_with_its_one_line(any_spark: Any, broker_db: BrokerDb) -> None:
    """A recreated topic fails the DataFrame's reader task; the Python error's line is the batch's."""
    kafka, db, topic = broker_db.kafka, broker_db.db, broker_db.new_topic(1)
    fill(kafka, topic, 5, 1, b"old", OLD_TS)
    settings = JobSettings("count_topic", (topic,), kafka.bootstrap_servers, broker_db.database_url)
    TransactionalJob(any_spark, settings, count_messages).run()
    kafka.recreate_topic(topic, 1)
    fill(kafka, topic, 8, 1, b"new", NEW_TS)
    before = snapshot(db)

    def total(frame: Any) -> Any:
        return frame.groupBy("topic").count().withColumnRenamed("count", "metric")

    with pytest.raises(BatchFailed) as raised:
        TransactionalJob(any_spark, settings, dataframe_aggregate=total).run()
    assert str(raised.value) == (
        f"job 'count_topic' batch 1 failed: TopicRecreated: {mismatch_line('count_topic', topic, 0, 4)}"
    )
    assert not raised.value.transient
    assert snapshot(db) == before

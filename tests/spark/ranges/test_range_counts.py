"""A DataFrame job's report gives each range's messages as its reading tasks counted them.

Offsets are not messages: each committed transaction leaves a marker that takes an offset
(the mock broker writes them too), so a range's offset span overstates its messages. The
tasks hand their counts back (``txstore.spark.ranges.range_counts``): through an accumulator on
classic Spark, as observed marker rows under Spark Connect. What could make that report
wrong: a task retried after it counted, a query reading the frame twice, two jobs in one
process sharing the accumulator, a query that stops reading early, a tuple of pieces in
the wrong range. Real Spark, PostgreSQL and the mock broker; the pure parts without servers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from tests.conftest import produce_in_transactions, send
from tests.helpers.counting import BrokerDb, Counting
from txstore import ResultsTable, TransactionalJob
from txstore.core.ranges import OffsetRange
from txstore.job import JobSettings
from txstore.settings import PER_BATCH
from txstore.spark.ranges.range_counts import (
    MARKER,
    CountChannel,
    _PieceCounts,
    observations_merge,
    range_messages,
)
from txstore.spark.ranges.range_task import COMMITTED
from txstore.spark.runtime.sessions import is_connect
from txstore.spark.source.arrow import arrow_schema
from txstore.testing.mock_kafka import MockKafkaCluster

# -- without servers ------------------------------------------------------------------------


def test_a_range_is_the_sum_of_its_pieces_and_left_out_while_one_is_missing() -> None:
    ranges = [OffsetRange("t", 0, 0, 30), OffsetRange("t", 1, 10, 20), OffsetRange("u", 0, 5, 5)]
    expected = [("t", 0, 0, 10), ("t", 0, 10, 30), ("t", 1, 10, 20), ("t", 2, 0, 9)]
    reported = {("t", 0, 0, 10): 7, ("t", 0, 10, 30): 12, ("t", 2, 0, 9): 9, ("t", 1, 0, 10): 10}
    # t/1's only piece was not reported (one for offsets before the range does not count);
    # u/0 has no piece to read: no messages.
    assert range_messages(ranges, expected, reported) == {("t", 0): 19, ("u", 0): 0}
    reported[("t", 1, 10, 20)] = 4
    assert range_messages(ranges, expected, reported) == {("t", 0): 19, ("t", 1): 4, ("u", 0): 0}


def test_a_piece_reported_again_replaces_itself_and_tokens_stay_apart() -> None:
    param = _PieceCounts()
    value = param.zero({})
    value = param.addInPlace(value, {"a": {("t", 0, 0, 10): 7}})
    value = param.addInPlace(value, {"a": {("t", 0, 0, 10): 7, ("t", 1, 0, 4): 4}, "b": {("t", 0, 0, 10): 7}})
    assert value == {"a": {("t", 0, 0, 10): 7, ("t", 1, 0, 4): 4}, "b": {("t", 0, 0, 10): 7}}


def _batches(schema: pa.Schema, rows: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pylist(
        [{"topic": "t", "partition": 0, "offset": i, "value": b"v"} for i in range(rows)], schema=schema
    )


def test_under_connect_a_task_hands_spark_its_messages_then_one_marker_row_per_piece_it_read() -> None:
    schema = arrow_schema(["topic", "partition", "offset", "value"])  # topic, partition, offset: not null
    pieces = {OffsetRange("t", 0, 0, 5): 3, OffsetRange("t", 0, 5, 9): 0}
    out = list(CountChannel("x").handed_back(_batches(schema, 3), schema, pieces))
    assert [b.schema.names for b in out] == [[*schema.names, MARKER]] * 2
    assert all(b.schema == out[0].schema for b in out)  # one Arrow stream, one schema
    messages, markers = out
    assert messages.column(MARKER).null_count == 3
    assert markers.column(MARKER).to_pylist() == [
        {"topic": "t", "partition": 0, "from_offset": 0, "until_offset": 5, "messages": 3},
        {"topic": "t", "partition": 0, "from_offset": 5, "until_offset": 9, "messages": 0},
    ]
    # The marker rows keep the columns Spark was told are never null, with zeros there.
    assert (
        markers.select(["topic", "partition", "offset"]).to_pylist()
        == [{"topic": "", "partition": 0, "offset": 0}] * 2
    )
    assert markers.column("value").null_count == 2


def test_a_task_that_stops_early_reports_nothing() -> None:
    schema = arrow_schema(["topic", "partition", "offset", "value"])
    handed = CountChannel("x").handed_back(_batches(schema, 3), schema, {OffsetRange("t", 0, 0, 5): 3})
    next(handed)
    handed.close()  # Spark stopped pulling (a limit): no marker row comes
    assert list(handed) == []


# -- real Spark, PostgreSQL and the mock broker ---------------------------------------------


def per_topic(frame: Any) -> Any:
    return frame.groupBy("topic").count().selectExpr("topic", "`count` AS metric")


def retried(frame: Any) -> Any:
    """count_topic's totals, computed where each task's first attempt fails after the reading
    task has counted every message (so its counts reach Spark with a failed attempt)."""

    def flaky(batches: Iterator[Any]) -> Iterator[Any]:  # nested: pickled by value, like a user's
        from pyspark import TaskContext

        held = list(batches)
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            raise RuntimeError("txstore test: a task's first attempt fails after reading everything")
        yield from held

    return per_topic(frame.select("topic").mapInArrow(flaky, "topic string"))


QUERIES: dict[str, tuple[Callable[[Any], Any], int]] = {
    # the query, and how many times it counts each message
    "a task retried after it counted": (retried, 1),
    "the frame read twice": (lambda frame: per_topic(frame.unionByName(frame)), 2),
}


def dataframe_job(spark: Any, kafka: MockKafkaCluster, url: str, topic: str, job: str, query: Any) -> Any:
    settings = JobSettings(job, (topic,), kafka.bootstrap_servers, url, commit=PER_BATCH)
    return TransactionalJob(spark, settings, dataframe_aggregate=query, push_down_counts=False)


@pytest.mark.spark
@pytest.mark.parametrize("case", list(QUERIES))
def test_each_range_reports_its_messages_once_whatever_the_query_does(
    any_spark: Any, broker_db: BrokerDb, case: str
) -> None:
    query, times = QUERIES[case]
    topic = broker_db.new_topic(2)
    produce_in_transactions(
        broker_db.kafka.bootstrap_servers, topic, transactions=4, per_transaction=6, partitions=2
    )
    ends = broker_db.log_ends(topic)
    assert ends == {0: 16, 1: 16}  # 12 messages and 4 markers each
    report = dataframe_job(
        any_spark, broker_db.kafka, broker_db.database_url, topic, "twice", query
    ).run_batch()
    # A Spark Connect client older than PySpark 4.2 cannot send one observation in two branches
    # of a plan: there nothing is observed (the query still runs) and the spans are reported.
    messages = 12 if not is_connect(any_spark) or observations_merge() else 16
    assert [(r.range.partition, r.range.size, r.messages) for r in report.ranges] == [
        (0, 16, messages),
        (1, 16, messages),
    ]
    assert broker_db.totals(topic, job="twice") == {topic: 24 * times}
    assert broker_db.offsets(topic, "twice") == ends


@pytest.mark.spark
def test_a_query_that_stops_reading_early_reports_the_offsets_it_passed(counting: Counting) -> None:
    topic = counting.new_topic(1)
    produce_in_transactions(
        counting.kafka.bootstrap_servers, topic, transactions=4, per_transaction=5, partitions=1
    )
    report = dataframe_job(
        counting.spark, counting.kafka, counting.database_url, topic, "early", lambda f: per_topic(f.limit(3))
    ).run_batch()
    assert counting.totals(topic, job="early") == {topic: 3}
    assert [(r.range.size, r.messages) for r in report.ranges] == [(24, 24)]  # no task read it all


@pytest.mark.spark
def test_two_jobs_in_one_process_each_report_their_own_messages_batch_after_batch(counting: Counting) -> None:
    """Both jobs' tasks hand counts to the one accumulator of the SparkContext at once."""
    topics = {"left": counting.new_topic(2), "right": counting.new_topic(3)}
    reports: dict[str, list[list[tuple[int, int]]]] = {job: [] for job in topics}
    errors: list[BaseException] = []

    def run(job: str, batches: int) -> None:
        try:
            for n in range(batches):
                produce_in_transactions(
                    counting.kafka.bootstrap_servers,
                    topics[job],
                    transactions=2,
                    per_transaction=6 + n,
                    partitions=2,
                )
                report = dataframe_job(
                    counting.spark, counting.kafka, counting.database_url, topics[job], job, per_topic
                ).run_batch()
                reports[job].append([(r.range.partition, r.messages) for r in report.ranges])
        except BaseException as e:  # re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(job, 3)) for job in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    # Batch n: 2 transactions of 6 + n messages over partitions 0 and 1 (a 3-partition topic's
    # third partition gets none: no range).
    for job in topics:
        assert reports[job] == [[(0, 6), (1, 6)], [(0, 8), (1, 6)], [(0, 8), (1, 8)]], job
        assert counting.totals(topics[job], job=job) == {topics[job]: 12 + 14 + 16}


@pytest.mark.spark
def test_a_results_table_reports_its_skipped_messages_among_the_messages_it_read(
    any_spark: Any,
    kafka: MockKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_topic: Callable[..., str],
) -> None:
    """``--on-bad-message skip``: the messages are the range's, the skipped ones among them."""
    db.execute("CREATE TABLE words (word text PRIMARY KEY, n bigint NOT NULL)")
    db.commit()
    topic = new_topic(1)
    produce_in_transactions(kafka.bootstrap_servers, topic, transactions=3, per_transaction=4, partitions=1)
    send(kafka.bootstrap_servers, topic, [(0, None, b"bad\x00word", None), (0, None, b"x", None)])
    settings = JobSettings(
        "words", (topic,), kafka.bootstrap_servers, database_url, commit=PER_BATCH, on_bad_message="skip"
    )
    table = ResultsTable("words", ("word",), (("n", "sum"),))
    job = TransactionalJob(
        any_spark,
        settings,
        dataframe_aggregate=lambda f: f.selectExpr("CAST(value AS STRING) AS word", "CAST(1 AS BIGINT) AS n"),
        results_table=table,
    )
    report = job.run_batch()
    assert [(r.outcome, r.range.size, r.messages, r.skipped) for r in report.ranges] == [
        (COMMITTED, 17, 14, 1)
    ]
    assert dict(db.execute("SELECT word, n FROM words").fetchall()) == {"x": 13}

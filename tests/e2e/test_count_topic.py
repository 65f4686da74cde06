"""count_topic end to end: real Spark (local[2,4]), real PostgreSQL, the Kafka-protocol broker."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from tests.conftest import produce_in_transactions
from tests.helpers.counting import Counting, spark_job_count
from txstore.core.errors import BatchFailed
from txstore.core.ranges import OffsetRange
from txstore.core.starting import parse_starting_offsets
from txstore.count_topic import count_messages
from txstore.job import BatchReport, TransactionalJob
from txstore.kafka.client import fetch_watermarks
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED

pytestmark = pytest.mark.spark


def test_counts_equal_messages_produced_over_several_runs(any_counting: Counting) -> None:
    topic = any_counting.new_topic(4)
    produced = 0
    for run, counts in enumerate([{0: 300, 1: 200, 2: 100, 3: 1}, {1: 50}, {0: 7, 3: 700}]):
        any_counting.produce(topic, counts)
        produced += sum(counts.values())
        report = any_counting.job(topic).run_batch()
        assert report.messages == sum(counts.values()), f"run {run}"
        assert {r.range.partition for r in report.ranges} == set(counts)
        assert all(r.outcome == COMMITTED for r in report.ranges)
        any_counting.assert_counted_exactly(topic, produced)


def test_several_topics_in_one_job_keep_separate_totals(counting: Counting) -> None:
    a, b = counting.new_topic(2), counting.new_topic(3)
    counting.produce(a, {0: 10, 1: 20})
    counting.produce(b, {2: 5})
    counting.job(a, b).run_batch()
    assert counting.totals(a, b) == {a: 30, b: 5}


def test_empty_partitions_get_no_task_and_an_empty_topic_launches_no_spark_job(counting: Counting) -> None:
    sparse, empty = counting.new_topic(4), counting.new_topic(3)
    counting.produce(sparse, {1: 9})
    report = counting.job(sparse).run_batch()
    assert [r.range.partition for r in report.ranges] == [1]

    jobs_before = spark_job_count(counting.spark)
    report = counting.job(empty).run_batch()
    again = counting.job(sparse).run_batch()  # caught up: nothing new either
    assert report.ranges == () and again.ranges == ()
    assert spark_job_count(counting.spark) == jobs_before
    assert counting.offsets(empty) == {0: 0, 1: 0, 2: 0}
    assert counting.totals(empty, sparse) == {empty: 0, sparse: 9}


def test_a_partition_whose_offsets_have_holes_is_counted_exactly(counting: Counting) -> None:
    topic = counting.new_topic(2)
    produce_in_transactions(
        counting.kafka.bootstrap_servers, topic, transactions=5, per_transaction=6, partitions=2
    )
    counting.job(topic).run_batch()
    assert counting.totals(topic) == {topic: 30}
    ends = counting.log_ends(topic)
    assert ends[0] > 15  # markers take offsets
    assert counting.offsets(topic) == ends


def test_starting_offsets_latest_counts_only_what_comes_after_the_first_run(counting: Counting) -> None:
    topic = counting.new_topic(2)
    counting.produce(topic, {0: 10, 1: 10})
    latest = parse_starting_offsets("latest")
    assert counting.job(topic, starting_offsets=latest).run_batch().ranges == ()
    assert counting.offsets(topic) == {0: 10, 1: 10}
    counting.produce(topic, {0: 3, 1: 4})
    counting.job(topic, starting_offsets=latest).run_batch()
    assert counting.totals(topic) == {topic: 7}


def test_partial_json_starting_offsets_start_unnamed_partitions_at_earliest_and_log_it(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    topic = counting.new_topic(3)
    counting.produce(topic, {0: 10, 1: 10, 2: 10})
    starting = parse_starting_offsets(f'{{"{topic}": {{"0": 4, "1": -1}}}}')
    with caplog.at_level(logging.INFO, logger="txstore"):
        counting.job(topic, starting_offsets=starting).run_batch()
    assert counting.totals(topic) == {topic: 6 + 0 + 10}
    logged = caplog.text
    assert f"{topic}/0 starts at offset 4 (--starting-offsets JSON)" in logged
    assert f"{topic}/1 starts at latest offset 10 (--starting-offsets JSON)" in logged
    assert f"{topic}/2 starts at earliest offset 0 (not named in --starting-offsets JSON)" in logged


def test_a_task_retried_after_its_commit_leaves_counts_unchanged_and_the_job_succeeds(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = counting.new_topic(3)
    counting.produce(topic, {0: 40, 1: 50, 2: 60})
    # Each task's first attempt commits, then fails before Spark hears of it
    # (a lost acknowledgement); Spark runs it again.
    monkeypatch.setenv("TXSTORE_FAILPOINTS", "after-commit@first")
    report: BatchReport = counting.job(topic).run_batch()
    assert [r.outcome for r in report.ranges] == [ALREADY_COMMITTED] * 3
    assert counting.totals(topic) == {topic: 150}
    assert counting.offsets(topic) == {0: 40, 1: 50, 2: 60}


def test_a_task_failing_before_commit_is_retried_and_counts_once(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = counting.new_topic(2)
    counting.produce(topic, {0: 11, 1: 12})
    monkeypatch.setenv("TXSTORE_FAILPOINTS", "between-upsert-and-offsets@first")
    report = counting.job(topic).run_batch()
    assert [r.outcome for r in report.ranges] == [COMMITTED, COMMITTED]
    assert counting.totals(topic) == {topic: 23}


@pytest.mark.parametrize(("moved_to", "kind"), [(3, "gap"), (15, "overlap"), (25, "overlap")])
def test_a_gap_or_overlap_found_at_commit_fails_the_batch_and_changes_nothing(
    counting: Counting, moved_to: int, kind: str
) -> None:
    topic = counting.new_topic(1)
    counting.produce(topic, {0: 10})
    counting.job(topic).run_batch()
    counting.produce(topic, {0: 10})
    job = counting.job(topic)
    planned = job.plan()
    assert [(r.from_offset, r.until_offset) for r in planned] == [(10, 20)]
    # Someone moves the stored offset between planning and committing.
    counting.db.execute("UPDATE txn_offsets SET off = %s WHERE topic = %s", (moved_to, topic))
    with pytest.raises(BatchFailed, match=rf"partition 0 range 10 -> 20: {kind}, stored offset {moved_to}"):
        job.execute(planned)
    assert counting.totals(topic) == {topic: 10}
    assert counting.offsets(topic) == {0: moved_to}


def test_a_partition_added_after_the_first_run_is_counted_from_its_earliest_offset(
    counting: Counting,
) -> None:
    topic = counting.new_topic(4)
    counting.produce(topic, {0: 5, 1: 5, 2: 5, 3: 5})
    latest = parse_starting_offsets("latest")
    counting.job(topic, starting_offsets=latest).run_batch()
    # The job knew only partitions 0 and 1 (as if 2 and 3 were added later).
    counting.db.execute("DELETE FROM txn_offsets WHERE topic = %s AND part >= 2", (topic,))
    counting.produce(topic, {0: 1, 3: 2})
    counting.job(topic, starting_offsets=latest).run_batch()
    counting.assert_counted_exactly(topic, 1 + 5 + 7)


def test_rate_limited_batches_continue_exactly_where_the_last_one_stopped(counting: Counting) -> None:
    topic = counting.new_topic(3)
    counting.produce(topic, {0: 300, 1: 100, 2: 0})
    sizes = []
    for _ in range(10):
        report = counting.job(topic, max_offsets_per_batch=120).run_batch()
        if not report.ranges:
            break
        sizes.append({r.range.partition: r.messages for r in report.ranges})
    assert sizes[0] == {0: 90, 1: 30}
    assert all(sum(s.values()) <= 120 for s in sizes)
    counting.assert_counted_exactly(topic, 400)


def test_partitions_added_under_a_running_job_are_counted_from_their_earliest_offset(
    counting: Counting,
) -> None:
    topic = counting.new_topic(4)
    counting.produce(topic, {0: 5, 1: 5, 2: 6, 3: 7})
    visible = {"partitions": 2}  # the metadata the running job sees: 2 partitions, later 4

    def metadata(conf: Any, topics: Any) -> list[Any]:
        return [w for w in fetch_watermarks(conf, topics) if w.partition < visible["partitions"]]

    settings = counting.settings("count_topic", topic, starting_offsets=parse_starting_offsets("latest"))
    with TransactionalJob(counting.spark, settings, count_messages, watermarks=metadata) as job:
        assert job.run_batch().ranges == ()  # first run: starts at latest
        counting.produce(topic, {0: 1})
        job.run_batch()
        visible["partitions"] = 4  # partitions 2 and 3 "appear"
        report = job.run_batch()
    assert sorted((r.range.partition, r.range.from_offset, r.messages) for r in report.ranges) == [
        (2, 0, 6),
        (3, 0, 7),
    ]
    counting.assert_counted_exactly(topic, 1 + 6 + 7)


def test_a_range_committed_in_part_by_another_writer_after_planning_is_planned_again(
    counting: Counting,
) -> None:
    """A late task of an earlier failed batch, or a second instance, commits part of a planned
    range: the range is refused as an overlap, and ``--once`` plans again from the stored offset."""
    from txstore.core.results import TOPIC_TOTAL
    from txstore.postgres.sink import TransactionalSink

    topic = counting.new_topic(1)
    counting.produce(topic, {0: 40})
    counting.job(topic).run_batch()
    counting.produce(topic, {0: 60})
    interfered: list[bool] = []

    def watermarks_then_another_writer(conf: Any, topics: Any) -> list[Any]:
        # Offsets were read just before this: the other writer commits in between.
        if not interfered:
            interfered.append(True)
            with psycopg.connect(counting.database_url) as conn:
                TransactionalSink(conn, "count_topic").commit(
                    OffsetRange(topic, 0, 40, 55), {TOPIC_TOTAL: 15}
                )
        return fetch_watermarks(conf, topics)

    settings = counting.settings("count_topic", topic)
    with TransactionalJob(
        counting.spark, settings, count_messages, watermarks=watermarks_then_another_writer
    ) as job:
        job.run()  # --once
        assert job.batches == 2
    assert interfered == [True]
    counting.assert_counted_exactly(topic, 100)

"""What a user can plug in around the txstore stream source and sink, and what it does to the offsets.

Real Spark, real PostgreSQL, the mock broker. Each case is a query a user can write: a union of
two sources, a self-union, a join that repeats rows, a filter, a repartition, a ``rate`` source
into the sink, another query's plan left behind. The sink commits a micro-batch's planned
offsets only when its own query read them and every row is a planned message, once
(:mod:`txstore.core.micro_batch`); whatever it cannot verify stops the query in one line
before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.counting import Counting
from tests.helpers.streams import JOB, QueryFailed, sink
from txstore.core.fingerprint import Fingerprint
from txstore.core.micro_batch import (
    Delivery,
    MicroBatchNotRead,
    MicroBatchReadTwice,
    RangeRead,
    Receipt,
    RowsOutsideBatch,
    RowsRepeated,
    StreamPlan,
    merge_spans,
    spans_array,
    spans_from_array,
    verify_micro_batch,
)
from txstore.core.ranges import OffsetRange

COUNT = {"txstore.countMessages": "true"}
KEEP = ("topic", "partition", "offset")


# -- pure: the verification ----------------------------------------------------------------------

A0 = OffsetRange("a", 0, 10, 20)
A1 = OffsetRange("a", 1, 0, 5)
PLAN = StreamPlan("p1", (A0, A1, OffsetRange("a", 2, 7, 7)), 2, {("a", 0): 0, ("a", 1): 1})
LAST = Fingerprint(19, 1000, "d")


def receipts(
    query: str = "q", batch: int = 3, stage: int = 1, shift: int = 0, run: str = "r"
) -> list[Receipt]:
    return [
        Receipt(0, stage, 0 + shift, query, batch, (RangeRead(A0, 9, LAST),), run),
        Receipt(1, stage, 1 + shift, query, batch, (RangeRead(A1, 5, None),), run),
    ]


def delivery(
    spans: dict[tuple[str, int], list[tuple[int, int]]], run: tuple[str, int, str] = ("q", 3, "r")
) -> Delivery:
    return Delivery(frozenset({run}), spans)


def test_a_micro_batch_read_by_its_own_query_with_each_message_once_is_verified() -> None:
    reads = verify_micro_batch(
        "j", 3, PLAN, receipts(), delivery({("a", 0): [(10, 15), (16, 20)], ("a", 1): [(0, 5)]})
    )
    assert reads == {("a", 0): RangeRead(A0, 9, LAST), ("a", 1): RangeRead(A1, 5, None)}
    # fewer rows than messages (a filter), and no row at all, are fine
    assert verify_micro_batch("j", 3, PLAN, receipts(), delivery({("a", 0): [(12, 13)]}))
    assert verify_micro_batch("j", 3, PLAN, receipts(), delivery({}))


def test_a_plan_another_query_read_or_nobody_read_is_never_committed() -> None:
    with pytest.raises(MicroBatchNotRead) as e:
        verify_micro_batch("j", 3, PLAN, receipts(query="other"), delivery({}))
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(
        "job 'j' micro-batch 3 of query q: the job's planned micro-batch (a/0 10 -> 20, ...)"
    )
    assert "read by query other micro-batch 3 (another query of this job, or one that stopped" in line
    with pytest.raises(MicroBatchNotRead, match="no task of this query read it"):
        verify_micro_batch("j", 3, PLAN, [], delivery({}))
    with pytest.raises(MicroBatchNotRead, match="not read by this micro-batch"):
        verify_micro_batch("j", 3, PLAN, receipts(batch=2), delivery({}))
    with pytest.raises(MicroBatchNotRead, match="not read by this micro-batch"):
        verify_micro_batch("j", 3, PLAN, receipts()[:1], delivery({}))  # one task's receipt missing
    with pytest.raises(MicroBatchNotRead, match="received no rows from any task"):
        verify_micro_batch("j", 3, PLAN, receipts(), Delivery(frozenset()))
    with pytest.raises(MicroBatchNotRead, match="the sink's tasks ran in query q micro-batch 2"):
        verify_micro_batch("j", 3, PLAN, receipts(), delivery({}, run=("q", 2, "r")))
    # receipts of another query, or of an earlier run of this one (a restart re-reads its last
    # micro-batch, in another stage), neither stand for this run's nor make it a second read
    old = [Receipt(0, 1, 0, "old", 3, (RangeRead(A0, 9, LAST),), "r")]
    earlier = receipts(stage=0, run="r0")
    assert verify_micro_batch("j", 3, PLAN, old + earlier + receipts(), delivery({}))
    with pytest.raises(MicroBatchNotRead, match="not read by this micro-batch"):
        verify_micro_batch("j", 3, PLAN, earlier, delivery({}))


def test_a_task_read_as_two_spark_partitions_is_a_self_union() -> None:
    with pytest.raises(MicroBatchReadTwice) as e:
        verify_micro_batch("j", 3, PLAN, receipts() + receipts(shift=2), delivery({}))
    assert "read the micro-batch's messages twice (range a/0 10 -> 20 was read as 2 Spark partitions" in str(
        e.value
    )
    with pytest.raises(MicroBatchReadTwice):  # a self-join: two stages, the same partitions
        verify_micro_batch("j", 3, PLAN, receipts() + receipts(stage=2), delivery({}))
    # a retried or speculated task is the same stage and partition: once
    assert verify_micro_batch("j", 3, PLAN, receipts() + receipts(), delivery({}))


def test_rows_outside_the_plan_or_twice_are_refused_naming_the_message() -> None:
    with pytest.raises(RowsOutsideBatch) as e:
        verify_micro_batch("j", 3, PLAN, receipts(), delivery({("b", 0): [(0, 3)]}))
    assert "rows of topic 'b' partition 0 offsets 0..2, outside this micro-batch's range none" in str(e.value)
    with pytest.raises(RowsOutsideBatch, match=r"offsets 5..19, outside this micro-batch's range \[10, 20\)"):
        verify_micro_batch("j", 3, PLAN, receipts(), delivery({("a", 0): [(5, 20)]}))
    with pytest.raises(RowsOutsideBatch, match=r"offsets 10..20"):
        verify_micro_batch("j", 3, PLAN, receipts(), delivery({("a", 0): [(10, 21)]}))
    with pytest.raises(RowsRepeated) as repeated:
        verify_micro_batch("j", 3, PLAN, receipts(), delivery({("a", 0): [(10, 15), (14, 16)]}))
    assert "two rows of the message at topic 'a' partition 0 offset 14" in str(repeated.value)
    with pytest.raises(RowsRepeated, match="which holds 9 messages"):  # 10 distinct offsets, 9 messages read
        verify_micro_batch("j", 3, PLAN, receipts(), delivery({("a", 0): [(10, 20)]}))


def test_count_rows_must_be_each_planned_range_once_with_what_its_task_read() -> None:
    def counts(rows: list[tuple[OffsetRange, int]]) -> Delivery:
        return Delivery(frozenset({("q", 3, "r")}), counts=rows)

    assert verify_micro_batch("j", 3, PLAN, receipts(), counts([(A0, 9), (A1, 5)]))
    with pytest.raises(RowsRepeated, match="count row twice"):
        verify_micro_batch("j", 3, PLAN, receipts(), counts([(A0, 9), (A1, 5), (A0, 9)]))
    with pytest.raises(MicroBatchNotRead, match="no count row for range a/1 0 -> 5"):
        verify_micro_batch("j", 3, PLAN, receipts(), counts([(A0, 9)]))
    with pytest.raises(RowsOutsideBatch, match="says 8 messages, but its reading task read 9"):
        verify_micro_batch("j", 3, PLAN, receipts(), counts([(A0, 8), (A1, 5)]))
    with pytest.raises(RowsOutsideBatch, match="outside this micro-batch's range"):
        verify_micro_batch("j", 3, PLAN, receipts(), counts([(OffsetRange("a", 0, 10, 19), 9), (A1, 5)]))


def test_spans_merge_across_tasks_and_name_the_first_shared_offset() -> None:
    assert merge_spans([[(0, 3)], [(3, 5), (7, 8)]]) == ([(0, 5), (7, 8)], None)
    assert merge_spans([[(0, 3)], [(2, 5)]]) == ([(0, 5)], 2)
    assert spans_from_array(spans_array([(1, 4), (2**40, 2**40 + 1)])) == [(1, 4), (2**40, 2**40 + 1)]


def test_a_write_task_turns_arrow_rows_into_spans_per_partition_with_repeats_kept() -> None:
    import pyarrow as pa

    from txstore.spark.stream.stream_write_tasks import _batch_spans, _task_spans

    batch = pa.RecordBatch.from_pydict(
        {
            "topic": ["a", "a", "a", "b", "a", None],
            "partition": pa.array([0, 0, 0, 1, 1, 0], pa.int32()),
            "offset": pa.array([5, 6, 8, 3, 0, 9], pa.int64()),
        }
    )
    spans, unplaced = _batch_spans(batch)
    assert spans == {("a", 0): [(5, 7), (8, 9)], ("b", 1): [(3, 4)], ("a", 1): [(0, 1)]}
    assert unplaced == 1
    unsorted = pa.RecordBatch.from_pydict(
        {"topic": ["a"] * 4, "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array([7, 5, 6, 6])}
    )
    spans, _ = _batch_spans(unsorted)
    assert spans == {("a", 0): [(5, 7), (6, 8)]}  # offset 6 twice: two spans that overlap
    merged = _task_spans([spans])
    assert merge_spans([spans_from_array(merged[("a", 0)])])[1] == 6


# -- real queries --------------------------------------------------------------------------------


def _refused(run: Callable[[], Any]) -> str:
    with pytest.raises(QueryFailed) as e:
        run()
    return str(e.value)


def test_a_self_union_is_refused_before_anything_is_committed(streaming: Counting, tmp_path: Path) -> None:
    """df.union(df) reads every message twice: counted, it would double every count."""
    topic = streaming.new_topic(2)
    streaming.produce(topic, {0: 6, 1: 4})
    for i, options in enumerate([{}, COUNT]):
        line = _refused(
            lambda options=options, i=i: streaming.run_available_now(
                topic, tmp_path / f"c{i}", rows=lambda df: df.union(df), **options
            )
        )
        assert "read the micro-batch's messages twice" in line or "two rows of the message" in line
        assert "nothing was written" in line
        assert streaming.totals(topic, job=JOB) == {topic: 0}
        assert set(streaming.offsets(topic, job=JOB).values()) <= {0}


def test_a_union_with_another_jobs_source_moves_neither_job(streaming: Counting, tmp_path: Path) -> None:
    """Job A's sink handed job B's messages too: refused; neither job's offsets move, so following
    any advice cannot count B's messages twice."""
    mine, theirs = streaming.new_topic(1), streaming.new_topic(1)
    streaming.produce(mine, {0: 5})
    streaming.produce(theirs, {0: 7})
    a = streaming.stream(mine).select(*KEEP)
    b = streaming.stream(theirs, job="other_job").select(*KEEP)
    query = sink(a.union(b), streaming.database_url, tmp_path / "chk").trigger(availableNow=True).start()
    with pytest.raises(Exception) as e:
        query.awaitTermination(120)
    assert f"rows of topic '{theirs}' partition 0 offsets 0..6, outside this micro-batch's range none" in str(
        e.value
    )
    assert streaming.totals(mine, job=JOB) == {mine: 0}
    assert set(streaming.offsets(mine, job=JOB).values()) <= {0}
    assert set(streaming.offsets(theirs, job="other_job").values()) <= {0}


def test_a_union_of_two_sources_of_the_same_job_says_what_is_wrong(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(1)
    streaming.produce(topic, {0: 3})
    a = streaming.stream(topic)
    b = streaming.stream(topic)
    query = sink(a.union(b), streaming.database_url, tmp_path / "chk").trigger(availableNow=True).start()
    with pytest.raises(Exception) as e:
        query.awaitTermination(120)
    line = str(e.value)
    assert "another readStream.format('txstore') of this job in this Spark application" in line
    assert "a union or join of two sources of the same job" in line
    assert streaming.totals(topic, job=JOB) == {topic: 0}


def test_a_filter_and_a_repartition_count_what_they_keep_and_move_the_whole_range(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(3)
    streaming.produce(topic, {0: 10, 1: 7, 2: 4})
    streaming.run_available_now(
        topic, tmp_path / "chk", rows=lambda df: df.where("offset % 2 = 0").repartition(5)
    )
    streaming.assert_counted_exactly(topic, 5 + 4 + 2, job=JOB)


def test_a_join_that_repeats_a_messages_row_is_refused(streaming: Counting, tmp_path: Path) -> None:
    topic = streaming.new_topic(1)
    streaming.produce(topic, {0: 4})
    static = streaming.spark.createDataFrame([(0, "x"), (0, "y")], "partition int, tag string")
    line = _refused(
        lambda: streaming.run_available_now(
            topic, tmp_path / "chk", rows=lambda df: df.join(static, "partition").select(*KEEP)
        )
    )
    assert f"two rows of the message at topic '{topic}' partition 0 offset 0" in line
    assert streaming.totals(topic, job=JOB) == {topic: 0}


def test_rows_without_their_partition_and_offset_are_refused_before_anything_is_read(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(1)
    streaming.produce(topic, {0: 4})
    line = _refused(
        lambda: streaming.run_available_now(topic, tmp_path / "chk", rows=lambda df: df.select("topic"))
    )
    assert "the query's rows have no partition, offset column" in line
    assert streaming.totals(topic, job=JOB) == {topic: 0}


def test_a_rate_source_never_commits_the_plan_a_failed_query_left(
    streaming: Counting, tmp_path: Path
) -> None:
    """Job J's query fails in its sink's commit after reading: its plan stays in
    txn_stream_plans, read. A ``rate`` source shaped like txstore's rows into J's sink must not
    commit it (offsets moved, nothing counted, the messages lost)."""
    topic = streaming.new_topic(1)
    streaming.produce(topic, {0: 6})
    with pytest.raises(QueryFailed):
        streaming.run_available_now(topic, tmp_path / "a", failpoints="before-commit")
    assert set(streaming.offsets(topic, job=JOB).values()) == {0}
    rate = (
        streaming.spark.readStream.format("rate")
        .option("rowsPerSecond", "5")
        .load()
        .selectExpr(f"'{topic}' AS topic", "0 AS partition", "value AS offset")
    )
    query = (
        sink(rate, streaming.database_url, tmp_path / "b").trigger(processingTime="200 milliseconds").start()
    )
    try:
        with pytest.raises(Exception) as e:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert "was not read by this micro-batch" in str(e.value) or "outside this micro-batch" in str(e.value)
    assert set(streaming.offsets(topic, job=JOB).values()) == {0}
    assert streaming.totals(topic, job=JOB) == {topic: 0}
    # the job's own query then counts everything once
    streaming.run_available_now(topic, tmp_path / "a")
    streaming.assert_counted_exactly(topic, 6, job=JOB)


def test_the_stream_keeps_the_last_message_so_a_recreated_topic_refilled_past_its_offsets_stops_it(
    streaming: Counting, tmp_path: Path
) -> None:
    """The mock broker has no topic IDs: the fingerprint of the last message counted, stored by the
    sink, is what tells the new log from the old (200 of 600 would be skipped otherwise)."""
    topic = streaming.new_topic(1)
    checkpoint = tmp_path / "chk"
    for options in ({}, COUNT):
        streaming.produce(topic, {0: 4}, value=b"old")
        streaming.run_available_now(topic, checkpoint, **options)
    row = streaming.db.execute(
        "SELECT off, last_off, last_digest FROM txn_offsets WHERE job = %s AND topic = %s", (JOB, topic)
    ).fetchone()
    streaming.db.rollback()
    assert row is not None and row[0] == 8 and row[1] == 7 and row[2]
    streaming.kafka.recreate_topic(topic, 1)
    streaming.produce(topic, {0: 12}, value=b"new")
    line = _refused(lambda: streaming.run_available_now(topic, checkpoint))
    assert f"job '{JOB}' topic '{topic}' partition 0: the topic was deleted and recreated" in line
    assert streaming.totals(topic, job=JOB) == {topic: 8}
    assert streaming.offsets(topic, job=JOB) == {0: 8}


def test_the_stream_lock_line_tells_a_second_source_in_this_application_from_a_query_elsewhere() -> None:
    from txstore.spark.stream.stream_lock import driver_process, stream_locked_line

    me = f"txstore stream {driver_process()}"
    here = stream_locked_line("j", (me, "127.0.0.1"), me)
    assert "\n" not in here
    assert here.startswith(
        "job 'j': another readStream.format('txstore') of this job in this Spark application"
    )
    assert "a union or join of two sources of the same job in one query" in here
    elsewhere = stream_locked_line("j", ("txstore stream other-host:42", "10.0.0.7"), me)
    assert elsewhere == (
        "job 'j': another streaming query of this job is running (txstore stream other-host:42 from "
        "10.0.0.7) (it holds the job's stream lock); stop it first, or give this query another txstore.job"
    )
    assert "another streaming query of this job is running (it holds" in stream_locked_line("j", None, me)

"""A checkpoint that is not the job's is refused before anything is read, never trusted.

``readStream.format("txstore")``'s offsets are ``{topic: {partition: offset}}``: nothing in
them says which job or query wrote them. So a partition the job has no ``txn_offsets`` row for
must start where this job would start it (its ``startingOffsets`` for a topic it never
started, the log's earliest offset for a partition that enters later), and a topic the query
does not read must not be in the checkpoint. Real Spark, real PostgreSQL, the mock broker.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers.counting import BrokerDb, Counting
from tests.helpers.streams import QueryFailed, counting_planner
from txstore.spark.stream.stream_checkpoint import ForeignCheckpoint, check_checkpoint_starts

pytestmark = pytest.mark.spark

A, B = "job_a", "job_b"


def rows(db: psycopg.Connection, job: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT topic, part, off, generation FROM txn_offsets WHERE job = %s ORDER BY 1, 2", (job,)
    ).fetchall()


# -- pure ----------------------------------------------------------------------------------------


def test_a_start_without_a_row_must_be_where_the_job_would_start_it() -> None:
    would = {
        ("t", 0): (0, "earliest offset 0 (startingOffsets)"),
        ("t", 1): (0, "earliest offset 0 (startingOffsets)"),
    }
    # Rows for both: nothing to say here (check_alignment compares them).
    check_checkpoint_starts("j", ["t"], {("t", 0): 8, ("t", 1): 3}, {("t", 0): 8, ("t", 1): 5}, would)
    # No rows, the start the job would pick: accepted.
    check_checkpoint_starts("j", ["t"], {("t", 0): 0, ("t", 1): 0}, {}, would)
    with pytest.raises(ForeignCheckpoint) as e:
        check_checkpoint_starts("j", ["t"], {("t", 0): 0, ("t", 1): 3}, {("t", 0): 0}, would)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(
        "job 'j' topic 't' partition 1: the checkpoint starts this micro-batch at offset 3, but the job "
        "has no offset stored for this partition and would start it at earliest offset 0 (startingOffsets)"
    ), line
    assert "nothing was read" in line and "new checkpointLocation" in line
    # A partition Kafka does not report (the checkpoint's topic had more partitions).
    with pytest.raises(
        ForeignCheckpoint, match=r"partition 5: the checkpoint starts .* Kafka reports no such"
    ):
        check_checkpoint_starts("j", ["t"], {("t", 5): 2}, {}, would)
    # A topic the query does not read.
    with pytest.raises(ForeignCheckpoint) as e:
        check_checkpoint_starts("j", ["t"], {("other", 0): 4, ("t", 0): 0}, {}, would)
    line = str(e.value)
    assert line.startswith(
        "job 'j': the checkpoint names topic 'other', which this query does not read (it reads 't'): the "
        "checkpoint is another query's, or this query's from before that topic left its subscribe; "
    ), line
    assert "new checkpointLocation" in line


def test_a_querys_start_is_stored_when_taken_so_its_micro_batches_are_its_own_and_another_start_is_not(
    broker_db: BrokerDb,
) -> None:
    """The source's planning as Spark calls it, without Spark. startingOffsets latest: the start
    is the log end when the query takes its initial offset, stored then (as count_topic stores
    its start); the first micro-batch, planned after more messages came, starts there and is the
    job's. A start that is not where a job would start is refused before its rows are made."""
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 5, 1: 2})
    reader = counting_planner(broker_db.kafka, broker_db.database_url, topic, A, startingOffsets="latest")
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 5, "1": 2}}
        assert rows(broker_db.db, A) == [(topic, 0, 5, 0), (topic, 1, 2, 0)]
        broker_db.produce(topic, {0: 3})
        end = reader.latestOffset(start, None)
        assert end == {topic: {"0": 8, "1": 2}}
        ranges = [
            (r.partition, r.from_offset, r.until_offset)
            for p in reader.partitions(start, end)
            for r in p.ranges
        ]
        assert ranges == [(0, 5, 8)]
    finally:
        reader.stop()

    other = counting_planner(broker_db.kafka, broker_db.database_url, topic, B, startingOffsets="latest")
    try:
        with pytest.raises(
            ForeignCheckpoint,
            match=r"partition 0: the checkpoint starts this micro-batch at offset 5, .* would start it at latest offset 8 \(startingOffsets\)",
        ):
            other.partitions(start, end)
        with pytest.raises(
            ForeignCheckpoint, match="partition 0: the checkpoint starts this micro-batch at offset 5"
        ):
            other.latestOffset(start, None)
    finally:
        other.stop()
    assert rows(broker_db.db, B) == []


# -- real queries --------------------------------------------------------------------------------


@pytest.mark.parametrize("count_messages", [False, True], ids=["per-message", "counted"])
def test_another_jobs_checkpoint_is_refused_by_a_new_job_before_anything_is_read(
    streaming: Counting, tmp_path: Path, count_messages: bool
) -> None:
    """Job A's checkpoint copied for new job B (no rows, startingOffsets earliest), then pointed at
    directly: B stops in one line naming the offsets, writes nothing, and leaves A alone. B with a
    checkpoint of its own then counts the topic from its start. A checkpoint of A given to B once
    B has rows is the older-copy case: B's rows decide, and it stops too."""
    options = {"txstore.countMessages": "true"} if count_messages else {}
    topic = streaming.new_topic(2)
    chk_a, chk_b = tmp_path / "a", tmp_path / "b"
    streaming.produce(topic, {0: 8, 1: 3})
    streaming.run_available_now(topic, chk_a, job=A, **options)
    streaming.produce(topic, {0: 2, 1: 1})
    a_rows, a_totals = rows(streaming.db, A), streaming.totals(topic, job=A)
    assert a_totals == {topic: 11}

    shutil.copytree(chk_a, chk_b)
    for checkpoint in (chk_b, chk_a):  # a copy, and A's own directory
        with pytest.raises(QueryFailed) as e:
            streaming.run_available_now(topic, checkpoint, job=B, **options)
        message = str(e.value)
        expected = (
            f"job '{B}' topic '{topic}' partition 0: the checkpoint starts this micro-batch at offset 8, "
            "but the job has no offset stored for this partition and would start it at earliest offset 0 "
            "(startingOffsets): the checkpoint is not this job's"
        )
        assert expected in message, message
        assert "nothing was read" in message and "new checkpointLocation" in message
        assert rows(streaming.db, B) == []
        assert streaming.totals(topic, job=B) == {topic: 0}
        assert rows(streaming.db, A) == a_rows and streaming.totals(topic, job=A) == a_totals

    shutil.rmtree(chk_b)
    streaming.run_available_now(topic, chk_b, job=B, **options)  # its own: from the start
    streaming.assert_counted_exactly(topic, 14, job=B)

    # B has rows now: A's checkpoint is an older copy. (Had the log not grown, its next batch
    # would end where B's rows are: taken as B's own batch replayed, and not counted again.)
    streaming.produce(topic, {0: 1})
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, chk_a, job=B, **options)
    assert f"job '{B}' topic '{topic}' partition 0: txn_offsets stores offset 10 but the checkpoint" in str(
        e.value
    )
    assert streaming.totals(topic, job=B) == {topic: 14}
    assert rows(streaming.db, A) == a_rows and streaming.totals(topic, job=A) == a_totals


def test_a_checkpoint_of_a_query_on_another_topic_is_refused_naming_the_topic(
    streaming: Counting, tmp_path: Path
) -> None:
    """A's checkpoint (topic X) for B reading topic Y, and for B reading X and Y: refused, one
    line each, before anything is read (not as a partition Kafka "no longer has")."""
    x, y = streaming.new_topic(1), streaming.new_topic(1)
    streaming.produce(x, {0: 5})
    streaming.produce(y, {0: 4})
    checkpoint = tmp_path / "a"
    streaming.run_available_now(x, checkpoint, job=A)
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(y, checkpoint, job=B)
    message = str(e.value)
    assert (
        f"job '{B}': the checkpoint names topic '{x}', which this query does not read (it reads '{y}')"
        in (message)
    ), message
    assert "new checkpointLocation" in message
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(f"{x},{y}", checkpoint, job=B)
    assert (
        f"job '{B}' topic '{x}' partition 0: the checkpoint starts this micro-batch at offset 5, but the job "
        "has no offset stored for this partition and would start it at earliest offset 0"
    ) in str(e.value)
    assert rows(streaming.db, B) == []
    assert streaming.totals(x, y, job=B) == {x: 0, y: 0}
    assert streaming.totals(x, job=A) == {x: 5}

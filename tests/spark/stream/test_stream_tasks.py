"""A streaming micro-batch's ranges as Spark tasks: one task per core when there are more ranges.

Each task of a Python source feeding a Python sink takes two Python workers, so a micro-batch of
many partitions reads neighbouring ranges in one task per core (``txstore.tasks``, by default the
parallelism ``txstore.register`` measured). The runs are fixed when the micro-batch is planned: a
retried task reads exactly its ranges again. Pure planning first, then real queries on real
Spark, PostgreSQL and the mock broker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import produce
from tests.helpers.counting import BrokerDb, Counting
from tests.helpers.streams import CLASSIC_AND_CONNECT, JOB, QueryFailed, counting_planner, run_available_now
from txstore.core.errors import ConfigError
from txstore.core.micro_batch import spans_from_array
from txstore.core.ranges import OffsetRange, group_ranges
from txstore.spark.ranges.tasks import default_parallelism, is_connect
from txstore.spark.source.datasource import RangesPartition
from txstore.spark.source_format import registered_source
from txstore.spark.stream.stream_offsets import micro_batch_tasks
from txstore.spark.stream.stream_options import parse_stream_options
from txstore.spark.stream.stream_write_tasks import deliver
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

COUNT = {"txstore.countMessages": "true"}


def ranges(*sizes: int) -> list[OffsetRange]:
    return [OffsetRange("t", p, 100, 100 + size) for p, size in enumerate(sizes)]


# -- pure ----------------------------------------------------------------------------------------


def test_no_more_ranges_than_tasks_get_a_task_each_and_without_a_number_every_range_does() -> None:
    planned = ranges(5, 500, 50)
    assert micro_batch_tasks(planned, 3) == [[r] for r in planned]
    assert micro_batch_tasks(planned, 8) == [[r] for r in planned]
    assert micro_batch_tasks(planned, None) == [[r] for r in planned]
    assert micro_batch_tasks([], 2) == []


def test_more_ranges_than_tasks_are_cut_in_order_into_one_run_of_neighbours_per_task() -> None:
    planned = ranges(*[1_000] * 8)
    groups = micro_batch_tasks(planned, 2)
    assert groups == [planned[:4], planned[4:]]
    assert micro_batch_tasks(planned, 2) == groups  # planned again: the same runs
    uneven = ranges(10, 10, 400_000, 10, 10)
    runs = micro_batch_tasks(uneven, 3)
    assert len(runs) == 3 and [uneven[2]] in runs
    assert [r for run in runs for r in run] == uneven  # each range once, in order


def test_group_ranges_makes_at_most_the_runs_asked_for() -> None:
    assert group_ranges(ranges(7), 4) == [ranges(7)]
    assert group_ranges([], 4) == []
    equal = ranges(*[3] * 9)
    runs = group_ranges(equal, 4)
    assert len(runs) == 4 and max(map(len, runs)) - min(map(len, runs)) == 1
    assert [r for run in runs for r in run] == equal
    with pytest.raises(ValueError):
        group_ranges(ranges(1), 0)


def test_the_tasks_option_is_a_whole_number_of_at_least_one_else_the_registered_default() -> None:
    base = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "subscribe": "t",
        "txstore.job": "j",
        "txstore.databaseUrl": "postgresql://u@127.0.0.1/db",
    }
    assert parse_stream_options(base, {}).tasks is None
    assert parse_stream_options(base, {}, default_tasks=6).tasks == 6
    assert parse_stream_options({**base, "txstore.tasks": "3"}, {}, default_tasks=6).tasks == 3
    for bad in ("0", "-2", "two", "1.5", ""):
        with pytest.raises(ConfigError) as e:
            parse_stream_options({**base, "txstore.tasks": bad}, {})
        line = str(e.value)
        assert "\n" not in line
        assert line == (
            f"option txstore.tasks must be a whole number of at least 1 (the most Spark tasks a "
            f"micro-batch's ranges are read in), got {bad!r}"
        )


def test_the_sink_adds_a_task_s_counted_rows_per_topic_or_counts_its_message_rows() -> None:
    import pyarrow as pa

    counted = [
        pa.RecordBatch.from_pydict(
            {
                "topic": ["a", "b", "a"],
                "partition": [0, 0, 1],
                "txstore_from": [0, 0, 0],
                "txstore_until": [3, 4, 5],
                "txstore_messages": [3, 4, 5],
            }
        ),
        pa.RecordBatch.from_pydict(
            {
                "topic": ["b"],
                "partition": [1],
                "txstore_from": [7],
                "txstore_until": [7],
                "txstore_messages": [0],
            }
        ),
    ]
    summed = deliver(iter(counted), counted=True)
    assert summed.counts == {"a": 8, "b": 4}
    assert summed.counted == [("a", 0, 0, 3, 3), ("b", 0, 0, 4, 4), ("a", 1, 0, 5, 5), ("b", 1, 7, 7, 0)]
    rows = [
        pa.RecordBatch.from_pydict({"topic": ["a", "b", "a"], "partition": [0, 0, 0], "offset": [5, 9, 6]}),
        pa.RecordBatch.from_pydict({"topic": ["b"], "partition": [0], "offset": [10]}),
    ]
    each = deliver(iter(rows), counted=False)
    assert each.counts == {"a": 2, "b": 2}
    assert {k: spans_from_array(v) for k, v in each.spans.items()} == {
        ("a", 0): [(5, 7)],
        ("b", 0): [(9, 11)],
    }
    assert each.unplaced == 0


def test_register_hands_its_parallelism_to_the_source_as_the_default() -> None:
    source = registered_source(3)
    assert source.default_tasks == 3
    assert source.name() == "txstore"
    assert registered_source(5).default_tasks == 5 and source.default_tasks == 3


# -- real planning and queries ------------------------------------------------------------------


def test_the_planned_micro_batch_is_one_partition_per_task_holding_its_ranges_in_order(
    kafka: MockKafkaCluster,
    database_url: str,
    new_topic: Callable[..., str],
) -> None:
    """The source's own planning (as Spark calls it, without Spark): five ranges, two tasks."""
    topic = new_topic(5)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 4, 2: 5, 3: 6, 4: 7})
    reader = counting_planner(kafka, database_url, topic, "planned_tasks", **{"txstore.tasks": "2"})
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        parts = reader.partitions(start, end)
    finally:
        reader.stop()
    assert all(isinstance(p, RangesPartition) for p in parts)
    planned = [[(r.partition, r.from_offset, r.until_offset) for r in p.ranges] for p in parts]
    assert planned == [[(0, 0, 3), (1, 0, 4), (2, 0, 5)], [(3, 0, 6), (4, 0, 7)]]


def _data_stages(spark: Any, query: Any) -> list[Any]:
    """Classic only: the stages of the query's micro-batches that read data (Spark's status)."""
    tracker = spark.sparkContext.statusTracker()
    stages = []
    for job_id in tracker.getJobIdsForGroup(str(query.runId)):
        job = tracker.getJobInfo(job_id)
        stages += [tracker.getStageInfo(s) for s in job.stageIds] if job else []
    return [s for s in stages if s is not None]


@CLASSIC_AND_CONNECT
@pytest.mark.parametrize("counted", [True, False], ids=["countMessages", "topic-column"])
def test_more_partitions_than_cores_are_read_in_one_task_per_core_and_counted_exactly(
    session: Any, counted: bool, broker_db: BrokerDb, tmp_path: Path
) -> None:
    """Without txstore.tasks the default is the parallelism register() measured (on Connect
    too); progress still counts a row per range (countMessages) or per message."""
    topic = broker_db.new_topic(5)
    checkpoint = tmp_path / "chk"
    options = COUNT if counted else {}
    rows: Callable[[Any], Any] | None = (
        None if counted else (lambda df: df.select("topic", "partition", "offset"))
    )
    broker_db.produce(topic, {0: 3, 1: 14, 2: 5, 3: 16, 4: 7})
    query = run_available_now(
        session, broker_db.kafka, broker_db.database_url, topic, checkpoint, rows=rows, **options
    )
    broker_db.assert_counted_exactly(topic, 45, job=JOB)
    data = [p for p in query.recentProgress if p.numInputRows > 0]
    assert [p.numInputRows for p in data] == ([5] if counted else [45])
    (source,) = data[0].sources  # the progress ends where txstore committed
    assert {int(p): o for p, o in json.loads(source.endOffset)[topic].items()} == broker_db.offsets(
        topic, job=JOB
    )
    if not is_connect(session):
        (stage,) = [s for s in _data_stages(session, query) if s.numTasks > 0]
        assert stage.numTasks == default_parallelism(session) == 2

    broker_db.produce(topic, {1: 2, 4: 9})
    run_available_now(
        session, broker_db.kafka, broker_db.database_url, topic, checkpoint, rows=rows, **options
    )
    broker_db.assert_counted_exactly(topic, 56, job=JOB)


def test_a_retried_task_reads_exactly_its_planned_ranges_again(streaming: Counting, tmp_path: Path) -> None:
    """Each task's first attempt fails after reading its first range (a fail point); Spark
    retries it (local[2,4]) and the retry reads the task's ranges, fixed at planning, again:
    the counts are exact, a row per planned range, the offsets the plan's ends."""
    topic = streaming.new_topic(4)
    streaming.produce(topic, {0: 11, 1: 22, 2: 33, 3: 44})
    query = streaming.run_available_now(
        topic,
        tmp_path / "chk",
        **{**COUNT, "txstore.tasks": "2", "txstore.failpoints": "after-first-range@first"},
    )
    streaming.assert_counted_exactly(topic, 110, job=JOB)
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows > 0] == [4]
    (stage,) = [s for s in _data_stages(streaming.spark, query) if s.numTasks > 0]
    assert (stage.numTasks, stage.numCompletedTasks, stage.numFailedTasks) == (2, 2, 2)


def test_a_task_that_keeps_failing_stops_the_query_and_commits_nothing(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(4)
    streaming.produce(topic, {0: 1, 1: 2, 2: 3, 3: 4})
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(
            topic,
            tmp_path / "chk",
            **{**COUNT, "txstore.tasks": "2", "txstore.failpoints": "after-first-range"},
        )
    assert "fail point after-first-range" in str(e.value)
    assert streaming.totals(topic, job=JOB) == {topic: 0}  # the start rows only: nothing counted
    assert streaming.offsets(topic, job=JOB) == {0: 0, 1: 0, 2: 0, 3: 0}

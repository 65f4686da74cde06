"""A message the aggregate cannot process: one line naming it, no retries; or skipped and recorded.

The test case is a Kafka timestamp no calendar can hold (year 11476): ``--window`` turns
it into a window start and Python raises ``OverflowError: date value out of range``,
every time. Real PostgreSQL, Spark local[2,4] (so a failed task would be retried 4
times) and the mock broker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message

from tests.conftest import send
from tests.helpers.counting import Counting, log_ends, offsets, totals
from tests.helpers.job_processes import count_topic_args, job_env, operator_cli, run_job
from tests.postgres.test_idempotent_and_outbox import stored_messages
from txstore.core.errors import BadMessage
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL, ResultKey
from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.bad_messages import BadOffset, describe_skipped, isolate
from txstore.postgres import store
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

BEYOND_ANY_CALENDAR_MS = 300_000_000_000_000  # year 11476: datetime cannot hold it
MINUTE_MS = 60_000
GOOD_MS = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
REASON = "OverflowError: date value out of range"


def messages_with_bad_timestamps(
    partitions: int, per_partition: int, bad: set[tuple[int, int]]
) -> list[tuple[int, bytes, bytes, int]]:
    """``per_partition`` messages per partition, a minute apart; ``(partition, offset)`` in
    ``bad`` carry a timestamp beyond any calendar instead."""
    return [
        (
            p,
            b"k",
            b"v",
            BEYOND_ANY_CALENDAR_MS if (p, i) in bad else GOOD_MS + i * MINUTE_MS,
        )
        for p in range(partitions)
        for i in range(per_partition)
    ]


def bad_rows(db: psycopg.Connection, job: str) -> list[tuple[str, int, int, int, str]]:
    return [
        tuple(row)  # type: ignore[misc]
        for row in db.execute(
            "SELECT topic, part, generation, off, reason FROM txn_bad_messages WHERE job = %s "
            "ORDER BY topic, part, off",
            (job,),
        ).fetchall()
    ]


def window_counts(db: psycopg.Connection, job: str, topic: str) -> int:
    row = db.execute(
        "SELECT coalesce(sum(metric), 0) FROM txn_data WHERE job = %s AND topic = %s AND grain = 'window'",
        (job, topic),
    ).fetchone()
    assert row is not None
    return int(row[0])


def failed_spark_tasks(spark: Any, after_job: int) -> int:
    """Failed task attempts (each would be retried) in the Spark jobs started after ``after_job``."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job_id in tracker.getJobIdsForGroup(None):
        if job_id > after_job:
            for stage in tracker.getJobInfo(job_id).stageIds:
                info = tracker.getStageInfo(stage)
                failed += info.numFailedTasks if info is not None else 0
    return failed


def last_spark_job(spark: Any) -> int:
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)


def settings(
    kafka: MockKafkaCluster, database_url: str, topic: str, job: str = "count_topic", **more: Any
) -> JobSettings:
    return JobSettings(job, (topic,), kafka.bootstrap_servers, database_url, **more)


# -- fail (the default) ---------------------------------------------------------------


def test_a_message_no_calendar_can_hold_stops_the_job_at_once_with_one_line_naming_its_offset(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    send(kafka.bootstrap_servers, topic, messages_with_bad_timestamps(2, 6, {(0, 3)}))
    # Spark may retry a task 4 times here, and --interval would retry the batch 3 times.
    env = job_env(PYSPARK_SUBMIT_ARGS="--master local[2,4] pyspark-shell")
    args = count_topic_args(kafka, database_url, topic, "--window", "1m", "--interval", "0.2")
    started = time.monotonic()
    result = run_job(*args, env=env)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"count_topic: error: job 'count_topic' topic '{topic}' partition 0 offset 3: the aggregate "
        f"failed on this message ({REASON}); nothing was committed for its range, and retrying "
        "cannot help. To skip such messages and record them in txn_bad_messages, rerun with "
        "--on-bad-message skip"
    )
    assert "Lost task" not in result.stderr, "Spark retried the task"
    assert "retrying at the next interval" not in result.stderr, "the job retried the batch"
    assert "Traceback" not in result.stderr
    assert elapsed < 120
    assert offsets(db, topic) == {0: 0, 1: 6}  # the good partition's range committed on its own
    assert totals(db, topic) == {topic: 6}
    assert bad_rows(db, "count_topic") == []

    # skip: the bad message is recorded, every other one counted; a rerun counts nothing twice.
    skip = count_topic_args(kafka, database_url, topic, "--window", "1m", "--on-bad-message", "skip")
    for _ in range(2):
        result = run_job(*skip, "--once", env=env)
        assert result.returncode == 0, result.stderr
    assert totals(db, topic) == {topic: 11}
    assert window_counts(db, "count_topic", topic) == 11
    assert offsets(db, topic) == log_ends(kafka, topic)
    assert bad_rows(db, "count_topic") == [(topic, 0, 0, 3, REASON)]

    status = operator_cli("status", "--json", "--database-url", database_url)
    assert [(r["partition"], r["skipped"]) for r in json.loads(status.stdout)] == [(0, 1), (1, 0)]
    table = operator_cli("status", "--database-url", database_url).stdout.splitlines()
    assert table[0].split()[-1] == "SKIPPED"
    assert [line.split()[-1] for line in table[1:]] == ["1", "0"]
    jobs = json.loads(operator_cli("jobs", "--json", "--database-url", database_url).stdout)
    assert [(j["job"], j["total"], j["skipped"]) for j in jobs] == [("count_topic", 11, 1)]


def test_the_first_run_with_skip_warns_naming_each_skipped_message(
    kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    send(kafka.bootstrap_servers, topic, messages_with_bad_timestamps(1, 5, {(0, 1), (0, 4)}))
    args = count_topic_args(kafka, database_url, topic, "--window", "1m", "--on-bad-message", "skip")
    result = run_job(*args, "--once")
    assert result.returncode == 0, result.stderr
    assert (
        f"WARNING txstore: job count_topic: range {topic}/0 0 -> 5: skipped 2 messages the aggregate "
        f"failed on, recorded in txn_bad_messages: offset 1 ({REASON}), offset 4 ({REASON})"
    ) in result.stderr


def test_per_batch_commits_stop_on_a_bad_message_without_a_failed_task_and_commit_nothing(
    counting: Counting,
) -> None:
    topic = counting.new_topic(2)
    send(counting.kafka.bootstrap_servers, topic, messages_with_bad_timestamps(2, 40, {(1, 17), (1, 30)}))
    before = last_spark_job(counting.spark)
    s = settings(counting.kafka, counting.database_url, topic, commit="per-batch", min_partitions=5)
    with (
        TransactionalJob(counting.spark, s, CountMessages(window_ms=MINUTE_MS)) as job,
        pytest.raises(BadMessage) as e,
    ):
        job.run_batch()
    assert str(e.value).startswith(
        f"job 'count_topic' topic '{topic}' partition 1 offset 17: the aggregate failed on this message "
        f"({REASON}); nothing was committed"
    )
    assert (e.value.topic, e.value.partition, e.value.offset) == (topic, 1, 17)
    assert not e.value.transient
    assert failed_spark_tasks(counting.spark, before) == 0
    assert counting.offsets(topic) == {0: 0, 1: 0}
    assert counting.totals(topic) == {topic: 0}


def test_the_interval_loop_stops_on_a_bad_message_instead_of_retrying(counting: Counting) -> None:
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, messages_with_bad_timestamps(1, 3, {(0, 0)}))
    before = last_spark_job(counting.spark)
    s = settings(counting.kafka, counting.database_url, topic, interval=0.1, max_batch_failures=3)
    job = TransactionalJob(counting.spark, s, CountMessages(window_ms=MINUTE_MS))
    with pytest.raises(BadMessage, match=f"topic '{topic}' partition 0 offset 0: "):
        job.run()
    assert job.batches == 1
    assert failed_spark_tasks(counting.spark, before) == 0
    assert counting.offsets(topic) == {0: 0}


# -- skip -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("commit", "partitions", "more"),
    [
        ("per-range", 3, {}),  # one range per task: RangeTask.run
        ("per-range", 6, {}),  # more ranges than 2 x cores: RangeTask.run_together
        ("per-batch", 3, {"min_partitions": 7}),  # pieces of ranges, summed on the driver
    ],
)
def test_skip_counts_exactly_the_good_messages_and_records_the_bad_ones_with_the_commit(
    counting: Counting, commit: str, partitions: int, more: dict[str, Any]
) -> None:
    topic = counting.new_topic(partitions)
    bad = {(0, 0), (0, 2), (0, 29), (2, 15)}  # neighbours, first, last, and alone
    send(counting.kafka.bootstrap_servers, topic, messages_with_bad_timestamps(partitions, 30, bad))
    good = partitions * 30 - len(bad)
    before = last_spark_job(counting.spark)
    s = settings(counting.kafka, counting.database_url, topic, commit=commit, on_bad_message="skip", **more)
    aggregate = CountMessages(window_ms=MINUTE_MS)
    with TransactionalJob(counting.spark, s, aggregate) as job:
        report = job.run_batch()
        assert sorted((r.range.partition, b.offset) for r in report.ranges for b in r.bad_messages) == sorted(
            bad
        )
        assert {r.range.partition: r.skipped for r in report.ranges if r.skipped} == {0: 3, 2: 1}
        assert job.run_batch().ranges == ()  # nothing new: nothing counted or recorded twice
    assert failed_spark_tasks(counting.spark, before) == 0
    assert counting.totals(topic) == {topic: good}
    assert window_counts(counting.db, "count_topic", topic) == good
    assert counting.offsets(topic) == counting.log_ends(topic)
    assert bad_rows(counting.db, "count_topic") == [(topic, p, 0, o, REASON) for p, o in sorted(bad)]

    # More data, good and bad: only the new messages count, the old bad rows stay as they were.
    send(
        counting.kafka.bootstrap_servers,
        topic,
        [(1, b"k", b"v", GOOD_MS), (1, b"k", b"v", BEYOND_ANY_CALENDAR_MS)],
    )
    with TransactionalJob(counting.spark, s, aggregate) as job:
        job.run_batch()
    assert counting.totals(topic) == {topic: good + 1}
    assert bad_rows(counting.db, "count_topic") == [
        (topic, p, 0, o, REASON) for p, o in sorted(bad | {(1, 31)})
    ]


def sum_ints(offset_range: OffsetRange, batches: Iterable[list[Message]]) -> dict[ResultKey, int]:
    """A user's aggregate: the sum of values that must be decimal integers (``int()`` raises otherwise)."""
    total = 0
    for batch in batches:
        for m in batch:
            total += int(m.value() or b"")
    return {TOPIC_TOTAL: total}


def test_a_users_aggregate_raising_on_a_value_is_skipped_per_message_and_the_sum_stays_exact(
    counting: Counting,
) -> None:
    topic = counting.new_topic(2)
    values = [(p, None, str(i).encode(), None) for p in range(2) for i in range(1, 51)]
    values[7] = (0, None, b"not a number", None)
    values[60] = (1, None, b"", None)
    send(counting.kafka.bootstrap_servers, topic, values)
    s = settings(counting.kafka, counting.database_url, topic, job="summer", on_bad_message="skip")
    with TransactionalJob(counting.spark, s, sum_ints) as job:
        job.run_batch()
    assert store.topic_totals(counting.db, "summer", [topic]) == {topic: 2 * sum(range(1, 51)) - 8 - 11}
    assert bad_rows(counting.db, "summer") == [
        (topic, 0, 0, 7, "ValueError: invalid literal for int() with base 10: b'not a number'"),
        (topic, 1, 0, 10, "ValueError: invalid literal for int() with base 10: b''"),
    ]


# -- the idempotent sink's transform ------------------------------------------------------


def upper_or_raise(message: Message) -> tuple[bytes | None, bytes | None]:
    value = message.value() or b""
    if value == b"poison":
        raise ValueError("poison is not allowed")
    return message.key(), value.upper()


@pytest.mark.parametrize("on_bad_message", ["fail", "skip"])
def test_a_transform_raising_on_a_message_fails_with_its_offset_or_skips_it(
    counting: Counting, on_bad_message: str
) -> None:
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, [(0, b"k", v, None) for v in (b"a", b"poison", b"c")])
    before = last_spark_job(counting.spark)
    s = settings(
        counting.kafka,
        counting.database_url,
        topic,
        job="copier",
        sink="idempotent",
        on_bad_message=on_bad_message,
    )
    with TransactionalJob(counting.spark, s, transform=upper_or_raise) as job:
        if on_bad_message == "fail":
            with pytest.raises(BadMessage) as e:
                job.run_batch()
            assert str(e.value).startswith(
                f"job 'copier' topic '{topic}' partition 0 offset 1: the transform failed on this "
                "message (ValueError: poison is not allowed); nothing was committed"
            )
            assert stored_messages(counting.db, "copier") == []
            assert counting.offsets(topic, "copier") == {0: 0}
        else:
            job.run_batch()
            assert stored_messages(counting.db, "copier") == [
                (topic, 0, 0, b"k", b"A"),
                (topic, 0, 2, b"k", b"C"),
            ]
            assert bad_rows(counting.db, "copier") == [(topic, 0, 0, 1, "ValueError: poison is not allowed")]
            assert counting.offsets(topic, "copier") == {0: 3}
    assert failed_spark_tasks(counting.spark, before) == 0


def test_skip_is_refused_for_a_dataframe_aggregate(kafka: MockKafkaCluster, database_url: str) -> None:
    from txstore.core.errors import ConfigError

    s = settings(kafka, database_url, "some-topic", on_bad_message="skip")
    with pytest.raises(ConfigError, match="--on-bad-message skip"):
        TransactionalJob(None, s, dataframe_aggregate=lambda frame: frame)


def test_on_bad_message_takes_fail_or_skip_only(kafka: MockKafkaCluster, database_url: str) -> None:
    from txstore.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--on-bad-message must be one of fail, skip"):
        settings(kafka, database_url, "some-topic", on_bad_message="ignore")


# -- finding the messages, without servers ---------------------------------------------------


def kafka_messages(topic: str, timestamps: list[int]) -> list[Message]:
    return [
        Message(topic=topic, partition=2, offset=10 + i, key=b"k", value=b"v", timestamp=(1, ts))
        for i, ts in enumerate(timestamps)
    ]


@pytest.mark.parametrize("bad_at", [set(), {0}, {9}, {3, 4}, {0, 5, 6, 7, 19}, set(range(20))])
def test_isolation_finds_exactly_the_failing_offsets_and_keeps_the_good_messages_deltas(
    bad_at: set[int],
) -> None:
    timestamps = [BEYOND_ANY_CALENDAR_MS if i in bad_at else GOOD_MS + i * MINUTE_MS for i in range(20)]
    messages = kafka_messages("t", timestamps)
    whole = OffsetRange("t", 2, 10, 30)
    count = CountMessages(window_ms=MINUTE_MS)
    found = isolate(count, whole, [messages[:8], messages[8:], []], first_only=False)
    good = [m for i, m in enumerate(messages) if i not in bad_at]
    assert found.bad == tuple(BadOffset("t", 2, 10 + i, REASON) for i in sorted(bad_at))
    assert dict(found.deltas) == (count(whole, [good]) if good else {})
    assert found.messages == 20
    first = isolate(count, whole, [messages[:8], messages[8:]], first_only=True)
    assert first.bad == found.bad[:1]


def test_isolation_finds_nothing_when_no_single_message_fails() -> None:
    def fails_on_more_than_three(
        offset_range: OffsetRange, batches: Iterable[list[Message]]
    ) -> dict[ResultKey, int]:
        n = sum(len(b) for b in batches)
        if n > 3:
            raise ValueError("too many at once")
        return {TOPIC_TOTAL: n}

    messages = kafka_messages("t", [GOOD_MS] * 10)
    found = isolate(fails_on_more_than_three, OffsetRange("t", 2, 10, 20), [messages], first_only=False)
    assert found.bad == ()
    assert found.deltas == {TOPIC_TOTAL: 10}


def test_the_warning_names_the_first_five_skipped_messages_and_counts_the_rest() -> None:
    bad = [BadOffset("t", 0, o, "ValueError: x") for o in range(100)]
    assert describe_skipped(bad[:2], 2) == "offset 0 (ValueError: x), offset 1 (ValueError: x)"
    text = describe_skipped(bad, 250)
    assert text.startswith("offset 0 (ValueError: x), ") and text.count("offset ") == 5
    assert text.endswith("offset 4 (ValueError: x), and 245 more")

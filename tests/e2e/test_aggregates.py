"""Per-key and per-window counts, per-batch commits and DataFrame aggregates, end to end.

Real Spark (local[2,4]), real PostgreSQL, the Kafka-protocol test broker.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from tests.conftest import Outgoing
from tests.helpers.counting import Counting
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.errors import ConfigError
from txstore.core.failpoints import FAILPOINTS_ENV
from txstore.core.ranges import split_ranges
from txstore.core.results import decode_key
from txstore.core.windows import window_start
from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED

pytestmark = pytest.mark.spark

MINUTE = 60_000
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
KEYS: list[bytes | None] = [b"alice", b"bob", None, b"\xff\xfe", "ключ".encode()]

Address = tuple[str, str | None, datetime | None]


def expected(messages: Sequence[Outgoing], by_key: bool, window_ms: int | None) -> dict[Address, int]:
    """What count_topic must have stored for ``messages``, computed independently."""
    rows: Counter[Address] = Counter({("topic", None, None): len(messages)})
    for _, key, _, ts in messages:
        assert ts is not None
        window = window_start(ts, window_ms) if window_ms else None
        if by_key and window_ms:
            rows[("key+window", decode_key(key), window)] += 1
        elif by_key:
            rows[("key", decode_key(key), None)] += 1
        elif window_ms:
            rows[("window", None, window)] += 1
    return dict(rows)


def stored(db: psycopg.Connection, job: str, topic: str) -> dict[Address, Decimal]:
    rows = db.execute(
        "SELECT grain, key, window_start, metric FROM txn_data WHERE job = %s AND topic = %s", (job, topic)
    ).fetchall()
    return {(g, k, w): m for g, k, w, m in rows}


def keyed_messages(rng: random.Random, n: int, partitions: int) -> list[Outgoing]:
    # Timestamps jump back and forth over ten minutes: event time, not arrival order.
    return [
        (
            rng.randrange(partitions),
            rng.choice(KEYS),
            b"v",
            BASE_MS + rng.randrange(-5, 5) * MINUTE + rng.randrange(MINUTE),
        )
        for _ in range(n)
    ]


def keyed_topic(counting: Counting, seed: int, n: int, partitions: int = 3) -> tuple[str, list[Outgoing]]:
    """A new topic on ``counting``'s broker holding ``n`` :func:`keyed_messages` (``random.Random(seed)``)
    over its ``partitions``: the topic and the messages sent."""
    topic = counting.new_topic(partitions)
    messages = keyed_messages(random.Random(seed), n, partitions)
    counting.send(topic, messages)
    return topic, messages


def assert_stored(counting: Counting, job: str, topic: str, want: dict[Address, Any]) -> None:
    """``job`` stored exactly ``want`` for ``topic`` and committed every partition up to the log end."""
    assert stored(counting.db, job, topic) == want
    assert counting.offsets(topic, job) == counting.log_ends(topic)


def settings(kafka: AnyKafka, database_url: str, job: str, topic: str, **more: Any) -> JobSettings:
    return JobSettings(job, (topic,), kafka.bootstrap_servers, database_url, **more)


def per_key_and_minute(frame: Any) -> Any:
    """A DataFrame aggregate: the messages of each topic, key and minute (``window_start``) of their
    timestamps, and no topic total."""
    from pyspark.sql import functions as F

    minute = F.window("timestamp", "1 minute").start.alias("window_start")
    return frame.groupBy("topic", "key", minute).agg(F.count("*").alias("metric"))


def columns_seen(aggregate: Callable[[Any], Any]) -> tuple[Callable[[Any], Any], list[list[str]]]:
    """``aggregate``, noting first the columns of each frame it is given; and the list of those notes."""
    seen: list[list[str]] = []

    def noting(frame: Any) -> Any:
        seen.append(frame.columns)
        return aggregate(frame)

    return noting, seen


def test_per_key_and_window_counts_stay_exact_over_restarts_replays_and_out_of_order_timestamps(
    any_counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = any_counting.new_topic(3)
    rng = random.Random(20261122)
    variants = {"by-key": (True, None), "by-window": (False, MINUTE), "by-both": (True, MINUTE)}
    produced: list[Outgoing] = []
    for run in range(3):
        batch = keyed_messages(rng, 300, 3)
        any_counting.send(topic, batch)
        produced += batch
        if run == 1:
            # Every task's first attempt commits, then dies before Spark hears of it:
            # the retries replay the ranges and must find them committed.
            monkeypatch.setenv(FAILPOINTS_ENV, "after-commit@first")
        else:
            monkeypatch.delenv(FAILPOINTS_ENV, raising=False)
        for job, (by_key, window_ms) in variants.items():
            # A new job object per run: a restart that knows only what the database says.
            s = any_counting.settings(job, topic)
            with TransactionalJob(any_counting.spark, s, CountMessages(by_key, window_ms)) as runner:
                report = runner.run_batch()
            outcomes = {r.outcome for r in report.ranges}
            assert outcomes == ({ALREADY_COMMITTED} if run == 1 else {COMMITTED}), (job, run)
            assert stored(any_counting.db, job, topic) == expected(produced, by_key, window_ms), (job, run)
            assert any_counting.offsets(topic, job) == any_counting.log_ends(topic)


def test_per_batch_commits_sum_across_partitions_with_more_tasks_than_partitions(
    any_counting: Counting,
) -> None:
    topic, messages = keyed_topic(any_counting, 5, 2_000, partitions=2)
    s = any_counting.settings("batch", topic, commit="per-batch", min_partitions=6)
    with TransactionalJob(any_counting.spark, s, CountMessages(by_key=True)) as job:
        report = job.run_batch()
    assert [r.outcome for r in report.ranges] == [COMMITTED, COMMITTED]
    assert report.messages == 2_000
    tracker = any_counting.spark.sparkContext.statusTracker()
    last_job = max(tracker.getJobIdsForGroup(None))
    map_stage = min(tracker.getJobInfo(last_job).stageIds)
    assert tracker.getStageInfo(map_stage).numTasks == len(split_ranges([r.range for r in report.ranges], 6))
    assert tracker.getStageInfo(map_stage).numTasks >= 6
    assert_stored(any_counting, "batch", topic, expected(messages, True, None))


def test_a_per_batch_commit_whose_acknowledgement_is_lost_is_recognised_as_committed(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, messages = keyed_topic(counting, 6, 600)
    # The driver's first COMMIT lands, then it fails before learning so; it commits again.
    monkeypatch.setenv(FAILPOINTS_ENV, "after-commit@first")
    s = counting.settings("batch", topic, commit="per-batch")
    with TransactionalJob(counting.spark, s, CountMessages(by_key=True)) as job:
        report = job.run_batch()
        assert {r.outcome for r in report.ranges} == {ALREADY_COMMITTED}
        assert stored(counting.db, "batch", topic) == expected(messages, True, None)
        monkeypatch.delenv(FAILPOINTS_ENV)
        more = keyed_messages(random.Random(7), 100, 3)
        counting.send(topic, more)
        job.failpoints = type(job.failpoints)()
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
    assert_stored(counting, "batch", topic, expected(messages + more, True, None))


def test_a_dataframe_aggregate_commits_per_batch_like_the_python_one(counting: Counting) -> None:
    topic, messages = keyed_topic(counting, 8, 900)
    s = counting.settings("frames", topic)
    with TransactionalJob(counting.spark, s, dataframe_aggregate=per_key_and_minute) as job:
        report = job.run_batch()
        assert {r.outcome for r in report.ranges} == {COMMITTED}
        assert job.run_batch().ranges == ()  # nothing new: no Spark job, nothing committed
    want = expected(messages, True, MINUTE)
    del want[("topic", None, None)]  # this aggregate keeps no topic total
    assert_stored(counting, "frames", topic, want)


def test_a_dataframe_aggregate_given_only_its_read_columns_counts_exactly_the_same(
    counting: Counting,
) -> None:
    topic, messages = keyed_topic(counting, 9, 900)
    aggregate, seen = columns_seen(per_key_and_minute)
    s = counting.settings("frames-columns", topic)
    columns = ("key", "timestamp", "topic")
    with TransactionalJob(counting.spark, s, dataframe_aggregate=aggregate, read_columns=columns) as job:
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
    assert seen and all(c == list(columns) for c in seen)  # the check's frame and the batch's
    want = expected(messages, True, MINUTE)
    del want[("topic", None, None)]
    assert_stored(counting, "frames-columns", topic, want)


def test_a_dataframe_aggregate_using_a_column_its_read_columns_leave_out_stops_before_reading(
    counting: Counting,
) -> None:
    topic, _ = keyed_topic(counting, 10, 20, partitions=1)

    def per_key(frame: Any) -> Any:
        return frame.groupBy("topic", "key").count().withColumnRenamed("count", "metric")

    s = counting.settings("frames-missing", topic)
    with (
        TransactionalJob(counting.spark, s, dataframe_aggregate=per_key, read_columns=("topic",)) as job,
        pytest.raises(ConfigError) as caught,
    ):
        job.run_batch()
    line = str(caught.value)
    assert line.startswith("the dataframe_aggregate cannot run over read_columns topic: ")
    assert "`key`" in line and line.endswith("SQLSTATE: 42703; add the columns it uses to read_columns")
    assert "\n" not in line
    assert counting.offsets(topic, "frames-missing") == {}  # nothing planned, read or committed
    with pytest.raises(ConfigError, match="read_columns names what a dataframe_aggregate reads"):
        TransactionalJob(counting.spark, s, CountMessages(), read_columns=("topic",))
    with pytest.raises(ConfigError, match="'payload' is not a Kafka-source column"):
        TransactionalJob(counting.spark, s, dataframe_aggregate=per_key, read_columns=("payload",))

"""format("txstore") (batch and stream) starting at a time: Spark's ``startingTimestamp``,
``startingOffsetsByTimestamp`` and ``startingOffsetsByTimestampStrategy``.

The pure tests parse the options and decide the starts from given offsets-for-times answers;
the others run on Apache Kafka (the test broker answers every time lookup with -1), with
messages whose create times are set, read on classic Spark and through Spark Connect.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import txstore
from tests.conftest import send
from tests.helpers.counting import offsets, totals
from tests.helpers.streams import counting_planner, run_available_now
from txstore.core.errors import ConfigError
from txstore.core.ranges import PartitionWatermarks
from txstore.core.starting import (
    ERROR_STRATEGY,
    LATEST_STRATEGY,
    StartingOffsets,
    resolve_starting_offsets,
    times_to_look_up,
)
from txstore.kafka.client_settings import client_config
from txstore.kafka.list_offsets import offsets_for_times
from txstore.spark.source.read_options import parse_read_options
from txstore.spark.source.read_planning import plan, plan_job_ranges, plan_read_ranges
from txstore.testing.real_kafka import RealKafkaCluster

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BASE = {"kafka.bootstrap.servers": "k:9092", "subscribe": "a"}
MARKS = [PartitionWatermarks("a", 0, 0, 10), PartitionWatermarks("a", 1, 2, 8)]


def options(**given: str) -> Any:
    return parse_read_options({**BASE, **given}, environ={})


def refusal(**given: str) -> str:
    with pytest.raises(ConfigError) as e:
        options(**given)
    return str(e.value)


# -- pure ----------------------------------------------------------------------------------------


def test_spark_s_timestamp_options_are_parsed_with_spark_s_precedence_and_its_error_default() -> None:
    by_partition = options(startingOffsetsByTimestamp=json.dumps({"a": {"0": T0, "1": T0 + 5}}))
    assert by_partition.starting.timestamps == {("a", 0): T0, ("a", 1): T0 + 5}
    assert by_partition.starting.no_message_at_time == ERROR_STRATEGY  # Spark's default
    assert by_partition.starting.time_setting == "option startingOffsetsByTimestamp"
    # startingTimestamp wins over startingOffsetsByTimestamp, which wins over startingOffsets.
    both = options(
        startingTimestamp=str(T0 + 9),
        startingOffsetsByTimestamp=json.dumps({"a": {"0": T0, "1": T0}}),
        startingOffsets="latest",
        startingOffsetsByTimestampStrategy="LATEST",
    )
    assert [both.starting.time_of(("a", p)) for p in (0, 1)] == [T0 + 9, T0 + 9]
    assert both.starting.no_message_at_time == LATEST_STRATEGY
    assert options(startingTimestamp="2026-01-01T00:00:00.007Z").starting.timestamp_ms == T0 + 7
    assert options().starting.time_of(("a", 0)) is None


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"startingOffsetsByTimestamp": "{"}, "option startingOffsetsByTimestamp is not valid JSON"),
        ({"startingOffsetsByTimestamp": '{"a": {"0": -1}}'}, "is not a time in epoch milliseconds"),
        ({"startingOffsetsByTimestamp": '{"a": {"x": 1}}'}, "partition 'x' of topic 'a' is not a number"),
        ({"startingOffsetsByTimestamp": '{"b": {"0": 1}}'}, "names topics that are not subscribed: 'b'"),
        ({"startingTimestamp": "yesterday"}, "option startingTimestamp 'yesterday' is neither epoch"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, "must be error (refuse a partition"),
    ],
)
def test_a_bad_time_option_is_refused_in_one_line_naming_it(given: dict[str, str], expected: str) -> None:
    line = refusal(**given)
    assert expected in line and "\n" not in line


def test_with_assign_the_times_json_names_exactly_the_assigned_partitions() -> None:
    given = {"kafka.bootstrap.servers": "k:9092", "assign": '{"a": [0, 1]}'}
    with pytest.raises(ConfigError, match="leaves out assigned 'a' partition 1"):
        parse_read_options({**given, "startingOffsetsByTimestamp": '{"a": {"0": 1}}'}, environ={})
    ok = parse_read_options({**given, "startingOffsetsByTimestamp": '{"a": {"0": 1, "1": 2}}'}, environ={})
    assert ok.starting.timestamps == {("a", 0): 1, ("a", 1): 2}


def test_each_partition_starts_at_the_answer_for_its_own_time_capped_at_the_last_stable_offset() -> None:
    starting = StartingOffsets(timestamps={("a", 0): T0, ("a", 1): T0 + 5}, no_message_at_time=ERROR_STRATEGY)
    assert times_to_look_up(starting, [("a", 0), ("a", 1)]) == {("a", 0): T0, ("a", 1): T0 + 5}
    assert times_to_look_up(starting, [("a", 0)], started_topics={"a"}) == {}  # a started topic: earliest
    decisions = resolve_starting_offsets(
        starting, MARKS, [m.key for m in MARKS], (), {("a", 0): 4, ("a", 1): 12}
    )
    assert [(d.partition, d.offset) for d in decisions] == [(0, 4), (1, 8)]  # 12 is past the end: 8
    assert "startingOffsetsByTimestamp" not in decisions[0].reason  # the jobs' default setting name
    # A new partition of a topic the job already started begins at its earliest offset, whatever the time.
    later = resolve_starting_offsets(starting, MARKS[1:], [m.key for m in MARKS], {"a"}, {})
    assert [(d.partition, d.offset) for d in later] == [(1, 2)]


def test_no_message_at_the_time_is_refused_with_error_and_starts_at_the_end_with_latest() -> None:
    starting = StartingOffsets(
        timestamp_ms=T0, no_message_at_time=ERROR_STRATEGY, time_setting="option startingTimestamp"
    )
    with pytest.raises(ConfigError) as e:
        resolve_starting_offsets(starting, MARKS, [m.key for m in MARKS], (), {("a", 0): 3, ("a", 1): -1})
    assert str(e.value) == (
        "option startingTimestamp: topic 'a' partition 1 has no message at or after "
        "2026-01-01T00:00:00Z (its log holds offsets 2 to 8); give an earlier time, or "
        "startingOffsetsByTimestampStrategy latest to start such a partition at its end"
    )
    latest = StartingOffsets(timestamp_ms=T0, no_message_at_time=LATEST_STRATEGY)
    decisions = resolve_starting_offsets(
        latest, MARKS, [m.key for m in MARKS], (), {("a", 0): 3, ("a", 1): -1}
    )
    assert [(d.partition, d.offset) for d in decisions] == [(0, 3), (1, 8)]


def test_times_json_must_name_every_partition_read_and_no_other() -> None:
    keys = [m.key for m in MARKS]
    left_out = StartingOffsets(timestamps={("a", 0): T0}, time_setting="option startingOffsetsByTimestamp")
    with pytest.raises(ConfigError, match="leaves out 'a' partition 1: name a time for every partition"):
        resolve_starting_offsets(left_out, MARKS, keys, (), {("a", 0): 1})
    stranger = StartingOffsets(timestamps={("a", 0): T0, ("a", 1): T0, ("a", 7): T0})
    with pytest.raises(ConfigError, match="names 'a' partition 7, which Kafka does not report"):
        resolve_starting_offsets(stranger, MARKS, keys, (), {})


def test_a_batch_read_and_a_job_s_read_start_where_the_answers_say() -> None:
    read = options(startingOffsetsByTimestamp=json.dumps({"a": {"0": T0, "1": T0}}))
    ranges = plan_read_ranges(read, MARKS, {("a", 0): 6, ("a", 1): 3})
    assert [(r.partition, r.from_offset, r.until_offset) for r in ranges] == [(0, 6, 10), (1, 3, 8)]
    with pytest.raises(ConfigError, match="partition 1 has no message at or after"):
        plan_read_ranges(read, MARKS, {("a", 0): 6, ("a", 1): -1})
    # txstore.job: a job's first start goes by time; once it holds the topic, a partition without a
    # row is a new one and starts at earliest, as the job itself would start it.
    first = plan_job_ranges("j", {}, MARKS, read.starting, {("a", 0): 6, ("a", 1): 5})
    assert [(r.partition, r.from_offset) for r in first] == [(0, 6), (1, 5)]
    later = plan_job_ranges("j", {("a", 0): 1}, MARKS, read.starting, {})
    assert [(r.partition, r.from_offset) for r in later] == [(0, 1), (1, 2)]


# -- on Apache Kafka -------------------------------------------------------------------------------


def timed_messages(bootstrap: str, topic: str) -> None:
    """Partition 0: create times T0+0s..T0+9s in order; partition 1: T0+20s..T0+24s, one late
    message first (T0+30s) so that Kafka's answer is the first at or after, not the oldest after."""
    send(bootstrap, topic, [(0, b"k", b"p0-%d" % s, T0 + s * 1000) for s in range(10)])
    send(bootstrap, topic, [(1, b"k", b"p1-late", T0 + 30_000)])
    send(bootstrap, topic, [(1, b"k", b"p1-%d" % s, T0 + s * 1000) for s in range(20, 25)])


@pytest.fixture
def timed_topic(real_kafka: RealKafkaCluster, new_real_topic: Callable[..., str]) -> str:
    """A new topic of 2 partitions on Apache Kafka holding :func:`timed_messages`."""
    topic = new_real_topic(2)
    timed_messages(real_kafka.bootstrap_servers, topic)
    return topic


def test_each_partition_s_own_time_is_looked_up_at_once_through_one_client(
    real_kafka: RealKafkaCluster, timed_topic: str, admin_clients: list[Any]
) -> None:
    """``startingOffsetsByTimestamp`` gives each partition its own time: one question per time, all
    sent before any answer is awaited, on one admin client (a client a time, one after another,
    took a client's first answer, about 55 ms then, per time). librdkafka's own class, counted."""
    conf = client_config(real_kafka.bootstrap_servers)
    topic = timed_topic
    # partition 1's answer for 22 s is offset 0: its late message (30 s) is the first at or after
    assert offsets_for_times(conf, {(topic, 0): T0 + 6_500, (topic, 1): T0 + 22_000}) == {
        (topic, 0): 7,
        (topic, 1): 0,
    }
    assert len(admin_clients) == 1
    # partition 0 has no message that late (-1); partition 1's 31 s is past its last message too
    assert offsets_for_times(conf, {(topic, 0): T0 + 25_000, (topic, 1): T0 + 31_000}) == {
        (topic, 0): -1,
        (topic, 1): -1,
    }
    assert offsets_for_times(conf, {(topic, 0): T0 + 9_000, (topic, 1): T0 + 9_000}) == {
        (topic, 0): 9,
        (topic, 1): 0,
    }
    assert offsets_for_times(conf, {}) == {}
    assert len(admin_clients) == 3


def test_a_read_by_timestamp_plans_through_one_client_each_partition_from_its_own_time(
    real_kafka: RealKafkaCluster, timed_topic: str, admin_clients: list[Any]
) -> None:
    """The read's log offsets and its offsets for times, asked through one admin client."""
    times = json.dumps({timed_topic: {"0": T0 + 6_500, "1": T0 + 22_000}})
    read = parse_read_options(
        {
            "kafka.bootstrap.servers": real_kafka.bootstrap_servers,
            "subscribe": timed_topic,
            "startingOffsetsByTimestamp": times,
        },
        {},
    )
    ranges = plan(read)
    assert len(admin_clients) == 1
    assert [(r.partition, r.from_offset, r.until_offset) for r in ranges] == [(0, 7, 10), (1, 0, 6)]


def test_a_stream_s_first_start_at_a_time_asks_kafka_through_one_client(
    real_kafka: RealKafkaCluster,
    timed_topic: str,
    database_url: str,
    db: psycopg.Connection,
    admin_clients: list[Any],
) -> None:
    """A query's first start at a time asked its offsets for times through a client of its own,
    beside the one its log offsets and topic IDs share (issue 38). The source's planning methods,
    called as Spark calls them; the starts are real Kafka's answers, stored as the job's rows."""
    topic = timed_topic
    job = f"one_client_{topic}"
    times = json.dumps({topic: {"0": T0 + 6_500, "1": T0 + 22_000}})
    reader = counting_planner(real_kafka, database_url, topic, job, startingOffsetsByTimestamp=times)
    try:
        start = reader.initialOffset()
    finally:
        reader.stop()
    assert start == {topic: {"0": 7, "1": 0}}
    assert len(admin_clients) == 1
    assert offsets(db, topic, job=job) == {0: 7, 1: 0}


def batch_read(spark: Any, bootstrap: str, topic: str, **given: str) -> Any:
    reader = (
        spark.read.format("txstore").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    )
    for name, value in given.items():
        reader = reader.option(name, value)
    return reader.load()


def test_a_batch_read_by_timestamp_per_partition_reads_exactly_the_messages_from_each_time(
    any_spark: Any, real_kafka: RealKafkaCluster, timed_topic: str
) -> None:
    txstore.register(any_spark)
    topic, bootstrap = timed_topic, real_kafka.bootstrap_servers
    times = json.dumps({topic: {"0": T0 + 6_500, "1": T0 + 22_000}})
    df = batch_read(any_spark, bootstrap, topic, startingOffsetsByTimestamp=times)
    rows = sorted(
        (r.partition, r.offset, r.value.decode()) for r in df.select("partition", "offset", "value").collect()
    )
    # partition 0: 7 s onwards (offsets 7-9); partition 1: Kafka's answer for 22 s is offset 0, the
    # late message (30 s), and so every message after it: an offset range, as Spark reads it.
    assert rows == [(0, 7, "p0-7"), (0, 8, "p0-8"), (0, 9, "p0-9")] + [
        (1, i, v) for i, v in enumerate(["p1-late", "p1-20", "p1-21", "p1-22", "p1-23", "p1-24"])
    ]
    one_time = batch_read(any_spark, bootstrap, topic, startingTimestamp=str(T0 + 9_000))
    assert sorted((r.partition, r.offset) for r in one_time.select("partition", "offset").collect()) == [
        (0, 9),
        *[(1, i) for i in range(6)],
    ]


def test_a_partition_with_no_message_that_late_fails_load_by_default_and_reads_nothing_with_latest(
    spark: Any, real_kafka: RealKafkaCluster, timed_topic: str
) -> None:
    txstore.register(spark)
    topic, bootstrap = timed_topic, real_kafka.bootstrap_servers
    late = str(T0 + 25_000)  # partition 0 ends at 9 s; partition 1 has its 30 s message at offset 0
    with pytest.raises(Exception, match=f"topic '{topic}' partition 0 has no message at or after"):
        batch_read(spark, bootstrap, topic, startingTimestamp=late)  # refused at load()
    df = batch_read(
        spark, bootstrap, topic, startingTimestamp=late, startingOffsetsByTimestampStrategy="latest"
    )
    assert sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect()) == [
        (1, i) for i in range(6)
    ]


def test_a_stream_started_at_a_time_counts_exactly_the_messages_from_it_and_stores_its_starts(
    spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    timed_topic: str,
    tmp_path: Path,
) -> None:
    txstore.register(spark)
    topic, bootstrap = timed_topic, real_kafka.bootstrap_servers
    job = f"times_{topic}"

    def run() -> None:
        run_available_now(
            spark,
            real_kafka,
            database_url,
            topic,
            tmp_path / "checkpoint",
            job=job,
            startingOffsetsByTimestamp=json.dumps({topic: {"0": T0 + 8_000, "1": T0 + 40_000}}),
            startingOffsetsByTimestampStrategy="latest",
            **{"txstore.countMessages": "true"},
        )

    run()
    # partition 0 from offset 8 (8 s): 2 messages; partition 1: none at 40 s, so at its end (6).
    assert totals(db, topic, job=job) == {topic: 2}
    assert offsets(db, topic, job=job) == {0: 10, 1: 6}
    send(bootstrap, topic, [(1, b"k", b"new", T0)])  # an old create time, yet a new message: counted
    run()  # the same checkpoint: the times are for the first start only
    assert totals(db, topic, job=job) == {topic: 3}
    assert offsets(db, topic, job=job) == {0: 10, 1: 7}

"""spark.read.format("txstore") on real Spark, classic and Spark Connect, against the mock broker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest

import txstore
from tests.conftest import Outgoing, produce, produce_in_transactions, send
from tests.helpers.counting import Counting
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.ranges import OffsetRange
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.spark.ranges.tasks import spark_failure_reason
from txstore.spark.source.source_columns import WITHOUT_HEADERS, kafka_source_schema
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark


@pytest.fixture(params=["classic", pytest.param("connect", marks=pytest.mark.connect)])
def session(request: pytest.FixtureRequest) -> Any:
    """The same test on a classic SparkSession and on a Spark Connect client."""
    spark = request.getfixturevalue("spark" if request.param == "classic" else "spark_connect")
    txstore.register(spark)
    return spark


def read(spark: Any, topics: str, kafka: AnyKafka, **options: str) -> Any:
    reader = (
        spark.read.format("txstore")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topics)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows(frame: Any) -> list[tuple[Any, ...]]:
    """Every column, the timestamp as exact epoch microseconds, headers as tuples; in Kafka order."""
    collected = frame.selectExpr(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "unix_micros(timestamp) AS micros",
        "timestampType",
        "headers",
    ).collect()
    found = [
        (
            r.key,
            r.value,
            r.topic,
            r.partition,
            r.offset,
            r.micros,
            r.timestampType,
            None if r.headers is None else [(h.key, h.value) for h in r.headers],
        )
        for r in collected
    ]
    return sorted(found, key=lambda row: (row[2], row[3], row[4]))


def offsets_read(frame: Any) -> dict[tuple[str, int], list[int]]:
    found: dict[tuple[str, int], list[int]] = {}
    for r in frame.select("topic", "partition", "offset").collect():
        found.setdefault((r.topic, r.partition), []).append(r.offset)
    return {k: sorted(v) for k, v in found.items()}


def test_load_returns_exactly_the_messages_of_several_topics_with_the_kafka_source_columns(
    session: Any, any_kafka: AnyKafka, new_any_topic: Callable[..., str]
) -> None:
    a, b = new_any_topic(3), new_any_topic(1)
    ms = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z
    to_a: list[Outgoing] = [
        (0, b"k0", b"v0", ms, None),
        (1, None, b"no key", ms + 1, [("trace", b"t1"), ("empty", None)]),
        (0, b"k2", None, ms + 2, None),  # a tombstone
        (2, b"", b"", ms + 3, [("h", b"")]),
        (0, b"\xff\x00", b"\x00" * 3, ms + 4, None),
    ]
    to_b: list[Outgoing] = [(0, b"bk", b"bv", ms + 5, None), (0, b"bk", b"bv2", ms + 6, None)]
    send(any_kafka.bootstrap_servers, a, to_a)
    send(any_kafka.bootstrap_servers, b, to_b)

    frame = read(session, f"{a}, {b}", any_kafka, includeHeaders="true")

    assert frame.schema == kafka_source_schema()
    next_offset: dict[tuple[str, int], int] = {}
    expected = []
    for topic, sent in ((a, to_a), (b, to_b)):
        for partition, key, value, timestamp, headers in sent:
            offset = next_offset.get((topic, partition), 0)
            next_offset[(topic, partition)] = offset + 1
            # timestampType 0: create time, as the producer set it
            expected.append((key, value, topic, partition, offset, timestamp * 1000, 0, headers))
    assert rows(frame) == sorted(expected, key=lambda row: (row[2], row[3], row[4]))
    # Collected timestamps are the same instants (PySpark gives naive local times).
    first = frame.where("offset = 0 AND partition = 0").select("timestamp").collect()
    assert {r.timestamp.astimezone(timezone.utc) for r in first} == {
        datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=timezone.utc),
        datetime(2026, 1, 1, 0, 0, 0, 128000, tzinfo=timezone.utc),
    }


def test_offsets_across_transaction_markers_are_each_messages_own(
    txstore_spark: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Consecutive offsets are built as a range; a marker's hole must not be filled in."""
    topic = new_topic(2)
    produce_in_transactions(kafka.bootstrap_servers, topic, transactions=3, per_transaction=4, partitions=2)
    conf = client_config(kafka.bootstrap_servers)
    expected = {
        (m.partition, m.high): [
            msg.offset()
            for batch in RangeReader(conf, OffsetRange(topic, m.partition, 0, m.high))
            for msg in batch
        ]
        for m in fetch_watermarks(conf, [topic])
    }
    assert all(len(offs) < high for (_, high), offs in expected.items())  # the markers' holes are there

    found = read(txstore_spark, topic, kafka).select("partition", "offset").collect()

    for (partition, _), offs in expected.items():
        assert sorted(r.offset for r in found if r.partition == partition) == offs


def test_an_empty_topic_is_an_empty_dataframe_with_the_kafka_source_schema(
    session: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    frame = read(session, new_topic(2), kafka)
    assert frame.schema == kafka_source_schema(WITHOUT_HEADERS)
    assert frame.collect() == []


def test_txstore_job_reads_exactly_the_ranges_the_jobs_next_batch_reads_and_commits_nothing(
    session: Any, any_counting: Counting
) -> None:
    counted, never_counted = any_counting.new_topic(3), any_counting.new_topic(2)
    any_counting.produce(counted, {0: 30, 1: 20, 2: 10})
    any_counting.job(counted, max_offsets_per_batch=30).run_batch()  # commits a part
    any_counting.produce(counted, {2: 5})
    any_counting.produce(never_counted, {0: 4, 1: 3})
    committed = any_counting.offsets(counted)
    assert committed == {0: 15, 1: 10, 2: 5}
    tables = "SELECT (SELECT array_agg(t ORDER BY t::text) FROM txn_offsets t), (SELECT array_agg(d ORDER BY d::text) FROM txn_data d)"
    before = any_counting.db.execute(tables).fetchone()

    frame = read(
        session,
        f"{counted},{never_counted}",
        any_counting.kafka,
        **{"txstore.job": "count_topic", "txstore.databaseUrl": any_counting.database_url},
    )
    found = offsets_read(frame)

    ends = any_counting.log_ends(counted)
    # From the committed offsets to the log end; the partitions the job never committed from earliest.
    assert found == {
        **{(counted, p): list(range(committed[p], ends[p])) for p in range(3)},
        (never_counted, 0): [0, 1, 2, 3],
        (never_counted, 1): [0, 1, 2],
    }
    assert any_counting.db.execute(tables).fetchone() == before  # no offset row created, nothing committed
    # And the job's own next batch reads exactly those ranges of the topic it counts.
    report = any_counting.job(counted).run_batch()
    assert {(r.range.partition, r.range.from_offset, r.range.until_offset) for r in report.ranges} == {
        (p, committed[p], ends[p]) for p in range(3)
    }


def test_a_refused_option_fails_at_load_and_its_one_line_is_in_the_error(
    session: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    with pytest.raises(Exception) as caught:
        read(session, new_topic(1), kafka, **{"kafka.enable.auto.commit": "true"}).collect()
    assert spark_failure_reason(caught.value) == (
        "ConfigError: option kafka.enable.auto.commit cannot be set: the txstore reader fixes it "
        "(read_committed, no offset commits, fail on aged-out offsets); drop the option"
    )


def test_starting_and_ending_offsets_choose_the_rows_like_sparks_kafka_source(
    txstore_spark: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 10, 1: 10})

    assert read(txstore_spark, topic, kafka, startingOffsets="latest").collect() == []
    everything = read(txstore_spark, topic, kafka, startingOffsets="earliest", endingOffsets="latest")
    assert offsets_read(everything) == {(topic, 0): list(range(10)), (topic, 1): list(range(10))}
    some = read(
        txstore_spark,
        topic,
        kafka,
        startingOffsets=f'{{"{topic}": {{"0": 3, "1": -2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 7, "1": 4}}}}',
    )
    assert offsets_read(some) == {(topic, 0): [3, 4, 5, 6], (topic, 1): [0, 1, 2, 3]}
    only_partition_0 = read(
        txstore_spark, topic, kafka, startingOffsets=f'{{"{topic}": {{"0": 8, "1": -1}}}}'
    )
    assert offsets_read(only_partition_0) == {(topic, 0): [8, 9]}
    assert len(read(txstore_spark, topic, kafka).limit(3).collect()) == 3  # a read stopped early


def test_an_unknown_topic_fails_naming_it(txstore_spark: Any, kafka: MockKafkaCluster) -> None:
    with pytest.raises(Exception) as caught:
        read(txstore_spark, "no-such-topic", kafka).collect()
    assert "UnknownTopic: topic 'no-such-topic' does not exist on Kafka at" in str(caught.value)


def test_a_declared_schema_reads_only_its_columns_in_its_order_with_the_same_values(
    session: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    ms = 1_767_225_600_000
    sent: list[Outgoing] = [
        (0, b"a", b"1", ms, None),
        (1, None, b"2", ms + 1, [("h", b"x")]),
        (0, b"b", None, ms + 2, None),
    ]
    send(kafka.bootstrap_servers, topic, sent)
    declared = (
        "timestamp timestamp, key binary, partition int, headers array<struct<key:string,value:binary>>"
    )

    frame = (
        session.read.format("txstore")
        .schema(declared)
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )

    assert frame.columns == ["timestamp", "key", "partition", "headers"]
    found = sorted(
        (r.partition, r.key, r.micros, None if r.headers is None else [(h.key, h.value) for h in r.headers])
        for r in frame.selectExpr("partition", "key", "unix_micros(timestamp) AS micros", "headers").collect()
    )
    assert found == sorted(
        (p, k, t * 1000, h) for p, k, _v, t, h in sent
    )  # the same values as the full read, with no value column built
    everything = read(session, topic, kafka, includeHeaders="true")
    assert sorted(frame.collect()) == sorted(everything.select(*frame.columns).collect())


def test_a_declared_schema_of_another_type_fails_with_its_one_line(
    txstore_spark: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 2})
    with pytest.raises(Exception) as caught:
        (
            txstore_spark.read.format("txstore")
            .schema("topic string, key string")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", topic)
            .load()
            .collect()
        )
    assert spark_failure_reason(caught.value) == (
        "ConfigError: schema: column key is binary, not string; declare it as key binary and "
        "cast it after load()"
    )

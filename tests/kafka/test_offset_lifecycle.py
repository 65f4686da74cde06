"""Offsets Kafka no longer has: retention loss, recreated topics, vanished partitions, two jobs."""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import produce
from tests.helpers.counting import Counting, log_ends
from tests.helpers.kafka_transactions import TX_TIMEOUT, first_transaction, in_transaction
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.errors import DataLoss, OffsetOutOfLog
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark


def fall_behind_retention(kafka: AnyKafka, topic: str) -> tuple[int, int]:
    """Produce ~8 MiB to partition 0: the test broker keeps ~5 MiB, so the oldest age out."""
    produce(kafka.bootstrap_servers, topic, {0: 80}, value=b"x" * 100_000)
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])[0]
    assert marks.low > 3
    return marks.low, marks.high


def counted_then_aged_out(counting: Counting, topic: str) -> tuple[int, int]:
    """Partition 0 of ``topic``: 3 large messages counted by count_topic, then
    :func:`fall_behind_retention` (the first 3 and more age out); its log start and end after."""
    counting.produce(topic, {0: 3}, value=b"x" * 100_000)
    counting.job(topic).run_batch()
    return fall_behind_retention(counting.kafka, topic)


def snapshot(db: psycopg.Connection) -> tuple[list[tuple], list[tuple]]:
    return (
        db.execute("SELECT * FROM txn_offsets ORDER BY topic, part").fetchall(),
        db.execute("SELECT * FROM txn_data ORDER BY topic").fetchall(),
    )


def test_retention_loss_stops_the_job_by_default_with_how_many_were_lost(counting: Counting) -> None:
    topic = counting.new_topic(1)
    low, _ = counted_then_aged_out(counting, topic)
    before = snapshot(counting.db)
    with pytest.raises(DataLoss) as raised:
        counting.job(topic).run_batch()
    assert str(raised.value) == (
        f"job 'count_topic' topic '{topic}' partition 0: stored offset 3 is below the log-start offset {low}; "
        f"{low - 3} messages aged out of Kafka before they were counted. To skip them and record the loss "
        "in txn_lost_ranges, rerun with --fail-on-data-loss false"
    )
    assert snapshot(counting.db) == before


def test_retention_loss_with_fail_on_data_loss_false_moves_on_and_records_the_lost_range(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    topic = counting.new_topic(1)
    low, high = counted_then_aged_out(counting, topic)
    with caplog.at_level(logging.WARNING, logger="txstore"):
        counting.job(topic, fail_on_data_loss=False).run_batch()
    assert f"{topic}/0: offsets 3 -> {low} ({low - 3} messages) aged out of Kafka" in caplog.text
    lost = counting.db.execute(
        "SELECT job, topic, part, from_off, until_off, detected_at FROM txn_lost_ranges"
    ).fetchall()
    assert [row[:5] for row in lost] == [("count_topic", topic, 0, 3, low)]
    assert lost[0][5] is not None
    # Everything still in Kafka was counted, exactly once.
    assert counting.totals(topic) == {topic: 3 + (high - low)}
    assert counting.offsets(topic) == {0: high}


def test_fail_on_data_loss_false_skips_aged_out_offsets_when_a_new_partition_appears_in_the_same_batch(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    topic, added = counting.new_topic(1), counting.new_topic(2)
    low, high = counted_then_aged_out(counting, topic)
    counting.produce(added, {0: 5, 1: 7})
    # The next batch both starts the new topic's partitions and meets the aged-out offsets.
    with caplog.at_level(logging.WARNING, logger="txstore"):
        counting.job(topic, added, fail_on_data_loss=False).run_batch()
    assert f"{topic}/0: offsets 3 -> {low} ({low - 3} messages) aged out of Kafka" in caplog.text
    lost = counting.db.execute("SELECT topic, part, from_off, until_off FROM txn_lost_ranges").fetchall()
    assert lost == [(topic, 0, 3, low)]
    assert counting.totals(topic, added) == {topic: 3 + (high - low), added: 12}
    assert counting.offsets(topic) == {0: high}
    assert counting.offsets(added) == {0: 5, 1: 7}


def out_of_log_line(counting: Counting, counts: dict[int, int], change: str) -> tuple[str, str]:
    """A new 2-partition topic holding ``counts``, counted; its offset rows then changed by ``change``
    (SQL, ``%s`` the topic): the topic, and the line (:class:`OffsetOutOfLog`) the next batch stops
    with, having left the offsets and results as they were."""
    topic = counting.new_topic(2)
    counting.produce(topic, counts)
    counting.job(topic).run_batch()
    counting.db.execute(change, (topic,))
    before = snapshot(counting.db)
    with pytest.raises(OffsetOutOfLog) as raised:
        counting.job(topic).run_batch()
    assert snapshot(counting.db) == before
    return topic, str(raised.value)


def test_an_offset_beyond_the_log_end_stops_the_job_with_the_reset_command(counting: Counting) -> None:
    as_if_recreated = "UPDATE txn_offsets SET off = 900 WHERE topic = %s AND part = 1"
    topic, line = out_of_log_line(counting, {0: 5, 1: 5}, as_if_recreated)
    assert line == (
        f"job 'count_topic' topic '{topic}' partition 1: stored offset 900 is beyond the log-end offset 5 "
        "(topic deleted and recreated, or an unclean leader election); to start over from its earliest "
        f"offset: txstore reset --job count_topic --topic {topic} --partition 1 --to-earliest --execute"
    )


def test_a_vanished_partition_stops_the_job_with_the_reset_command(counting: Counting) -> None:
    vanished = "INSERT INTO txn_offsets (job, topic, part, off) VALUES ('count_topic', %s, 7, 12)"
    topic, line = out_of_log_line(counting, {0: 5}, vanished)
    assert line == (
        f"job 'count_topic' topic '{topic}' partition 7: stored offset 12 but Kafka no longer has this "
        "partition (topic deleted, or recreated with fewer partitions); to drop its offset: "
        f"txstore reset --job count_topic --topic {topic} --partition 7 --forget --execute"
    )


def test_two_jobs_counting_the_same_topic_keep_independent_exact_results(counting: Counting) -> None:
    topic = counting.new_topic(3)
    counting.produce(topic, {0: 10, 1: 20, 2: 30})
    counting.job(topic, job="a").run_batch()
    counting.produce(topic, {1: 5})
    counting.job(topic, job="b").run_batch()
    counting.job(topic, job="b").run_batch()
    assert counting.totals(topic, job="a") == {topic: 60}
    assert counting.totals(topic, job="b") == {topic: 65}
    counting.job(topic, job="a").run_batch()
    assert counting.totals(topic, job="a") == {topic: 65}
    assert counting.offsets(topic, job="a") == counting.offsets(topic, job="b") == counting.log_ends(topic)


def test_the_test_broker_cannot_answer_offsets_for_times(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Why --starting-timestamp is tested without the broker: librdkafka's mock answers -1
    (no such offset) to every offsets-for-times lookup. If a future mock answers, this fails
    as a reminder to add the end-to-end test."""
    from confluent_kafka import Producer

    from txstore.kafka.list_offsets import offsets_for_timestamp

    topic = new_topic(1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(5):
        producer.produce(topic, value=b"x", partition=0, timestamp=1_767_225_600_000 + i)
    assert producer.flush(10) == 0
    found = offsets_for_timestamp(client_config(kafka.bootstrap_servers), [(topic, 0)], 1_767_225_600_002)
    assert found == {(topic, 0): -1}


def group_offsets(kafka: AnyKafka, group: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def test_committed_offsets_are_mirrored_to_a_kafka_consumer_group(any_counting: Counting) -> None:
    topic = any_counting.new_topic(3)
    any_counting.produce(topic, {0: 4, 1: 6})
    group = f"mirror-{topic}"
    with any_counting.job(topic, commit_to_kafka_group=group) as job:
        job.run_batch()
        any_counting.produce(topic, {2: 9})
        job.run_batch()
    assert (
        group_offsets(any_counting.kafka, group, topic, 3)
        == {0: 4, 1: 6, 2: 9}
        == any_counting.offsets(topic)
    )


def test_a_failing_group_mirror_is_logged_and_never_affects_the_counts(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    topic = counting.new_topic(2)
    counting.produce(topic, {0: 5, 1: 5})
    group = f"mirror-{topic}"
    offset_commit_api = 8
    counting.kafka.push_request_errors(offset_commit_api, *[25] * 50)  # UNKNOWN_MEMBER_ID: not retriable
    try:
        with (
            caplog.at_level(logging.WARNING, logger="txstore"),
            counting.job(topic, commit_to_kafka_group=group) as job,
        ):
            job.run_batch()
    finally:
        counting.kafka.clear_request_errors(offset_commit_api)
    assert f"could not mirror offsets to Kafka group '{group}'" in caplog.text
    assert "(the database stays correct)" in caplog.text
    assert counting.totals(topic) == {topic: 10}
    assert counting.offsets(topic) == {0: 5, 1: 5}


def test_the_test_broker_has_no_last_stable_offset_below_an_open_transaction(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Why capping offsets-for-times answers at the last stable offset is tested without the
    broker (tests/core/test_planning.py): librdkafka's mock answers a read-committed ListOffsets with
    the high watermark even while a producer transaction is open. If a future mock keeps the
    last stable offset below the open transaction, this fails as a reminder to add the
    end-to-end test (--starting-timestamp on a topic with an open transaction)."""
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 3})
    producer = first_transaction(kafka, f"open-{topic}", lambda p: in_transaction(p, topic, {0: 4}, b"open"))
    try:
        assert log_ends(kafka, topic) == {0: 7}  # read-committed end, yet past the open transaction
    finally:
        producer.abort_transaction(TX_TIMEOUT)

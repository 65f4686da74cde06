"""A topic's life on real Apache Kafka: recreated, grown, trimmed, aged out and compacted.

The mock broker cannot add partitions, delete records, age messages out by time or
compact; Kafka does all of it here (the session's broker, tests/helpers/real_kafka_fixture.py,
checks retention every 0.5 s and lets the cleaner back off 0.5 s). Each test counts
with count_topic and compares with what Kafka holds, read back by a plain consumer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)

from tests.conftest import send
from tests.helpers.counting import Counting
from tests.helpers.recreated import snapshot
from txstore.core.errors import BatchFailed, DataLoss, OffsetOutOfLog, TopicRecreated
from txstore.core.ranges import OffsetRange
from txstore.core.starting import parse_starting_offsets
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.testing.real_kafka import RealKafkaCluster

pytestmark = pytest.mark.spark

ADMIN_TIMEOUT = 30.0
WAIT_SECONDS = 60.0  # retention and the cleaner act within a few seconds here; bounded anyway
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds:g} s")
        time.sleep(0.2)


def log_start(kafka: RealKafkaCluster, topic: str, partition: int = 0) -> int:
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])
    return next(m.low for m in marks if m.partition == partition)


def delete_records(kafka: RealKafkaCluster, topic: str, partition: int, before: int) -> None:
    """Kafka's DeleteRecords (kafka-delete-records): the log start moves up to ``before``."""
    futures = kafka.admin().delete_records(
        [TopicPartition(topic, partition, before)], request_timeout=ADMIN_TIMEOUT
    )
    for future in futures.values():
        assert future.result(ADMIN_TIMEOUT).low_watermark == before


def set_topic_config(kafka: RealKafkaCluster, topic: str, settings: dict[str, str]) -> None:
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()
        ],
    )
    for future in kafka.admin().incremental_alter_configs([resource]).values():
        future.result(ADMIN_TIMEOUT)


def messages_in_log(kafka: RealKafkaCluster, topic: str) -> dict[int, list[int]]:
    """The offsets of the messages Kafka holds now, per partition (holes left out)."""
    conf = client_config(kafka.bootstrap_servers)
    found: dict[int, list[int]] = {}
    for w in fetch_watermarks(conf, [topic]):
        found[w.partition] = [
            m.offset()
            for batch in RangeReader(conf, OffsetRange(topic, w.partition, w.low, w.high))
            for m in batch
        ]
    return found


def stop_line(counting: Counting, topic: str, error: type[Exception]) -> str:
    """The line a batch of ``topic`` stops with, raising ``error``, once it is known to have
    written nothing."""
    before = snapshot(counting.db)
    with pytest.raises(error) as raised:
        counting.job(topic).run_batch()
    assert snapshot(counting.db) == before
    return str(raised.value)


def assert_offsets_3_to_7_lost_stop_the_job(counting: Counting, topic: str) -> None:
    """A batch of ``topic``, whose offsets 3-7 left Kafka before they were counted (stored offset 3,
    log start 8), stops in one line and writes nothing."""
    assert stop_line(counting, topic, DataLoss) == (
        f"job 'count_topic' topic '{topic}' partition 0: stored offset 3 is below the log-start offset 8; "
        "5 messages aged out of Kafka before they were counted. To skip them and record the loss "
        "in txn_lost_ranges, rerun with --fail-on-data-loss false"
    )


# -- recreated ------------------------------------------------------------------------------


def test_a_topic_recreated_and_refilled_below_then_past_the_stored_offset_stops_the_job_each_time(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    topic = real_counting.new_topic(1, prefix="refill")
    real_counting.produce(topic, {0: 6})
    real_counting.job(topic).run_batch()

    real_kafka.recreate_topic(topic, 1)
    real_counting.produce(topic, {0: 2})  # below the stored offset 6
    assert stop_line(real_counting, topic, OffsetOutOfLog) == (
        f"job 'count_topic' topic '{topic}' partition 0: stored offset 6 is beyond the log-end offset 2 "
        "(topic deleted and recreated, or an unclean leader election); to start over from its earliest "
        f"offset: txstore reset --job count_topic --topic {topic} --partition 0 --to-earliest --execute"
    )

    real_counting.produce(topic, {0: 7})  # now past it (9 > 6), other messages at offset 5
    recreated = stop_line(real_counting, topic, TopicRecreated)
    assert re.search(r"the topic was deleted and recreated \(stored topic ID ", recreated), recreated


# -- partitions added -----------------------------------------------------------------------


def test_partitions_added_while_a_job_runs_are_counted_from_their_first_offset_exactly(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """CreatePartitions (kafka-topics --alter --partitions) under a running job started at
    ``latest``: the new partitions are counted from offset 0, not from their end."""
    topic = real_counting.new_topic(2, prefix="grow")
    real_counting.produce(topic, {0: 5, 1: 5})  # before the job: not counted (latest)
    with real_counting.job(topic, starting_offsets=parse_starting_offsets("latest")) as job:
        assert job.run_batch().ranges == ()
        real_counting.produce(topic, {0: 3})
        assert job.run_batch().messages == 3

        futures = real_kafka.admin().create_partitions(
            [NewPartitions(topic, 5)], request_timeout=ADMIN_TIMEOUT
        )
        futures[topic].result(ADMIN_TIMEOUT)
        wait_until(lambda: len(real_counting.log_ends(topic)) == 5, "5 partitions in the metadata")
        real_counting.produce(topic, {1: 2, 2: 4, 3: 1, 4: 6})
        report = job.run_batch()
        real_counting.produce(topic, {2: 1, 4: 1})
        again = job.run_batch()
    assert sorted((r.range.partition, r.range.from_offset, r.messages) for r in report.ranges) == [
        (1, 5, 2),
        (2, 0, 4),
        (3, 0, 1),
        (4, 0, 6),
    ]
    assert sorted((r.range.partition, r.range.from_offset, r.messages) for r in again.ranges) == [
        (2, 4, 1),
        (4, 6, 1),
    ]
    assert real_counting.totals(topic) == {topic: 3 + 2 + 4 + 1 + 6 + 2}
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 8, 1: 7, 2: 5, 3: 1, 4: 7}


# -- retention: DeleteRecords and retention.ms ----------------------------------------------


def test_records_deleted_before_they_were_counted_stop_the_job_in_one_line_writing_nothing(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    topic = real_counting.new_topic(1, prefix="trim")
    real_counting.produce(topic, {0: 3})
    real_counting.job(topic).run_batch()
    real_counting.produce(topic, {0: 10})
    delete_records(real_kafka, topic, 0, 8)  # offsets 3-7 gone before they were counted
    assert_offsets_3_to_7_lost_stop_the_job(real_counting, topic)


def test_records_deleted_after_planning_refuse_the_range_and_the_next_batch_records_them_lost(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Deleted between planning and reading: the range reads Kafka's 'out of range' at its start,
    commits nothing; with --fail-on-data-loss false the next batch skips and records them."""
    topic = real_counting.new_topic(2, prefix="trim-late")
    real_counting.produce(topic, {0: 10, 1: 4})
    job = real_counting.job(topic, fail_on_data_loss=False)
    planned = job.plan()
    delete_records(real_kafka, topic, 0, 6)
    with pytest.raises(BatchFailed) as raised:
        job.execute(planned)
    assert raised.value.transient
    assert f"'{topic}' partition 0: offset 0 is no longer in Kafka" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert real_counting.totals(topic) == {topic: 4}  # partition 1's range committed on its own
    assert real_counting.offsets(topic) == {0: 0, 1: 4}

    with caplog.at_level(logging.WARNING, logger="txstore"):
        real_counting.job(topic, fail_on_data_loss=False).run_batch()
    assert f"{topic}/0: offsets 0 -> 6 (6 messages) aged out of Kafka" in caplog.text
    lost = real_counting.db.execute("SELECT topic, part, from_off, until_off FROM txn_lost_ranges").fetchall()
    assert lost == [(topic, 0, 0, 6)]
    assert real_counting.totals(topic) == {topic: 4 + 4}
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 10, 1: 4}


@pytest.mark.parametrize("fail_on_data_loss", [True, False], ids=["stops", "records-lost"])
def test_messages_aged_out_by_retention_ms_stop_the_job_or_are_recorded_lost(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
    caplog: pytest.LogCaptureFixture,
    fail_on_data_loss: bool,
) -> None:
    """Producer timestamps a year old and retention.ms of a day: Kafka's retention check (every
    0.5 s here) deletes the segments (rolling the active one) and the log start moves."""
    topic = real_counting.new_topic(1, prefix="aged")
    bootstrap = real_kafka.bootstrap_servers
    now = int(time.time() * 1000)
    send(bootstrap, topic, [(0, b"k", b"new", now) for _ in range(3)])
    real_counting.job(topic).run_batch()
    send(bootstrap, topic, [(0, b"k", b"old", T0 - 86_400_000 * 365) for _ in range(5)])  # offsets 3-7
    set_topic_config(real_kafka, topic, {"retention.ms": "1"})  # everything ages out
    wait_until(lambda: log_start(real_kafka, topic) == 8, "log start at 8 (retention)")
    set_topic_config(real_kafka, topic, {"retention.ms": str(7 * 86_400_000)})
    send(bootstrap, topic, [(0, b"k", b"after", now) for _ in range(4)])  # offsets 8-11
    if fail_on_data_loss:
        assert_offsets_3_to_7_lost_stop_the_job(real_counting, topic)
        return
    with caplog.at_level(logging.WARNING, logger="txstore"):
        real_counting.job(topic, fail_on_data_loss=False).run_batch()
    assert f"{topic}/0: offsets 3 -> 8 (5 messages) aged out of Kafka" in caplog.text
    assert real_counting.db.execute("SELECT part, from_off, until_off FROM txn_lost_ranges").fetchall() == [
        (0, 3, 8)
    ]
    assert real_counting.totals(topic) == {topic: 3 + 4}
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 12}


# -- compaction -----------------------------------------------------------------------------

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",  # the next append after 0.1 s rolls the segment: it can be cleaned
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "0",
}


def produce_keys(bootstrap: str, topic: str, keys: int, rounds: int, tag: bytes) -> None:
    send(
        bootstrap,
        topic,
        [(0, b"key-%d" % k, tag + b"-%d" % r, None) for r in range(rounds) for k in range(keys)],
    )


def compacted(kafka: RealKafkaCluster, topic: str, bootstrap: str, below: int) -> None:
    """Roll the segment (one message after segment.ms) until the cleaner has removed offsets below
    ``below``: some offset under it is a hole."""

    def cleaned() -> bool:
        held = messages_in_log(kafka, topic)[0]
        return len([o for o in held if o < below]) < below

    deadline = time.monotonic() + WAIT_SECONDS
    while not cleaned():
        if time.monotonic() > deadline:
            raise AssertionError(f"the cleaner did not compact {topic} within {WAIT_SECONDS:g} s")
        time.sleep(0.3)
        send(bootstrap, topic, [(0, b"roll", b"roll", None)])
    # No more cleaning from here (a count compared with the log must not race the cleaner): the
    # topic stops being compacted, and a cleaning already under way has ended once two reads agree.
    set_topic_config(kafka, topic, {"cleanup.policy": "delete"})
    wait_until(lambda: stable_log(kafka, topic), "a log the cleaner no longer changes")


def stable_log(kafka: RealKafkaCluster, topic: str) -> bool:
    first = messages_in_log(kafka, topic)
    time.sleep(1.0)
    return messages_in_log(kafka, topic) == first


def test_a_compacted_topic_with_holes_is_counted_exactly_before_and_after_the_cleaner_ran(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """Run 1 counts every version of 10 keys; the cleaner then removes the old versions,
    including the last message run 1 counted (its check finds none there: not an error). Run 2
    counts exactly the messages Kafka still holds above the stored offset, holes and all; a new
    job counts exactly what Kafka holds from the start."""
    topic = real_counting.new_topic(1, prefix="compact", config=COMPACTED)
    bootstrap = real_kafka.bootstrap_servers
    produce_keys(bootstrap, topic, 10, 3, b"first")  # offsets 0-29
    real_counting.job(topic).run_batch()
    assert real_counting.totals(topic) == {topic: 30}
    produce_keys(bootstrap, topic, 10, 2, b"second")  # offsets 30-49: every key again
    compacted(real_kafka, topic, bootstrap, below=30)
    held = messages_in_log(real_kafka, topic)[0]
    assert 29 not in held  # the last message run 1 counted is gone

    report = real_counting.job(topic).run_batch()
    assert report.messages == len([o for o in held if o >= 30])
    real_counting.assert_counted_exactly(topic, 30 + report.messages)

    fresh = real_counting.job(topic, job="from_scratch").run_batch()
    now_held = messages_in_log(real_kafka, topic)[0]
    assert fresh.messages == len(now_held) < real_counting.log_ends(topic)[0]
    assert real_counting.totals(topic, job="from_scratch") == {topic: len(now_held)}

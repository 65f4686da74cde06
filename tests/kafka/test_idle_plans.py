"""A running job's idle plans on Apache Kafka: what they ask less, and what they still tell.

An idle partition (committed offset at its log end) is not asked its log start, and an idle
topic whose IDs are stored is asked its topic ID every few seconds, not every plan (issue 38:
at 1,024 partitions these were most of an idle plan). These tests prove what that must not change: the log start of
every partition with something to read, the topic ID stored while idle, and a recreated
topic told before anything of it is counted.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

from tests.conftest import send
from tests.helpers.counting import Counting
from tests.helpers.recreated import snapshot, topic_id_changed_line
from txstore.core.errors import TopicRecreated, UnknownTopic
from txstore.core.ranges import IDLE_TOPIC_ID_SECONDS
from txstore.core.starting import parse_starting_offsets
from txstore.job import TransactionalJob
from txstore.kafka.client import ENDS_TIMEOUT_SECONDS, Watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.topic_ids import fetch_topic_ids
from txstore.testing.real_kafka import RealKafkaCluster

pytestmark = pytest.mark.spark

ADMIN_TIMEOUT = 30.0
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def delete_records(kafka: RealKafkaCluster, topic: str, partition: int, before: int) -> None:
    futures = kafka.admin().delete_records(
        [TopicPartition(topic, partition, before)], request_timeout=ADMIN_TIMEOUT
    )
    for future in futures.values():
        assert future.result(ADMIN_TIMEOUT).low_watermark == before


def same_three(partition: int = 0) -> list[tuple[int, bytes, bytes, int]]:
    """Three messages with fixed keys, values and timestamps: a recreated topic refilled with them
    holds byte-identical messages at the same offsets, so only Kafka's topic ID tells it."""
    return [(partition, b"k%d" % i, b"same-%d" % i, T0 + i) for i in range(3)]


def test_a_partition_at_its_log_end_is_not_asked_its_log_start_and_every_other_one_is(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    topic = real_counting.new_topic(3, prefix="idle-start")
    real_counting.produce(topic, {0: 10, 1: 10, 2: 4})
    for partition in (0, 1):
        delete_records(real_kafka, topic, partition, 6)
    conf = client_config(real_kafka.bootstrap_servers)
    ask = Watermarks()
    try:
        everything = {(w.partition, w.low, w.high) for w in ask(conf, [topic])}
        assert everything == {(0, 6, 10), (1, 6, 10), (2, 0, 4)}
        # 0: at its end (nothing to read: [10, 10)); 1: below it, asked; 2: no row, asked
        settled = {(topic, 0): 10, (topic, 1): 7}
        assert {(w.partition, w.low, w.high) for w in ask(conf, [topic], settled=settled)} == {
            (0, 10, 10),
            (1, 6, 10),
            (2, 0, 4),
        }
        # aged out below the committed offset: asked, and the loss is seen
        assert {(w.partition, w.low) for w in ask(conf, [topic], settled={(topic, 0): 2})} == {
            (0, 6),
            (1, 6),
            (2, 0),
        }
    finally:
        ask.close()


def test_an_idle_job_stores_the_topic_id_so_a_recreation_before_its_first_message_is_told(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    """Started at ``latest`` on a topic with messages: nothing to count, yet the rows get the
    topic ID at once; a same-length recreation is then told when data comes, before counting."""
    topic = real_counting.new_topic(1, prefix="idle-id")
    send(real_kafka.bootstrap_servers, topic, same_three())
    latest = parse_starting_offsets("latest")
    assert real_counting.job(topic, starting_offsets=latest).run_batch().ranges == ()
    old_id = fetch_topic_ids(client_config(real_kafka.bootstrap_servers), [topic])[topic]
    stored = real_counting.db.execute("SELECT off, topic_id FROM txn_offsets WHERE topic = %s", (topic,))
    assert stored.fetchall() == [(3, old_id)]

    real_kafka.recreate_topic(topic, 1)
    send(real_kafka.bootstrap_servers, topic, same_three())
    new_id = fetch_topic_ids(client_config(real_kafka.bootstrap_servers), [topic])[topic]
    assert new_id != old_id
    send(real_kafka.bootstrap_servers, topic, [(0, b"k", b"after", T0 + 10)])
    before = snapshot(real_counting.db)
    with pytest.raises(TopicRecreated) as raised:
        real_counting.job(topic, starting_offsets=latest).run_batch()
    assert str(raised.value) == topic_id_changed_line(topic, old_id, new_id)
    assert snapshot(real_counting.db) == before


def test_a_job_asks_kafka_its_log_offsets_and_topic_ids_through_one_admin_client(
    real_counting: Counting, real_kafka: RealKafkaCluster, admin_clients: list[Any]
) -> None:
    """A new librdkafka client waited about 55 ms for its first answer (15 ms since
    RECONNECT_BACKOFF_MS): a job's first plan asked its topic IDs through a client of their own,
    after the log offsets' one (issue 38). The IDs
    are real Kafka's and stored as before."""
    topic = real_counting.new_topic(2, prefix="one-client")
    real_counting.produce(topic, {0: 3, 1: 2})
    job = real_counting.job(topic)
    assert len(job.run_batch().ranges) == 2
    assert len(admin_clients) == 1
    topic_id = fetch_topic_ids(client_config(real_kafka.bootstrap_servers), [topic])[topic]
    stored = real_counting.db.execute(
        "SELECT part, off, topic_id FROM txn_offsets WHERE topic = %s", (topic,)
    )
    assert sorted(stored.fetchall()) == [(0, 3, topic_id), (1, 2, topic_id)]


def test_a_job_started_at_a_time_asks_kafka_its_offsets_for_times_through_the_same_admin_client(
    real_counting: Counting, real_kafka: RealKafkaCluster, admin_clients: list[Any]
) -> None:
    """A first start at a time (``--starting-timestamp``) asked Kafka's offsets for
    times through a client of its own, a client's first answer more (issue 38). The starts
    are real Kafka's answers: each partition from its first message at or after the time."""
    topic = real_counting.new_topic(2, prefix="one-client-time")
    send(
        real_kafka.bootstrap_servers,
        topic,
        [(p, b"k", b"v%d" % s, T0 + s * 1000) for p in (0, 1) for s in range(4)],
    )
    send(real_kafka.bootstrap_servers, topic, [(1, b"k", b"v4", T0 + 4_000)])
    at_a_time = replace(parse_starting_offsets("latest"), timestamp_ms=T0 + 2_000)
    job = real_counting.job(topic, starting_offsets=at_a_time)
    ranges = job.run_batch().ranges
    assert sorted((r.range.partition, r.range.from_offset, r.range.until_offset) for r in ranges) == [
        (0, 2, 4),
        (1, 2, 5),
    ]
    assert len(admin_clients) == 1
    assert real_counting.totals(topic) == {topic: 5}


def test_a_topic_recreated_with_the_same_messages_stops_an_idle_running_job_within_seconds(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    """Nothing to read: the idle plans ask an idle topic's ID every IDLE_TOPIC_ID_SECONDS, not
    every plan, so the running job stops within that, having read and committed nothing."""
    topic = real_counting.new_topic(1, prefix="idle-recreated")
    send(real_kafka.bootstrap_servers, topic, same_three())
    with real_counting.job(topic) as job:
        assert job.run_batch().messages == 3
        old_id = fetch_topic_ids(client_config(real_kafka.bootstrap_servers), [topic])[topic]
        real_kafka.recreate_topic(topic, 1)
        send(real_kafka.bootstrap_servers, topic, same_three())
        new_id = fetch_topic_ids(client_config(real_kafka.bootstrap_servers), [topic])[topic]
        before = snapshot(real_counting.db)
        started = time.monotonic()
        with pytest.raises(TopicRecreated) as raised:
            while time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 30:
                assert job.run_batch().ranges == ()  # idle: the same log end, nothing to read
                time.sleep(0.2)
        assert time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 10
    assert str(raised.value) == topic_id_changed_line(topic, old_id, new_id)
    assert snapshot(real_counting.db) == before
    assert real_counting.totals(topic) == {topic: 3}


# -- an idle plan taken as the last one (txstore.core.idle) ---------------------------------


def _idle_plans(job: TransactionalJob, plans: int = 5) -> None:
    for _ in range(plans):
        assert job.run_batch().ranges == ()


def test_an_idle_job_counts_a_new_message_at_its_very_next_plan(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    """The idle plans compare the log ends each time: one new message in any partition ends
    them at once, and is counted exactly once, in the next batch."""
    topic = real_counting.new_topic(3, prefix="idle-next")
    real_counting.produce(topic, {0: 2, 1: 2, 2: 2})
    with real_counting.job(topic) as job:
        assert job.run_batch().messages == 6
        _idle_plans(job)
        for partition in (2, 0, 1):
            real_counting.produce(topic, {partition: 1})
            report = job.run_batch()
            assert [(r.range.partition, r.messages) for r in report.ranges] == [(partition, 1)]
            _idle_plans(job, 2)
    real_counting.assert_counted_exactly(topic, 9)


def test_a_row_changed_under_an_idle_job_is_planned_from_at_its_next_plan(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    """The idle plans read the job's rows each time and compare every column: a row moved back
    by hand (as an operator's SQL would) is planned from at the next plan, not seconds later."""
    topic = real_counting.new_topic(2, prefix="idle-row")
    real_counting.produce(topic, {0: 4, 1: 3})
    with real_counting.job(topic) as job:
        assert job.run_batch().messages == 7
        _idle_plans(job)
        real_counting.db.execute(
            "UPDATE txn_offsets SET off = 1, generation = generation + 1, last_off = NULL, "
            "last_timestamp = NULL, last_digest = NULL WHERE job = 'count_topic' AND topic = %s AND part = 0",
            (topic,),
        )
        real_counting.db.commit()
        started = time.monotonic()
        report = job.run_batch()
    assert time.monotonic() - started < IDLE_TOPIC_ID_SECONDS
    assert [(r.range.partition, r.range.from_offset, r.messages) for r in report.ranges] == [(0, 1, 3)]


def test_a_partition_added_under_an_idle_job_is_counted_from_offset_zero_within_seconds(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    """An idle plan asks no metadata: a partition added meanwhile, whose messages are the only
    new ones, is found when the idle topic's ID is due (IDLE_TOPIC_ID_SECONDS) and counted from
    offset 0."""
    topic = real_counting.new_topic(2, prefix="idle-grow")
    real_counting.produce(topic, {0: 2, 1: 2})
    with real_counting.job(topic) as job:
        assert job.run_batch().messages == 4
        _idle_plans(job)
        futures = real_kafka.admin().create_partitions(
            [NewPartitions(topic, 3)], request_timeout=ADMIN_TIMEOUT
        )
        futures[topic].result(ADMIN_TIMEOUT)
        real_counting.produce(topic, {2: 5})
        started = time.monotonic()
        counted = 0
        while counted < 5 and time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 30:
            report = job.run_batch()
            assert all((r.range.partition, r.range.from_offset) == (2, 0) for r in report.ranges)
            counted += report.messages
            time.sleep(0.2)
        assert time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 10
    real_counting.assert_counted_exactly(topic, 9)


def test_a_topic_deleted_under_an_idle_job_stops_it_at_once_with_the_vanished_topic_line(
    real_counting: Counting, real_kafka: RealKafkaCluster
) -> None:
    """The idle plan's log-end lookup fails on a deleted topic: the plan is then made the whole
    way, whose metadata says the topic is gone (not that Kafka did not answer)."""
    topic = real_counting.new_topic(2, prefix="idle-gone")
    real_counting.produce(topic, {0: 2, 1: 1})
    with real_counting.job(topic) as job:
        assert job.run_batch().messages == 3
        _idle_plans(job)
        real_kafka.delete_topic(topic)
        started = time.monotonic()
        with pytest.raises(UnknownTopic) as raised:
            job.run_batch()
        assert time.monotonic() - started < ENDS_TIMEOUT_SECONDS + 5
    assert "does not exist on Kafka at" in str(raised.value)
    assert "though the job stored offsets for 2 of its partitions" in str(raised.value)

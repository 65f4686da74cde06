"""Publishing through the outbox against real Apache Kafka's size limit (``max.message.bytes``).

Kafka applies a topic's ``max.message.bytes`` to a whole record batch, not to one message: a
producer that packs several parts of a commit into one batch can be refused for parts that
each fit. Every part that fits the topic on its own is sent, by the job and by
``txstore publish --retry-failed``; a part that does not is set aside with its exact size (a
record batch of that one message, as Kafka counts it) and the one fix that sends it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.conftest import send
from tests.helpers.cli import txstore
from tests.helpers.counting import Counting
from tests.postgres.test_idempotent_and_outbox import read_topic
from tests.postgres.test_outbox_delivery import message_size, outbox_rows
from tests.postgres.test_sink import seed
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL, by_key
from txstore.count_topic import CountMessages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.client_settings import client_config
from txstore.kafka.producers import close_producers
from txstore.postgres.db import connect
from txstore.postgres.outbox import OutboxPublisher, outbox_counts
from txstore.postgres.sink import PUBLISH_MAX_BYTES, TransactionalSink
from txstore.testing.real_kafka import ADMIN_TIMEOUT_SECONDS, RealKafkaCluster


def set_topic_limit(kafka: RealKafkaCluster, topic: str, limit: int) -> None:
    """Set ``topic``'s ``max.message.bytes`` (the largest record batch Kafka appends to it)."""
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in kafka.admin().incremental_alter_configs([resource]).values():
        future.result(ADMIN_TIMEOUT_SECONDS)


def commit_by_key(database_url: str, job: str, topic: str, ranges: int, keys: int, max_bytes: int) -> None:
    """``ranges`` commits of ``keys`` keys each (one message per key), published to ``topic`` in
    parts of at most ``max_bytes``."""
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, job, publish_to=topic, publish_max_bytes=max_bytes)
        for r in range(ranges):
            deltas: dict[Any, int] = {TOPIC_TOTAL: keys, **{by_key(f"key-{i:03d}"): 1 for i in range(keys)}}
            sink.commit(OffsetRange("events", 0, r * keys, (r + 1) * keys), deltas)


def outbox_sizes(db: psycopg.Connection, job: str) -> list[int]:
    return [
        int(size)
        for (size,) in db.execute(
            "SELECT octet_length(payload::text) + octet_length(dedup_key) + octet_length(headers::text) "
            "FROM txn_outbox WHERE job = %s ORDER BY id",
            (job,),
        ).fetchall()
    ]


def test_parts_that_each_fit_the_topic_are_all_sent_though_two_together_would_not(
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> None:
    """The issue's wedge: 100 keys in parts under 4096 bytes, a topic taking 6000 bytes a batch."""
    results = new_real_topic(1, prefix="small", config={"max.message.bytes": "6000"})
    seed(db, "j", "events", {0: 0})
    commit_by_key(database_url, "j", results, ranges=3, keys=100, max_bytes=4096)
    sizes = outbox_sizes(db, "j")
    assert len(sizes) >= 6 and all(s < 4096 for s in sizes)
    assert sizes[0] + sizes[1] > 6000  # two parts in one record batch are over the topic's limit
    try:
        with connect(database_url) as conn:
            assert OutboxPublisher(client_config(real_kafka.bootstrap_servers), "j").publish_pending(
                conn
            ) == len(sizes)
    finally:
        close_producers()
    assert [(sent, failed) for _, sent, failed, _ in outbox_rows(db, "j")] == [(True, False)] * len(sizes)
    messages = read_topic(real_kafka, results)
    assert len(messages) == len(sizes) and all(message_size(m) < 4096 for m in messages)
    keys = [
        r["key"] for m in messages for r in json.loads(m.value() or b"")["results"] if r["grain"] == "key"
    ]
    assert sorted(keys) == sorted(f"key-{i:03d}" for i in range(100) for _ in range(3))


def test_parts_set_aside_as_too_large_are_all_sent_by_retry_failed_once_the_topic_takes_one_part(
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> None:
    """Set aside while the topic took less than a part; the topic then takes any one part, never
    two: ``txstore publish --retry-failed`` sends every one of them."""
    results = new_real_topic(1, prefix="small", config={"max.message.bytes": "500"})
    seed(db, "j", "events", {0: 0})
    commit_by_key(database_url, "j", results, ranges=2, keys=100, max_bytes=4096)
    sizes = outbox_sizes(db, "j")
    kafka_options = ["--bootstrap-servers", real_kafka.bootstrap_servers]
    first = txstore("publish", "--job", "j", *kafka_options, url=database_url)
    assert first.returncode == 0, first.stderr
    assert f"published 0 results of job 'j'; 0 waiting, {len(sizes)} set aside" in first.stdout
    assert all("too large" in reason for *_, reason in outbox_rows(db, "j"))

    set_topic_limit(real_kafka, results, 6000)
    retried = txstore("publish", "--job", "j", "--retry-failed", *kafka_options, url=database_url)
    assert retried.returncode == 0, retried.stderr
    assert f"published {len(sizes)} results of job 'j'; 0 waiting, 0 set aside" in retried.stdout
    assert len(read_topic(real_kafka, results)) == len(sizes)


@pytest.mark.spark
def test_count_topic_by_key_publishes_every_part_to_a_topic_that_takes_one_part_a_batch_but_not_two(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """The issue's run: ``count_topic --by key --publish-topic small --publish-max-bytes 4096`` over
    100 keys, the topic taking 6000 bytes a record batch."""
    topic = real_counting.new_topic(1, prefix="keys")
    results = real_counting.new_topic(1, prefix="small", config={"max.message.bytes": "6000"})
    send(real_kafka.bootstrap_servers, topic, [(0, b"key-%03d" % i, b"v", None) for i in range(100)])
    settings = JobSettings(
        "small",
        (topic,),
        real_kafka.bootstrap_servers,
        real_counting.database_url,
        publish_topic=results,
        publish_max_bytes=4096,
    )
    try:
        with TransactionalJob(real_counting.spark, settings, CountMessages(by_key=True)) as job:
            job.run_batch()
    finally:
        close_producers()
    assert outbox_counts(real_counting.db, "small") == (0, 0)
    messages = read_topic(real_kafka, results)
    assert len(messages) >= 2 and all(message_size(m) < 4096 for m in messages)
    found = {r["key"]: r["total"] for m in messages for r in json.loads(m.value() or b"")["results"]}
    assert found == {None: 100, **{f"key-{i:03d}": 1 for i in range(100)}}


BATCH_SIZE = re.compile(r"on its own it is a record batch of (\d+) bytes")


def first_segment_bytes(kafka: RealKafkaCluster, topic: str) -> int:
    """The size of partition 0's first log segment: what Kafka appended, record batches as stored."""
    return (kafka.workdir / "data" / f"{topic}-0" / "00000000000000000000.log").stat().st_size


def test_a_part_is_sent_to_a_topic_taking_just_above_or_exactly_its_record_batch_and_set_aside_below(
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> None:
    """Each job's one part is first set aside by a topic taking 500 bytes, with the size of its
    record batch; with the topic's limit at that size plus one, at it, or one below, the part is
    sent, sent (Kafka stores exactly that many bytes), or set aside again with the same size, the
    limit to raise it to, and sent once the topic takes it."""
    kafka_options = ["--bootstrap-servers", real_kafka.bootstrap_servers]
    sizes: dict[str, int] = {}
    topics: dict[str, str] = {}
    for job in ("above", "at", "below"):
        topics[job] = new_real_topic(1, prefix=job, config={"max.message.bytes": "500"})
        seed(db, job, "events", {0: 0})
        commit_by_key(database_url, job, topics[job], ranges=1, keys=100, max_bytes=PUBLISH_MAX_BYTES)
        first = txstore("publish", "--job", job, *kafka_options, url=database_url)
        assert "published 0 results" in first.stdout and "1 set aside" in first.stdout, first.stderr
        ((_, _, _, reason),) = outbox_rows(db, job)
        found = BATCH_SIZE.search(reason)
        assert found, reason
        sizes[job] = int(found.group(1))
        assert f"raise that to at least {sizes[job]}" in reason and repr(topics[job]) in reason
        assert "lower --publish-max-bytes splits only later commits" in reason
        assert "MSG_SIZE_TOO_LARGE" in reason

    for job, limit in (("above", sizes["above"] + 1), ("at", sizes["at"]), ("below", sizes["below"] - 1)):
        set_topic_limit(real_kafka, topics[job], limit)
        retried = txstore("publish", "--job", job, "--retry-failed", *kafka_options, url=database_url)
        assert retried.returncode == 0, retried.stderr
    for job in ("above", "at"):
        assert [(sent, failed) for _, sent, failed, _ in outbox_rows(db, job)] == [(True, False)]
        assert first_segment_bytes(real_kafka, topics[job]) == sizes[job]  # Kafka counts the same bytes
    ((_, sent, failed, reason),) = outbox_rows(db, "below")
    assert (sent, failed) == (False, True) and f"record batch of {sizes['below']} bytes" in reason
    assert read_topic(real_kafka, topics["below"]) == []

    set_topic_limit(real_kafka, topics["below"], sizes["below"])
    retried = txstore("publish", "--job", "below", "--retry-failed", *kafka_options, url=database_url)
    assert "published 1 results of job 'below'; 0 waiting, 0 set aside" in retried.stdout, retried.stderr
    assert len(read_topic(real_kafka, topics["below"])) == 1

"""count_topic jobs and what they stored: totals, committed offsets and the log ends they should equal."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.client import client_config, fetch_watermarks
from txstore.postgres import store


def job_for(
    spark: Any, kafka: AnyKafka, database_url: str, *topics: str, **settings: Any
) -> TransactionalJob:
    return TransactionalJob(
        spark,
        JobSettings(
            settings.pop("job", "count_topic"), topics, kafka.bootstrap_servers, database_url, **settings
        ),
        count_messages,
    )


def totals(db: psycopg.Connection, *topics: str, job: str = "count_topic") -> dict[str, int]:
    return store.topic_totals(db, job, list(topics))


def offsets(db: psycopg.Connection, topic: str, job: str = "count_topic") -> dict[int, int]:
    return {p: o for (t, p), o in store.committed_offsets(db, job, [topic]).items() if t == topic}


def log_ends(kafka: AnyKafka, topic: str) -> dict[int, int]:
    return {m.partition: m.high for m in fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])}


def spark_job_count(spark: Any) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def assert_counted_exactly(
    db: psycopg.Connection, kafka: AnyKafka, topic: str, total: int, job: str = "count_topic"
) -> None:
    """``job`` counted ``topic`` exactly once: its total is ``total`` and it committed every
    partition up to the log end."""
    assert totals(db, topic, job=job) == {topic: total}
    assert offsets(db, topic, job) == log_ends(kafka, topic)

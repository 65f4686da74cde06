"""count_topic jobs and what they stored: totals, committed offsets and the log ends they should equal;
``BrokerDb`` and ``Counting`` (the ``broker_db`` and ``counting`` fixtures) hold what such a test takes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import Outgoing, produce, send
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
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


@dataclass(frozen=True)
class BrokerDb:
    """The ``broker_db`` fixture: the mock broker, PostgreSQL (its URL and a connection) and new
    topics, with the helpers above bound to them (a job run as its own process needs no Spark here)."""

    kafka: AnyKafka
    database_url: str
    db: psycopg.Connection
    new_topic: Callable[..., str]

    def produce(self, topic: str, counts: dict[int, int], **message: Any) -> None:
        produce(self.kafka.bootstrap_servers, topic, counts, **message)

    def totals(self, *topics: str, job: str = "count_topic") -> dict[str, int]:
        return totals(self.db, *topics, job=job)

    def offsets(self, topic: str, job: str = "count_topic") -> dict[int, int]:
        return offsets(self.db, topic, job)

    def log_ends(self, topic: str) -> dict[int, int]:
        return log_ends(self.kafka, topic)

    def assert_counted_exactly(self, topic: str, total: int, job: str = "count_topic") -> None:
        assert_counted_exactly(self.db, self.kafka, topic, total, job)

    def settings(self, job: str, *topics: str, **more: Any) -> JobSettings:
        """``job``'s settings for ``topics`` on this broker and database (``more``: JobSettings' others)."""
        return JobSettings(job, topics, self.kafka.bootstrap_servers, self.database_url, **more)

    def send(self, topic: str, messages: Iterable[Outgoing]) -> int:
        """tests/conftest.py's ``send`` to this broker: each message as given, all acknowledged."""
        return send(self.kafka.bootstrap_servers, topic, messages)

    def txstore(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The ``txstore`` operator command (tests/helpers/cli.py) on this database and broker."""
        from tests.helpers.cli import txstore

        return txstore(*args, url=self.database_url, kafka=self.kafka)


@dataclass(frozen=True)
class Counting(BrokerDb):
    """The ``counting`` fixture (and ``streaming``, on its ``session``): ``broker_db`` with Spark,
    and count_topic jobs and streaming queries on it."""

    spark: Any

    def job(self, *topics: str, **settings: Any) -> TransactionalJob:
        return job_for(self.spark, self.kafka, self.database_url, *topics, **settings)

    def stream(self, topic: str, **options: str) -> Any:
        """A streaming DataFrame of ``topic`` (tests/helpers/streams.py's ``stream``)."""
        from tests.helpers.streams import stream

        return stream(self.spark, self.kafka, self.database_url, topic, **options)

    def run_available_now(self, topic: str, checkpoint: Path, **query: Any) -> Any:
        """One Trigger.AvailableNow run of ``topic``'s stream into the sink (tests/helpers/streams.py)."""
        from tests.helpers.streams import run_available_now

        return run_available_now(self.spark, self.kafka, self.database_url, topic, checkpoint, **query)

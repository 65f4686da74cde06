"""``txstore demo``: the whole pipeline on embedded parts, in one command.

A Kafka-protocol mock broker (or, with ``--kafka real``, Apache Kafka started from its jars:
:mod:`txstore.testing.real_kafka`, fetched once through Maven) with generated messages, the
PostgreSQL named by ``TXSTORE_DATABASE_URL`` or else a throwaway local one (pgserver), and Spark
in local mode. Runs count_topic twice with new messages in between and prints the counts
beside the number of messages produced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Producer

from txstore.core.errors import ConfigError, DatabaseUnavailable, first_line
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.client_settings import CLIENT_LOGGER
from txstore.postgres import store
from txstore.postgres.db import DATABASE_URL_ENV, connect, redact
from txstore.postgres.migrate import upgrade
from txstore.runner import spark_session
from txstore.testing.mock_kafka import MockKafkaCluster

log = logging.getLogger("txstore")


@contextlib.contextmanager
def demo_database(quiet: bool = True) -> Iterator[str]:
    """``TXSTORE_DATABASE_URL`` if set, else a throwaway PostgreSQL deleted afterwards.

    ``quiet``: without the warnings pgserver's platformdirs gives where ``XDG_RUNTIME_DIR`` is unset
    (a container, a CI runner, ``sudo``): it falls back to another folder, which is fine here.

    A URL given is connected to first, so that a server that cannot be reached is one line
    (:class:`DatabaseUnavailable`) before Alembic's migrations would raise their own traceback."""
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        try:
            connect(url, given_by=DATABASE_URL_ENV).close()
        except DatabaseUnavailable as e:
            raise DatabaseUnavailable(f"{e}, or unset it for a throwaway PostgreSQL") from None
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="txstore-demo-pg-") as pgdata, warnings.catch_warnings():
        if quiet:
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        import pgserver

        server = pgserver.get_server(  # type: ignore[attr-defined]
            pgdata, cleanup_mode="delete"
        )
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def produce(bootstrap: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "logger": CLIENT_LOGGER,  # librdkafka's own lines at DEBUG, not on stderr
        }
    )
    for i in range(start, start + count):
        producer.produce(
            topic, key=f"user-{i % 97}".encode(), value=f'{{"n": {i}}}'.encode(), partition=i % partitions
        )
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} demo messages were not delivered")


@contextlib.contextmanager
def demo_broker(kind: str) -> Iterator[Any]:
    """The demo's broker: librdkafka's mock cluster, or Apache Kafka (one KRaft node on
    127.0.0.1, its files deleted afterwards); a broker that cannot be had is one line."""
    if kind == "mock":
        with MockKafkaCluster() as kafka:
            yield kafka
        return
    from txstore.testing.real_kafka import (
        KafkaJarsUnavailable,
        KafkaStartFailed,
        RealKafkaCluster,
        kafka_jars,
    )

    try:
        cluster = RealKafkaCluster(kafka_jars())  # started here; closed by the with below
    except (KafkaJarsUnavailable, KafkaStartFailed) as e:
        raise ConfigError(f"--kafka real: {e}; run the demo without it for the mock broker") from None
    with cluster:
        yield cluster


def create_tables(database_url: str) -> None:
    """The txstore tables, by Alembic's migrations to head; a database that refuses them (a role
    that may not create tables) stops the demo in one line with PostgreSQL's reason, not a
    traceback."""
    import sqlalchemy.exc

    try:
        upgrade(database_url)
    except sqlalchemy.exc.DBAPIError as e:
        reason = first_line(e.orig if e.orig is not None else e)
        raise ConfigError(
            f"cannot create the txstore tables in {redact(database_url)}: {reason}; set "
            f"{DATABASE_URL_ENV} to a database where this role may create tables, or unset it for a "
            "throwaway PostgreSQL"
        ) from None


def run_demo(
    messages: int = 20_000, partitions: int = 4, kafka_kind: str = "mock", verbose: bool = False
) -> int:
    topic = "demo-events"
    job = f"demo-{int(time.time())}"
    with demo_broker(kafka_kind) as kafka, demo_database(quiet=not verbose) as database_url:
        kafka.create_topic(topic, partitions)
        name = "Apache Kafka" if kafka_kind == "real" else "mock Kafka"
        print(f"{name} at {kafka.bootstrap_servers}, PostgreSQL at {redact(database_url)}")
        create_tables(database_url)
        spark = spark_session("txstore demo", quiet=not verbose)
        settings = JobSettings(job, (topic,), kafka.bootstrap_servers, database_url)
        produced = 0
        ok = True
        for run, count in enumerate((messages, messages // 2), start=1):
            produce(kafka.bootstrap_servers, topic, count, partitions, start=produced)
            produced += count
            TransactionalJob(spark, settings, count_messages).run()
            with connect(database_url) as conn:
                counted = store.topic_totals(conn, job, [topic])[topic]
            verdict = "exact" if counted == produced else "MISMATCH"
            ok = ok and counted == produced
            print(f"run {run}: topic {topic}: produced {produced}, counted {counted} ({verdict})")
        spark.stop()  # type: ignore[attr-defined]
    return 0 if ok else 1

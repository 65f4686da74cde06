"""The quickstart demo on its embedded defaults, and ranges read as DataFrames."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.conftest import REPO
from tests.helpers.ops_roles import role_that_cannot_create_tables
from txstore.core.ranges import OffsetRange
from txstore.kafka.client_settings import client_config
from txstore.postgres.db import redact
from txstore.spark.ranges.tasks import TASKS_PER_CORE, default_parallelism, read_ranges
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

pytestmark = pytest.mark.spark


def demo(
    *args: str, database_url: str | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``txstore demo ARGS`` in a process of its own, on a throwaway PostgreSQL unless given
    ``database_url`` (as ``TXSTORE_DATABASE_URL``), without the variables named in ``unset``."""
    env = {k: v for k, v in os.environ.items() if k not in ("TXSTORE_DATABASE_URL", *unset)}
    env["PYSPARK_PYTHON"] = sys.executable
    if database_url is not None:
        env["TXSTORE_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "txstore.ops.cli", "demo", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_counts_exactly_on_an_embedded_broker_and_throwaway_database() -> None:
    result = demo("--messages", "3000", "--partitions", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run 1: topic demo-events: produced 3000, counted 3000 (exact)" in result.stdout
    assert "run 2: topic demo-events: produced 4500, counted 4500 (exact)" in result.stdout


SPARK_AND_PLATFORM_NOISE = (
    "log4j",  # Spark's banner: "Using Spark's default log4j profile"
    " WARN ",  # hostname/loopback, NativeCodeLoader, SparkUI port, DAGScheduler on stop
    "NativeCodeLoader",
    "[Stage ",  # console progress bars
    "XDG_RUNTIME_DIR",  # pgserver's platformdirs, where the variable is unset
    "Setting default log level",  # Spark's logging started by PySpark's gateway as an interpreter's
    "setLogLevel",  # ... and its hint after it
)


def test_the_demo_says_what_the_user_needs_without_spark_or_platform_noise() -> None:
    result = demo("--messages", "300", "--partitions", "2", unset=("XDG_RUNTIME_DIR",))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run 2: topic demo-events: produced 450, counted 450 (exact)" in result.stdout
    output = result.stdout + result.stderr
    assert [n for n in SPARK_AND_PLATFORM_NOISE if n in output] == [], output[-3000:]
    assert "INFO txstore.ranges: range demo-events/0" in result.stderr  # a small batch: at INFO


def test_verbose_brings_back_spark_own_log_lines() -> None:
    result = demo("--messages", "30", "--partitions", "1", "--verbose")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Using Spark's default log4j profile" in result.stderr, result.stderr[-3000:]


def test_a_demo_whose_database_cannot_be_reached_is_one_line_not_a_traceback() -> None:
    """``TXSTORE_DATABASE_URL`` naming no server: the demo stops in one line naming the
    database and what to do, exit 1, as every txstore command does (was: Alembic's traceback)."""
    result = demo("--messages", "10", database_url="postgresql://nobody@127.0.0.1:1/txstore")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("txstore: error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        "txstore: error: cannot connect to PostgreSQL at postgresql://nobody@127.0.0.1:1/txstore: "
    ), errors
    assert errors[0].endswith(
        "; check TXSTORE_DATABASE_URL and that the server is up, or unset it for a throwaway PostgreSQL"
    ), errors


def test_a_demo_whose_database_role_cannot_create_the_tables_is_one_line_not_a_traceback(
    empty_database_url: str,
) -> None:
    """A reachable database where the role may not create tables (PostgreSQL 15+ gives PUBLIC
    no CREATE on schema public): the migration's own error, in one line naming the database and
    what to do, exit 1 (was: Alembic's traceback)."""
    with role_that_cannot_create_tables(empty_database_url, "demo_reader") as (url, password):
        result = demo("--messages", "10", database_url=url)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert password not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("txstore: error: ")]
    assert errors == [
        f"txstore: error: cannot create the txstore tables in {redact(url)}: permission denied for "
        "schema public; set TXSTORE_DATABASE_URL to a database where this role may create tables, "
        "or unset it for a throwaway PostgreSQL"
    ], result.stderr[-3000:]


def test_the_demo_counts_exactly_on_apache_kafka_with_kafka_real(real_kafka: RealKafkaCluster) -> None:
    """``txstore demo --kafka real``: its own Apache Kafka broker (``real_kafka`` only makes this
    test skip, or fail in CI, without Kafka's jars), stopped and deleted at the end."""
    result = demo("--kafka", "real", "--messages", "2000", "--partitions", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("Apache Kafka at 127.0.0.1:"), result.stdout
    assert "run 1: topic demo-events: produced 2000, counted 2000 (exact)" in result.stdout
    assert "run 2: topic demo-events: produced 3000, counted 3000 (exact)" in result.stdout


def test_a_range_reads_as_a_dataframe_with_the_kafka_source_columns(
    spark: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    when = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    for i in range(6):
        producer.produce(
            topic,
            key=None if i == 0 else f"k{i}".encode(),
            value=bytes([i, 255]),
            partition=i % 2,
            timestamp=when + i,
            headers=[("h", b"v")] if i == 1 else None,
        )
    assert producer.flush(10) == 0
    ranges = [OffsetRange(topic, 0, 1, 3), OffsetRange(topic, 1, 0, 3)]
    df = read_ranges(spark, ranges, client_config(kafka.bootstrap_servers))
    assert tuple(df.columns) == KAFKA_SOURCE_COLUMNS
    assert df.rdd.getNumPartitions() == 2
    rows = sorted(df.collect(), key=lambda r: (r.partition, r.offset))
    assert [(r.partition, r.offset) for r in rows] == [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    first = rows[2]  # partition 1, offset 0: message i=1
    assert first.key == b"k1" and first.value == bytes([1, 255]) and first.topic == topic
    assert first.timestampType == 0
    assert first.timestamp.astimezone(timezone.utc) == datetime.fromtimestamp((when + 1) / 1000, timezone.utc)
    assert [(h.key, h.value) for h in first.headers] == [("h", b"v")]
    assert df.groupBy("partition").count().orderBy("partition").collect()[1]["count"] == 3
    assert read_ranges(spark, [], client_config(kafka.bootstrap_servers)).count() == 0


def test_many_ranges_read_as_one_spark_partition_per_core_each_message_once(
    spark: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """More ranges than TASKS_PER_CORE per core share one task per core (Spark's per-task cost
    paid per core, not per partition); min_partitions keeps one task per piece."""
    partitions = 4 * TASKS_PER_CORE * default_parallelism(spark)
    topic = new_topic(partitions)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(partitions * 5):
        producer.produce(topic, value=str(i).encode(), partition=i % partitions)
    assert producer.flush(10) == 0
    ranges = [OffsetRange(topic, p, 1, 5) for p in range(partitions)]
    conf = client_config(kafka.bootstrap_servers)
    expected = sorted((p, o) for p in range(partitions) for o in range(1, 5))

    grouped = read_ranges(spark, ranges, conf)
    assert grouped.rdd.getNumPartitions() == default_parallelism(spark)
    assert sorted((r.partition, r.offset) for r in grouped.collect()) == expected

    one_each = read_ranges(spark, ranges, conf, min_partitions=partitions)
    assert one_each.rdd.getNumPartitions() == partitions
    assert sorted((r.partition, r.offset) for r in one_each.collect()) == expected

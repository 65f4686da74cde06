"""Structured Streaming queries for the tests: ``readStream``/``writeStream.format("txstore")``
built the way the stream tests build them, a Trigger.AvailableNow run, and the source's planning
methods called as Spark calls them (without Spark).

The ``session`` fixture (the classic session, or with :data:`CLASSIC_AND_CONNECT` also a Spark
Connect client) is in tests/spark/stream/conftest.py; the ``readers`` fixture below is imported by
tests/spark/stream/conftest.py and tests/core/conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.spark.stream.stream_source import TxstoreStreamReader, stream_reader

JOB = "stream_job"

CLASSIC_AND_CONNECT = pytest.mark.parametrize(
    "session", ["classic", pytest.param("connect", marks=pytest.mark.connect)], indirect=True
)
"""The test runs on the classic session and through a Spark Connect client (``session`` fixture)."""

ROWS_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
    ]
)
"""A source's rows with some of Kafka's columns."""

COUNT_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("txstore_from", LongType()),
        StructField("txstore_until", LongType()),
        StructField("txstore_messages", LongType()),
    ]
)
"""A source's rows with ``txstore.countMessages``: one per range read, its messages counted."""


class QueryFailed(Exception):
    pass


def stream(
    spark: Any, kafka: AnyKafka, url: str, topic: str, job: str = JOB, by: str = "subscribe", **options: str
) -> Any:
    """``job``'s streaming DataFrame of ``topic`` (``by``: the option naming it, e.g. ``subscribePattern``)."""
    reader = (
        spark.readStream.format("txstore")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option(by, topic)
        .option("txstore.job", job)
        .option("txstore.databaseUrl", url)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def sink(df: Any, url: str, checkpoint: Path, job: str = JOB) -> Any:
    return (
        df.writeStream.format("txstore")
        .option("txstore.job", job)
        .option("txstore.databaseUrl", url)
        .option("checkpointLocation", str(checkpoint))
    )


def run_available_now(
    spark: Any,
    kafka: AnyKafka,
    url: str,
    topic: str,
    checkpoint: Path,
    failpoints: str = "",
    rows: Callable[[Any], Any] | None = None,
    sink_options: dict[str, str] | None = None,
    output_mode: str = "append",
    job: str = JOB,
    **options: str,
) -> Any:
    """One Trigger.AvailableNow run of ``job``'s stream -> sink query; ``rows`` shapes the source's
    DataFrame before the sink, ``sink_options`` are the sink's extra options. A query that fails
    raises :class:`QueryFailed` with its line."""
    df = stream(spark, kafka, url, topic, job=job, **options)
    writer = sink(df if rows is None else rows(df), url, checkpoint, job=job).outputMode(output_mode)
    if failpoints:
        writer = writer.option("txstore.failpoints", failpoints)
    for name, value in (sink_options or {}).items():
        writer = writer.option(name, value)
    query = writer.trigger(availableNow=True).start()
    try:
        query.awaitTermination(120)
    except Exception as e:  # the query failed: StreamingQueryException with the source's line
        raise QueryFailed(str(e)) from None
    assert not query.isActive
    return query


def source_options(servers: str, url: str, topic: str, job: str, **more: str) -> dict[str, str]:
    """The stream source's options for ``topic``, as a query sets them."""
    return {
        "kafka.bootstrap.servers": servers,
        "subscribe": topic,
        "txstore.job": job,
        "txstore.databaseUrl": url,
        **more,
    }


def counting_planner(kafka: AnyKafka, url: str, topic: str, job: str, **more: str) -> TxstoreStreamReader:
    """The source's planning methods (``initialOffset``, ``latestOffset``, ``partitions``), called
    as Spark calls them, without Spark; its rows count each range's messages (:data:`COUNT_SCHEMA`).
    The caller stops it."""
    options = source_options(
        kafka.bootstrap_servers, url, topic, job, **{"txstore.countMessages": "true", **more}
    )
    return stream_reader(options, COUNT_SCHEMA)


@pytest.fixture
def readers() -> Iterator[list[TxstoreStreamReader]]:
    """Readers a test made: stopped after it (each holds its job's stream lock while it plans)."""
    made: list[TxstoreStreamReader] = []
    yield made
    for r in made:
        r.stop()

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import txstore
from tests.helpers.counting import Counting
from tests.helpers.streams import readers
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

__all__ = ["readers"]  # the stream readers a test made, stopped after it (tests/helpers/streams.py)


@pytest.fixture
def session(request: pytest.FixtureRequest) -> Any:
    """The classic session, or (``@CLASSIC_AND_CONNECT``, tests/helpers/streams.py) also a Spark
    Connect client, whose source and sink run on the server; registered, so the source's default
    txstore.tasks is its parallelism."""
    spark = request.getfixturevalue(
        "spark_connect" if getattr(request, "param", "") == "connect" else "spark"
    )
    txstore.register(spark)
    return spark


@pytest.fixture
def streaming(
    session: Any,
    kafka: MockKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_topic: Callable[..., str],
) -> Counting:
    """``counting`` (tests/conftest.py) on ``session``: ``streaming.run_available_now(topic, checkpoint)``,
    ``streaming.stream(topic)``, ``streaming.assert_counted_exactly(topic, 3, job=JOB)``."""
    return Counting(kafka, database_url, db, new_topic, spark=session)


@pytest.fixture
def real_streaming(
    session: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> Counting:
    """``streaming`` on Apache Kafka: ``real_streaming.new_topic(1, prefix="x")`` creates a topic there,
    ``real_streaming.kafka`` is the broker."""
    return Counting(real_kafka, database_url, db, new_real_topic, spark=session)

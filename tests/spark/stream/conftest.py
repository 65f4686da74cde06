from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import txstore
from tests.helpers.counting import Counting
from txstore.testing.mock_kafka import MockKafkaCluster


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

"""The core tests' fixtures: ``readers`` (tests/helpers/streams.py), the stream readers a test made,
and ``real_counting``, ``counting`` on Apache Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.helpers.counting import Counting
from tests.helpers.streams import readers
from txstore.testing.real_kafka import RealKafkaCluster

__all__ = ["readers"]


@pytest.fixture
def real_counting(
    spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> Counting:
    """``counting`` (tests/conftest.py) on Apache Kafka: ``real_counting.kafka`` is the broker,
    ``real_counting.job(topic_pattern=...)`` a count_topic job on it."""
    return Counting(real_kafka, database_url, db, new_real_topic, spark=spark)

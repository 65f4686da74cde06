"""The Kafka tests' fixtures: ``real_counting``, the ``counting`` fixture on Apache Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.helpers.counting import Counting
from txstore.testing.real_kafka import RealKafkaCluster


@pytest.fixture
def real_counting(
    spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
) -> Counting:
    """What a count_topic test on the session's Apache Kafka takes, in one (tests/helpers/counting.py):
    ``real_counting.new_topic(3)`` creates a topic there, ``real_counting.job(topic).run_batch()``
    counts it, ``real_counting.assert_counted_exactly(topic, 3)``."""
    return Counting(real_kafka, database_url, db, new_real_topic, spark=spark)

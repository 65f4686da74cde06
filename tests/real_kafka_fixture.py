"""The real Apache Kafka broker for tests (txstore/testing/real_kafka.py), one per test session.

Registered from tests/conftest.py. ``real_kafka`` skips, with one line saying
why, when Kafka's jars are not cached and Maven cannot fetch them; in CI
(``CI=true``) it fails instead, so a CI run never passes without them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from txstore.kafka.reader import close_idle_consumers
from txstore.testing.real_kafka import KafkaJarsUnavailable, RealKafkaCluster, kafka_jars


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def real_kafka() -> Iterator[RealKafkaCluster]:
    """Apache Kafka (one KRaft node) on a free 127.0.0.1 port, shared by the session's tests."""
    try:
        jars, problem = kafka_jars(), ""
    except KafkaJarsUnavailable as e:
        jars, problem = None, str(e)
    if problem:  # outside the except block: pytest shows one line, not a chained traceback
        if _in_ci():
            pytest.fail(f"real Kafka (CI must run it): {problem}", pytrace=False)
        pytest.skip(f"real Kafka not available: {problem}")
    with RealKafkaCluster(jars) as cluster:
        yield cluster
        close_idle_consumers()  # readers this process kept for reuse, before their broker goes


_topic_numbers = itertools.count()


@pytest.fixture
def new_real_topic(real_kafka: RealKafkaCluster) -> Callable[..., str]:
    """Create a uniquely named topic on the real broker: ``new_real_topic(partitions=4)``."""

    def create(partitions: int = 4, prefix: str = "real", config: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{os.getpid()}-{next(_topic_numbers)}"
        real_kafka.create_topic(name, partitions, config=config)
        return name

    return create

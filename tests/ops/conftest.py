"""The operator commands' fixtures: a job 'counter' that counted some of a topic."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers.cli import count_some
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.testing.mock_kafka import MockKafkaCluster


@pytest.fixture
def counted(database_url: str, kafka: MockKafkaCluster, new_topic: Callable[..., str]) -> str:
    """A topic with 3 partitions (10/20/30 messages) of which job 'counter' committed 4/20/0."""
    return count_some(database_url, kafka, new_topic(3))


@pytest.fixture
def counted_on_any(database_url: str, any_kafka: AnyKafka, new_any_topic: Callable[..., str]) -> str:
    """``counted`` on the mock broker, then on real Kafka."""
    return count_some(database_url, any_kafka, new_any_topic(3))

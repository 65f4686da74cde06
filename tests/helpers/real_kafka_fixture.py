"""The real Apache Kafka broker for tests (txstore/testing/real_kafka.py), one per test session.

Registered from tests/conftest.py. ``real_kafka`` skips, with one line saying
why, when Kafka's jars are not cached and Maven cannot fetch them; in CI
(``CI=true``) it fails instead, so a CI run never passes without them.

``any_kafka`` runs a test twice: on the mock broker (``kafka``), then on this
real one (marked ``real_kafka``: ``-m "not real_kafka"`` leaves it out), with
``new_any_topic`` creating its topics on whichever it is. Which tests take it,
and why those: docs/development.md, "On both brokers".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from tests.helpers.topics import topic_name
from txstore.kafka.reader import close_idle_consumers
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import KafkaJarsUnavailable, RealKafkaCluster, kafka_jars

T = TypeVar("T")
AnyKafka = MockKafkaCluster | RealKafkaCluster
"""Either broker: both have ``bootstrap_servers``, ``create_topic``, ``delete_topic``, ``recreate_topic``."""


# Retention and compaction within a test's seconds (tests/kafka/test_real_kafka_lifecycle.py): Kafka
# checks retention every 5 minutes and the cleaner backs off 15 s by default. Only topics that
# ask for it (retention.ms, cleanup.policy=compact) are touched: by default nothing ages out, as
# tests produce messages with CreateTimes months old (Kafka's 7 days would delete them at once).
SESSION_BROKER_CONFIG = {
    "log.retention.ms": "-1",
    "log.retention.check.interval.ms": "500",
    "log.cleaner.backoff.ms": "500",
    "log.segment.delete.delay.ms": "1000",
}


# The login the SASL_SSL listener knows (tests/kafka/test_real_kafka_logins.py).
SCRAM_USER = "txstore-job"
SCRAM_PASSWORD = "s3cret pass=word;"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def jars_or_skip(
    fetch: Callable[[], T], what: str = "real Kafka", skip: str = "real Kafka not available"
) -> T:
    """``fetch()`` (``kafka_jars``: Kafka's jars), or, where they cannot be had, a one-line skip
    (``skip: why``); in CI (``CI=true``) a failure instead (``what (CI must run it): why``)."""
    try:
        return fetch()
    except KafkaJarsUnavailable as e:
        problem = str(e)
    # outside the except block: pytest shows one line, not a chained traceback
    if _in_ci():
        pytest.fail(f"{what} (CI must run it): {problem}", pytrace=False)
    pytest.skip(f"{skip}: {problem}")


@pytest.fixture(scope="session")
def real_kafka() -> Iterator[RealKafkaCluster]:
    """Apache Kafka (one KRaft node) on a free 127.0.0.1 port, shared by the session's tests."""
    jars = jars_or_skip(kafka_jars)
    with RealKafkaCluster(
        jars, broker_config=SESSION_BROKER_CONFIG, scram_users={SCRAM_USER: SCRAM_PASSWORD}
    ) as cluster:
        yield cluster
        close_idle_consumers()  # readers this process kept for reuse, before their broker goes


@pytest.fixture
def new_real_topic(real_kafka: RealKafkaCluster) -> Callable[..., str]:
    """Create a uniquely named topic on the real broker: ``new_real_topic(partitions=4)``."""

    def create(partitions: int = 4, prefix: str = "real", config: dict[str, str] | None = None) -> str:
        name = topic_name(prefix)
        real_kafka.create_topic(name, partitions, config=config)
        return name

    return create


@pytest.fixture(params=["mock", pytest.param("real", marks=pytest.mark.real_kafka)])
def any_kafka(request: pytest.FixtureRequest) -> AnyKafka:
    """The mock broker, then real Apache Kafka (the session's): a test taking it runs on both."""
    cluster: AnyKafka = request.getfixturevalue("kafka" if request.param == "mock" else "real_kafka")
    return cluster


@pytest.fixture
def new_any_topic(any_kafka: AnyKafka) -> Callable[..., str]:
    """Create a uniquely named topic on ``any_kafka``: ``new_any_topic(partitions=4)``.

    ``config`` (topic settings, e.g. ``{"max.message.bytes": "4194304"}``) goes to the real
    broker; the mock has no topic settings (its limits are librdkafka's mock defaults).
    """

    def create(partitions: int = 4, prefix: str = "any", config: dict[str, str] | None = None) -> str:
        name = topic_name(prefix)
        if isinstance(any_kafka, RealKafkaCluster):
            any_kafka.create_topic(name, partitions, config=config)
        else:
            any_kafka.create_topic(name, partitions)
        return name

    return create

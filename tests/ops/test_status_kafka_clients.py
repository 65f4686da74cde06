"""`txstore status` asks Kafka about a job's topics through one client, not one per topic: a new
librdkafka client waits about 55 ms for its first answer, so a job of 20 topics took 1.4 s where
one of a single topic took 0.35 s."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import txstore.kafka.client
from tests.conftest import produce
from txstore.core.starting import StartDecision
from txstore.kafka.client_settings import client_config
from txstore.ops.health_facts import health_facts
from txstore.ops.status import status
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.testing.mock_kafka import MockKafkaCluster


@pytest.fixture
def admin_clients(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every Kafka admin client txstore's Kafka adapter makes from now on (librdkafka's own class,
    counted, not replaced)."""
    made: list[Any] = []

    class Counted(txstore.kafka.client.AdminClient):  # type: ignore[misc]
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            made.append(self)

    monkeypatch.setattr(txstore.kafka.client, "AdminClient", Counted)
    return made


def test_status_and_its_check_ask_every_topic_of_a_job_through_one_kafka_client(
    database_url: str, kafka: MockKafkaCluster, new_topic: Callable[..., str], admin_clients: list[Any]
) -> None:
    topics = [new_topic(2, prefix=f"t{i}") for i in range(4)]
    for i, topic in enumerate(topics):
        produce(kafka.bootstrap_servers, topic, {0: i + 1, 1: 2 * i + 1})
    with connect(database_url) as conn:
        store.create_start_rows(
            conn, "four_topics", [StartDecision(t, p, 0, "test") for t in topics for p in range(2)]
        )
        conf = client_config(kafka.bootstrap_servers)

        shown, problem = status(conn, conf, "four_topics")
        assert problem is None
        assert [(s.topic, s.partition, s.log_end, s.lag) for s in shown] == [
            (t, p, n, n) for i, t in enumerate(topics) for p, n in ((0, i + 1), (1, 2 * i + 1))
        ]
        assert len(admin_clients) == 1

        facts, _ = health_facts(conn, conf, "four_topics", timedelta(minutes=5))
        assert [(f.topic, f.partition, f.watermarks.high if f.watermarks else None) for f in facts] == [
            (t, p, n) for i, t in enumerate(topics) for p, n in ((0, i + 1), (1, 2 * i + 1))
        ]
        # one for every topic's log offsets, one for their topic IDs (none on this broker)
        assert len(admin_clients) == 3

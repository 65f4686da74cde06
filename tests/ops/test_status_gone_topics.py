"""`txstore status` when a topic a job stored offsets for is gone from Kafka (deleted, or never
there): that topic's Kafka columns are empty and named in one warning line; every other topic
is shown as usual, and Kafka is not said to be down."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.conftest import produce
from tests.helpers.cli import txstore
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.core.starting import StartDecision
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.sink import TransactionalSink
from txstore.testing.mock_kafka import MockKafkaCluster


@pytest.mark.slow
def test_a_topic_gone_from_kafka_blanks_only_its_own_rows_and_is_named_in_the_warning(
    database_url: str, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    kept = new_topic(2, prefix="z-kept")  # sorted after the gone topic: asked of Kafka second
    gone = "a-gone-topic-never-in-kafka"
    produce(kafka.bootstrap_servers, kept, {0: 5, 1: 7})
    with connect(database_url) as conn:
        store.create_start_rows(
            conn,
            "two_topics",
            [StartDecision(gone, 0, 0, "test"), *(StartDecision(kept, p, 0, "test") for p in range(2))],
        )
        sink = TransactionalSink(conn, "two_topics")
        sink.commit(OffsetRange(gone, 0, 0, 3), {TOPIC_TOTAL: 3})
        sink.commit(OffsetRange(kept, 0, 0, 2), {TOPIC_TOTAL: 2})

    result = txstore("status", "--job", "two_topics", "--json", url=database_url, kafka=kafka)

    assert result.returncode == 0, result.stderr
    rows = {(r["topic"], r["partition"]): r for r in json.loads(result.stdout)}
    assert (rows[(gone, 0)]["offset"], rows[(gone, 0)]["log_end"], rows[(gone, 0)]["lag"]) == (3, None, None)
    assert [
        (rows[(kept, p)]["offset"], rows[(kept, p)]["log_end"], rows[(kept, p)]["lag"]) for p in (0, 1)
    ] == [
        (2, 5, 3),
        (0, 7, 7),
    ]
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 1, result.stderr
    assert gone in warnings[0] and "not in Kafka" in warnings[0], warnings
    assert "did not answer" not in result.stderr

    check = txstore("status", "--check", "--job", "two_topics", url=database_url, kafka=kafka)
    assert check.returncode == 2, check.stdout + check.stderr
    problems = check.stdout.splitlines()[1:]
    assert [line.split()[0] for line in problems if gone in line] == ["ERR"], check.stdout
    assert not [line for line in problems if kept in line and line.startswith("ERR")], check.stdout

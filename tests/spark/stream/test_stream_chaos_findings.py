"""What the streaming chaos trials (``python -m tests.chaos --stream``) found, each as a plain test.

A running query's PostgreSQL sessions end under it when the server restarts or an administrator
terminates them (the trials' ``pg-terminate`` and ``pg-unreachable``). The stored counts stayed
exact in every trial, but the *query* stopped with ``psycopg.OperationalError``; since the
source connects again and re-takes its locks (``PlanningSession._db``, :mod:`txstore.spark.stream.stream_session`), it goes on.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from tests.conftest import produce
from tests.helpers.streams import counting_planner
from txstore.testing.mock_kafka import MockKafkaCluster


def _terminate(db: psycopg.Connection, application_name: str) -> int:
    """pg_terminate_backend of the database's sessions whose application_name is LIKE the pattern."""
    rows = db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND application_name LIKE %s",
        (application_name,),
    ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def test_the_sources_planning_goes_on_after_its_session_is_terminated(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    """The source as Spark calls it, without Spark: plan, terminate its session, plan again."""
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 4})
    reader = counting_planner(kafka, database_url, topic, "planning_terminated")
    try:
        start = reader.initialOffset()
        assert reader.latestOffset(start, None) == {topic: {"0": 3, "1": 4}}
        assert _terminate(db, "txstore stream %") == 1
        produce(kafka.bootstrap_servers, topic, {0: 2})
        assert reader.latestOffset(start, None) == {topic: {"0": 5, "1": 4}}
    finally:
        reader.stop()

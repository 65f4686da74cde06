"""``txstore reset --forget`` deletes the rows of partitions Kafka no longer has; a partition Kafka
still has would be read again from where the job starts it, so that takes ``--force``, and the plan
says what would be read again (issue 37 point 9: it planned to delete every row)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import produce
from tests.helpers.cli import count_some, offsets, txstore
from txstore.core.starting import StartDecision
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.testing.mock_kafka import MockKafkaCluster


@pytest.mark.slow
def test_forgetting_partitions_kafka_still_has_shows_what_is_read_again_and_needs_force(
    database_url: str, kafka: MockKafkaCluster, db: psycopg.Connection, counted: str
) -> None:
    forget = ("reset", "--job", "counter", "--topic", counted, "--forget")
    plan = txstore(*forget, "--partition", "0", "--partition", "1", url=database_url, kafka=kafka)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines() == [
        f"reset of job 'counter', topic '{counted}':",
        f"  {counted}/0: 4 -> (row deleted; Kafka still has it, offsets 0 to 10: the job starts it again "
        "at its earliest offset 0, 4 messages counted again)",
        f"  {counted}/1: 20 -> (row deleted; Kafka still has it, offsets 0 to 20: the job starts it again "
        "at its earliest offset 0, 20 messages counted again)",
        "dry run: nothing was changed; add --execute to apply this plan",
    ]
    assert plan.stderr == (
        f"txstore: warning: Kafka still has topic '{counted}' partitions [0, 1]: forgetting them makes "
        "the job read them again (24 messages counted again); --execute needs --force\n"
    )
    refused = txstore(*forget, "--partition", "1", "--execute", url=database_url, kafka=kafka)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"txstore: error: Kafka still has topic '{counted}' partitions [1]: forgetting them makes the job "
        "read them again (20 messages counted again); nothing was changed: --forget is for partitions "
        "Kafka no longer has; add --force to forget these anyway\n"
    )
    assert offsets(db, counted) == {0: 4, 1: 20, 2: 0}
    forced = txstore(*forget, "--partition", "1", "--execute", "--force", url=database_url, kafka=kafka)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[-1] == "applied"
    assert offsets(db, counted) == {0: 4, 2: 0}


def test_forgetting_every_row_of_a_topic_kafka_has_says_the_jobs_starting_offsets_decide(
    database_url: str, kafka: MockKafkaCluster, counted: str
) -> None:
    plan = txstore("reset", "--job", "counter", "--topic", counted, "--forget", url=database_url, kafka=kafka)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[2] == (
        f"  {counted}/1: 20 -> (row deleted; Kafka still has it, offsets 0 to 20: the job starts it again "
        "where its --starting-offsets say, at earliest offset 0 (the default): 20 messages counted again)"
    )


@pytest.mark.slow
def test_forgetting_a_deleted_topic_or_a_vanished_partition_needs_no_force(
    database_url: str, kafka: MockKafkaCluster, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    gone = count_some(database_url, kafka, new_topic(3))
    kafka.delete_topic(gone)
    forget = txstore(
        "reset", "--job", "counter", "--topic", gone, "--forget", "--execute", url=database_url, kafka=kafka
    )
    assert forget.returncode == 0, forget.stderr
    assert forget.stdout.splitlines()[1:] == [
        f"  {gone}/0: 4 -> (row deleted; Kafka no longer has it)",
        f"  {gone}/1: 20 -> (row deleted; Kafka no longer has it)",
        f"  {gone}/2: 0 -> (row deleted; Kafka no longer has it)",
        "applied",
    ]
    assert offsets(db, gone) == {}
    shrunk = new_topic(1)
    produce(kafka.bootstrap_servers, shrunk, {0: 3})
    with connect(database_url) as conn:
        store.create_start_rows(conn, "counter", [StartDecision(shrunk, p, 0, "test") for p in (0, 7)])
    vanished = txstore(
        "reset",
        "--job",
        "counter",
        "--topic",
        shrunk,
        "--partition",
        "7",
        "--forget",
        "--execute",
        url=database_url,
        kafka=kafka,
    )
    assert vanished.returncode == 0, vanished.stderr
    assert offsets(db, shrunk) == {0: 0}


@pytest.mark.slow
def test_forgetting_without_kafka_cannot_tell_what_kafka_has_and_needs_force(
    database_url: str, kafka: MockKafkaCluster, db: psycopg.Connection, counted: str
) -> None:
    forget = ("reset", "--job", "counter", "--topic", counted, "--partition", "2", "--forget")
    refused = txstore(*forget, "--execute", url=database_url)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"txstore: error: cannot tell whether Kafka still has topic '{counted}' partitions [2]: Kafka not "
        "given (--bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS); nothing was changed: --forget is for "
        "partitions Kafka no longer has; add --force to forget these anyway\n"
    )
    down = txstore(*forget, "--execute", "--bootstrap-servers", "127.0.0.1:1", url=database_url)
    assert down.returncode == 1
    assert down.stderr.startswith("txstore: error: cannot tell whether Kafka still has topic ")
    assert "Kafka at 127.0.0.1:1 did not answer" in down.stderr
    assert down.stderr.count("\n") == 1
    assert offsets(db, counted) == {0: 4, 1: 20, 2: 0}
    forced = txstore(*forget, "--execute", "--force", url=database_url)
    assert forced.returncode == 0, forced.stderr
    assert f"{counted}/2: 0 -> (row deleted; whether Kafka still has it is not known)" in forced.stdout
    assert offsets(db, counted) == {0: 4, 1: 20}
